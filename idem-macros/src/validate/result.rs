//! The return type of an `#[idempotent]` tool: a `Result` whose `Ok` value can be stored and
//! replayed.

use syn::{ItemFn, Type};

use crate::signature::{self, Shape};

/// The return type of an `#[idempotent]` tool: a future's output for the future shapes, a
/// `Result` recognised by its syntax, with an owned `Ok` type.
pub(super) fn check(
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
    if shape == Shape::Sync && returned.is_some_and(signature::is_future) {
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
    let Some(ok) = signature::result_ok_type(output) else {
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
    if let Some(borrowed) = signature::borrowed_part(ok) {
        errors.push(syn::Error::new_spanned(
            borrowed,
            "a replayed result must be owned: on a replay the `Ok` value is read back from the \
             store, which cannot lend a borrow; return an owned type (`String`, not `&str`; \
             `Vec<T>`, not `&[T]`)",
        ));
    }
}
