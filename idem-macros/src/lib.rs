//! Attribute macros of idem. Use them through the `idem` facade, whose docs describe them.

mod args;
mod classify;
mod expand;
mod output;
mod retry;
mod validate;

use proc_macro::TokenStream;

use args::Attr;

/// Runs the body at most once per intent key; see `idem::idempotent`.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::attribute(Attr::Idempotent, args.into(), item.into()).into()
}

/// Classifies a tool as a read, safe to retry; see `idem::read`.
#[proc_macro_attribute]
pub fn read(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::attribute(Attr::Read, args.into(), item.into()).into()
}

/// Classifies a tool as an unkeyed write, never retried; see `idem::write`.
#[proc_macro_attribute]
pub fn write(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::attribute(Attr::Write, args.into(), item.into()).into()
}

/// Calls a `#[read]` or `#[idempotent]` tool again with backoff until it succeeds; see
/// `idem::retry!`.
#[proc_macro]
pub fn retry(input: TokenStream) -> TokenStream {
    retry::expand(input.into()).into()
}

/// The classification of a tool, read from its companion; used through `idem::tool_info!`, which
/// passes `$crate` first.
#[doc(hidden)]
#[proc_macro]
pub fn tool_info(input: TokenStream) -> TokenStream {
    classify::tool_info(input.into()).into()
}
