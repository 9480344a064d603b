//! rmcp's tool router under `#[idem::tools]`: the function `#[tool_router]` generates (or one
//! the user writes) that returns a `ToolRouter<Self>` gets its body passed through
//! `__private::tool_router_answers`, so that idem's answers (in doubt, in flight elsewhere, …)
//! reach the model as tool results, with no line for the user to forget.
//!
//! `#[tool_router]` adds its function to the block when it expands. Written below ours, it has
//! not expanded yet when ours does, so ours puts a hidden attribute (`wrap_tool_router`) right
//! after it, which expands once `#[tool_router]` has; written above ours, it has already added
//! the function, which ours then finds itself.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Attribute, ImplItem, ItemImpl, Path, ReturnType, Type};

/// Where `#[tool_router]` sits on the block, if it has not expanded yet.
pub(crate) fn pending(block: &ItemImpl) -> Option<usize> {
    block.attrs.iter().position(is_tool_router)
}

/// The hidden attribute that wraps the router once `#[tool_router]` at `at` has expanded.
pub(crate) fn wrap_later(block: &mut ItemImpl, at: usize, krate: &Path) {
    let wrap: Attribute = syn::parse_quote!(#[#krate::__private::wrap_tool_router(#krate)]);
    block.attrs.insert(at + 1, wrap);
}

/// Passes the body of every router function of `block` through `tool_router_answers`.
pub(crate) fn wrap(block: &mut ItemImpl, krate: &Path) {
    for item in &mut block.items {
        let ImplItem::Fn(function) = item else { continue };
        if !function.sig.inputs.is_empty() || !returns_a_router(&function.sig.output) {
            continue;
        }
        let body = &function.block;
        let answers = quote!(#krate::__private::tool_router_answers);
        function.block = syn::parse_quote!({ #answers(#body, Self::idem_tools()) });
    }
}

/// Expands the hidden `wrap_tool_router(path)`: `path` is the facade's.
pub(crate) fn expand_wrap(args: TokenStream, item: TokenStream) -> TokenStream {
    let krate: Path = match syn::parse2(args) {
        Ok(krate) => krate,
        Err(error) => return error.into_compile_error(),
    };
    match syn::parse2::<ItemImpl>(item.clone()) {
        Ok(mut block) => {
            wrap(&mut block, &krate);
            quote!(#block)
        }
        // `#[tool_router]` emits an `impl` block; anything else is its own error, reported
        // where it arose.
        Err(_) => item,
    }
}

/// Whether `output` is `-> …ToolRouter<Self>`, rmcp's router of the block's type.
fn returns_a_router(output: &ReturnType) -> bool {
    let ReturnType::Type(_, ty) = output else { return false };
    let Type::Path(path) = ty.as_ref() else { return false };
    let Some(last) = path.path.segments.last() else { return false };
    if last.ident != "ToolRouter" {
        return false;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else { return false };
    let mut args = args.args.iter();
    matches!(
        (args.next(), args.next()),
        (Some(syn::GenericArgument::Type(Type::Path(of))), None) if of.path.is_ident("Self")
    )
}

/// Whether `attr` is rmcp's `#[tool_router]` (by its last segment, as rmcp's own macros tell
/// `#[tool]`).
fn is_tool_router(attr: &Attribute) -> bool {
    attr.path().segments.last().is_some_and(|last| last.ident == "tool_router")
}
