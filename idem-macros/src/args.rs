//! Parsing the attribute's options into a view that keeps the user's tokens for error spans.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{LitStr, Path, Token};

mod kw {
    syn::custom_keyword!(scope);
    syn::custom_keyword!(tool);
    syn::custom_keyword!(store);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(in_doubt);
}

/// Which attribute is being expanded.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attr {
    Read,
    Idempotent,
    Write,
}

impl Attr {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Attr::Read => "read",
            Attr::Idempotent => "idempotent",
            Attr::Write => "write",
        }
    }
}

/// One option as written: its keyword's span and its value.
pub(crate) struct Opt<T> {
    pub(crate) key: Span,
    pub(crate) value: T,
}

/// The options of one attribute, as written. Meaning is checked in `validate`.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) scope: Option<Opt<LitStr>>,
    pub(crate) tool: Option<Opt<LitStr>>,
    pub(crate) store: Option<Opt<Path>>,
    pub(crate) wait: Option<Opt<LitStr>>,
    pub(crate) ttl: Option<Opt<LitStr>>,
    pub(crate) in_doubt: Option<Opt<LitStr>>,
    pub(crate) krate: Option<Opt<LitStr>>,
    /// Repeated options, reported with the rest once parsing is done.
    pub(crate) repeated: Option<syn::Error>,
}

/// Parses `keyword = value` into `slot`, noting a repeat in `repeated` rather than failing, so
/// that every repeated option is reported together.
fn parse_option<K: Parse + Spanned, T: Parse>(
    input: ParseStream,
    name: &str,
    slot: &mut Option<Opt<T>>,
    repeated: &mut Option<syn::Error>,
) -> syn::Result<()> {
    let key = input.parse::<K>()?.span();
    input.parse::<Token![=]>()?;
    let value = input.parse()?;
    if slot.is_some() {
        let error = syn::Error::new(key, format!("`{name}` is given twice: keep one"));
        match repeated {
            Some(errors) => errors.combine(error),
            None => *repeated = Some(error),
        }
    } else {
        *slot = Some(Opt { key, value });
    }
    Ok(())
}

impl Parse for Options {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut o = Options::default();
        let r = &mut o.repeated;
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            if lookahead.peek(kw::scope) {
                parse_option::<kw::scope, _>(input, "scope", &mut o.scope, r)?;
            } else if lookahead.peek(kw::tool) {
                parse_option::<kw::tool, _>(input, "tool", &mut o.tool, r)?;
            } else if lookahead.peek(kw::store) {
                parse_option::<kw::store, _>(input, "store", &mut o.store, r)?;
            } else if lookahead.peek(kw::wait) {
                parse_option::<kw::wait, _>(input, "wait", &mut o.wait, r)?;
            } else if lookahead.peek(kw::ttl) {
                parse_option::<kw::ttl, _>(input, "ttl", &mut o.ttl, r)?;
            } else if lookahead.peek(kw::in_doubt) {
                parse_option::<kw::in_doubt, _>(input, "in_doubt", &mut o.in_doubt, r)?;
            } else if lookahead.peek(Token![crate]) {
                parse_option::<Token![crate], _>(input, "crate", &mut o.krate, r)?;
            } else {
                return Err(lookahead.error());
            }
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(o)
    }
}

mod param_kw {
    syn::custom_keyword!(skip);
}

/// Removes the `#[idem(…)]` helper attributes from the parameters (the compiler knows no such
/// attribute) and returns, per parameter, the span of its `skip` if it had one.
pub(crate) fn take_param_options(
    item: &mut syn::ItemFn,
    errors: &mut Vec<syn::Error>,
) -> Vec<Option<Span>> {
    item.sig
        .inputs
        .iter_mut()
        .map(|input| {
            let attrs = match input {
                syn::FnArg::Receiver(receiver) => &mut receiver.attrs,
                syn::FnArg::Typed(typed) => &mut typed.attrs,
            };
            let mut skip = None;
            attrs.retain(|attr| {
                if !attr.path().is_ident("idem") {
                    return true;
                }
                match attr.parse_args_with(|input: ParseStream| input.parse::<param_kw::skip>()) {
                    Ok(keyword) => skip = Some(keyword.span),
                    Err(_) => errors.push(syn::Error::new_spanned(
                        attr,
                        "unknown parameter option: the only one is `#[idem(skip)]`, which leaves \
                         the parameter out of the key",
                    )),
                }
                false
            });
            if let (syn::FnArg::Receiver(receiver), Some(span)) = (&*input, skip) {
                errors.push(syn::Error::new(
                    span,
                    format!(
                        "`{}` is never part of the key: drop `#[idem(skip)]`",
                        quote::quote!(#receiver)
                    ),
                ));
                skip = None;
            }
            skip
        })
        .collect()
}
