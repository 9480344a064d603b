//! The checks that make misuse a compile error, all in one pass, each spanned on the user's
//! tokens. The result is a view of the tool that `expand` turns into code.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::{Expr, FnArg, Ident, ItemFn, LitStr, Member, Pat, Path, Stmt, Type};

use crate::args::{Attr, Options};

/// How the body runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A plain `fn`: the body goes in a closure.
    Sync,
    /// An `async fn`: the body goes in an `async move` block.
    Async,
    /// A `fn` whose body is `Box::pin(async move { … })`, as `#[async_trait]` and rmcp's `#[tool]`
    /// write it: the inner block is wrapped.
    Boxed,
}

/// The value a `scope = "param.field"` names.
pub(crate) struct Scope {
    pub(crate) text: String,
    pub(crate) param: Ident,
    pub(crate) fields: Vec<Member>,
}

/// A parameter that enters the key.
pub(crate) struct KeyParam {
    pub(crate) name: Ident,
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
    pub(crate) store: Option<Path>,
    pub(crate) wait_ms: Option<u64>,
    pub(crate) ttl_ms: Option<u64>,
    pub(crate) rerun: bool,
    pub(crate) shape: Shape,
    /// The `Result<T, E>` the body produces.
    pub(crate) output: Option<Type>,
    /// Whether a companion type can sit beside the function (not for methods).
    pub(crate) companion: bool,
}

/// Checks `item` under `attr` with `options`; `skips` holds each parameter's `#[idem(skip)]`.
/// Every problem found is pushed to `errors`.
pub(crate) fn tool(
    attr: Attr,
    options: Options,
    item: &ItemFn,
    skips: &[Option<Span>],
    errors: &mut Vec<syn::Error>,
) -> Tool {
    let sig = &item.sig;
    let fn_name = sig.ident.to_string();
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
        for span in skips.iter().flatten() {
            errors.push(syn::Error::new(
                *span,
                format!(
                    "`#[idem(skip)]` has no meaning on `#[{attr_name}]`, which has no key: drop it"
                ),
            ));
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

    let shape = if sig.asyncness.is_some() {
        Shape::Async
    } else if boxed_async_block(item).is_some() {
        Shape::Boxed
    } else {
        Shape::Sync
    };
    let output = match (&sig.output, shape) {
        (syn::ReturnType::Type(_, ty), Shape::Boxed) => future_output(ty),
        (syn::ReturnType::Type(_, ty), _) => Some((**ty).clone()),
        (syn::ReturnType::Default, _) => None,
    };
    if attr == Attr::Idempotent && !output.as_ref().is_some_and(is_result) {
        let message = format!(
            "an `#[idempotent]` tool returns `Result<T, E>`: its `Ok` value is stored and replayed, \
             and the store's failures travel in `E: From<idem::Error>`; change `{fn_name}` to return \
             a `Result`"
        );
        errors.push(match &sig.output {
            syn::ReturnType::Type(_, ty) => syn::Error::new_spanned(ty, message),
            syn::ReturnType::Default => syn::Error::new_spanned(&sig.ident, message),
        });
    }

    let params: Vec<(Option<&Ident>, &syn::PatType, Option<Span>)> = sig
        .inputs
        .iter()
        .zip(skips)
        .filter_map(|(input, skip)| match input {
            FnArg::Receiver(_) => None,
            FnArg::Typed(typed) => Some((plain_name(&typed.pat), typed, *skip)),
        })
        .collect();

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
        (Some(scope), Attr::Idempotent) => parse_scope(&scope.value, &params, errors),
        _ => None,
    };

    let mut key_params = Vec::new();
    if attr == Attr::Idempotent {
        for (name, typed, skip) in &params {
            let is_scope = scope.as_ref().is_some_and(|s| Some(&s.param) == *name);
            match (skip, is_scope) {
                (Some(span), true) => errors.push(syn::Error::new(
                    *span,
                    "the scope parameter cannot be skipped: the key is built from it; drop \
                     `#[idem(skip)]` or choose another scope",
                )),
                (Some(_), false) => {}
                (None, true) if scope.as_ref().is_some_and(|s| s.fields.is_empty()) => {}
                (None, _) => match name {
                    Some(name) => {
                        key_params.push(KeyParam { name: (*name).clone(), ty: (*typed.ty).clone() })
                    }
                    None => errors.push(syn::Error::new_spanned(
                        &typed.pat,
                        "a key parameter needs a plain name, which the key uses: bind it to a \
                         name, or mark it `#[idem(skip)]` if it is not part of the intent",
                    )),
                },
            }
        }
    }

    let wait_ms = options.wait.as_ref().and_then(|o| duration_ms(&o.value, errors));
    let ttl_ms = options.ttl.as_ref().and_then(|o| duration_ms(&o.value, errors));
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

    let companion = !mentions_self(sig);
    Tool {
        attr,
        name,
        pinned: options.tool.is_some(),
        krate,
        scope,
        key_params,
        store: options.store.map(|o| o.value),
        wait_ms,
        ttl_ms,
        rerun,
        shape,
        output,
        companion,
    }
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

fn plain_name(pat: &Pat) -> Option<&Ident> {
    match pat {
        Pat::Ident(ident) if ident.subpat.is_none() && ident.by_ref.is_none() => Some(&ident.ident),
        _ => None,
    }
}

fn parse_scope(
    lit: &LitStr,
    params: &[(Option<&Ident>, &syn::PatType, Option<Span>)],
    errors: &mut Vec<syn::Error>,
) -> Option<Scope> {
    let text = lit.value();
    let mut segments = text.split('.');
    let first = segments.next().unwrap_or_default();
    let param = params.iter().find_map(|(name, _, _)| name.filter(|n| *n == first));
    let Some(param) = param else {
        let names: Vec<String> =
            params.iter().filter_map(|(name, _, _)| name.map(ToString::to_string)).collect();
        let known = if names.is_empty() {
            "it has none".to_owned()
        } else {
            format!("they are: {}", names.join(", "))
        };
        errors.push(syn::Error::new_spanned(
            lit,
            format!(
                "`scope = \"{text}\"` names no parameter ({known}); the scope is a parameter, or a \
                 field path into one such as \"req.order_id\""
            ),
        ));
        return None;
    };
    let mut fields = Vec::new();
    for segment in segments {
        match syn::parse_str::<Member>(segment) {
            Ok(member) => fields.push(with_span(member, lit.span())),
            Err(_) => {
                errors.push(syn::Error::new_spanned(
                    lit,
                    format!("`{segment}` in `scope = \"{text}\"` is not a field name"),
                ));
                return None;
            }
        }
    }
    Some(Scope { text, param: Ident::new(&param.to_string(), param.span()), fields })
}

fn with_span(member: Member, span: Span) -> Member {
    match member {
        Member::Named(ident) => Member::Named(Ident::new(&ident.to_string(), span)),
        Member::Unnamed(index) => Member::Unnamed(syn::Index { index: index.index, span }),
    }
}

/// `"500ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"` in milliseconds.
fn duration_ms(lit: &LitStr, errors: &mut Vec<syn::Error>) -> Option<u64> {
    let text = lit.value();
    let digits = text.chars().take_while(char::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let scale = match unit {
        "ms" => Some(1),
        "s" => Some(1_000),
        "m" => Some(60_000),
        "h" => Some(3_600_000),
        "d" => Some(86_400_000),
        _ => None,
    };
    let ms = scale.and_then(|scale| number.parse::<u64>().ok()?.checked_mul(scale));
    if ms.is_none() {
        errors.push(syn::Error::new_spanned(
            lit,
            format!(
                "`\"{text}\"` is not a duration: write a whole number and one unit of ms, s, m, h or \
                 d, such as \"500ms\", \"30s\" or \"24h\""
            ),
        ));
    }
    ms
}

/// The `async move` block of a body that is only `Box::pin(async move { … })`.
fn boxed_async_block(item: &ItemFn) -> Option<&syn::ExprAsync> {
    boxed_async_block_of(&item.block)
}

/// Like [`boxed_async_block`], for mutation.
pub(crate) fn boxed_async_block_mut(block: &mut syn::Block) -> Option<&mut syn::ExprAsync> {
    let [Stmt::Expr(Expr::Call(call), None)] = block.stmts.as_mut_slice() else {
        return None;
    };
    if !is_box_pin(&call.func) || call.args.len() != 1 {
        return None;
    }
    match call.args.first_mut() {
        Some(Expr::Async(block)) if block.capture.is_some() => Some(block),
        _ => None,
    }
}

fn boxed_async_block_of(block: &syn::Block) -> Option<&syn::ExprAsync> {
    let [Stmt::Expr(Expr::Call(call), None)] = block.stmts.as_slice() else {
        return None;
    };
    if !is_box_pin(&call.func) || call.args.len() != 1 {
        return None;
    }
    match call.args.first() {
        Some(Expr::Async(block)) if block.capture.is_some() => Some(block),
        _ => None,
    }
}

fn is_box_pin(func: &Expr) -> bool {
    let Expr::Path(path) = func else { return false };
    let segments: Vec<String> = path.path.segments.iter().map(|s| s.ident.to_string()).collect();
    segments.ends_with(&["Box".to_owned(), "pin".to_owned()])
}

/// `X` in a return type such as `Pin<Box<dyn Future<Output = X> + Send + 'a>>`.
fn future_output(ty: &Type) -> Option<Type> {
    struct Find(Option<Type>);
    impl<'ast> syn::visit::Visit<'ast> for Find {
        fn visit_assoc_type(&mut self, assoc: &'ast syn::AssocType) {
            if self.0.is_none() && assoc.ident == "Output" {
                self.0 = Some(assoc.ty.clone());
            }
        }
    }
    let mut find = Find(None);
    syn::visit::Visit::visit_type(&mut find, ty);
    find.0
}

/// Whether `ty` is a `Result` (or an alias whose name ends in `Result`).
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(path) if path.qself.is_none() => {
            path.path.segments.last().is_some_and(|last| last.ident.to_string().ends_with("Result"))
        }
        Type::Paren(inner) => is_result(&inner.elem),
        Type::Group(inner) => is_result(&inner.elem),
        _ => false,
    }
}

/// A method or associated fn: a companion type cannot sit in an `impl` block.
fn mentions_self(sig: &syn::Signature) -> bool {
    fn walk(tokens: TokenStream) -> bool {
        tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => ident == "self" || ident == "Self",
            TokenTree::Group(group) => walk(group.stream()),
            _ => false,
        })
    }
    walk(sig.generics.to_token_stream())
        || walk(sig.inputs.to_token_stream())
        || walk(sig.output.to_token_stream())
}
