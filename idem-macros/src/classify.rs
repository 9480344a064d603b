//! The compile-time classification: a hidden companion constant beside each tool function,
//! `__idem_tool_<name>: Option<ToolInfo>`, that `retry!` and `tool_info!` read.
//!
//! A constant, not a type named like the function: a module of the function's name (`mod charge;
//! pub use charge::charge;`) takes that name in the type namespace, and an inherent `impl` can
//! hold a constant where it cannot hold a type. `Option`, so that a lookup that finds none can
//! fall back to `None` and say what to import.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, Path};

use crate::args::Attr;
use crate::validate::Tool;

/// The companion's name for a function named `function` (raw or not).
pub(crate) fn companion_name(function: &Ident) -> Ident {
    format_ident!("__idem_tool_{}", function.unraw(), span = Span::mixed_site())
}

/// The companion of a function whose signature does not show it is in an `impl` or a trait.
pub(crate) fn companion(tool: &Tool, item: &ItemFn) -> TokenStream {
    if !tool.companion {
        return TokenStream::new();
    }
    let krate = &tool.krate;
    let vis = &item.vis;
    let companion = companion_name(&item.sig.ident);
    let name = &tool.name;
    let mixed = Span::mixed_site();
    let kind = match (tool.attr, &tool.scope) {
        (Attr::Read, _) => quote_spanned!(mixed=> #krate::__private::Kind::Read),
        (Attr::Idempotent, Some(scope)) => {
            let scope = &scope.text;
            quote_spanned!(mixed=> #krate::__private::Kind::Idempotent { scope: #scope })
        }
        (Attr::Idempotent, None) | (Attr::Write, _) => {
            quote_spanned!(mixed=> #krate::__private::Kind::Write)
        }
    };
    quote_spanned! {mixed=>
        #[doc(hidden)]
        #[allow(non_upper_case_globals, dead_code)]
        #vis const #companion: ::core::option::Option<#krate::__private::ToolInfo> =
            ::core::option::Option::Some(#krate::__private::ToolInfo { name: #name, kind: #kind });
    }
}

/// The function's name as a user reads it (`type` for `r#type`), for messages.
pub(crate) fn function_name(path: &Path) -> String {
    path.segments.last().map(|last| last.ident.unraw().to_string()).unwrap_or_default()
}

/// A module `__idem_lookup` whose `FOUND` is the companion of the function at `path`, as seen
/// from where the module is expanded.
///
/// A path of one segment (a function in scope, perhaps imported) falls back to `None` when no
/// companion is in scope, so that the caller can say what to import: a glob import in the
/// initializer's block shadows the module's, so the user's names (`use super::*`, inner) win
/// over the fallback (outer) whenever they hold the companion. A longer path names the
/// companion beside the function directly (a module or a type's inherent `impl`), where the
/// compiler's error names what is missing.
pub(crate) fn lookup(path: &Path, krate: &TokenStream) -> TokenStream {
    let mixed = Span::mixed_site();
    let last = path.segments.last().expect("a path has a segment");
    let companion = {
        let mut companion = companion_name(&last.ident);
        companion.set_span(mixed.located_at(last.ident.span()));
        companion
    };
    let ty = quote_spanned!(mixed=> ::core::option::Option<#krate::__private::ToolInfo>);
    if let Some(first) = path.segments.first().filter(|first| first.ident == "Self") {
        // The lookup is an item, and an item inside a method cannot see the `impl`'s `Self`.
        let error = syn::Error::new_spanned(
            &first.ident,
            "name the type instead of `Self` here: the classification is looked up from outside \
             the `impl`, where `Self` means nothing",
        )
        .into_compile_error();
        return quote_spanned! {mixed=>
            #error
            mod __idem_lookup {
                pub const FOUND: #ty = ::core::option::Option::Some(#krate::__private::ToolInfo {
                    name: "",
                    kind: #krate::__private::Kind::Read,
                });
            }
        };
    }
    if path.leading_colon.is_none() && path.segments.len() == 1 {
        return quote_spanned! {mixed=>
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
        };
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
    quote_spanned! {mixed=>
        #[allow(non_snake_case, unused_imports)]
        mod __idem_lookup {
            use super::*;
            pub const FOUND: #ty = #leading #(#prefix::)* #companion;
        }
    }
}

/// `tool_info!`'s expansion: `$crate`'s tokens, a comma, then the tool's path (as the facade's
/// `macro_rules!` forwards them). A constant expression.
pub(crate) fn tool_info(input: TokenStream) -> TokenStream {
    let mut tokens = input.into_iter();
    let krate: TokenStream = tokens
        .by_ref()
        .take_while(|token| !matches!(token, TokenTree::Punct(p) if p.as_char() == ','))
        .collect();
    let mut rest: TokenStream = tokens.collect();
    // A `$tool:path` fragment arrives wrapped in an invisible group.
    if let [TokenTree::Group(group)] = rest.clone().into_iter().collect::<Vec<_>>().as_slice() {
        if group.delimiter() == Delimiter::None {
            rest = group.stream();
        }
    }
    let mut path: Path = match syn::parse2(rest) {
        Ok(path) => path,
        Err(error) => return error.into_compile_error(),
    };
    for segment in &mut path.segments {
        segment.arguments = syn::PathArguments::None;
    }
    let name = function_name(&path);
    let companion = companion_name(&path.segments.last().expect("a path").ident);
    let unknown = format!(
        "`{name}` has no idem classification here. If it is marked `#[idem::read]`, \
         `#[idem::idempotent]` or `#[idem::write]` elsewhere, import its hidden companion with \
         it: `use …::{{{name}, {companion}}};` (importing the function alone, as `pub use \
         {name}::{name};` beside a module named `{name}` does, leaves the companion behind). \
         A tool declared inside a function's body cannot be looked up: declare it at module \
         level. Otherwise mark it with one of those attributes; a method taking `self` has no \
         classification of its own"
    );
    let lookup = lookup(&path, &krate);
    let mixed = Span::mixed_site();
    let info = crate::expand::respan(
        quote_spanned! {mixed=>
            const __IDEM_INFO: #krate::__private::ToolInfo = match __idem_lookup::FOUND {
                ::core::option::Option::Some(info) => info,
                ::core::option::Option::None => ::core::panic!("{}", #unknown),
            };
        },
        path.span(),
    );
    quote_spanned! {mixed=> {
        #lookup
        #info
        __IDEM_INFO
    }}
}
