//! The check of `reconcile = "…"`: the function it names, and whether the tool can lend it its
//! receiver.

use syn::{LitStr, Path};

use crate::checked::Reconciler;

/// The reconciler `reconcile = "…"` names: a path, called with the key; for a tool taking
/// `&self`, one name is a method of the same type, called with `&self` and the key. A method
/// taking `&mut self` or `self` cannot lend its receiver to a reconciler beside its body.
pub(crate) fn reconciler(
    lit: &LitStr,
    sig: &syn::Signature,
    errors: &mut Vec<syn::Error>,
) -> Option<Reconciler> {
    let Ok(path) = lit.parse::<Path>() else {
        errors.push(syn::Error::new_spanned(
            lit,
            "`reconcile` names a function by its path, such as \"find_charge\" or \
             \"vendor::find_charge\": one that takes the call's `&idem::Key` and answers \
             `Result<idem::Reconciled<T>, E>`",
        ));
        return None;
    };
    let receiver = sig.receiver();
    if let Some(receiver) = receiver {
        let shared = receiver.reference.is_some()
            && receiver.mutability.is_none()
            && receiver.colon_token.is_none();
        if !shared {
            errors.push(syn::Error::new_spanned(
                receiver,
                "a tool with a reconciler takes `&self`: its reconciler borrows the receiver \
                 beside the body, which `&mut self` or `self` cannot share; take `&self`, or \
                 name a free function that needs only the key",
            ));
            return None;
        }
    }
    let method = receiver.is_some() && path.get_ident().is_some();
    Some(Reconciler { path, method, span: lit.span() })
}
