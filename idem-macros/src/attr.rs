//! The attributes as written: which of ours an attribute is, its options, and the parameters'
//! `#[idem(…)]` options, parsed into views that keep the user's tokens for error spans.

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
    syn::custom_keyword!(reconcile);
    syn::custom_keyword!(destructive);
    syn::custom_keyword!(ignore);
    syn::custom_keyword!(approve);
    syn::custom_keyword!(approve_if);
    syn::custom_keyword!(approval_ttl);
    syn::custom_keyword!(approve_wait);
    syn::custom_keyword!(transactional);
    syn::custom_keyword!(__idem_in_tools);
    syn::custom_keyword!(__idem_transaction);
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

    /// The attribute `path` names, if it is one of ours (`read`, `idem::write`, …).
    pub(crate) fn named_by(path: &Path) -> Option<Attr> {
        let ours = path.segments.len() == 1
            || (path.segments.len() == 2 && path.segments[0].ident == "idem");
        if !ours {
            return None;
        }
        match path.segments.last()?.ident.to_string().as_str() {
            "read" => Some(Attr::Read),
            "idempotent" => Some(Attr::Idempotent),
            "write" => Some(Attr::Write),
            _ => None,
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
    pub(crate) reconcile: Option<Opt<LitStr>>,
    pub(crate) krate: Option<Opt<LitStr>>,
    /// `destructive = false`: the write only adds; any expression, so that a value that is not
    /// `true` or `false` is reported by validation with the fix.
    pub(crate) destructive: Option<Opt<syn::Expr>>,
    /// `ignore = ["body", …]`: fields of the flattened argument object left out of the key.
    pub(crate) ignore: Option<Opt<Ignore>>,
    /// `approve`, bare: every call needs a person's approval.
    pub(crate) approve: Option<Span>,
    /// `approve_if = "amount > 10_000"`: a call needs approval when the expression, over the
    /// tool's arguments, is true.
    pub(crate) approve_if: Option<Opt<LitStr>>,
    /// `approval_ttl = "1h"`: how long an approval stays good for a call to use.
    pub(crate) approval_ttl: Option<Opt<LitStr>>,
    /// `approve_wait = "5m"`: how long a call waits for the decision.
    pub(crate) approve_wait: Option<Opt<LitStr>>,
    /// `transactional = "tx"`: the body's effects are all writes through the transaction the
    /// parameter `tx` receives, which commits with the call's record.
    pub(crate) transactional: Option<Opt<LitStr>>,
    /// Written by `#[idem::tools]`, never by a user: the block the method sits in.
    pub(crate) in_tools: Option<Opt<InTools>>,
    /// Written by `#[idem::tools]`, never by a user: the transaction parameter it took out of
    /// the method's signature (so that a framework's macro does not see it).
    pub(crate) transaction: Option<Opt<TxParam>>,
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

/// Notes a bare `keyword` in `slot`, or its repeat in `repeated`.
fn flag(key: Span, name: &str, slot: &mut Option<Span>, repeated: &mut Option<syn::Error>) {
    if slot.is_some() {
        let error = syn::Error::new(key, format!("`{name}` is given twice: keep one"));
        match repeated {
            Some(errors) => errors.combine(error),
            None => *repeated = Some(error),
        }
    } else {
        *slot = Some(key);
    }
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
            } else if lookahead.peek(kw::reconcile) {
                parse_option::<kw::reconcile, _>(input, "reconcile", &mut o.reconcile, r)?;
            } else if lookahead.peek(kw::destructive) {
                parse_option::<kw::destructive, _>(input, "destructive", &mut o.destructive, r)?;
            } else if lookahead.peek(kw::approve) {
                let key = input.parse::<kw::approve>()?.span();
                if input.peek(Token![=]) {
                    return Err(syn::Error::new(
                        key,
                        "`approve` takes no value: write `approve` for every call, or \
                         `approve_if = \"…\"` with a condition over the arguments",
                    ));
                }
                flag(key, "approve", &mut o.approve, r);
            } else if lookahead.peek(kw::approve_if) {
                parse_option::<kw::approve_if, _>(input, "approve_if", &mut o.approve_if, r)?;
            } else if lookahead.peek(kw::approval_ttl) {
                parse_option::<kw::approval_ttl, _>(input, "approval_ttl", &mut o.approval_ttl, r)?;
            } else if lookahead.peek(kw::approve_wait) {
                parse_option::<kw::approve_wait, _>(input, "approve_wait", &mut o.approve_wait, r)?;
            } else if lookahead.peek(kw::ignore) {
                parse_option::<kw::ignore, _>(input, "ignore", &mut o.ignore, r)?;
            } else if lookahead.peek(kw::transactional) {
                parse_option::<kw::transactional, _>(
                    input,
                    "transactional",
                    &mut o.transactional,
                    r,
                )?;
            } else if input.peek(kw::__idem_transaction) {
                parse_option::<kw::__idem_transaction, _>(
                    input,
                    "transaction",
                    &mut o.transaction,
                    r,
                )?;
            } else if input.peek(kw::__idem_in_tools) {
                parse_option::<kw::__idem_in_tools, _>(input, "in_tools", &mut o.in_tools, r)?;
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

/// The field names of `ignore = ["body", "cc"]`, as written.
pub(crate) struct Ignore {
    pub(crate) fields: Vec<LitStr>,
}

impl Parse for Ignore {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let content;
        syn::bracketed!(content in input);
        let fields = content.parse_terminated(<LitStr as Parse>::parse, Token![,])?;
        Ok(Ignore { fields: fields.into_iter().collect() })
    }
}

/// What `#[idem::tools]` tells the attribute of each method it classifies, as the hidden option
/// `__idem_in_tools = ("Type::method", name)`: the path its records name after the module's, and
/// the name a framework gives the tool (an expression of type `&'static str`, such as
/// `<Self as Tool>::NAME`), or `_` where no framework names it.
pub(crate) struct InTools {
    pub(crate) function: LitStr,
    pub(crate) name: Option<syn::Expr>,
}

impl Parse for InTools {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let content;
        syn::parenthesized!(content in input);
        let function = content.parse()?;
        content.parse::<Token![,]>()?;
        let name = if content.peek(Token![_]) {
            content.parse::<Token![_]>()?;
            None
        } else {
            Some(content.parse()?)
        };
        Ok(InTools { function, name })
    }
}

/// A transaction parameter, as `#[idem::tools]` hands it on: `(tx: &rusqlite::Transaction<'_>)`.
pub(crate) struct TxParam {
    pub(crate) name: syn::Ident,
    pub(crate) ty: syn::Type,
    /// Where it was in the signature it was taken from (`None`: handed on by `#[idem::tools]`).
    pub(crate) at: Option<usize>,
}

impl Parse for TxParam {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let content;
        syn::parenthesized!(content in input);
        let name = content.parse()?;
        content.parse::<Token![:]>()?;
        let ty = content.parse()?;
        Ok(TxParam { name, ty, at: None })
    }
}

impl TxParam {
    /// Takes the parameter named `name` out of `sig`, if it has one bound to a plain name.
    pub(crate) fn take_from(sig: &mut syn::Signature, name: &str) -> Option<TxParam> {
        let at = sig.inputs.iter().position(|input| match input {
            syn::FnArg::Typed(typed) => {
                matches!(&*typed.pat, syn::Pat::Ident(ident) if ident.ident == name)
            }
            syn::FnArg::Receiver(_) => false,
        })?;
        let inputs = std::mem::take(&mut sig.inputs);
        let mut taken = None;
        for (i, input) in inputs.into_iter().enumerate() {
            match input {
                syn::FnArg::Typed(typed) if i == at => {
                    if let syn::Pat::Ident(ident) = *typed.pat {
                        taken = Some(TxParam { name: ident.ident, ty: *typed.ty, at: Some(at) });
                    }
                }
                other => sig.inputs.push(other),
            }
        }
        taken
    }
}

mod param_kw {
    syn::custom_keyword!(skip);
    syn::custom_keyword!(flatten);
}

/// The `#[idem(…)]` options of one parameter, by the span of each keyword given.
#[derive(Clone, Copy, Default)]
pub(crate) struct ParamOptions {
    /// `skip`: the parameter is not part of the key.
    pub(crate) skip: Option<Span>,
    /// `flatten`: the parameter is the tool's whole argument object.
    pub(crate) flatten: Option<Span>,
}

/// Removes the `#[idem(…)]` helper attributes from the parameters (the compiler knows no such
/// attribute) and returns each parameter's options.
pub(crate) fn take_param_options(
    item: &mut syn::ItemFn,
    errors: &mut Vec<syn::Error>,
) -> Vec<ParamOptions> {
    item.sig
        .inputs
        .iter_mut()
        .map(|input| {
            let attrs = match input {
                syn::FnArg::Receiver(receiver) => &mut receiver.attrs,
                syn::FnArg::Typed(typed) => &mut typed.attrs,
            };
            let mut options = ParamOptions::default();
            attrs.retain(|attr| {
                if !attr.path().is_ident("idem") {
                    return true;
                }
                let parsed = attr.parse_args_with(|input: ParseStream| {
                    let lookahead = input.lookahead1();
                    if lookahead.peek(param_kw::skip) {
                        Ok((true, input.parse::<param_kw::skip>()?.span))
                    } else if lookahead.peek(param_kw::flatten) {
                        Ok((false, input.parse::<param_kw::flatten>()?.span))
                    } else {
                        Err(lookahead.error())
                    }
                });
                match parsed {
                    Ok((true, span)) => options.skip = Some(span),
                    Ok((false, span)) => options.flatten = Some(span),
                    Err(_) => errors.push(syn::Error::new_spanned(
                        attr,
                        "unknown parameter option: write `#[idem(skip)]`, which leaves the \
                         parameter out of the key, or `#[idem(flatten)]`, which makes the \
                         parameter's fields the key's arguments",
                    )),
                }
                false
            });
            if let syn::FnArg::Receiver(receiver) = &*input {
                let given = [("skip", options.skip.take()), ("flatten", options.flatten.take())];
                for (name, span) in given {
                    if let Some(span) = span {
                        errors.push(syn::Error::new(
                            span,
                            format!(
                                "`{}` is never part of the key: drop `#[idem({name})]`",
                                quote::quote!(#receiver)
                            ),
                        ));
                    }
                }
            }
            if let (Some(_), Some(flatten)) = (options.skip, options.flatten) {
                errors.push(syn::Error::new(
                    flatten,
                    "a parameter is either skipped or flattened into the key, not both: keep one",
                ));
                options.flatten = None;
            }
            options
        })
        .collect()
}
