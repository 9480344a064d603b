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
                     `idem::retry!(charge_card(4200, \"cus_1\", \"step-7\").await)` for an async one";

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
        if !matches!(&*call.func, Expr::Path(path) if path.qself.is_none()) {
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
            "{USAGE}; a method has no compile-time classification to check, so retry a free \
             function that calls it"
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
    let check = safety_check(&func.path, &krate);
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
