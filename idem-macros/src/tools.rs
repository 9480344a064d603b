//! `#[idem::tools]` on an `impl` block: the compile-time classification of its methods. The
//! attribute on a method declares its companion constant (`__idem_tool_<name>`, see `companion`)
//! only where it can prove nothing about being in an `impl`; a method taking `self`, naming
//! `Self` or boxed by `#[async_trait]` or rmcp's `#[tool]` gets none from it, because a trait
//! impl cannot hold one. So this attribute declares exactly those companions, in a second,
//! inherent impl of the same type beside the block, together with `idem_tools()` listing every
//! classified method.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, ImplItem, ImplItemFn, ItemFn, LitStr, Path, Token, Visibility};

use crate::attr::{Attr, Options};
use crate::companion;
use crate::signature::{self, Shape};
use crate::validate;

/// The options of `#[idem::tools(…)]`: only `crate = "path"`.
struct ToolsOptions {
    krate: Option<LitStr>,
}

impl Parse for ToolsOptions {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.is_empty() {
            return Ok(ToolsOptions { krate: None });
        }
        input.parse::<Token![crate]>().map_err(|error| {
            syn::Error::new(
                error.span(),
                "`#[idem::tools]` takes no options but `crate = \"path\"`; the tools' own \
                 options go on their `#[read]`, `#[idempotent]` or `#[write]`",
            )
        })?;
        input.parse::<Token![=]>()?;
        let krate = input.parse()?;
        input.parse::<Option<Token![,]>>()?;
        Ok(ToolsOptions { krate: Some(krate) })
    }
}

/// Expands `#[idem::tools]`. The block itself is emitted unchanged, so that the methods'
/// attributes (ours, rmcp's `#[tool]`) expand as usual, whichever order they are stacked in.
pub(crate) fn expand(options: TokenStream, item: TokenStream) -> TokenStream {
    let (block, krate) = match parse(options, item.clone()) {
        Ok(parsed) => parsed,
        Err(error) => {
            let error = error.into_compile_error();
            return quote!(#error #item);
        }
    };

    let mut consts = Vec::new();
    let mut listed = Vec::new();
    let mut reconcilers = Vec::new();
    for member in &block.items {
        let ImplItem::Fn(method) = member else { continue };
        let Some((attr, options, rewritten)) = classification(&method.attrs) else { continue };
        let name = options
            .tool
            .as_ref()
            .map(|tool| tool.value.value())
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| method.sig.ident.unraw().to_string());
        let scope = options.scope.as_ref().map(|scope| scope_text(&scope.value.value()));
        let info = companion::info(&krate, attr, &name, scope.as_deref());
        // rmcp's `#[tool]` above ours turns an `async fn` into a boxed one before ours sees it.
        let boxed_by_tool = rewritten && method.sig.asyncness.is_some();
        if boxed_by_tool || !companion::declares_companion(&as_item_fn(method)) {
            let public = Visibility::Public(Token![pub](Span::mixed_site()));
            consts.push(companion::declaration(&krate, &public, &method.sig.ident, &info));
        }
        if attr == Attr::Idempotent {
            reconcilers.extend(sweep_entry(&krate, method, &options, &name));
        }
        listed.push(info);
    }
    let sweep = sweep(&krate, &reconcilers);

    let (impl_generics, _, where_clause) = block.generics.split_for_impl();
    let self_ty = &block.self_ty;
    quote! {
        #block

        impl #impl_generics #self_ty #where_clause {
            #(#consts)*

            /// The idem classification of the tools of this type's `#[idem::tools]` block, in
            /// the block's order: their names and kinds, and the MCP hints that follow.
            #[allow(dead_code)]
            pub fn idem_tools() -> &'static [#krate::__private::ToolInfo] {
                const TOOLS: &[#krate::__private::ToolInfo] = &[#(#listed),*];
                TOOLS
            }

            #sweep
        }
    }
}

/// The `impl` block and the facade's path, or the error that `item` is not a block or the
/// options are not `crate = "path"`.
fn parse(options: TokenStream, item: TokenStream) -> syn::Result<(syn::ItemImpl, Path)> {
    let block: syn::ItemImpl = syn::parse2(item).map_err(|_| {
        syn::Error::new(
            Span::call_site(),
            "`#[idem::tools]` goes on an `impl` block (inherent, or a trait impl such as \
             rig's `impl Tool for …`), whose `#[read]`, `#[idempotent]` and `#[write]` \
             methods it classifies; on a free function, the attribute alone is enough",
        )
    })?;
    let options = syn::parse2::<ToolsOptions>(options)?;
    let krate = match &options.krate {
        Some(lit) => lit.parse().map_err(|_| {
            syn::Error::new_spanned(
                lit,
                "`crate` must be a path to the idem facade, such as \"::idem\" or \"my_idem\"",
            )
        })?,
        None => syn::parse_quote!(::idem),
    };
    Ok((block, krate))
}

/// `idem_sweep(&self)`, for a block with reconcilers: a sweep asks through `&self`, which a sweep
/// that may run on any thread needs to share (`Self: Sync`), so a block without any gets none.
fn sweep(krate: &Path, reconcilers: &[TokenStream]) -> Option<TokenStream> {
    (!reconcilers.is_empty()).then(|| {
        // The receiver the entries name, at the call site as theirs are.
        let this = quote_spanned!(Span::call_site()=> self);
        quote_spanned! {Span::mixed_site()=>
            /// A sweep of the keys in doubt of this block's tools that name a reconciler, asking
            /// each through `self`, over the process default store (`.store(…)` sets another).
            #[allow(dead_code)]
            pub fn idem_sweep(&#this) -> #krate::__private::Sweep<'_> {
                #krate::__private::Sweep::new() #(#reconcilers)*
            }
        }
    })
}

/// The sweep's entry for a method's `reconcile = "…"`: its tool name and a closure asking the
/// reconciler, as the attribute's expansion asks it (a method name gets `self`). `None` where the
/// attribute will refuse the option, which it reports itself.
fn sweep_entry(
    krate: &Path,
    method: &ImplItemFn,
    options: &Options,
    name: &str,
) -> Option<TokenStream> {
    let mixed = Span::mixed_site();
    let written = &options.reconcile.as_ref()?.value;
    // The attribute's own check, whose errors the attribute reports when it expands.
    let reconciler = validate::reconciler(written, &method.sig, &mut Vec::new())?;
    let path = &reconciler.path;
    let (target, receiver) = if reconciler.method {
        (quote!(Self::#path), quote_spanned!(Span::call_site()=> self,))
    } else {
        (quote!(#path), TokenStream::new())
    };
    let shape = signature::shape_and_output(&as_item_fn(method)).0;
    Some(if shape == Shape::Sync {
        quote_spanned! {mixed=>
            .tool(#name, move |__idem_key: &#krate::__private::Key| {
                #krate::__private::ask_sync(#target, (#receiver __idem_key,))
            })
        }
    } else {
        quote_spanned! {mixed=>
            .tool_async(#name, move |__idem_key: #krate::__private::Key| async move {
                #krate::__private::ask_async(#target, (#receiver &__idem_key,)).await
            })
        }
    })
}

/// `r#type.id` as a user reads it, `type.id`, as the attribute writes a scope's text.
fn scope_text(written: &str) -> String {
    written
        .split('.')
        .map(|segment| segment.strip_prefix("r#").unwrap_or(segment))
        .collect::<Vec<_>>()
        .join(".")
}

/// The method as the attribute on it sees it, for `companion::declares_companion`.
fn as_item_fn(method: &ImplItemFn) -> ItemFn {
    ItemFn {
        attrs: method.attrs.clone(),
        vis: method.vis.clone(),
        sig: method.sig.clone(),
        block: Box::new(method.block.clone()),
    }
}

/// The method's classification attribute, its options, and whether an `async fn` is boxed by
/// rmcp's `#[tool]` written above it before ours expands. Options that do not parse are the
/// attribute's own error, reported when it expands.
fn classification(attrs: &[Attribute]) -> Option<(Attr, Options, bool)> {
    attrs.iter().enumerate().find_map(|(index, attr)| {
        let kind = Attr::named_by(attr.path())?;
        let options = match &attr.meta {
            syn::Meta::Path(_) => Options::default(),
            _ => attr.parse_args::<Options>().unwrap_or_default(),
        };
        let rewritten = attrs[..index]
            .iter()
            .any(|before| before.path().segments.last().is_some_and(|last| last.ident == "tool"));
        Some((kind, options, rewritten))
    })
}
