//! Finding a tool's companion (see `companion`) from a path the user wrote, at compile time:
//! the lookup `retry!` and `tool_info!` share, and the constant evaluation of their check on it.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Ident, Path, QSelf};

use crate::companion::companion_name;
use crate::signature::mentions_self_type;
use crate::spans::respan;

/// The function's name as a user reads it (`type` for `r#type`), for messages.
pub(crate) fn function_name(path: &Path) -> String {
    path.segments.last().map(|last| last.ident.unraw().to_string()).unwrap_or_default()
}

/// Where a lookup finds a tool's companion.
pub(crate) enum Lookup {
    /// Items declaring a module `__idem_lookup` whose `FOUND` is the companion, as seen from
    /// where they are expanded: checked by `cargo check` too, since it evaluates item constants.
    Module(TokenStream),
    /// A constant expression of the companion, for a path through `Self` (`Self::send_payment`,
    /// `<Self as Tool>::call`): an item inside a method cannot see the `impl`'s `Self`, so the
    /// caller evaluates it in an inline `const` block, where a failure surfaces when the crate is
    /// built rather than checked.
    Inline(TokenStream),
}

/// Finds the companion of the tool at `qself` and `path`.
///
/// A path of one segment (a function in scope, perhaps imported) falls back to `None` when no
/// companion is in scope, so that the caller can say what to import: a glob import in the
/// initializer's block shadows the module's, so the user's names (`use super::*`, inner) win
/// over the fallback (outer) whenever they hold the companion. A longer path names the
/// companion beside the function directly (a module, or a type's inherent `impl`, where the
/// attribute or `#[idem::tools]` put it); a trait method (`<Adder as Tool>::call`) is looked up
/// on its type. In a module the compiler's error names what is missing; on a type, which may
/// lack its `#[idem::tools]` block, the lookup falls back to `None` (`none_on_every_type`), so
/// that the caller can say to add it.
pub(crate) fn lookup(qself: Option<&QSelf>, path: &Path, krate: &TokenStream) -> Lookup {
    let mixed = Span::mixed_site();
    let last = path.segments.last().expect("a path has a segment");
    let companion = {
        let mut companion = companion_name(&last.ident);
        companion.set_span(mixed.located_at(last.ident.span()));
        companion
    };
    let ty = quote_spanned!(mixed=> ::core::option::Option<#krate::__private::ToolInfo>);
    if let Some(qself) = qself {
        let owner = &qself.ty;
        let fallback = none_on_every_type(&companion, &ty);
        if mentions_self_type(owner.to_token_stream()) {
            return Lookup::Inline(quote!({ #fallback <#owner>::#companion }));
        }
        return Lookup::Module(quote_spanned! {mixed=>
            #[allow(non_snake_case, unused_imports)]
            mod __idem_lookup {
                use super::*;
                #fallback
                pub const FOUND: #ty = <#owner>::#companion;
            }
        });
    }
    if path.segments.first().is_some_and(|first| first.ident == "Self") {
        let owner = path.segments.iter().take(path.segments.len() - 1).map(|s| &s.ident);
        let fallback = none_on_every_type(&companion, &ty);
        return Lookup::Inline(quote!({ #fallback #(#owner::)* #companion }));
    }
    if path.leading_colon.is_none() && path.segments.len() == 1 {
        return Lookup::Module(quote_spanned! {mixed=>
            #[allow(non_snake_case, non_upper_case_globals, unused_imports)]
            mod __idem_lookup {
                use super::*;
                use self::__idem_fallback::*;
                mod __idem_fallback {
                    // For a `crate = "…"` path that names an import of the caller's module.
                    use super::*;
                    pub const #companion: #ty = ::core::option::Option::None;
                }
                pub const FOUND: #ty = {
                    use super::*;
                    #companion
                };
            }
        });
    }
    let mut prefix: Vec<TokenStream> = Vec::new();
    for (index, segment) in path.segments.iter().take(path.segments.len() - 1).enumerate() {
        let ident = &segment.ident;
        // The lookup sits one module below the caller: `self` is its `super`, and a `super`
        // first climbs one more.
        match (index, ident.to_string().as_str()) {
            (0, "self") => prefix.push(quote_spanned!(mixed=> super)),
            (0, "super") => prefix.push(quote_spanned!(mixed=> super::super)),
            _ => prefix.push(quote!(#ident)),
        }
    }
    let leading = path.leading_colon;
    let fallback = none_on_every_type(&companion, &ty);
    Lookup::Module(quote_spanned! {mixed=>
        #[allow(non_snake_case, unused_imports)]
        mod __idem_lookup {
            use super::*;
            #fallback
            pub const FOUND: #ty = #leading #(#prefix::)* #companion;
        }
    })
}

/// Items that give every type a `None` constant named `companion`, which a type's own companion
/// (an inherent associated constant) takes precedence over: a method of a type whose `impl` has
/// no `#[idem::tools]` is then found unclassified, and the caller's check says to add it, rather
/// than the compiler saying that a constant it never heard of does not exist. A module path does
/// not resolve through a trait, so a function missing from its module is still the compiler's
/// error.
fn none_on_every_type(companion: &Ident, ty: &TokenStream) -> TokenStream {
    quote_spanned! {Span::mixed_site()=>
        #[allow(non_upper_case_globals, dead_code)]
        trait __IdemUnclassified {
            const #companion: #ty = ::core::option::Option::None;
        }
        impl<T: ?::core::marker::Sized> __IdemUnclassified for T {}
    }
}

/// Whether `None` from the lookup of `qself` and `path` means a method of a type without its
/// companion: a path longer than one name reaches `None` only through `none_on_every_type`.
pub(crate) fn names_a_method(qself: Option<&QSelf>, path: &Path) -> bool {
    qself.is_some() || path.segments.len() > 1
}

/// The start of the message for a method that `names_a_method` and has no companion: its type's
/// `impl` block lacks `#[idem::tools]`, or the block does not mark it.
pub(crate) fn method_unclassified(name: &str) -> String {
    format!(
        "`{name}` has no idem classification on its type: a method that takes `self` or names \
         `Self` is classified by `#[idem::tools]` on its `impl` block. Put `#[idem::tools]` on \
         the `impl` block that holds `{name}`"
    )
}

/// Where a failed lookup of the tool at `path` is reported: its last segment, the function's or
/// the method's name (`delete_account` in `Bank::delete_account`).
pub(crate) fn method_span(path: &Path) -> Span {
    path.segments.last().map_or_else(|| path.span(), |last| last.ident.span())
}

/// The tokens of a block that evaluates `check` (a `match` on the companion `found` by
/// `lookup`, of type `output`) at compile time and yields its value, located at `span`: a
/// constant item after the lookup's module, or an inline `const` block.
pub(crate) fn evaluate(
    found: Lookup,
    output: TokenStream,
    span: Span,
    check: impl FnOnce(TokenStream) -> TokenStream,
) -> TokenStream {
    let mixed = Span::mixed_site();
    match found {
        Lookup::Module(module) => {
            let check = respan(check(quote_spanned!(mixed=> __idem_lookup::FOUND)), span);
            quote_spanned! {mixed=> {
                #module
                const __IDEM_INFO: #output = #check;
                __IDEM_INFO
            }}
        }
        Lookup::Inline(found) => {
            let check = check(found);
            respan(quote_spanned!(mixed=> const { #check }), span)
        }
    }
}
