//! `#[idem::tools]` on an `impl` block: the compile-time classification of its methods. The
//! attribute on a method declares its companion constant (`__idem_tool_<name>`, see `classify`)
//! only where it can prove nothing about being in an `impl`; a method taking `self`, naming
//! `Self` or boxed by `#[async_trait]` or rmcp's `#[tool]` gets none from it, because a trait
//! impl cannot hold one. So this attribute declares exactly those companions, in a second,
//! inherent impl of the same type beside the block, together with `idem_tools()` listing every
//! classified method.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, ImplItem, ImplItemFn, ItemFn, LitStr, Path, Token};

use crate::args::{Attr, Options};

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
    let block: syn::ItemImpl = match syn::parse2(item.clone()) {
        Ok(block) => block,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "`#[idem::tools]` goes on an `impl` block (inherent, or a trait impl such as \
                 rig's `impl Tool for …`), whose `#[read]`, `#[idempotent]` and `#[write]` \
                 methods it classifies; on a free function, the attribute alone is enough",
            )
            .into_compile_error();
            return quote!(#error #item);
        }
    };
    let options = match syn::parse2::<ToolsOptions>(options) {
        Ok(options) => options,
        Err(error) => {
            let error = error.into_compile_error();
            return quote!(#error #item);
        }
    };
    let krate: Path = match &options.krate {
        Some(lit) => match lit.parse() {
            Ok(path) => path,
            Err(_) => {
                let error = syn::Error::new_spanned(
                    lit,
                    "`crate` must be a path to the idem facade, such as \"::idem\" or \"my_idem\"",
                )
                .into_compile_error();
                return quote!(#error #item);
            }
        },
        None => syn::parse_quote!(::idem),
    };

    let mixed = Span::mixed_site();
    let mut consts = Vec::new();
    let mut listed = Vec::new();
    let mut reconcilers = Vec::new();
    for member in &block.items {
        let ImplItem::Fn(method) = member else { continue };
        let Some((attr, options, rewritten)) = classification(&method.attrs) else { continue };
        let ident = &method.sig.ident;
        let name = options
            .tool
            .as_ref()
            .map(|tool| tool.value.value())
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| syn::ext::IdentExt::unraw(ident).to_string());
        let kind = match (attr, &options.scope) {
            (Attr::Read, _) => quote_spanned!(mixed=> #krate::__private::Kind::Read),
            (Attr::Idempotent, Some(scope)) => {
                let scope = scope_text(&scope.value.value());
                quote_spanned!(mixed=> #krate::__private::Kind::Idempotent { scope: #scope })
            }
            // No scope is the attribute's own error; classify it as what it would do now.
            (Attr::Idempotent, None) | (Attr::Write, _) => {
                quote_spanned!(mixed=> #krate::__private::Kind::Write)
            }
        };
        let info = quote_spanned!(mixed=> #krate::__private::ToolInfo { name: #name, kind: #kind });
        // rmcp's `#[tool]` above ours turns an `async fn` into a boxed one before ours sees it.
        let boxed_by_tool = rewritten && method.sig.asyncness.is_some();
        if boxed_by_tool || !crate::validate::declares_companion(&as_item_fn(method)) {
            let companion = crate::classify::companion_name(ident);
            consts.push(quote_spanned! {mixed=>
                #[doc(hidden)]
                #[allow(non_upper_case_globals, dead_code)]
                pub const #companion: ::core::option::Option<#krate::__private::ToolInfo> =
                    ::core::option::Option::Some(#info);
            });
        }
        if attr == Attr::Idempotent {
            reconcilers.extend(sweep_entry(&krate, method, &options, &name));
        }
        listed.push(info);
    }
    // Only a block with reconcilers gets a sweep: it asks through `&self`, which a sweep that
    // may run on any thread needs to share (`Self: Sync`).
    let sweep = (!reconcilers.is_empty()).then(|| {
        // The receiver the entries name, at the call site as theirs are.
        let this = quote_spanned!(Span::call_site()=> self);
        quote_spanned! {mixed=>
            /// A sweep of the keys in doubt of this block's tools that name a reconciler, asking
            /// each through `self`, over the process default store (`.store(…)` sets another).
            #[allow(dead_code)]
            pub fn idem_sweep(&#this) -> #krate::__private::Sweep<'_> {
                #krate::__private::Sweep::new() #(#reconcilers)*
            }
        }
    });

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
    let path: Path = options.reconcile.as_ref()?.value.parse().ok()?;
    let receiver = method.sig.receiver();
    if receiver
        .is_some_and(|r| r.reference.is_none() || r.mutability.is_some() || r.colon_token.is_some())
    {
        return None;
    }
    let (target, receiver) = match (receiver, path.get_ident()) {
        (Some(_), Some(_)) => (quote!(Self::#path), quote_spanned!(Span::call_site()=> self,)),
        _ => (quote!(#path), TokenStream::new()),
    };
    let shape = crate::output::shape_and_output(&as_item_fn(method)).0;
    Some(if shape == crate::output::Shape::Sync {
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

/// The method as the attribute on it sees it, for `validate::declares_companion`.
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
        let path = attr.path();
        let ours = path.segments.len() == 1
            || (path.segments.len() == 2 && path.segments[0].ident == "idem");
        let kind = match path.segments.last()?.ident.to_string().as_str() {
            "read" => Attr::Read,
            "idempotent" => Attr::Idempotent,
            "write" => Attr::Write,
            _ => return None,
        };
        if !ours {
            return None;
        }
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
