//! The approval options: `approve` (every call needs a person's approval) or `approve_if = "…"`
//! (when a condition over the arguments holds), with `approval_ttl` and `approve_wait`, which
//! mean something only with one of them.

use crate::attr::Options;
use crate::checked::Approval;

use super::options;

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
