//! Compile-time behaviour of the attributes and `retry!`: every misuse is an error in our words,
//! spanned on the user's tokens (`tests/ui/*.rs`), and every supported shape compiles
//! (`tests/ui/pass/*.rs`).

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
    cases.pass("tests/ui/pass/*.rs");
}
