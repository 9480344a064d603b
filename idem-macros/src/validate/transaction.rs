//! `transactional = "tx"`: the tool's effects are all writes through the transaction its
//! parameter `tx` receives, which commits with the call's record. The parameter is taken out of
//! the signature (the caller does not pass it: the engine lends it), and the options that
//! cannot hold for such a tool are refused here.

use syn::ItemFn;

use crate::attr::{Attr, Options, TxParam};
use crate::signature::{self, Shape};

/// Takes the transaction parameter out of `item`'s signature (or the one `#[idem::tools]` took
/// out already), checking what a transactional tool needs; `None` for any other tool.
pub(crate) fn take(
    attr: Attr,
    options: &mut Options,
    item: &mut ItemFn,
    errors: &mut Vec<syn::Error>,
) -> Option<TxParam> {
    let fn_name = item.sig.ident.to_string();
    let written = options.transactional.as_ref()?;
    let (key, name) = (written.key, written.value.value());
    if attr != Attr::Idempotent {
        errors.push(syn::Error::new(
            key,
            format!(
                "`transactional` has no meaning on `#[{}]`: only an `#[idempotent(scope = \"…\")]` \
                 tool has a record to commit with its writes",
                attr.name()
            ),
        ));
        return None;
    }
    let taken = match options.transaction.take() {
        Some(told) => Some(told.value),
        None => TxParam::take_from(&mut item.sig, &name),
    };
    let Some(taken) = taken else {
        errors.push(syn::Error::new(
            written.value.span(),
            format!(
                "`transactional = \"{name}\"` names the parameter that receives the transaction, \
                 and `{fn_name}` has none named `{name}`: add `{name}: &rusqlite::Transaction<'_>`"
            ),
        ));
        return None;
    };
    if options.store.is_none() {
        errors.push(syn::Error::new(
            key,
            format!(
                "a transactional tool writes to the database its store is in, so `{fn_name}` \
                 names that store: add `store = path`, a function (or static) giving the \
                 `Arc<SqliteStore>` whose file holds your tables"
            ),
        ));
    }
    if let Some(reconcile) = &options.reconcile {
        errors.push(syn::Error::new(
            reconcile.key,
            "a transactional tool is never in doubt (its writes and its record commit together), \
             so it has no reconciler: drop `reconcile`",
        ));
    }
    if let Some(approval) = options.approve.or(options.approve_if.as_ref().map(|o| o.key)) {
        errors.push(syn::Error::new(
            approval,
            "a transactional call asks no one: its body runs inside the transaction it commits \
             with, which cannot wait for a person; drop the approval, or make the tool an \
             ordinary `#[idempotent]` one",
        ));
    }
    let (shape, _) = signature::shape_and_output(item);
    if shape != Shape::Sync {
        errors.push(syn::Error::new_spanned(
            &item.sig.ident,
            format!(
                "`{fn_name}` is transactional, so its body holds the store's write lock and a \
                 rusqlite transaction, which cannot cross an `.await`: make it a plain `fn`"
            ),
        ));
    }
    Some(taken)
}
