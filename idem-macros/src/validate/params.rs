//! The typed parameters as the checks see them: plain and wrapped names, and the flattened
//! argument object.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::{FnArg, Ident, Pat, Type};

use crate::attr::ParamOptions;
use crate::checked::Flatten;

pub(super) fn plain_name(pat: &Pat) -> Option<&Ident> {
    match pat {
        Pat::Ident(ident) if ident.subpat.is_none() && ident.by_ref.is_none() => Some(&ident.ident),
        _ => None,
    }
}

/// One typed parameter as the checks see it.
pub(super) struct Param<'a> {
    /// Its plain name, or, when flattened, the name inside its wrapper pattern.
    pub(super) name: Option<&'a Ident>,
    pub(super) typed: &'a syn::PatType,
    pub(super) options: ParamOptions,
}

/// The typed parameters of `sig` (not its receiver), each with its `#[idem(…)]` options.
pub(super) fn typed<'a>(sig: &'a syn::Signature, param_options: &[ParamOptions]) -> Vec<Param<'a>> {
    sig.inputs
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
        .collect()
}

/// `req` in `Parameters(req)` or `Wrapper { 0: req }`: the one name a wrapper pattern binds.
pub(super) fn wrapped_name(pat: &Pat) -> Option<&Ident> {
    match pat {
        Pat::TupleStruct(tuple) if tuple.elems.len() == 1 => plain_name(&tuple.elems[0]),
        Pat::Struct(fields) if fields.fields.len() == 1 && fields.rest.is_none() => {
            plain_name(&fields.fields[0].pat)
        }
        _ => None,
    }
}

/// The one parameter marked `#[idem(flatten)]`, checked to be an object a client could send.
pub(super) fn flatten_param(params: &[Param], errors: &mut Vec<syn::Error>) -> Option<Flatten> {
    let mut marked = params.iter().filter(|p| p.options.flatten.is_some());
    let first = marked.next()?;
    for extra in marked {
        errors.push(syn::Error::new(
            extra.options.flatten.unwrap_or_else(Span::call_site),
            "only one parameter can be the tool's whole argument object: keep `#[idem(flatten)]` \
             on one",
        ));
    }
    let Some(name) = first.name else {
        errors.push(syn::Error::new_spanned(
            &first.typed.pat,
            "a `#[idem(flatten)]` parameter is a name (`req: PaymentRequest`) or a one-field \
             wrapper pattern (`Parameters(req): Parameters<PaymentRequest>`), whose binding is the \
             argument object",
        ));
        return None;
    };
    let object = if plain_name(&first.typed.pat).is_some() {
        Some(&*first.typed.ty)
    } else {
        wrapped_type(&first.typed.ty)
    };
    if let Some(ty) = object.filter(|ty| not_an_object(ty)) {
        errors.push(syn::Error::new_spanned(
            ty,
            format!(
                "`#[idem(flatten)]` makes the fields of `{name}` the key's arguments, but `{}` has \
                 no fields: flatten the struct the client's arguments deserialize into, or drop \
                 `#[idem(flatten)]` to key `{name}` by its name",
                tidy(ty.to_token_stream())
            ),
        ));
        return None;
    }
    Some(Flatten { name: name.clone(), ty: (*first.typed.ty).clone(), ignore: Vec::new() })
}

/// `T` in `Parameters<T>`: the type a one-field wrapper pattern binds, when it is written out.
pub(super) fn wrapped_type(ty: &Type) -> Option<&Type> {
    let Type::Path(path) = ty else { return None };
    let syn::PathArguments::AngleBracketed(args) = &path.path.segments.last()?.arguments else {
        return None;
    };
    let mut types = args.args.iter().filter_map(|arg| match arg {
        syn::GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    match (types.next(), types.next()) {
        (Some(ty), None) => Some(ty),
        _ => None,
    }
}

/// Types that are known not to serialize as a JSON object: numbers, text, sequences, tuples.
pub(super) fn not_an_object(ty: &Type) -> bool {
    match ty {
        Type::Reference(reference) => not_an_object(&reference.elem),
        Type::Paren(inner) => not_an_object(&inner.elem),
        Type::Group(inner) => not_an_object(&inner.elem),
        Type::Array(_) | Type::Slice(_) | Type::Tuple(_) => true,
        Type::Path(path) if path.qself.is_none() => {
            let Some(last) = path.path.segments.last() else { return false };
            const SCALARS: &[&str] = &[
                "bool", "char", "str", "String", "u8", "u16", "u32", "u64", "u128", "usize", "i8",
                "i16", "i32", "i64", "i128", "isize", "f32", "f64", "Vec", "VecDeque", "Option",
                "Box", "Cow",
            ];
            let name = last.ident.to_string();
            match name.as_str() {
                // A box of an object is an object: look inside.
                "Box" | "Cow" => wrapped_type(ty).is_some_and(not_an_object),
                _ => SCALARS.contains(&name.as_str()),
            }
        }
        _ => false,
    }
}

/// Tokens as text without the spaces `to_string` puts between every two of them.
pub(super) fn tidy(tokens: TokenStream) -> String {
    let text = tokens.to_string();
    [(" (", "("), ("( ", "("), (" )", ")"), (" ,", ","), (" < ", "<"), (" <", "<"), ("< ", "<")]
        .into_iter()
        .chain([(" >", ">"), (" :: ", "::"), (":: ", "::"), ("& ", "&")])
        .fold(text, |text, (from, to)| text.replace(from, to))
}
