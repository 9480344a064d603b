//! The approval options: `approve` (every call needs a person's approval) or `approve_if = "…"`
//! (when a condition over the arguments holds), with `approval_ttl` and `approve_wait`, which
//! mean something only with one of them; and that an approval covers everything the body
//! receives.

use proc_macro2::TokenStream;
use quote::ToTokens;

use crate::attr::Options;
use crate::checked::{Approval, Scope};

use super::options;
use super::params::{tidy, Param};

/// What the approval options ask, if any, checked.
pub(super) fn approval(options: &Options, errors: &mut Vec<syn::Error>) -> Option<Approval> {
    let ttl = options.approval_ttl.as_ref();
    let wait = options.approve_wait.as_ref();
    let (condition, span) = match (options.approve, &options.approve_if) {
        (Some(_), Some(approve_if)) => {
            errors.push(syn::Error::new(
                approve_if.key,
                "`approve` already asks a person for every call: keep `approve` alone, or \
                 `approve_if = \"…\"` alone to ask only when its condition holds",
            ));
            return None;
        }
        (Some(span), None) => (None, span),
        (None, Some(approve_if)) => (condition(&approve_if.value, errors), approve_if.value.span()),
        (None, None) => {
            for (name, option) in [("approval_ttl", ttl), ("approve_wait", wait)] {
                if let Some(option) = option {
                    errors.push(syn::Error::new(
                        option.key,
                        format!(
                            "`{name}` has no meaning without `approve` or `approve_if = \"…\"`: \
                             add one of them, or drop `{name}`"
                        ),
                    ));
                }
            }
            return None;
        }
    };
    Some(Approval {
        condition,
        span,
        ttl: ttl.and_then(|o| options::duration(&o.value, errors)),
        wait: wait.and_then(|o| options::duration(&o.value, errors)),
    })
}

/// Refuses an approval that would not cover everything the body receives. A person approves
/// the key, which stands for the keyed arguments only: an input left out of it by `ignore` or
/// `#[idem(skip)]` could differ between the call a person approved and the one that runs under
/// that approval (another model turn, a concurrent call with the same key). One error per such
/// input, on its tokens.
pub(super) fn covers_every_input(
    options: &Options,
    params: &[Param],
    scope: Option<&Scope>,
    errors: &mut Vec<syn::Error>,
) {
    let option = match (options.approve, &options.approve_if) {
        (Some(_), _) => "approve",
        (None, Some(_)) => "approve_if",
        (None, None) => return,
    };
    for lit in options.ignore.iter().flat_map(|ignore| &ignore.value.fields) {
        let name = lit.value();
        errors.push(syn::Error::new_spanned(
            lit,
            format!(
                "an approval must cover everything the body receives, and `ignore` leaves \
                 `{name}` out of the key: a person would approve one `{name}` \
                 and another could run under that approval; key it (remove it from `ignore`), \
                 or drop `{option}`"
            ),
        ));
    }
    let scope = scope.map(|scope| &scope.param);
    for param in params {
        // A skipped scope is keyed all the same, and refused as skipped on its own.
        if param.options.skip.is_none() || (param.name.is_some() && param.name == scope) {
            continue;
        }
        let name = tidy(param.typed.pat.to_token_stream());
        let mut tokens = TokenStream::new();
        param.typed.pat.to_tokens(&mut tokens);
        param.typed.ty.to_tokens(&mut tokens);
        errors.push(syn::Error::new_spanned(
            tokens,
            format!(
                "an approval must cover everything the body receives, and `#[idem(skip)]` \
                 leaves `{name}` out of the key: a person would approve one \
                 `{name}` and another could run under that approval; key it (drop \
                 `#[idem(skip)]`), take it from `self` or a static instead of a parameter, or \
                 drop `{option}`"
            ),
        ));
    }
}

/// The condition of `approve_if = "…"`: a Rust expression over the tool's parameters, whose
/// tokens keep the literal's span so that its names resolve to the parameters.
fn condition(lit: &syn::LitStr, errors: &mut Vec<syn::Error>) -> Option<syn::Expr> {
    match lit.parse::<syn::Expr>() {
        Ok(expr) => Some(expr),
        Err(e) => {
            errors.push(syn::Error::new_spanned(
                lit,
                format!(
                    "`approve_if` must be a Rust expression over the tool's arguments that is \
                     true when a person must approve the call, such as \"amount > 10_000\": {e}"
                ),
            ));
            None
        }
    }
}
