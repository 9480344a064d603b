//! The checks that make misuse a compile error, all in one pass, each spanned on the user's
//! tokens. The result is a view of the tool that `expand` turns into code.

use std::time::Duration;

use proc_macro2::Span;
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::{Attribute, FnArg, Ident, ItemFn, LitStr, Member, Path, Type};

use crate::args::{Attr, Options, ParamOptions};
use crate::output::{self, Shape};

mod params;
mod reconcile;

use params::{flatten_param, parse_scope, plain_name, wrapped_name, Param};
pub(crate) use reconcile::{reconciler, Reconciler};

/// The value a `scope = "param.field"` names.
pub(crate) struct Scope {
    /// The path as data (in `Kind::Idempotent` and messages), raw identifiers written plain.
    pub(crate) text: String,
    pub(crate) param: Ident,
    pub(crate) fields: Vec<Member>,
}

/// A parameter that enters the key.
pub(crate) struct KeyParam {
    pub(crate) name: Ident,
    /// Its name in the key: `type` for `r#type`, as a Python service spells it.
    pub(crate) label: String,
    pub(crate) ty: Type,
    /// Its `#[cfg]` attributes, carried onto its use so that a parameter compiled out leaves
    /// the key with it.
    pub(crate) cfgs: Vec<Attribute>,
}

/// The parameter marked `#[idem(flatten)]`: the tool's whole argument object.
pub(crate) struct Flatten {
    /// The name bound to the object: the parameter's, or the one inside its pattern
    /// (`req` in `Parameters(req)`).
    pub(crate) name: Ident,
    /// The parameter's type, for spans.
    pub(crate) ty: Type,
}

/// A validated tool, ready to expand.
pub(crate) struct Tool {
    pub(crate) attr: Attr,
    pub(crate) name: String,
    /// Whether `tool = "…"` pinned the name: then the user chose it, and records are not tied
    /// to the function's path (which a move to another module changes).
    pub(crate) pinned: bool,
    pub(crate) krate: Path,
    pub(crate) scope: Option<Scope>,
    pub(crate) key_params: Vec<KeyParam>,
    /// The parameter whose fields are the key's arguments, if one is marked so; then it is the
    /// only one in the key.
    pub(crate) flatten: Option<Flatten>,
    pub(crate) store: Option<Path>,
    pub(crate) wait: Option<Duration>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) rerun: bool,
    /// The function named by `reconcile = "…"`, if any.
    pub(crate) reconcile: Option<Reconciler>,
    pub(crate) shape: Shape,
    /// The `Result<T, E>` the body produces.
    pub(crate) output: Option<Type>,
    /// Whether the companion constant is emitted beside the function (see `classify`).
    pub(crate) companion: bool,
}

/// Checks `item` under `attr` with `options`; `param_options` holds each parameter's
/// `#[idem(…)]`.
/// Every problem found is pushed to `errors`.
pub(crate) fn tool(
    attr: Attr,
    options: Options,
    item: &ItemFn,
    param_options: &[ParamOptions],
    errors: &mut Vec<syn::Error>,
) -> Tool {
    let sig = &item.sig;
    let fn_name = sig.ident.unraw().to_string();
    let attr_name = attr.name();

    if let Some(repeated) = options.repeated {
        errors.push(repeated);
    }
    for other in &item.attrs {
        if is_classification(other.path()) {
            errors.push(syn::Error::new_spanned(
                other,
                format!(
                    "`{fn_name}` is already classified `#[{attr_name}]`: a tool has one \
                     classification, so keep either this attribute or that one"
                ),
            ));
        }
    }

    if let (true, Some(reconcile)) = (attr != Attr::Idempotent, &options.reconcile) {
        errors.push(syn::Error::new(
            reconcile.key,
            format!(
                "`reconcile` has no meaning on `#[{attr_name}]`: a reconciler settles a key left \
                 in doubt, and only an `#[idempotent(scope = \"…\")]` tool has a key; drop it, \
                 or make the tool `#[idempotent]`"
            ),
        ));
    }
    if attr != Attr::Idempotent {
        let keyed = [
            ("scope", options.scope.as_ref().map(|o| o.key)),
            ("store", options.store.as_ref().map(|o| o.key)),
            ("wait", options.wait.as_ref().map(|o| o.key)),
            ("ttl", options.ttl.as_ref().map(|o| o.key)),
            ("in_doubt", options.in_doubt.as_ref().map(|o| o.key)),
        ];
        for (option, span) in keyed {
            if let Some(span) = span {
                errors.push(syn::Error::new(
                    span,
                    format!(
                        "`{option}` has no meaning on `#[{attr_name}]`, which runs the body as it is \
                         with no key; for a keyed write use `#[idempotent(scope = \"…\")]`"
                    ),
                ));
            }
        }
        for options in param_options {
            for (name, span) in [("skip", options.skip), ("flatten", options.flatten)] {
                if let Some(span) = span {
                    errors.push(syn::Error::new(
                        span,
                        format!(
                            "`#[idem({name})]` has no meaning on `#[{attr_name}]`, which has no \
                             key: drop it"
                        ),
                    ));
                }
            }
        }
    }

    if attr == Attr::Idempotent {
        if let Some(constness) = &sig.constness {
            errors.push(syn::Error::new_spanned(
                constness,
                "`#[idempotent]` cannot go on a `const fn`: its body runs at most once per key, at \
                 run time, through a store; remove `const`",
            ));
        }
        if let Some(abi) = &sig.abi {
            errors.push(syn::Error::new_spanned(
                abi,
                "`#[idempotent]` cannot go on an `extern` fn: foreign callers bypass the key; wrap \
                 a plain Rust fn and call it from the `extern` one",
            ));
        }
        if let Some(variadic) = &sig.variadic {
            errors.push(syn::Error::new_spanned(
                variadic,
                "`#[idempotent]` cannot go on a variadic fn: variadic arguments cannot enter the key",
            ));
        }
    }

    let name = match &options.tool {
        Some(tool) if tool.value.value().is_empty() => {
            errors.push(syn::Error::new_spanned(
                &tool.value,
                "`tool` is empty: give the tool a name",
            ));
            fn_name.clone()
        }
        Some(tool) => tool.value.value(),
        None => fn_name.clone(),
    };
    let krate = match &options.krate {
        Some(krate) => krate.value.parse::<Path>().unwrap_or_else(|_| {
            errors.push(syn::Error::new_spanned(
                &krate.value,
                "`crate` must be a path to the idem facade, such as \"::idem\" or \"my_idem\"",
            ));
            syn::parse_quote!(::idem)
        }),
        None => syn::parse_quote!(::idem),
    };

    let (shape, output) = output::shape_and_output(item);
    if attr == Attr::Idempotent {
        check_output(item, shape, output.as_ref(), &fn_name, errors);
    }

    let params: Vec<Param> = sig
        .inputs
        .iter()
        .zip(param_options)
        .filter_map(|(input, options)| match input {
            FnArg::Receiver(_) => None,
            FnArg::Typed(typed) => {
                // A flattened parameter may be a one-field wrapper pattern: its binding is the
                // argument object.
                let name = plain_name(&typed.pat)
                    .or_else(|| options.flatten.and_then(|_| wrapped_name(&typed.pat)));
                Some(Param { name, typed, options: *options })
            }
        })
        .collect();
    let flatten = if attr == Attr::Idempotent { flatten_param(&params, errors) } else { None };

    let scope = match (&options.scope, attr) {
        (None, Attr::Idempotent) => {
            errors.push(syn::Error::new(
                Span::call_site(),
                format!(
                    "`#[idempotent]` needs a `scope`: the unit of work this effect belongs to, such \
                     as `scope = \"order_id\"` or `scope = \"req.order_id\"`; two calls with the same \
                     arguments in the same scope are one effect, so choosing it is a modelling \
                     decision that `{fn_name}` must make"
                ),
            ));
            None
        }
        (Some(scope), Attr::Idempotent) => {
            parse_scope(&scope.value, &params, flatten.as_ref(), sig, errors)
        }
        _ => None,
    };

    let mut key_params = Vec::new();
    if attr == Attr::Idempotent {
        for param in &params {
            let Param { name, typed, options } = param;
            let is_scope = scope.as_ref().is_some_and(|s| Some(&s.param) == *name);
            let whole_scope = is_scope && scope.as_ref().is_some_and(|s| s.fields.is_empty());
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
                (None, _) => match (name, &flatten) {
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
    }

    let wait = options.wait.as_ref().and_then(|o| duration(&o.value, errors));
    let ttl = options.ttl.as_ref().and_then(|o| duration(&o.value, errors));
    let rerun = match &options.in_doubt {
        Some(o) => match o.value.value().as_str() {
            "fail" => false,
            "rerun" => true,
            other => {
                errors.push(syn::Error::new_spanned(
                    &o.value,
                    format!(
                        "`in_doubt = \"{other}\"` is not a policy: write \"fail\" (report the key in \
                         doubt, the default) or \"rerun\" (run again with the same key, where the \
                         vendor dedups it)"
                    ),
                ));
                false
            }
        },
        None => false,
    };

    let reconcile = match &options.reconcile {
        Some(o) if attr == Attr::Idempotent => reconciler(&o.value, sig, errors),
        _ => None,
    };

    Tool {
        attr,
        name,
        pinned: options.tool.is_some(),
        krate,
        scope,
        key_params,
        flatten,
        store: options.store.map(|o| o.value),
        wait,
        ttl,
        rerun,
        reconcile,
        shape,
        output,
        companion: declares_companion(item),
    }
}

/// Whether the attribute on `item` declares its companion constant beside it. Not when the
/// signature shows it is in an `impl` (it takes `self` or names `Self`), nor when its body is
/// `Box::pin(async move { … })`, as `#[async_trait]` and rmcp's `#[tool]` write it, in trait
/// impls, which cannot hold the companion: `#[idem::tools]` on the block declares those in an
/// inherent impl of its own. A free function written that way by hand loses only its
/// classification, while a companion in a trait impl would not compile.
pub(crate) fn declares_companion(item: &ItemFn) -> bool {
    !is_surely_in_impl(&item.sig) && output::shape_and_output(item).0 != Shape::Boxed
}

/// The return type of an `#[idempotent]` tool: a future's output for the future shapes, a
/// `Result` recognised by its syntax, with an owned `Ok` type.
fn check_output(
    item: &ItemFn,
    shape: Shape,
    output: Option<&Type>,
    fn_name: &str,
    errors: &mut Vec<syn::Error>,
) {
    let returned = match &item.sig.output {
        syn::ReturnType::Type(_, ty) => Some(&**ty),
        syn::ReturnType::Default => None,
    };
    // The whole return type, or the function's name when it returns nothing.
    let at_output = |message: String| match returned {
        Some(ty) => syn::Error::new_spanned(ty, message),
        None => syn::Error::new_spanned(&item.sig.ident, message),
    };
    if shape == Shape::Sync && returned.is_some_and(output::is_future) {
        errors.push(at_output(format!(
            "`{fn_name}` returns a future that is not `impl Future<Output = Result<T, E>>` and \
                 whose body is not `Box::pin(async move {{ … }})`: the macro cannot wrap it; write \
                 it as `async fn {fn_name}(…) -> Result<T, E>`"
        )));
        return;
    }
    let Some(output) = output else {
        errors.push(at_output(format!(
            "an `#[idempotent]` tool returns `Result<T, E>`: its `Ok` value is stored and \
                 replayed, and the store's failures travel in `E: From<idem::Error>`; change \
                 `{fn_name}` to return a `Result`"
        )));
        return;
    };
    let Some(ok) = output::result_ok_type(output) else {
        errors.push(syn::Error::new_spanned(
            output,
            format!(
                "an `#[idempotent]` tool returns `Result<T, E>`, written `Result<…>` or as an alias \
                 named `Result` such as `io::Result<T>` (the macro knows it by that name and cannot \
                 see through other aliases): its `Ok` value is stored and replayed, and the \
                 store's failures travel in `E: From<idem::Error>`; change `{fn_name}` to return \
                 a `Result`"
            ),
        ));
        return;
    };
    if let Some(borrowed) = output::borrowed_part(ok) {
        errors.push(syn::Error::new_spanned(
            borrowed,
            "a replayed result must be owned: on a replay the `Ok` value is read back from the \
             store, which cannot lend a borrow; return an owned type (`String`, not `&str`; \
             `Vec<T>`, not `&[T]`)",
        ));
    }
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

/// Whether `path` names one of our attributes (`read`, `idem::write`, …).
fn is_classification(path: &Path) -> bool {
    let last = match path.segments.last() {
        Some(last) => last.ident.to_string(),
        None => return false,
    };
    let ours =
        path.segments.len() == 1 || (path.segments.len() == 2 && path.segments[0].ident == "idem");
    ours && matches!(last.as_str(), "read" | "write" | "idempotent")
}

/// A `wait`/`ttl` value, in humantime's syntax (`"500ms"`, `"30s"`, `"24h"`, `"7d"`, `"1h 30m"`).
fn duration(lit: &LitStr, errors: &mut Vec<syn::Error>) -> Option<Duration> {
    let text = lit.value();
    match humantime::parse_duration(&text) {
        Ok(duration) => Some(duration),
        Err(error) => {
            errors.push(syn::Error::new_spanned(
                lit,
                format!(
                    "`\"{text}\"` is not a duration ({error}): write a number and a unit, such as \
                     \"500ms\", \"30s\", \"5m\", \"24h\" or \"7d\""
                ),
            ));
            None
        }
    }
}

/// Whether the signature proves the function sits in an `impl` or a trait: a receiver, or `Self`
/// anywhere in it. Without that proof it may be a free function, which needs its companion; a
/// function in an inherent `impl` can hold one too, so only this proof withholds it.
fn is_surely_in_impl(sig: &syn::Signature) -> bool {
    use crate::classify::mentions_self_type;
    sig.receiver().is_some()
        || mentions_self_type(sig.generics.to_token_stream())
        || mentions_self_type(sig.generics.where_clause.to_token_stream())
        || mentions_self_type(sig.inputs.to_token_stream())
        || mentions_self_type(sig.output.to_token_stream())
}
