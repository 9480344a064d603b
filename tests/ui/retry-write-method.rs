#![allow(unused_variables)]

struct Bank;

#[idem::tools]
impl Bank {
    #[idem::write]
    fn delete_account(&self, account: &str) -> Result<(), String> {
        Ok(())
    }
}

fn main() {
    let bank = Bank;
    let _ = idem::retry!(Bank::delete_account(&bank, "acct-1"));
}
