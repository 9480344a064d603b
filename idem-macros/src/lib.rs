//! Attribute macros of idem. Use them through the `idem` facade, whose docs describe them.
//!
//! # Module map
//!
//! Each file is one stage, and stages import downward only, in this order:
//!
//! - `attr`: the attributes' options and parameter options as written, parsed into views that
//!   keep the user's tokens for spans.
//! - `signature`: what a function's syntax says: its body's shape, its `Result`, whether it
//!   sits in an `impl`.
//! - `spans`: locating generated tokens on the user's.
//! - `checked`: a tool as validation leaves it, the view expansion reads.
//! - `companion`: the hidden constant that classifies a tool at compile time: its name, where
//!   it is declared, its tokens.
//! - `lookup`: finding a companion from a path the user wrote.
//! - `validate` (with `validate/`: `options`, `result`, `params`, `scope`, `key`, `reconcile`):
//!   every check of `#[idempotent]`, `#[read]` and `#[write]`, producing a `checked::Tool`.
//! - One file per macro: `expand` (`#[idempotent]`, `#[read]`, `#[write]`), `tools`
//!   (`#[idem::tools]`), `retry` (`retry!`), `tool_info` (`tool_info!`); `router` is the part of
//!   `#[idem::tools]` that wraps rmcp's tool router (and its hidden `wrap_tool_router`).

mod attr;
mod checked;
mod companion;
mod expand;
mod lookup;
mod retry;
mod router;
mod signature;
mod spans;
mod tool_info;
mod tools;
mod validate;

use proc_macro::TokenStream;

use attr::Attr;

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

/// Classifies the `#[read]`, `#[idempotent]` and `#[write]` methods of an `impl` block at compile
/// time; see `idem::tools`.
#[proc_macro_attribute]
pub fn tools(args: TokenStream, item: TokenStream) -> TokenStream {
    tools::expand(args.into(), item.into()).into()
}

/// Wraps the rmcp router function that `#[tool_router]` has added to a block under
/// `#[idem::tools]`; written by `#[idem::tools]` after a `#[tool_router]` below it.
#[doc(hidden)]
#[proc_macro_attribute]
pub fn wrap_tool_router(args: TokenStream, item: TokenStream) -> TokenStream {
    router::expand_wrap(args.into(), item.into()).into()
}

/// The classification of a tool, read from its companion; used through `idem::tool_info!`, which
/// passes `$crate` first.
#[doc(hidden)]
#[proc_macro]
pub fn tool_info(input: TokenStream) -> TokenStream {
    tool_info::expand(input.into()).into()
}
