//! `retry!`: parse a call of a classified tool, check at compile time that the tool is safe to
//! repeat, and hand the call to the runtime's backoff loop.

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Expr, ExprCall, LitStr, Path, Token};

mod kw {
    syn::custom_keyword!(backoff);
    syn::custom_keyword!(when);
}

struct Input {
    call: ExprCall,
    is_async: bool,
    backoff: Option<Expr>,
    when: Option<Expr>,
    krate: Option<LitStr>,
}

const USAGE: &str = "retry! takes a call of a `#[idem::read]` or `#[idem::idempotent]` function \
                     by its path: `idem::retry!(get_balance(\"cus_1\"))`, or \
                     `idem::retry!(charge_card(4200, \"cus_1\", \"step-7\").await)` for an async one, \
                     or `idem::retry!(Bank::send_payment(&bank, req).await)` for a method of an \
                     impl block under `#[idem::tools]`";

impl Parse for Input {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let expr: Expr = input.parse()?;
        let (call, is_async) = match expr {
            Expr::Call(call) => (call, false),
            Expr::Await(awaited) => match *awaited.base {
                Expr::Call(call) => (call, true),
                other => return Err(not_a_call(&other)),
            },
            other => return Err(not_a_call(&other)),
        };
        if !matches!(&*call.func, Expr::Path(_)) {
            return Err(syn::Error::new_spanned(&call.func, USAGE));
        }
        let mut parsed = Input { call, is_async, backoff: None, when: None, krate: None };
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let lookahead = input.lookahead1();
            let (name, span) = if lookahead.peek(kw::backoff) {
                ("backoff", input.parse::<kw::backoff>()?.span)
            } else if lookahead.peek(kw::when) {
                ("when", input.parse::<kw::when>()?.span)
            } else if lookahead.peek(Token![crate]) {
                ("crate", input.parse::<Token![crate]>()?.span)
            } else {
                return Err(lookahead.error());
            };
            input.parse::<Token![=]>()?;
            let repeated = match name {
                "backoff" => parsed.backoff.replace(input.parse()?).is_some(),
                "when" => parsed.when.replace(input.parse()?).is_some(),
                _ => parsed.krate.replace(input.parse()?).is_some(),
            };
            if repeated {
                return Err(syn::Error::new(span, format!("`{name}` is given twice: keep one")));
            }
        }
        Ok(parsed)
    }
}

fn not_a_call(expr: &Expr) -> syn::Error {
    let message = if matches!(expr, Expr::MethodCall(_)) {
        format!(
            "{USAGE}; a method call's receiver has a type the macro cannot see, so name the \
             method by its type: `Bank::send_payment(&bank, …)`"
        )
    } else {
        USAGE.to_owned()
    };
    syn::Error::new_spanned(expr, message)
}

pub(crate) fn expand(input: TokenStream) -> TokenStream {
    match syn::parse2::<Input>(input) {
        Ok(input) => expand_input(input).unwrap_or_else(syn::Error::into_compile_error),
        Err(error) => error.into_compile_error(),
    }
}

fn expand_input(input: Input) -> syn::Result<TokenStream> {
    let krate: Path = match &input.krate {
        Some(lit) => lit.parse()?,
        None => syn::parse_quote!(::idem),
    };
    let Expr::Path(func) = &*input.call.func else { unreachable!("checked while parsing") };
    let check = match crate::tools::method_path(func.qself.as_ref(), &func.path) {
        Some((owner, method)) => method_check(&owner, &method, &krate),
        None => safety_check(&func.path, &krate),
    };
    let backoff = match &input.backoff {
        Some(backoff) => quote!(#backoff),
        None => quote!(#krate::__private::Backoff::default()),
    };
    let when = match &input.when {
        Some(when) => quote!(#when),
        None => quote!(#krate::__private::retry_any),
    };
    let call = &input.call;
    Ok(if input.is_async {
        quote! {{
            #check
            #krate::__private::retry_async(&#backoff, #when, || #call).await
        }}
    } else {
        quote! {{
            #check
            #krate::__private::retry_blocking(&#backoff, #when, || #call)
        }}
    })
}

/// A method's classification is a constant of a marker type that `#[idem::tools]` puts beside
/// its block; only the markers of reads and idempotent tools are `RetrySafeMethod`. A method
/// with no such constant (no `#[idem::tools]` on its block, or no classification) fails to
/// resolve it, which names the method.
fn method_check(owner: &TokenStream, method: &syn::Ident, krate: &Path) -> TokenStream {
    let kind = crate::tools::companion(method, "kind");
    let assert = crate::expand::respan(
        quote!(#krate::__private::retry_safe_method(&<#owner>::#kind)),
        method.span(),
    );
    quote!(#assert;)
}

/// `tool_info!($crate, path)`: a method's constant, or a free function's companion type.
pub(crate) fn tool_info(input: TokenStream) -> TokenStream {
    let parsed = |input: ParseStream| {
        let mut krate = TokenStream::new();
        while !input.peek(Token![,]) {
            krate.extend([input.parse::<proc_macro2::TokenTree>()?]);
        }
        input.parse::<Token![,]>()?;
        let path: syn::ExprPath = input.parse()?;
        Ok((krate, path))
    };
    let (krate, path) =
        match syn::parse::Parser::parse2(parsed, input) {
            Ok(parsed) => parsed,
            Err(error) => return syn::Error::new(
                error.span(),
                "tool_info! takes the path of a classified tool: `idem::tool_info!(get_balance)`, \
                 or `idem::tool_info!(Bank::send_payment)` for a method under `#[idem::tools]`",
            )
            .into_compile_error(),
        };
    match crate::tools::method_path(path.qself.as_ref(), &path.path) {
        Some((owner, method)) => {
            let info = crate::tools::companion(&method, "tool");
            quote!(<#owner>::#info)
        }
        None => {
            let path = &path.path;
            quote!(<#path as #krate::Classified>::INFO)
        }
    }
}

/// A module that imports the tool's companion type under a fixed name, or, when the function
/// has none (it is unclassified), a fallback that is not `RetrySafe`: an explicit import shadows
/// a glob one in the type namespace only, so the fallback is seen exactly when no companion
/// exists. The bound then fails with our message, spanned on the user's path.
fn safety_check(path: &Path, krate: &Path) -> TokenStream {
    let mut import = path.clone();
    for segment in &mut import.segments {
        segment.arguments = syn::PathArguments::None;
    }
    let first = import.segments.first().map(|s| s.ident.to_string()).unwrap_or_default();
    let import = if import.leading_colon.is_some() || first == "crate" {
        quote!(#import)
    } else if first == "self" {
        let rest = import.segments.iter().skip(1);
        quote!(super #(::#rest)*)
    } else if first == "super" {
        quote!(super::#import)
    } else {
        quote!(#import)
    };
    let span = path.span();
    let assert =
        crate::expand::respan(quote!(#krate::__private::retry_safe::<__idem_tool>()), span);
    quote! {
        #[allow(non_snake_case)]
        mod __idem_retry_check {
            #[allow(unused_imports)]
            use super::*;
            #[allow(unused_imports)]
            use self::__idem_fallback::*;
            mod __idem_fallback {
                #[allow(non_camel_case_types, dead_code)]
                pub struct __idem_tool {}
            }
            #[allow(unused_imports)]
            use #import as __idem_tool;
            const _: () = #assert;
        }
    }
}
