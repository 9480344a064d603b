//! `tool_info!`: the classification of a tool, read from its companion at compile time.

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::quote_spanned;
use syn::ExprPath;

use crate::companion::companion_name;
use crate::lookup::{
    evaluate, function_name, lookup, method_span, method_unclassified, names_a_method,
};

/// `tool_info!`'s expansion: `$crate`'s tokens, a comma, then the tool's path (as the facade's
/// `macro_rules!` forwards them). A constant expression.
pub(crate) fn expand(input: TokenStream) -> TokenStream {
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
    let parsed: ExprPath =
        match syn::parse2(rest) {
            Ok(path) => path,
            Err(error) => return syn::Error::new(
                error.span(),
                "tool_info! takes the path of a classified tool: `idem::tool_info!(get_balance)`, \
                 or `idem::tool_info!(Bank::send_payment)` for a method under `#[idem::tools]`",
            )
            .into_compile_error(),
        };
    let mut path = parsed.path;
    for segment in &mut path.segments {
        segment.arguments = syn::PathArguments::None;
    }
    let name = function_name(&path);
    let companion = companion_name(&path.segments.last().expect("a path").ident);
    let unknown = if names_a_method(parsed.qself.as_ref(), &path) {
        format!(
            "{}, and mark `{name}` `#[idem::read]`, `#[idem::idempotent]` or `#[idem::write]` if \
             it is not",
            method_unclassified(&name)
        )
    } else {
        unknown_function(&name, &companion)
    };
    let found = lookup(parsed.qself.as_ref(), &path, &krate);
    let mixed = Span::mixed_site();
    evaluate(
        found,
        quote_spanned!(mixed=> #krate::__private::ToolInfo),
        method_span(&path),
        |found| {
            quote_spanned! {mixed=>
                match #found {
                    ::core::option::Option::Some(info) => info,
                    ::core::option::Option::None => ::core::panic!("{}", #unknown),
                }
            }
        },
    )
}

/// The message for a function that has no companion where it is named.
fn unknown_function(name: &str, companion: &syn::Ident) -> String {
    format!(
        "`{name}` has no idem classification here. If it is marked `#[idem::read]`, \
         `#[idem::idempotent]` or `#[idem::write]` elsewhere, import its hidden companion with \
         it: `use …::{{{name}, {companion}}};` (importing the function alone, as `pub use \
         {name}::{name};` beside a module named `{name}` does, leaves the companion behind). \
         A tool declared inside a function's body cannot be looked up: declare it at module \
         level. Otherwise mark it with one of those attributes; a method taking `self` is \
         classified by `#[idem::tools]` on its `impl` block"
    )
}
