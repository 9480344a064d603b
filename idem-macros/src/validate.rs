//! The checks that make misuse a compile error, all in one pass, each spanned on the user's
//! tokens. The result is a `checked::Tool`, which `expand` turns into code.
//!
//! The checks run in the order the user meets the tool's parts (its attributes, its signature,
//! its name and facade, its return type, its parameters, then the remaining options), and that
//! order is the order of the errors reported.

use syn::ext::IdentExt;
use syn::ItemFn;

use crate::attr::{Attr, InTools, Options, ParamOptions};
use crate::checked::Tool;
use crate::signature;

mod approval;
mod ignore;
mod key;
mod options;
mod params;
mod reconcile;
mod result;
mod scope;
mod transaction;

pub(crate) use reconcile::reconciler;
pub(crate) use transaction::take as take_transaction;

/// Checks `item` under `attr` with `options`; `param_options` holds each parameter's
/// `#[idem(…)]`.
/// Every problem found is pushed to `errors`.
pub(crate) fn tool(
    attr: Attr,
    mut options: Options,
    item: &ItemFn,
    param_options: &[ParamOptions],
    errors: &mut Vec<syn::Error>,
) -> Tool {
    let sig = &item.sig;
    let fn_name = sig.ident.unraw().to_string();
    let keyed = attr == Attr::Idempotent;

    if let Some(repeated) = options.repeated.take() {
        errors.push(repeated);
    }
    options::one_classification(attr, item, &fn_name, errors);
    options::rmcp_tool_needs_the_block(item, options.in_tools.is_some(), &fn_name, errors);
    if keyed {
        options::keyable_signature(sig, errors);
    } else {
        options::no_key_options(attr, &options, param_options, errors);
    }
    let name = options::tool_name(options.tool.as_ref(), &fn_name, errors);
    let krate = options::facade_path(options.krate.as_ref(), errors);

    let (shape, output) = signature::shape_and_output(item);
    if keyed {
        result::check(item, shape, output.as_ref(), &fn_name, errors);
    }

    let params = params::typed(sig, param_options);
    let mut flatten = if keyed { params::flatten_param(&params, errors) } else { None };
    if keyed {
        ignore::ignored(options.ignore.as_ref(), flatten.as_mut(), &fn_name, errors);
    }
    let scope = if keyed {
        let written = options.scope.as_ref().map(|o| &o.value);
        scope::scope(written, &params, flatten.as_ref(), sig, &fn_name, errors)
    } else {
        None
    };
    let key_params = if keyed {
        key::key_params(&params, scope.as_ref(), flatten.as_ref(), errors)
    } else {
        Vec::new()
    };

    let wait = options.wait.as_ref().and_then(|o| options::duration(&o.value, errors));
    let ttl = options.ttl.as_ref().and_then(|o| options::duration(&o.value, errors));
    let destructive = options::destructive(attr, options.destructive.as_ref(), errors);
    let rerun = options::rerun(options.in_doubt.as_ref().map(|o| &o.value), errors);
    let reconcile = match &options.reconcile {
        Some(o) if keyed => reconcile::reconciler(&o.value, sig, errors),
        _ => None,
    };

    let approval = if keyed { approval::approval(&options, errors) } else { None };
    if keyed {
        approval::covers_every_input(&options, &params, scope.as_ref(), errors);
    }

    let unmarked_method = options.in_tools.is_none() && signature::is_surely_in_impl(sig);
    let pinned = options.tool.is_some();
    let (named_by, function) = record_names(options.in_tools.map(|o| o.value), pinned, &name);

    Tool {
        attr,
        name,
        named_by,
        function,
        destructive,
        krate,
        scope,
        key_params,
        flatten,
        store: options.store.map(|o| o.value),
        wait,
        ttl,
        rerun,
        reconcile,
        approval,
        shape,
        output,
        transaction: None,
        unmarked_method,
    }
}

/// The name a framework gives the tool, if any, and the function its records name: a
/// framework's name is the tool's, so its records always name the function; otherwise a name
/// pinned with `tool = "…"` frees them from the function's path.
fn record_names(
    in_tools: Option<InTools>,
    pinned: bool,
    name: &str,
) -> (Option<syn::Expr>, Option<String>) {
    match in_tools {
        Some(block) => {
            let function = (!pinned || block.name.is_some()).then(|| block.function.value());
            (block.name, function)
        }
        None => (None, (!pinned).then(|| name.to_owned())),
    }
}
