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
    let param_options = args::take_param_options(&mut item, &mut errors);
    let options = match syn::parse2::<Options>(options) {
        Ok(options) => options,
        Err(error) => {
            errors.push(error);
            return with_errors(item.into_token_stream(), errors);
        }
    };
    let tool = validate::tool(attr, options, &item, &param_options, &mut errors);
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
    let json = json_wrapper(output);
    // A `Json<T>` (rmcp's, axum's) is not itself `Serialize`: the engine stores and replays the
    // `T` inside it, and the wrapper is put back around whichever one comes out.
    let (unwrap, rewrap) = match &json {
        Some(wrapper) => {
            (quote!(.map(|__idem_ok| __idem_ok.0)), quote!(.map(|__idem_ok| #wrapper(__idem_ok))))
        }
        None => (TokenStream::new(), TokenStream::new()),
    };
    match tool.shape {
        Shape::Sync => {
            let run = respan(quote!(#krate::__private::run_sync(__idem_call, __idem_body)), span);
            let body = &item.block;
            let closure = if json.is_some() {
                // The user's closure is called where it is made, so that it may be `FnMut`
                // (a `&mut self` method) without a `mut` binding.
                quote!(move || {
                    let __idem_ret: #output = (move || -> #output #body)();
                    __idem_ret #unwrap
                })
            } else {
                quote!(move || -> #output #body)
            };
            item.block = syn::parse_quote!({
                #prepare
                let __idem_body = #closure;
                #run #rewrap
            });
        }
        Shape::Async => {
            let block = async_body(krate, &prepare, output, &item.block, span, &unwrap, &rewrap);
            *item.block = block;
        }
        Shape::Boxed => {
            let inner = validate::boxed_async_block_mut(&mut item.block)
                .expect("validated: a boxed async body");
            inner.block = async_body(krate, &prepare, output, &inner.block, span, &unwrap, &rewrap);
        }
    }
}

/// `Json` in `Result<Json<T>, E>`: the path of a one-field wrapper named `Json`, without its
/// generics, so that it can be called to wrap a replayed `T`.
fn json_wrapper(output: &syn::Type) -> Option<syn::Path> {
    let syn::Type::Path(result) = output else { return None };
    let last = result.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else { return None };
    let Some(syn::GenericArgument::Type(syn::Type::Path(ok))) = args.args.first() else {
        return None;
    };
    let wrapper = ok.path.segments.last()?;
    if ok.qself.is_some() || wrapper.ident != "Json" {
        return None;
    }
    let mut path = ok.path.clone();
    for segment in &mut path.segments {
        segment.arguments = syn::PathArguments::None;
    }
    Some(path)
}

/// An async body behind the engine: the original block becomes the future the engine runs once.
fn async_body(
    krate: &syn::Path,
    prepare: &TokenStream,
    output: &syn::Type,
    body: &syn::Block,
    span: Span,
    unwrap: &TokenStream,
    rewrap: &TokenStream,
) -> syn::Block {
    // `.await` spanned like the call, so that a bound the compiler checks again where the
    // future is awaited is the same diagnostic, at the same place, and reported once.
    let run = respan(quote!(#krate::__private::run_async(__idem_call, __idem_body).await), span);
    syn::parse_quote!({
        #prepare
        let __idem_body = move || async move {
            let __idem_ret: #output = #body;
            __idem_ret #unwrap
        };
        #run #rewrap
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
    let flatten = tool.flatten.as_ref().map(|flat| {
        let ident = &flat.name;
        let label = ident.to_string();
        let flatten_arg = respan(
            quote!(#krate::__private::flatten_arg(__idem_args, #label, &#ident)),
            flat.ty.span(),
        );
        quote!(.and_then(|__idem_args| #flatten_arg))
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
    let rerun = tool
        .rerun
        .then(|| quote!(.map(|__idem_call| __idem_call.in_doubt(#krate::__private::InDoubtPolicy::Rerun))));
    quote! {
        let __idem_call = #krate::__private::args(#name)
            #(#args)*
            #flatten
            .map(|__idem_args| {
                #krate::__private::Call::from_canonical(
                    #name,
                    #scope_fn(&#param #(.#fields)*),
                    &__idem_args.canonical(),
                )
            })
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
