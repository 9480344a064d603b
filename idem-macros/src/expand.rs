//! Turning a validated tool into code: the original function, its body wrapped in the engine
//! the way `#[instrument]` wraps one, and its companion classification.
//!
//! Every token the expansion writes has a `Span::mixed_site()` resolution, so that its bindings
//! (`__idem_call`, `__idem_args`, …) and the user's parameters cannot see one another, whatever
//! the parameters are named; only the user's own tokens resolve at the call site.

use std::time::Duration;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{ItemFn, Path};

use crate::attr::{take_param_options, Attr, Options};
use crate::checked::{Flatten, Reconciler, Tool};
use crate::companion;
use crate::signature::{self, Shape};
use crate::spans::respan;
use crate::validate;

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
    let param_options = take_param_options(&mut item, &mut errors);
    let options = match syn::parse2::<Options>(options) {
        Ok(options) => options,
        Err(error) => {
            errors.push(error);
            return with_errors(item.into_token_stream(), errors);
        }
    };
    let (mut options, mut param_options) = (options, param_options);
    let transaction = validate::take_transaction(attr, &mut options, &mut item, &mut errors);
    // The parameters' options follow the signature, which no longer has the transaction's.
    if let Some(at) = transaction.as_ref().and_then(|taken| taken.at) {
        param_options.remove(at);
    }
    let mut tool = validate::tool(attr, options, &item, &param_options, &mut errors);
    tool.transaction = transaction;
    if !errors.is_empty() {
        return with_errors(item.into_token_stream(), errors);
    }
    let companion = companion_of(&tool, &item);
    if attr == Attr::Idempotent {
        wrap_body(&tool, &mut item);
    }
    if tool.unmarked_method {
        item.block.stmts.insert(0, not_an_rmcp_tool(&tool.krate, &item.sig.ident));
    }
    quote!(#item #companion)
}

/// The check that a method outside `#[idem::tools]` is not an rmcp `#[tool]` written above ours,
/// which has expanded and taken itself off before ours runs (see the runtime's
/// `for_macros/rmcp_tool.rs`): a fallback `<method>_tool_attr()`, which the inherent function
/// rmcp's `#[tool]` adds would shadow, named in a closure that is never called, so that it costs
/// nothing at run time. Located at the method's name; the type it passes is named like the
/// method, so that the message names it.
fn not_an_rmcp_tool(krate: &Path, method: &syn::Ident) -> syn::Stmt {
    let mixed = Span::mixed_site();
    let mut marker = method.clone();
    marker.set_span(mixed);
    // rmcp's `format_ident!("{}_tool_attr", …)` drops the `r#` of a raw name.
    let tool_attr = format_ident!("{}_tool_attr", method.unraw(), span = mixed);
    let fallback = syn::Ident::new("Fallback", mixed);
    let this = quote_spanned!(Span::call_site()=> Self);
    let check = respan(
        quote_spanned!(mixed=> #krate::__private::not_an_rmcp_tool(#marker, #this::#tool_attr)),
        method.span(),
    );
    syn::parse_quote_spanned! {mixed=>
        {
            struct #marker;
            trait #fallback {
                fn #tool_attr() -> #krate::__private::NoToolAttr {
                    #krate::__private::NoToolAttr
                }
            }
            impl<T: ?::core::marker::Sized> #fallback for T {}
            let _ = || #check;
        }
    }
}

/// The companion the attribute declares beside `item`, if it declares one there.
fn companion_of(tool: &Tool, item: &ItemFn) -> TokenStream {
    if !companion::declares_companion(item) {
        return TokenStream::new();
    }
    let scope = tool.scope.as_ref().map(|scope| scope.text.as_str());
    let info = companion::info(
        &tool.krate,
        tool.attr,
        &tool.name_tokens(),
        scope,
        tool.destructive,
        tool.approval.is_some(),
    );
    companion::declaration(&tool.krate, &item.vis, &item.sig.ident, &info)
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
    let mixed = Span::mixed_site();
    let json = json_wrapper(output);
    // A `Json<T>` (rmcp's, axum's) is not itself `Serialize`: the engine stores and replays the
    // `T` inside it, and the wrapper is put back around whichever one comes out.
    let (unwrap, rewrap) = match &json {
        Some(wrapper) => (
            quote_spanned!(mixed=> .map(|__idem_ok| __idem_ok.0)),
            quote_spanned!(mixed=> .map(|__idem_ok| #wrapper(__idem_ok))),
        ),
        None => (TokenStream::new(), TokenStream::new()),
    };
    let reconcile = tool.reconcile.as_ref().map(|r| reconcile_closure(krate, r, tool.shape));
    let (reconciler, reconciled) = match &reconcile {
        Some(closure) => (
            quote_spanned!(mixed=> let __idem_reconcile = #closure;),
            quote_spanned!(mixed=> __idem_reconcile,),
        ),
        None => (TokenStream::new(), TokenStream::new()),
    };
    let (run_sync, run_async) = match reconcile {
        Some(_) => (quote!(run_sync_reconciled), quote!(run_async_reconciled)),
        None => (quote!(run_sync), quote!(run_async)),
    };
    if let (Some(_), Shape::Async | Shape::Boxed) = (&tool.transaction, tool.shape) {
        let block = async_block(item, tool.shape);
        *block = async_transactional(tool, &prepare, output, block, &unwrap, &rewrap);
        return;
    }
    if let Some(transaction) = &tool.transaction {
        // Validated: sync, with a store, no reconciler.
        let run = respan(quote_spanned!(mixed=> #krate::__private::run_transactional), span);
        let store = tool.store.as_ref().expect("validated: a transactional tool names its store");
        let (name, ty) = (&transaction.name, &transaction.ty);
        let body = &item.block;
        *item.block = syn::parse_quote_spanned!(mixed=> {
            #prepare
            let __idem_body = move |#name: #ty| -> #output #body;
            let __idem_store = {
                #[allow(unused_imports)]
                use #krate::__private::{TxStoreFromFn as _, TxStoreFromStatic as _};
                (#store).__idem_tx_store()
            };
            #run(__idem_call, __idem_store, move |__idem_tx| __idem_body(__idem_tx) #unwrap) #rewrap
        });
        return;
    }
    match tool.shape {
        Shape::Sync => {
            let run = respan(quote_spanned!(mixed=> #krate::__private::#run_sync), span);
            let body = &item.block;
            let closure = if json.is_some() {
                // The user's closure is called where it is made, so that it may be `FnMut`
                // (a `&mut self` method) without a `mut` binding.
                quote_spanned!(mixed=> move || {
                    let __idem_ret: #output = (move || -> #output #body)();
                    __idem_ret #unwrap
                })
            } else {
                quote_spanned!(mixed=> move || -> #output #body)
            };
            *item.block = syn::parse_quote_spanned!(mixed=> {
                #prepare
                let __idem_body = #closure;
                #reconciler
                #run(__idem_call, #reconciled __idem_body) #rewrap
            });
        }
        Shape::Future => {
            let run = respan(quote_spanned!(mixed=> #krate::__private::#run_async), span);
            let codec = respan(quote_spanned!(mixed=> #krate::__private::codec_of), span);
            let body = &item.block;
            *item.block = syn::parse_quote_spanned!(mixed=> {
                #prepare
                let __idem_body = move || #body;
                let __idem_codec = #codec(&__idem_body);
                #reconciler
                #run(__idem_codec, __idem_call, #reconciled __idem_body)
            });
        }
        Shape::Async | Shape::Boxed => {
            let run = Run { run: run_async, reconciler, reconciled };
            let block = async_block(item, tool.shape);
            *block = async_body(krate, &prepare, output, block, span, &unwrap, &rewrap, &run);
        }
    }
}

/// How an async body reaches the engine: the entry point, and the reconciler's binding and
/// argument when the tool has one.
struct Run {
    run: TokenStream,
    reconciler: TokenStream,
    reconciled: TokenStream,
}

/// The closure that asks a tool's reconciler about its key: `reconcile(&key)`, or for a method
/// `Self::reconcile(self, &key)`; an async tool's returns the answer's future, which keeps the
/// key. `self` and `Self` are the user's (call-site), so that they name the method's receiver.
/// The block an async tool's body runs in: the function's own (`async fn`), or the one inside
/// its `Box::pin(async move { … })` (a boxed future).
fn async_block(item: &mut ItemFn, shape: Shape) -> &mut syn::Block {
    if shape == Shape::Boxed {
        &mut signature::boxed_async_block(&mut item.block)
            .expect("validated: a boxed async body")
            .block
    } else {
        &mut item.block
    }
}

fn reconcile_closure(krate: &syn::Path, reconciler: &Reconciler, shape: Shape) -> TokenStream {
    let mixed = Span::mixed_site();
    let path = &reconciler.path;
    let target = if reconciler.method {
        quote_spanned!(reconciler.span=> Self::#path)
    } else {
        quote!(#path)
    };
    let receiver = if reconciler.method {
        quote_spanned!(Span::call_site()=> self,)
    } else {
        TokenStream::new()
    };
    if shape == Shape::Sync {
        let ask = respan(quote_spanned!(mixed=> #krate::__private::ask_sync), reconciler.span);
        quote_spanned! {mixed=>
            move |__idem_key: &#krate::__private::Key| #ask(#target, (#receiver __idem_key,))
        }
    } else {
        // Awaited where it is named, so that an answer of the wrong type, which the compiler
        // reports at the call and again at the `.await`, is reported once.
        let ask = respan(
            quote_spanned!(mixed=> #krate::__private::ask_async(#target, (#receiver &__idem_key,)).await),
            reconciler.span,
        );
        quote_spanned! {mixed=>
            move |__idem_key: #krate::__private::Key| async move { #ask }
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
#[allow(clippy::too_many_arguments)]
fn async_body(
    krate: &syn::Path,
    prepare: &TokenStream,
    output: &syn::Type,
    body: &syn::Block,
    span: Span,
    unwrap: &TokenStream,
    rewrap: &TokenStream,
    run: &Run,
) -> syn::Block {
    let mixed = Span::mixed_site();
    let Run { run, reconciler, reconciled } = run;
    // The result and error types are checked once, by the sync `codec_of`, spanned like the
    // return type; the engine's future has no bounds on them left to check where it is awaited.
    let codec = respan(quote_spanned!(mixed=> #krate::__private::codec_of), span);
    let run = respan(
        quote_spanned!(mixed=> #krate::__private::#run(__idem_codec, __idem_call, #reconciled __idem_body).await),
        span,
    );
    syn::parse_quote_spanned!(mixed=> {
        #prepare
        let __idem_body = move || async move {
            let __idem_ret: #output = #body;
            __idem_ret #unwrap
        };
        let __idem_codec = #codec(&__idem_body);
        #reconciler
        #run #rewrap
    })
}

/// An async transactional body: an async closure over the transaction parameter, which the
/// store named lends (`__private::AsyncTransactional`, implemented by the store's crate), run on
/// the engine's transactional path. The bound is checked where the store is named, so that a
/// store that lends no such transaction is reported there, in our words: the parameter's type,
/// named as `fn(TX)`, rules out the impls of other drivers before the body's signature is
/// compared (else a store with one impl, for another driver, is a closure signature mismatch
/// in rustc's words).
fn async_transactional(
    tool: &Tool,
    prepare: &TokenStream,
    output: &syn::Type,
    body: &syn::Block,
    unwrap: &TokenStream,
    rewrap: &TokenStream,
) -> syn::Block {
    let krate = &tool.krate;
    let mixed = Span::mixed_site();
    let transaction = tool.transaction.as_ref().expect("called for a transactional tool");
    let store = tool.store.as_ref().expect("validated: a transactional tool names its store");
    let (name, ty) = (&transaction.name, &transaction.ty);
    let run = respan(
        quote_spanned!(mixed=> #krate::__private::run_transactional_async::<_, fn(#ty), _, _, _>(
            __idem_call,
            __idem_store,
            __idem_body,
        ).await),
        store.span(),
    );
    syn::parse_quote_spanned!(mixed=> {
        #prepare
        let __idem_body = async move |#name: #ty| {
            let __idem_ret: #output = #body;
            __idem_ret #unwrap
        };
        let __idem_store = {
            #[allow(unused_imports)]
            use #krate::__private::{AsyncTxStoreFromFn as _, AsyncTxStoreFromStatic as _};
            (#store).__idem_async_tx_store()
        };
        #run #rewrap
    })
}

/// `let __idem_call: Result<Call, Error> = …;` from the key parameters and the options. Each key
/// parameter is added in a statement of its own that carries the parameter's `#[cfg]`s.
fn prepare_call(tool: &Tool) -> TokenStream {
    let krate = &tool.krate;
    let name = tool.name_tokens();
    let mixed = Span::mixed_site();
    let args = tool.key_params.iter().map(|param| {
        let (ident, label, cfgs) = (&param.name, &param.label, &param.cfgs);
        // Located at the parameter's type, the parameter's own name included (it keeps its
        // resolution), so that a key parameter that is not `Serialize` is reported there.
        let key_arg = respan(
            quote_spanned!(mixed=> #krate::__private::key_arg(__idem_args, #label, &#ident)),
            param.ty.span(),
        );
        quote_spanned! {mixed=>
            #(#cfgs)*
            let __idem_args = __idem_args.and_then(|__idem_args| #key_arg);
        }
    });
    let flatten = tool.flatten.as_ref().map(|flat| flatten_args(krate, flat));
    let scope = tool.scope.as_ref().expect("validated: an idempotent tool has a scope");
    let (param, fields) = (&scope.param, &scope.fields);
    let scope_fn = respan(quote_spanned!(mixed=> #krate::__private::scope), param.span());
    // A transactional tool's store is typed, and handed to the engine beside the call.
    let store = tool.store.as_ref().filter(|_| tool.transaction.is_none()).map(|path| {
        quote_spanned! {mixed=>
            .and_then(|__idem_call| {
                #[allow(unused_imports)]
                use #krate::__private::{StoreFromFn as _, StoreFromStatic as _};
                (#path).__idem_store().map(|__idem_store| __idem_call.store(__idem_store))
            })
        }
    });
    let wait = tool.wait.map(|wait| {
        let wait = duration(wait);
        quote_spanned!(mixed=> .map(|__idem_call| __idem_call.wait(#wait)))
    });
    let ttl = tool.ttl.map(|ttl| {
        let ttl = duration(ttl);
        quote_spanned!(mixed=> .map(|__idem_call| __idem_call.ttl(#ttl)))
    });
    let rerun = tool.rerun.then(|| {
        quote_spanned! {mixed=>
            .map(|__idem_call| __idem_call.in_doubt(#krate::__private::InDoubtPolicy::Rerun))
        }
    });
    let approval = tool.approval.as_ref().map(|approval| {
        let required = match &approval.condition {
            // The condition's tokens keep the literal's span, so its names are the parameters.
            Some(condition) => {
                let check = respan(
                    quote_spanned!(mixed=> #krate::__private::approval_condition),
                    approval.span,
                );
                quote!(#check(#condition))
            }
            None => quote!(true),
        };
        let ttl = approval.ttl.map(|ttl| {
            let ttl = duration(ttl);
            quote_spanned!(mixed=> .map(|__idem_call| __idem_call.approval_ttl(#ttl)))
        });
        let wait = approval.wait.map(|wait| {
            let wait = duration(wait);
            quote_spanned!(mixed=> .map(|__idem_call| __idem_call.approve_wait(#wait)))
        });
        // Last: `approval_ttl` and `approve_wait` imply approval, which a false condition undoes.
        quote_spanned! {mixed=>
            #ttl
            #wait
            .map(|__idem_call| __idem_call.approve(#required))
        }
    });
    // Two tools with one name share their keys: the record says which function wrote it, so
    // that the other is refused instead of replaying it.
    let function = tool.function.as_ref().map(|function| {
        quote_spanned! {mixed=>
            .map(|__idem_call| __idem_call.function(
                ::core::concat!(::core::module_path!(), "::", #function)
            ))
        }
    });
    quote_spanned! {mixed=>
        let __idem_args = #krate::__private::args(#name);
        #(#args)*
        #flatten
        let __idem_call = __idem_args
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
            #rerun
            #approval;
    }
}

/// The statements that add a flattened parameter's fields to the key's arguments, less the
/// fields its `ignore` names.
fn flatten_args(krate: &Path, flat: &Flatten) -> TokenStream {
    let mixed = Span::mixed_site();
    let ident = &flat.name;
    let label = ident.unraw().to_string();
    let flatten_arg = respan(
        quote_spanned!(mixed=> #krate::__private::flatten_arg(__idem_args, #label, &#ident)),
        flat.ty.span(),
    );
    let ignore = (!flat.ignore.is_empty()).then(|| {
        // An access to each field, spanned on its name, so that a name that is not a field
        // of the object is rustc's "no field `…` on type `…`" there, listing the fields.
        let fields = flat.ignore.iter().map(|ignored| &ignored.field);
        let labels = flat.ignore.iter().map(|ignored| &ignored.label);
        quote_spanned! {mixed=>
            #(let _ = &#ident.#fields;)*
            let __idem_args = __idem_args.map(|__idem_args| __idem_args.ignoring(&[#(#labels),*]));
        }
    });
    quote_spanned! {mixed=>
        let __idem_args = __idem_args.and_then(|__idem_args| #flatten_arg);
        #ignore
    }
}

fn duration(duration: Duration) -> TokenStream {
    let (secs, nanos) = (duration.as_secs(), duration.subsec_nanos());
    quote_spanned!(Span::mixed_site()=> ::core::time::Duration::new(#secs, #nanos))
}
