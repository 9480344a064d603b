//! Turning a validated tool into code: the original function, its body wrapped in the engine
//! the way `#[instrument]` wraps one, and its companion classification.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{quote, ToTokens};
use syn::spanned::Spanned;
use syn::ItemFn;

use crate::args::{self, Attr, Options};
use crate::classify;
use crate::validate::{self, Shape, Tool};

/// Expands one attribute. On any error the function is still emitted (without our helper
/// attributes) beside the errors, so that one mistake does not bury the user in others.
pub(crate) fn attribute(attr: Attr, options: TokenStream, item: TokenStream) -> TokenStream {
    let mut item: ItemFn = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                format!("`#[{}]` goes on a function (a free fn or a method)", attr.name()),
            );
            return with_errors(item, vec![error]);
        }
    };
    let mut errors = Vec::new();
    let skips = args::take_param_options(&mut item, &mut errors);
    let options = match syn::parse2::<Options>(options) {
        Ok(options) => options,
        Err(error) => {
            errors.push(error);
            return with_errors(item.into_token_stream(), errors);
        }
    };
    let tool = validate::tool(attr, options, &item, &skips, &mut errors);
    if !errors.is_empty() {
        return with_errors(item.into_token_stream(), errors);
    }
    let companion = classify::companion(&tool, &item);
    if attr == Attr::Idempotent {
        wrap_body(&tool, &mut item);
    }
    quote!(#item #companion)
}

fn with_errors(item: TokenStream, errors: Vec<syn::Error>) -> TokenStream {
    let mut errors = errors.into_iter();
    let mut combined = errors.next().expect("called with at least one error");
    for error in errors {
        combined.combine(error);
    }
    let errors = combined.to_compile_error();
    quote!(#errors #item)
}

/// Puts the body behind the engine: derive the call, then run the body at most once for its key.
fn wrap_body(tool: &Tool, item: &mut ItemFn) {
    let krate = &tool.krate;
    let prepare = prepare_call(tool);
    let output = tool.output.as_ref().expect("validated: an idempotent tool returns a Result");
    let span = output.span();
    match tool.shape {
        Shape::Sync => {
            let run = respan(quote!(#krate::__private::run_sync(__idem_call, __idem_body)), span);
            let body = &item.block;
            item.block = syn::parse_quote!({
                #prepare
                let __idem_body = move || -> #output #body;
                #run
            });
        }
        Shape::Async => {
            let block = async_body(krate, &prepare, output, &item.block, span);
            *item.block = block;
        }
        Shape::Boxed => {
            let inner = validate::boxed_async_block_mut(&mut item.block)
                .expect("validated: a boxed async body");
            inner.block = async_body(krate, &prepare, output, &inner.block, span);
        }
    }
}

/// An async body behind the engine: the original block becomes the future the engine runs once.
fn async_body(
    krate: &syn::Path,
    prepare: &TokenStream,
    output: &syn::Type,
    body: &syn::Block,
    span: Span,
) -> syn::Block {
    let run = respan(quote!(#krate::__private::run_async(__idem_call, __idem_body)), span);
    syn::parse_quote!({
        #prepare
        let __idem_body = move || async move {
            let __idem_ret: #output = #body;
            __idem_ret
        };
        #run.await
    })
}

/// `let __idem_call: Result<Call, Error> = …;` from the key parameters and the options.
fn prepare_call(tool: &Tool) -> TokenStream {
    let krate = &tool.krate;
    let name = &tool.name;
    let args = tool.key_params.iter().map(|param| {
        let ident = &param.name;
        let label = ident.to_string();
        let key_arg = respan(
            quote!(#krate::__private::key_arg(__idem_args, #label, &#ident)),
            param.ty.span(),
        );
        quote!(.and_then(|__idem_args| #key_arg))
    });
    let scope = tool.scope.as_ref().expect("validated: an idempotent tool has a scope");
    let (param, fields) = (&scope.param, &scope.fields);
    let scope_fn = respan(quote!(#krate::__private::scope), param.span());
    let store = tool.store.as_ref().map(|path| {
        quote! {
            .and_then(|__idem_call| {
                #[allow(unused_imports)]
                use #krate::__private::{StoreFromFn as _, StoreFromStatic as _};
                (#path).__idem_store().map(|__idem_store| __idem_call.store(__idem_store))
            })
        }
    });
    let wait = tool.wait_ms.map(
        |ms| quote!(.map(|__idem_call| __idem_call.wait(::core::time::Duration::from_millis(#ms)))),
    );
    let ttl = tool.ttl_ms.map(
        |ms| quote!(.map(|__idem_call| __idem_call.ttl(::core::time::Duration::from_millis(#ms)))),
    );
    // Two unpinned tools with one function name share their keys: the record says which
    // function wrote it, so that the other is refused instead of replaying it.
    let function = (!tool.pinned).then(|| {
        quote!(.map(|__idem_call| __idem_call.function(
            ::core::concat!(::core::module_path!(), "::", #name)
        )))
    });
    let rerun = tool
        .rerun
        .then(|| quote!(.map(|__idem_call| __idem_call.in_doubt(#krate::__private::InDoubtPolicy::Rerun))));
    quote! {
        let __idem_call = #krate::__private::args(#name)
            #(#args)*
            .map(|__idem_args| {
                #krate::__private::Call::from_canonical(
                    #name,
                    #scope_fn(&#param #(.#fields)*),
                    &__idem_args.canonical(),
                )
            })
            #function
            #store
            #wait
            #ttl
            #rerun;
    }
}

/// `tokens` with every span set to `span`, so that a failed bound on a generated call points at
/// the user's tokens (a path whose tokens mix spans is reported at the attribute).
pub(crate) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                token = TokenTree::Group(inner);
            }
            token.set_span(span);
            token
        })
        .collect()
}
