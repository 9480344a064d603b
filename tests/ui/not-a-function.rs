#![allow(unused_variables)]

#[idem::read]
struct Balance;

fn main() {}
