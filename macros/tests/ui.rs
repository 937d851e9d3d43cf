//! Compile-time behaviour of `#[activity]` and `#[workflow]`: valid shapes expand and
//! type-check, and each misuse is a compile error pointing at the offending token.

#[test]
fn macro_misuse_is_a_spanned_compile_error() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
