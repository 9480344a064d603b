//! The checks of the attribute itself and of its options' values: one classification per tool,
//! options that only a keyed tool can use, a signature a key can guard, the tool's name, the
//! facade's path, durations and the in-doubt policy; an rmcp `#[tool]` outside `#[idem::tools]`.

use std::time::Duration;

use syn::{ItemFn, LitStr, Path};

use crate::attr::{Attr, Opt, Options, ParamOptions};
use crate::signature;

/// A tool carries one of our attributes: any other on `item` besides the one expanding is an
/// error.
pub(super) fn one_classification(
    attr: Attr,
    item: &ItemFn,
    fn_name: &str,
    errors: &mut Vec<syn::Error>,
) {
    let attr_name = attr.name();
    for other in &item.attrs {
        if Attr::named_by(other.path()).is_some() {
            errors.push(syn::Error::new_spanned(
                other,
                format!(
                    "`{fn_name}` is already classified `#[{attr_name}]`: a tool has one \
                     classification, so keep either this attribute or that one"
                ),
            ));
        }
    }
}

/// An rmcp `#[tool]` method (below ours, so not yet expanded) in a block without
/// `#[idem::tools]`: it would be keyed by its Rust name rather than rmcp's, lack its MCP hints,
/// and answer idem's outcomes as protocol errors the model never reads. A `#[tool]` above ours
/// has expanded unseen: the check `expand` puts in the method's body catches that one.
pub(super) fn rmcp_tool_needs_the_block(
    item: &ItemFn,
    in_tools: bool,
    fn_name: &str,
    errors: &mut Vec<syn::Error>,
) {
    if in_tools || !signature::is_surely_in_impl(&item.sig) {
        return;
    }
    let rmcp_tool = item
        .attrs
        .iter()
        .find(|attr| attr.path().segments.last().is_some_and(|last| last.ident == "tool"));
    if let Some(tool) = rmcp_tool {
        errors.push(syn::Error::new_spanned(
            tool,
            format!(
                "`{fn_name}` is an rmcp `#[tool]`, and its `impl` block has no `#[idem::tools]`: \
                 put `#[idem::tools]` on the block, above `#[tool_router]`. It names the tool \
                 as rmcp does (in its key and record), writes idem's MCP hints into its \
                 `#[tool]`, and makes the router answer idem's outcomes (in doubt, in flight) as \
                 tool results the model reads"
            ),
        ));
    }
}

/// On a `#[read]` or `#[write]`, which has no key, the options and parameter options that only
/// a key gives meaning to.
pub(super) fn no_key_options(
    attr: Attr,
    options: &Options,
    param_options: &[ParamOptions],
    errors: &mut Vec<syn::Error>,
) {
    let attr_name = attr.name();
    if let Some(reconcile) = &options.reconcile {
        errors.push(syn::Error::new(
            reconcile.key,
            format!(
                "`reconcile` has no meaning on `#[{attr_name}]`: a reconciler settles a key left \
                 in doubt, and only an `#[idempotent(scope = \"…\")]` tool has a key; drop it, \
                 or make the tool `#[idempotent]`"
            ),
        ));
    }
    let keyed = [
        ("scope", options.scope.as_ref().map(|o| o.key)),
        ("store", options.store.as_ref().map(|o| o.key)),
        ("wait", options.wait.as_ref().map(|o| o.key)),
        ("ttl", options.ttl.as_ref().map(|o| o.key)),
        ("in_doubt", options.in_doubt.as_ref().map(|o| o.key)),
        ("ignore", options.ignore.as_ref().map(|o| o.key)),
        ("approve", options.approve),
        ("approve_if", options.approve_if.as_ref().map(|o| o.key)),
        ("approval_ttl", options.approval_ttl.as_ref().map(|o| o.key)),
        ("approve_wait", options.approve_wait.as_ref().map(|o| o.key)),
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

/// An `#[idempotent]` body runs through a store at run time, from Rust callers with a fixed list
/// of arguments: not a `const`, `extern` or variadic fn.
pub(super) fn keyable_signature(sig: &syn::Signature, errors: &mut Vec<syn::Error>) {
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

/// The tool's name: `tool = "…"` if given and not empty, else the function's.
pub(super) fn tool_name(
    tool: Option<&Opt<LitStr>>,
    fn_name: &str,
    errors: &mut Vec<syn::Error>,
) -> String {
    match tool {
        Some(tool) if tool.value.value().is_empty() => {
            errors.push(syn::Error::new_spanned(
                &tool.value,
                "`tool` is empty: give the tool a name",
            ));
            fn_name.to_owned()
        }
        Some(tool) => tool.value.value(),
        None => fn_name.to_owned(),
    }
}

/// The path to the facade the generated code names: `crate = "…"`, or `::idem`.
pub(super) fn facade_path(krate: Option<&Opt<LitStr>>, errors: &mut Vec<syn::Error>) -> Path {
    match krate {
        Some(krate) => krate.value.parse::<Path>().unwrap_or_else(|_| {
            errors.push(syn::Error::new_spanned(
                &krate.value,
                "`crate` must be a path to the idem facade, such as \"::idem\" or \"my_idem\"",
            ));
            syn::parse_quote!(::idem)
        }),
        None => syn::parse_quote!(::idem),
    }
}

/// A `wait`/`ttl` value, in humantime's syntax (`"500ms"`, `"30s"`, `"24h"`, `"7d"`, `"1h 30m"`).
pub(super) fn duration(lit: &LitStr, errors: &mut Vec<syn::Error>) -> Option<Duration> {
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

/// Whether the tool may change or delete what is already there: `destructive = false` says a
/// write only adds (an order, a ticket); a read never changes anything, so it takes no such
/// option.
pub(super) fn destructive(
    attr: Attr,
    written: Option<&Opt<syn::Expr>>,
    errors: &mut Vec<syn::Error>,
) -> bool {
    let default = attr != Attr::Read;
    let Some(written) = written else { return default };
    if attr == Attr::Read {
        errors.push(syn::Error::new(
            written.key,
            "`destructive` has no meaning on `#[read]`, which changes nothing: drop it",
        ));
        return default;
    }
    match &written.value {
        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Bool(value), .. }) => value.value,
        other => {
            errors.push(syn::Error::new_spanned(
                other,
                "`destructive` is `true` (the default: the tool may change or delete what is \
                 already there) or `false` (it only adds, such as a new order or ticket)",
            ));
            default
        }
    }
}

/// Whether `in_doubt = "…"` asks to run a key left in doubt again (`"rerun"`) rather than report
/// it (`"fail"`, the default).
pub(super) fn rerun(in_doubt: Option<&LitStr>, errors: &mut Vec<syn::Error>) -> bool {
    let Some(lit) = in_doubt else { return false };
    match lit.value().as_str() {
        "fail" => false,
        "rerun" => true,
        other => {
            errors.push(syn::Error::new_spanned(
                lit,
                format!(
                    "`in_doubt = \"{other}\"` is not a policy: write \"fail\" (report the key in \
                     doubt, the default) or \"rerun\" (run again with the same key, where the \
                     vendor dedups it)"
                ),
            ));
            false
        }
    }
}
