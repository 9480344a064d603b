//! The parameters that enter an `#[idempotent]` tool's key: each one that is not skipped,
//! flattened or the whole scope, with the `#[cfg]`s that may compile it out.

use quote::ToTokens;
use syn::ext::IdentExt;
use syn::Attribute;

use super::params::Param;
use crate::checked::{Flatten, KeyParam, Scope};

/// The key parameters of `params`, given the tool's scope and flattened parameter.
pub(super) fn key_params(
    params: &[Param],
    scope: Option<&Scope>,
    flatten: Option<&Flatten>,
    errors: &mut Vec<syn::Error>,
) -> Vec<KeyParam> {
    let mut key_params = Vec::new();
    for param in params {
        let Param { name, typed, options } = param;
        let is_scope = scope.is_some_and(|s| Some(&s.param) == *name);
        let whole_scope = is_scope && scope.is_some_and(|s| s.fields.is_empty());
        let cfgs = conditions(&typed.attrs);
        if let (true, Some(cfg)) = (is_scope, cfgs.first()) {
            errors.push(syn::Error::new_spanned(
                cfg,
                "the scope parameter cannot be conditional: without it there is no key; drop \
                 the `#[cfg]` or choose a scope that is always there",
            ));
        }
        match (options.skip, is_scope) {
            (Some(span), true) => errors.push(syn::Error::new(
                span,
                "the scope parameter cannot be skipped: the key is built from it; drop \
                 `#[idem(skip)]` or choose another scope",
            )),
            (Some(_), false) => {}
            (None, _) if whole_scope => {}
            (None, _) if options.flatten.is_some() => {}
            (None, _) => match (name, flatten) {
                (_, Some(flat)) => errors.push(syn::Error::new_spanned(
                    &typed.pat,
                    format!(
                        "`{}` would enter the key beside `{}`, whose fields are the whole \
                         argument object (`#[idem(flatten)]`): mark it `#[idem(skip)]`, or \
                         make it the scope",
                        typed.pat.to_token_stream(),
                        flat.name
                    ),
                )),
                (Some(name), None) => key_params.push(KeyParam {
                    name: (*name).clone(),
                    label: name.unraw().to_string(),
                    ty: (*typed.ty).clone(),
                    cfgs,
                }),
                (None, None) => errors.push(syn::Error::new_spanned(
                    &typed.pat,
                    "a key parameter needs a plain name, which the key uses: bind it to a \
                     name; if it is the tool's whole argument object (rmcp's \
                     `Parameters(req)`), mark it `#[idem(flatten)]` so that its fields are \
                     the arguments; or mark it `#[idem(skip)]` if it is not part of the intent",
                )),
            },
        }
    }
    key_params
}

/// The attributes that may compile a parameter out: each `#[cfg(…)]`, and each
/// `#[cfg_attr(pred, …)]` cut down to the `cfg(…)` it applies (its other attributes belong to
/// the parameter, not to a use of it).
fn conditions(attrs: &[Attribute]) -> Vec<Attribute> {
    let mut conditions = Vec::new();
    for attr in attrs {
        if attr.path().is_ident("cfg") {
            conditions.push(attr.clone());
        } else if attr.path().is_ident("cfg_attr") {
            let parsed = attr.parse_args_with(
                syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
            );
            let Ok(parsed) = parsed else { continue };
            let mut parts = parsed.into_iter();
            let Some(predicate) = parts.next() else { continue };
            let cfgs: Vec<syn::Meta> = parts.filter(|meta| meta.path().is_ident("cfg")).collect();
            if !cfgs.is_empty() {
                conditions.push(syn::parse_quote!(#[cfg_attr(#predicate, #(#cfgs),*)]));
            }
        }
    }
    conditions
}
