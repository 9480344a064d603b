//! `ignore = ["body", …]`: fields of the flattened argument object that are not part of the
//! intent, left out of the key.

use syn::ext::IdentExt;
use syn::Member;

use super::scope::field;
use crate::attr::{Ignore, Opt};
use crate::checked::{Flatten, Ignored};

/// Records on `flatten` the fields `written` names. Whether each is a field of the object's type
/// is left to the compiler, which the expansion asks with an access to it spanned on its name.
pub(super) fn ignored(
    written: Option<&Opt<Ignore>>,
    flatten: Option<&mut Flatten>,
    fn_name: &str,
    errors: &mut Vec<syn::Error>,
) {
    let Some(written) = written else { return };
    let Some(flatten) = flatten else {
        errors.push(syn::Error::new(
            written.key,
            format!(
                "`ignore` names fields of the tool's argument object, the parameter marked \
                 `#[idem(flatten)]`, and `{fn_name}` has none: flatten the request parameter, or \
                 mark a parameter that is not part of the intent `#[idem(skip)]`"
            ),
        ));
        return;
    };
    if written.value.fields.is_empty() {
        errors.push(syn::Error::new(written.key, "`ignore = []` leaves nothing out: drop it"));
    }
    for lit in &written.value.fields {
        let text = lit.value();
        let Some(Member::Named(ident)) = field(&text, lit.span()) else {
            errors.push(syn::Error::new_spanned(
                lit,
                format!("`\"{text}\"` in `ignore` is not a field name"),
            ));
            continue;
        };
        let label = ident.unraw().to_string();
        if flatten.ignore.iter().any(|known| known.label == label) {
            errors.push(syn::Error::new_spanned(
                lit,
                format!("`{label}` is in `ignore` twice: keep one"),
            ));
            continue;
        }
        flatten.ignore.push(Ignored { field: ident, label });
    }
}
