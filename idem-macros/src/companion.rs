//! The compile-time classification: a hidden companion constant beside each tool function,
//! `__idem_tool_<name>: Option<ToolInfo>`, that `retry!` and `tool_info!` read (see `lookup`).
//! Its name, where it is declared, and its tokens, for the attributes and `#[idem::tools]` alike.
//!
//! A constant, not a type named like the function: a module of the function's name (`mod charge;
//! pub use charge::charge;`) takes that name in the type namespace, and an inherent `impl` can
//! hold a constant where it cannot hold a type. `Option`, so that a lookup that finds none can
//! fall back to `None` and say what to import.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote_spanned};
use syn::ext::IdentExt;
use syn::{Ident, ItemFn, Path, Visibility};

use crate::attr::Attr;
use crate::signature::{self, Shape};

/// The companion's name for a function named `function` (raw or not).
pub(crate) fn companion_name(function: &Ident) -> Ident {
    format_ident!("__idem_tool_{}", function.unraw(), span = Span::mixed_site())
}

/// Whether the attribute on `item` declares its companion constant beside it. Not when the
/// signature shows it is in an `impl` (it takes `self` or names `Self`), nor when its body is
/// `Box::pin(async move { … })`, as `#[async_trait]` and rmcp's `#[tool]` write it, in trait
/// impls, which cannot hold the companion: `#[idem::tools]` on the block declares those in an
/// inherent impl of its own. A free function written that way by hand loses only its
/// classification, while a companion in a trait impl would not compile. A function in an
/// inherent `impl` can hold one too, so only that proof withholds it.
pub(crate) fn declares_companion(item: &ItemFn) -> bool {
    !signature::is_surely_in_impl(&item.sig) && signature::shape_and_output(item).0 != Shape::Boxed
}

/// The `ToolInfo` of a tool named `name` (an expression of type `&'static str`) under `attr`,
/// with its scope's text if it has one, whether it may change or delete what is there, and
/// whether a person may have to approve a call. An
/// `#[idempotent]` tool without a scope (an error reported elsewhere) is classified as what it
/// would do now: a write.
pub(crate) fn info(
    krate: &Path,
    attr: Attr,
    name: &TokenStream,
    scope: Option<&str>,
    destructive: bool,
    approval: bool,
) -> TokenStream {
    let mixed = Span::mixed_site();
    let kind = match (attr, scope) {
        (Attr::Read, _) => quote_spanned!(mixed=> #krate::__private::Kind::Read),
        (Attr::Idempotent, Some(scope)) => {
            quote_spanned!(mixed=> #krate::__private::Kind::Idempotent { scope: #scope })
        }
        (Attr::Idempotent, None) | (Attr::Write, _) => {
            quote_spanned!(mixed=> #krate::__private::Kind::Write)
        }
    };
    quote_spanned! {mixed=>
        #krate::__private::ToolInfo::new(#name, #kind)
            .destructive(#destructive)
            .approval(#approval)
    }
}

/// The companion of `function`, visible as `vis`, holding `info`.
pub(crate) fn declaration(
    krate: &Path,
    vis: &Visibility,
    function: &Ident,
    info: &TokenStream,
) -> TokenStream {
    let companion = companion_name(function);
    quote_spanned! {Span::mixed_site()=>
        #[doc(hidden)]
        #[allow(non_upper_case_globals, dead_code)]
        #vis const #companion: ::core::option::Option<#krate::__private::ToolInfo> =
            ::core::option::Option::Some(#info);
    }
}
