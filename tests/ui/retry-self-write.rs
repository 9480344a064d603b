#![allow(unused_variables)]

struct Bank;

#[idem::tools]
impl Bank {
    #[idem::write]
    fn delete_account(&self, account: &str) -> Result<(), String> {
        Ok(())
    }

    fn delete_twice(&self) -> Result<(), String> {
        idem::retry!(Self::delete_account(self, "acct-1"))
    }
}

fn main() {
    let _ = Bank.delete_twice();
}
