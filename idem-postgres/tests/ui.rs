//! Compile-time behaviour of `transactional = "tx"` on an async tool: each misuse is an error in
//! our words, spanned on the user's tokens (`tests/ui/*.rs`).

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
