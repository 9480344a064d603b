//! Attribute macros of idem. Use them through the `idem` facade.

use proc_macro::TokenStream;

/// Placeholder until the macro issue lands.
#[proc_macro_attribute]
pub fn idempotent(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}

/// Placeholder until the macro issue lands.
#[proc_macro_attribute]
pub fn read(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}

/// Placeholder until the macro issue lands.
#[proc_macro_attribute]
pub fn write(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
