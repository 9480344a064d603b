#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

pub struct Server;

impl Server {
    #[idem::read]
    pub fn ping(x: u32) -> Result<u32, PayError> {
        Ok(x)
    }

    pub fn ping_hard() -> Result<u32, PayError> {
        idem::retry!(Self::ping(1))
    }
}

fn main() {}
