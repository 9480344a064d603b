//! The scope of an `#[idempotent]` tool: `scope = "param.field"`, the path to the value that
//! names the unit of work, checked against the parameters.

use proc_macro2::Span;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::{FnArg, Ident, LitStr, Member, Pat};

use super::params::{tidy, Param};
use crate::checked::{Flatten, Scope};

/// The scope `written` names; an `#[idempotent]` tool without one is an error that names
/// `fn_name`.
pub(super) fn scope(
    written: Option<&LitStr>,
    params: &[Param],
    flatten: Option<&Flatten>,
    sig: &syn::Signature,
    fn_name: &str,
    errors: &mut Vec<syn::Error>,
) -> Option<Scope> {
    let Some(written) = written else {
        errors.push(syn::Error::new(
            Span::call_site(),
            format!(
                "`#[idempotent]` needs a `scope`: the unit of work this effect belongs to, such \
                 as `scope = \"order_id\"` or `scope = \"req.order_id\"`; two calls with the same \
                 arguments in the same scope are one effect, so choosing it is a modelling \
                 decision that `{fn_name}` must make"
            ),
        ));
        return None;
    };
    parse_scope(written, params, flatten, sig, errors)
}

fn parse_scope(
    lit: &LitStr,
    params: &[Param],
    flatten: Option<&Flatten>,
    sig: &syn::Signature,
    errors: &mut Vec<syn::Error>,
) -> Option<Scope> {
    let written = lit.value();
    let mut segments = written.split('.').peekable();
    let first = segments.peek().copied().unwrap_or_default();
    let first = first.strip_prefix("r#").unwrap_or(first);
    let param = params.iter().find_map(|p| p.name.filter(|n| n.unraw() == first));
    // The scope's text as a user reads it: unrawed, and without the flattened object's name.
    let mut text = String::new();
    let param = match (param, flatten) {
        (Some(param), _) => {
            segments.next();
            text.push_str(first);
            param.clone()
        }
        // Not a parameter: a field of the argument object, as the client names it.
        (None, Some(flat)) => flat.name.clone(),
        (None, None) => {
            let names: Vec<String> = sig
                .inputs
                .iter()
                .map(|input| match input {
                    FnArg::Receiver(receiver) => receiver.self_token.to_token_stream().to_string(),
                    FnArg::Typed(typed) => pattern_text(&typed.pat),
                })
                .collect();
            let known = match names.as_slice() {
                [] => "the function has no parameters".to_owned(),
                names => format!("the function's parameters are: {}", names.join(", ")),
            };
            let patterned = params.iter().any(|p| p.name.is_none());
            let hint = if patterned {
                "; a pattern's binding such as `req` in `Parameters(req)` can be named once the \
                 parameter is marked `#[idem(flatten)]`, which also lets the scope name a field \
                 of it directly (\"invoice_id\")"
            } else {
                ""
            };
            errors.push(syn::Error::new_spanned(
                lit,
                format!(
                    "`scope = \"{written}\"` names no parameter ({known}); the scope is a parameter, \
                     or a field path into one such as \"req.order_id\"{hint}"
                ),
            ));
            return None;
        }
    };
    let mut fields = Vec::new();
    for segment in segments {
        let Some(member) = field(segment, lit.span()) else {
            errors.push(syn::Error::new_spanned(
                lit,
                format!("`{segment}` in `scope = \"{written}\"` is not a field name"),
            ));
            return None;
        };
        if !text.is_empty() {
            text.push('.');
        }
        match &member {
            Member::Named(ident) => text.push_str(&ident.unraw().to_string()),
            Member::Unnamed(index) => text.push_str(&index.index.to_string()),
        }
        fields.push(member);
    }
    Some(Scope { text, param, fields })
}

/// A parameter's pattern as the user wrote it, spaced the way rustfmt would.
fn pattern_text(pat: &Pat) -> String {
    tidy(pat.to_token_stream())
}

/// A field of a scope path, `r#type` or `type` alike naming the field `r#type`.
pub(super) fn field(segment: &str, span: Span) -> Option<Member> {
    if let Ok(index) = segment.parse::<u32>() {
        return Some(Member::Unnamed(syn::Index { index, span }));
    }
    let plain = segment.strip_prefix("r#").unwrap_or(segment);
    let mut ident = syn::parse_str::<Ident>(plain)
        .or_else(|_| syn::parse_str::<Ident>(&format!("r#{plain}")))
        .ok()?;
    ident.set_span(span);
    Some(Member::Named(ident))
}
