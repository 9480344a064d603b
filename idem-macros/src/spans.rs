//! Locating generated tokens on the user's, so that the compiler's errors about them point where
//! the user can act.

use proc_macro2::{Span, TokenStream, TokenTree};

/// `tokens` located at `span`, so that a failed bound on a generated call points at the user's
/// tokens (a path whose tokens mix spans is reported at the attribute), while still resolving
/// at the mixed site like the rest of the expansion.
pub(crate) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            let located = token.span().located_at(span);
            if let TokenTree::Group(group) = &token {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(located);
                token = TokenTree::Group(inner);
            }
            token.set_span(located);
            token
        })
        .collect()
}
