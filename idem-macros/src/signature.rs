//! What a tool's function says about itself, recognised by its syntax: how its body runs (sync,
//! async, boxed or returned future), the `Result<T, E>` it produces, and whether its signature
//! proves it sits in an `impl`.

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use syn::{Expr, GenericArgument, ItemFn, PathArguments, ReturnType, Stmt, Type, TypeParamBound};

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
    /// A `fn` returning `impl Future<Output = …>`: the body makes the future, which the engine
    /// runs once per key.
    Future,
}

/// The shape of `item`'s body and the type its body produces (the future's output for the
/// future-returning shapes), if it returns anything.
pub(crate) fn shape_and_output(item: &ItemFn) -> (Shape, Option<Type>) {
    let returned = match &item.sig.output {
        ReturnType::Type(_, ty) => Some(&**ty),
        ReturnType::Default => None,
    };
    if item.sig.asyncness.is_some() {
        return (Shape::Async, returned.cloned());
    }
    let future = returned.and_then(future_output);
    if boxed_async_block(&mut item.block.as_ref().clone()).is_some() {
        return (Shape::Boxed, future);
    }
    match returned {
        Some(Type::ImplTrait(_)) if future.is_some() => (Shape::Future, future),
        _ => (Shape::Sync, returned.cloned()),
    }
}

/// The `async move` block of a body that is only `Box::pin(async move { … })`.
pub(crate) fn boxed_async_block(block: &mut syn::Block) -> Option<&mut syn::ExprAsync> {
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

fn is_box_pin(func: &Expr) -> bool {
    let Expr::Path(path) = func else { return false };
    let segments: Vec<String> = path.path.segments.iter().map(|s| s.ident.to_string()).collect();
    segments.ends_with(&["Box".to_owned(), "pin".to_owned()])
}

/// `X` in a return type such as `impl Future<Output = X>` or
/// `Pin<Box<dyn Future<Output = X> + Send + 'a>>`.
fn future_output(ty: &Type) -> Option<Type> {
    struct Find(Option<Type>);
    impl<'ast> syn::visit::Visit<'ast> for Find {
        fn visit_trait_bound(&mut self, bound: &'ast syn::TraitBound) {
            let Some(last) = bound.path.segments.last() else { return };
            if self.0.is_some() || last.ident != "Future" {
                return syn::visit::visit_trait_bound(self, bound);
            }
            if let PathArguments::AngleBracketed(args) = &last.arguments {
                for arg in &args.args {
                    if let GenericArgument::AssocType(assoc) = arg {
                        if assoc.ident == "Output" {
                            self.0 = Some(assoc.ty.clone());
                        }
                    }
                }
            }
        }
    }
    let mut find = Find(None);
    syn::visit::Visit::visit_type(&mut find, ty);
    find.0
}

/// Whether `ty` mentions a `Future` bound (such as `Pin<Box<dyn Future<…>>>`).
pub(crate) fn is_future(ty: &Type) -> bool {
    future_output(ty).is_some()
        || matches!(ty, Type::ImplTrait(t) if t.bounds.iter().any(|b| matches!(b,
            TypeParamBound::Trait(t) if t.path.segments.last().is_some_and(|s| s.ident == "Future"))))
}

/// The `T` of a return type written as `Result<T, E>`, or as an alias named `Result` that fixes
/// the error type (`io::Result<T>`, `anyhow::Result<T>`): the type is recognised by its last
/// path segment being exactly `Result` with one or two type arguments, since a macro cannot see
/// through other aliases.
pub(crate) fn result_ok_type(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Paren(inner) => result_ok_type(&inner.elem),
        Type::Group(inner) => result_ok_type(&inner.elem),
        Type::Path(path) if path.qself.is_none() => {
            let last = path.path.segments.last()?;
            if last.ident != "Result" {
                return None;
            }
            let PathArguments::AngleBracketed(args) = &last.arguments else { return None };
            let types: Vec<&Type> = args
                .args
                .iter()
                .filter_map(|arg| match arg {
                    GenericArgument::Type(ty) => Some(ty),
                    _ => None,
                })
                .collect();
            match types.as_slice() {
                [ok] | [ok, _] => Some(ok),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The first borrowed type (`&'static str`, `&[u8]`) inside `ty`: a replay deserializes the
/// result from the store, which can only give owned values.
pub(crate) fn borrowed_part(ty: &Type) -> Option<&Type> {
    struct Find<'ast>(Option<&'ast Type>);
    impl<'ast> syn::visit::Visit<'ast> for Find<'ast> {
        fn visit_type(&mut self, ty: &'ast Type) {
            if self.0.is_none() {
                match ty {
                    Type::Reference(_) => self.0 = Some(ty),
                    _ => syn::visit::visit_type(self, ty),
                }
            }
        }
    }
    let mut find = Find(None);
    syn::visit::Visit::visit_type(&mut find, ty);
    find.0
}

/// Whether the signature proves the function sits in an `impl` or a trait: a receiver, or `Self`
/// anywhere in it. Without that proof it may be a free function.
pub(crate) fn is_surely_in_impl(sig: &syn::Signature) -> bool {
    sig.receiver().is_some()
        || mentions_self_type(sig.generics.to_token_stream())
        || mentions_self_type(sig.generics.where_clause.to_token_stream())
        || mentions_self_type(sig.inputs.to_token_stream())
        || mentions_self_type(sig.output.to_token_stream())
}

/// Whether `tokens` name `Self` anywhere.
pub(crate) fn mentions_self_type(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ident == "Self",
        TokenTree::Group(group) => mentions_self_type(group.stream()),
        _ => false,
    })
}
