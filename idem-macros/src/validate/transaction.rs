//! `transactional = "tx"`: the tool's effects are all writes through the transaction its
//! parameter `tx` receives, which commits with the call's record. The parameter is taken out of
//! the signature (the caller does not pass it: the engine lends it), and the options that
//! cannot hold for such a tool are refused here. A sync tool runs on the SQLite store (its
//! driver is sync); an `async fn` on a store that lends an async driver's transaction
//! (PostgreSQL), which the runtime's `AsyncTransactional` bound checks, in our words.

use quote::ToTokens;
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
    // A sync tool runs on SQLite, an async one on a store whose driver is async (PostgreSQL).
    let (shape, _) = signature::shape_and_output(item);
    let (tx_type, store_type) = match shape {
        Shape::Sync => ("&rusqlite::Transaction<'_>", "`Arc<SqliteStore>` whose file"),
        _ => ("&mut tokio_postgres::Transaction<'_>", "`Arc<PgStore>` whose database"),
    };
    let Some(taken) = taken else {
        errors.push(syn::Error::new(
            written.value.span(),
            format!(
                "`transactional = \"{name}\"` names the parameter that receives the transaction, \
                 and `{fn_name}` has none named `{name}`: add `{name}: {tx_type}`"
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
                 {store_type} holds your tables"
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
    // A second parameter of the same type would be a key parameter, refused as not
    // `Serialize`: say what it is instead.
    let lent_type = taken.ty.to_token_stream().to_string();
    for input in &item.sig.inputs {
        if let syn::FnArg::Typed(other) = input {
            if other.ty.to_token_stream().to_string() == lent_type {
                errors.push(syn::Error::new_spanned(
                    &other.ty,
                    format!(
                        "`{fn_name}` takes a second transaction: a transactional tool gets one, \
                         in the parameter `transactional = \"{name}\"` names, which commits \
                         with its record; write through `{name}` alone"
                    ),
                ));
            }
        }
    }
    // Told apart by the reference's shape: rusqlite lends `&Transaction`, the async drivers
    // `&mut` (a tokio-postgres or sqlx transaction is driven through `&mut self`).
    if let syn::Type::Reference(reference) = &taken.ty {
        let lent = &taken.name;
        match (shape, reference.mutability.is_some()) {
            (Shape::Sync, true) => errors.push(syn::Error::new_spanned(
                &taken.ty,
                format!(
                    "`{fn_name}` is a plain `fn`, which runs on the SQLite store with \
                     `{lent}: &rusqlite::Transaction<'_>`; a `&mut` transaction is an async \
                     driver's (tokio-postgres on a `PgStore`): make `{fn_name}` an `async fn`"
                ),
            )),
            (Shape::Async | Shape::Boxed, false) => errors.push(syn::Error::new_spanned(
                &taken.ty,
                format!(
                    "`{fn_name}` is an `async fn`, which runs on a store whose driver is async: \
                     take `{lent}: &mut tokio_postgres::Transaction<'_>` (a `PgStore`); a \
                     `&rusqlite::Transaction` cannot cross an `.await`, so a SQLite tool is a \
                     plain `fn`"
                ),
            )),
            _ => {}
        }
    }
    if shape == Shape::Future {
        errors.push(syn::Error::new_spanned(
            &item.sig.ident,
            format!(
                "`{fn_name}` is transactional, and its body must run inside the transaction the \
                 store lends, which a `fn` returning a future it made does not: make it an \
                 `async fn` (PostgreSQL) or a plain `fn` (SQLite)"
            ),
        ));
    }
    Some(taken)
}
