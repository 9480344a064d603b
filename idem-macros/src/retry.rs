//! `retry!`: parse a call of a classified tool, check at compile time that the tool is safe to
//! repeat, and hand the call to the runtime's backoff loop.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::{Expr, ExprCall, LitStr, Path, Token};

use crate::companion::companion_name;
use crate::lookup::{
    function_name, lookup, method_span, method_unclassified, names_a_method, Lookup,
};
use crate::spans::respan;

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
    let check = safety_check(func.qself.as_ref(), &func.path, &krate);
    let backoff = match &input.backoff {
        Some(backoff) => quote!(#backoff),
        None => quote_spanned!(Span::mixed_site()=> #krate::__private::Backoff::default()),
    };
    let when = match &input.when {
        Some(when) => quote!(#when),
        None => quote_spanned!(Span::mixed_site()=> #krate::__private::retry_any),
    };
    let call = &input.call;
    // The loop is written out here, in the caller's scope, rather than handed to a retry
    // function as a closure: each attempt evaluates the call anew where it stands, so borrows
    // end with the attempt and a call that borrows a context mutably (`&mut ToolContext`) can
    // repeat.
    let (attempt, pause) = if input.is_async {
        (
            quote_spanned!(Span::mixed_site()=> #krate::__private::attempt_async(#call).await),
            quote_spanned!(Span::mixed_site()=> #krate::__private::pause(delay).await),
        )
    } else {
        (
            quote_spanned!(Span::mixed_site()=> #krate::__private::attempt_sync(|| #call)),
            quote_spanned!(Span::mixed_site()=> #krate::__private::pause_blocking(delay)),
        )
    };
    Ok(quote_spanned! {Span::mixed_site()=> {
        #check
        let mut retrying = #krate::__private::Retrying::new(&#backoff, #when);
        loop {
            match #attempt {
                (::core::result::Result::Ok(value), _) => break ::core::result::Result::Ok(value),
                (::core::result::Result::Err(error), final_error) => {
                    match retrying.after(&error, final_error) {
                        ::core::option::Option::Some(delay) => #pause,
                        ::core::option::Option::None => break ::core::result::Result::Err(error),
                    }
                }
            }
        }
    }})
}

/// A compile-time check that the tool at `qself` and `path` is safe to repeat: its companion,
/// found by `lookup::lookup` (a method's from `#[idem::tools]`), says it is a read or an
/// idempotent write. A failure is a constant evaluation that panics with our message, located
/// at the user's path.
fn safety_check(qself: Option<&syn::QSelf>, path: &Path, krate: &Path) -> TokenStream {
    let name = function_name(path);
    let companion = companion_name(&path.segments.last().expect("a path").ident);
    let found = lookup(qself, path, &quote!(#krate));
    let write = format!(
        "`{name}` is a `#[idem::write]`: repeating it repeats its effect, so retry! never \
         repeats it; key it with `#[idem::idempotent(scope = \"…\")]` to make it safe to retry"
    );
    let unknown = if names_a_method(qself, path) {
        format!(
            "{}; retry! repeats the call, so `{name}` must be a read (`#[idem::read]`) or a keyed \
             write (`#[idem::idempotent(scope = \"…\")]`)",
            method_unclassified(&name)
        )
    } else {
        unknown_function(&name, &companion)
    };
    let mixed = Span::mixed_site();
    let check = |found: TokenStream| {
        let check = quote_spanned! {mixed=>
            match #found {
                ::core::option::Option::Some(info) if info.retry_safe() => {}
                ::core::option::Option::Some(_) => ::core::panic!("{}", #write),
                ::core::option::Option::None => ::core::panic!("{}", #unknown),
            }
        };
        respan(check, method_span(path))
    };
    match found {
        Lookup::Module(module) => {
            let check = check(quote_spanned!(mixed=> __idem_lookup::FOUND));
            quote_spanned!(mixed=> #module const _: () = #check;)
        }
        Lookup::Inline(found) => {
            let check = check(found);
            respan(quote_spanned!(mixed=> const { #check };), method_span(path))
        }
    }
}

/// The message for a function that has no companion where it is named.
fn unknown_function(name: &str, companion: &syn::Ident) -> String {
    format!(
        "`{name}` has no idem classification here. If it is a `#[idem::read]` or \
         `#[idem::idempotent]` tool imported from elsewhere, import its hidden companion with it: \
         `use …::{{{name}, {companion}}};` (importing the function alone, as `pub use \
         {name}::{name};` beside a module named `{name}` does, leaves the companion behind). \
         A tool declared inside a function's body cannot be looked up: declare it at module \
         level. Otherwise classify it: retry! repeats the call, so it takes only a read \
         (`#[idem::read]`) or a keyed write (`#[idem::idempotent(scope = \"…\")]`), never a \
         `#[idem::write]` or an unclassified function"
    )
}
