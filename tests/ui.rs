//! Compile-time behaviour of the attributes and `retry!`: every misuse is an error in our words,
//! spanned on the user's tokens (`tests/ui/*.rs`), and every supported shape compiles
//! (`tests/ui/pass/*.rs`); with the `rmcp` feature, misuses beside rmcp's attributes
//! (`tests/ui/rmcp/*.rs`); with the `sqlite` feature, transactional tools (`tests/ui/sqlite/*.rs`).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
    cases.pass("tests/ui/pass/*.rs");
    // Misuses of rmcp's attributes with ours, which need rmcp (the `rmcp` feature, as CI runs).
    #[cfg(feature = "rmcp")]
    cases.compile_fail("tests/ui/rmcp/*.rs");
    // Misuses of `transactional = "tx"`, which needs the SQLite store (the `sqlite` feature).
    #[cfg(feature = "sqlite")]
    cases.compile_fail("tests/ui/sqlite/*.rs");
}
