#![allow(unused_variables)]

#[derive(Debug)]
pub struct PayError;

impl From<idem::Error> for PayError {
    fn from(_: idem::Error) -> Self {
        PayError
    }
}

pub struct SearchResult<T> {
    pub hits: Vec<T>,
}

#[idem::idempotent(scope = "query")]
fn search(query: &str) -> SearchResult<String> {
    SearchResult { hits: Vec::new() }
}

fn main() {}
