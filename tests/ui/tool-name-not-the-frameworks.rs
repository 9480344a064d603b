#![allow(unused_variables)]

#[derive(Debug)]
pub struct TicketError;

impl From<idem::Error> for TicketError {
    fn from(_: idem::Error) -> Self {
        TicketError
    }
}

/// rig's `Tool` trait, in its shape: the impl names the tool with `const NAME`.
pub trait Tool {
    const NAME: &'static str;
    fn call(&self, request_id: String) -> Result<String, TicketError>;
}

pub struct OpenTicket;

// The framework names this tool `open_ticket`: a `tool = "…"` naming it otherwise is refused.
#[idem::tools]
impl Tool for OpenTicket {
    const NAME: &'static str = "open_ticket";

    #[idem::idempotent(scope = "request_id", tool = "open")]
    fn call(&self, request_id: String) -> Result<String, TicketError> {
        Ok(request_id)
    }
}

fn main() {}
