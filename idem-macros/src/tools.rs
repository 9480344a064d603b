//! `#[idem::tools]` on an `impl` block: the compile-time classification of its methods. The
//! attribute on a method declares its companion constant (`__idem_tool_<name>`, see `companion`)
//! only where it can prove nothing about being in an `impl`; a method taking `self`, naming
//! `Self` or boxed by `#[async_trait]` or rmcp's `#[tool]` gets none from it, because a trait
//! impl cannot hold one. So this attribute declares exactly those companions, in a second,
//! inherent impl of the same type beside the block, together with `idem_tools()` listing every
//! classified method.
//!
//! It also tells each method's attribute what only the block shows: the path its records name
//! (`Type::method`), and the name a framework gives the tool (rmcp's `#[tool(name = …)]` or the
//! method's name; rig's `<Self as Tool>::NAME` in a trait impl declaring `const NAME`), which is
//! then the tool's name everywhere. And it writes idem's MCP hints into each rmcp `#[tool]`
//! where the user set none.

use std::collections::HashMap;

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{
    Attribute, Ident, ImplItem, ImplItemFn, ItemFn, ItemImpl, LitStr, Meta, Path, Token, Visibility,
};

use crate::attr::{Attr, Opt, Options, TxParam};
use crate::companion;
use crate::router;
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

/// Expands `#[idem::tools]`. The block is emitted with each classified method's attribute told
/// where it sits (the hidden `__idem_in_tools` option: its record's path, and the name a
/// framework gives it), and each rmcp `#[tool]` given idem's hints where it sets none, so that
/// the methods' attributes (ours, rmcp's) then expand as usual, whichever order they are in.
pub(crate) fn expand(options: TokenStream, item: TokenStream) -> TokenStream {
    let (mut block, krate) = match parse(options, item.clone()) {
        Ok(parsed) => parsed,
        Err(error) => {
            let error = error.into_compile_error();
            return quote!(#error #item);
        }
    };

    match router::pending(&block) {
        Some(at) => router::wrap_later(&mut block, at, &krate),
        None => router::wrap(&mut block, &krate),
    }
    let rig = rig_name(&block);
    let type_name = type_name(&block.self_ty);
    let mut collected = Collected::default();
    for member in &mut block.items {
        if let ImplItem::Fn(method) = member {
            collected.method(&krate, rig.as_ref(), &type_name, method);
        }
    }
    let Collected { errors, consts, listed, reconcilers, .. } = collected;
    let sweep = sweep(&krate, &reconcilers);
    let errors = errors.into_iter().map(syn::Error::into_compile_error);

    let (impl_generics, _, where_clause) = block.generics.split_for_impl();
    let self_ty = &block.self_ty;
    // An associated constant, not one inside the function: a name such as rig's
    // `<Self as Tool>::NAME` needs `Self`.
    let tools = Ident::new("__IDEM_TOOLS", Span::mixed_site());
    quote! {
        #(#errors)*
        #block

        impl #impl_generics #self_ty #where_clause {
            #(#consts)*

            #[doc(hidden)]
            #[allow(dead_code)]
            const #tools: &'static [#krate::__private::ToolInfo] = &[#(#listed),*];

            /// The idem classification of the tools of this type's `#[idem::tools]` block, in
            /// the block's order: their names and kinds, and the MCP hints that follow.
            #[allow(dead_code)]
            pub fn idem_tools() -> &'static [#krate::__private::ToolInfo] {
                Self::#tools
            }

            #sweep
        }
    }
}

/// What `#[idem::tools]` gathers from the block's classified methods.
#[derive(Default)]
struct Collected {
    errors: Vec<syn::Error>,
    /// The framework names seen so far, with the method that has each.
    named: HashMap<String, String>,
    consts: Vec<TokenStream>,
    listed: Vec<TokenStream>,
    reconcilers: Vec<TokenStream>,
}

impl Collected {
    /// Gathers one method of the block, if it is classified, and tells its attributes where
    /// they sit (its record's path, the name a framework gives it, rmcp's hints).
    fn method(
        &mut self,
        krate: &syn::Path,
        rig: Option<&Framework>,
        type_name: &str,
        method: &mut ImplItemFn,
    ) {
        let Some((index, attr, options, rewritten)) = classification(&method.attrs) else {
            return;
        };
        let method_name = method.sig.ident.unraw().to_string();
        let rmcp = method.attrs.iter().position(is_rmcp_tool);
        let framework = match rmcp {
            Some(at) => Some(rmcp_name(&method.attrs[at], &method.sig.ident)),
            None => rig.cloned(),
        };
        if let Some(framework) = &framework {
            self.errors.extend(framework.conflict(options.tool.as_ref(), type_name));
            if let Some(literal) = &framework.literal {
                if let Some(other) = self.named.insert(literal.clone(), method_name.clone()) {
                    self.errors.push(syn::Error::new_spanned(
                        &method.sig.ident,
                        format!(
                            "`{other}` and `{method_name}` are both named `{literal}`, so they \
                                 would share their keys and records: give one of them another \
                                 `#[tool(name = \"…\")]`"
                        ),
                    ));
                }
            }
        }
        let name = match &framework {
            Some(framework) => framework.name.to_token_stream(),
            None => {
                let name = options
                    .tool
                    .as_ref()
                    .map(|tool| tool.value.value())
                    .filter(|name| !name.is_empty())
                    .unwrap_or_else(|| method_name.clone());
                LitStr::new(&name, Span::call_site()).to_token_stream()
            }
        };
        let scope = options.scope.as_ref().map(|scope| scope_text(&scope.value.value()));
        let destructive = destructive(attr, &options);
        let approval =
            attr == Attr::Idempotent && (options.approve.is_some() || options.approve_if.is_some());
        let info = companion::info(krate, attr, &name, scope.as_deref(), destructive, approval);
        // rmcp's `#[tool]` above ours turns an `async fn` into a boxed one before ours sees it.
        let boxed_by_tool = rewritten && method.sig.asyncness.is_some();
        if boxed_by_tool || !companion::declares_companion(&as_item_fn(method)) {
            let public = Visibility::Public(Token![pub](Span::mixed_site()));
            self.consts.push(companion::declaration(krate, &public, &method.sig.ident, &info));
        }
        if attr == Attr::Idempotent {
            self.reconcilers.extend(sweep_entry(krate, method, &options, &name));
        }
        self.listed.push(info);

        let function = format!("{type_name}::{method_name}");
        let framework = framework.map(|framework| framework.name);
        tell_the_attribute(&mut method.attrs[index], &function, framework.as_ref());
        // A framework's macro (rmcp's router) reads the signature before the method's own
        // attribute expands: the transaction parameter, which no caller passes, goes now.
        let transactional = options.transactional.as_ref().map(|o| o.value.value());
        if let Some(taken) =
            transactional.and_then(|name| TxParam::take_from(&mut method.sig, &name))
        {
            hand_on_the_transaction(&mut method.attrs[index], &taken);
        }
        if let Some(at) = rmcp {
            write_hints(&mut method.attrs[at], hints(attr, destructive));
        }
    }
}

/// The name a framework gives a method's tool, which is its key's and its record's name.
#[derive(Clone)]
struct Framework {
    /// An expression of type `&'static str`: `<Self as Tool>::NAME`, or a literal.
    name: syn::Expr,
    /// The name, where the macro can read it (a literal).
    literal: Option<String>,
    /// Where the name comes from, for messages.
    from: &'static str,
}

impl Framework {
    /// The error for a `tool = "…"` that names the tool otherwise than its framework does.
    fn conflict(&self, tool: Option<&Opt<LitStr>>, type_name: &str) -> Option<syn::Error> {
        let written = &tool?.value;
        let shown = match &self.literal {
            Some(literal) if *literal == written.value() => return None,
            Some(literal) => format!("`{literal}`"),
            None => format!("`<{type_name} as …>::NAME`"),
        };
        Some(syn::Error::new_spanned(
            written,
            format!(
                "{} names this tool {shown}, and that name is its key's and its record's: \
                 drop `tool = \"{}\"`, which would name it otherwise",
                self.from,
                written.value()
            ),
        ))
    }
}

/// rig's name for the tool of a trait impl that declares `const NAME` (rig's `Tool`):
/// `<Self as Trait>::NAME`, read when the tool runs.
fn rig_name(block: &ItemImpl) -> Option<Framework> {
    let (_, trait_path, _) = block.trait_.as_ref()?;
    let literal = block.items.iter().find_map(|item| match item {
        ImplItem::Const(constant) if constant.ident == "NAME" => Some(match &constant.expr {
            syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(name), .. }) => Some(name.value()),
            _ => None,
        }),
        _ => None,
    })?;
    Some(Framework {
        name: syn::parse_quote!(<Self as #trait_path>::NAME),
        literal,
        from: "the impl's `const NAME` (rig's name for the tool)",
    })
}

/// Whether `attr` is rmcp's `#[tool]` (or `#[rmcp::tool]`), as rmcp's `#[tool_router]` tells.
fn is_rmcp_tool(attr: &Attribute) -> bool {
    attr.path().segments.last().is_some_and(|last| last.ident == "tool")
}

/// rmcp's name for a `#[tool]` method: its `name = "…"`, else the method's name.
fn rmcp_name(attr: &Attribute, method: &Ident) -> Framework {
    let given = rmcp_options(attr).into_iter().flatten().find_map(|meta| match meta {
        Meta::NameValue(pair) if pair.path.is_ident("name") => match pair.value {
            syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(name), .. }) => Some(name),
            _ => None,
        },
        _ => None,
    });
    let name = given.unwrap_or_else(|| LitStr::new(&method.to_string(), method.span()));
    Framework {
        literal: Some(name.value()),
        name: syn::parse_quote!(#name),
        from: "rmcp's `#[tool]` (its `name = \"…\"`, else the method's name)",
    }
}

/// The options of rmcp's `#[tool(…)]`, or `None` where they do not parse as attribute options
/// (rmcp reports that).
fn rmcp_options(attr: &Attribute) -> Option<Punctuated<Meta, Token![,]>> {
    match &attr.meta {
        Meta::Path(_) => Some(Punctuated::new()),
        Meta::List(list) => list.parse_args_with(Punctuated::parse_terminated).ok(),
        Meta::NameValue(_) => None,
    }
}

/// Adds each of idem's hints that the `#[tool]` attribute's `annotations(…)` does not set, so
/// that the user's own hints win and `tools/list` shows the rest without any further call.
fn write_hints(attr: &mut Attribute, hints: [(&str, bool); 3]) {
    let Some(mut options) = rmcp_options(attr) else { return };
    let at = options.iter().position(|meta| meta.path().is_ident("annotations"));
    let mut annotations = match at.map(|at| &options[at]) {
        Some(Meta::List(list)) => {
            match list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) {
                Ok(annotations) => annotations,
                Err(_) => return,
            }
        }
        Some(_) => return,
        None => Punctuated::new(),
    };
    for (hint, value) in hints {
        if !annotations.iter().any(|meta| meta.path().is_ident(hint)) {
            let hint = Ident::new(hint, Span::call_site());
            annotations.push(syn::parse_quote!(#hint = #value));
        }
    }
    let annotations: Meta = syn::parse_quote!(annotations(#annotations));
    match at {
        Some(at) => options[at] = annotations,
        None => options.push(annotations),
    }
    let path = attr.path().clone();
    attr.meta = syn::parse_quote!(#path(#options));
}

/// The MCP hints of a tool classified `attr`, as rmcp's `annotations(…)` names them.
fn hints(attr: Attr, destructive: bool) -> [(&'static str, bool); 3] {
    let (read_only, idempotent) = match attr {
        Attr::Read => (true, true),
        Attr::Idempotent => (false, true),
        Attr::Write => (false, false),
    };
    [
        ("read_only_hint", read_only),
        ("idempotent_hint", idempotent),
        ("destructive_hint", destructive && attr != Attr::Read),
    ]
}

/// Whether the tool may change what is there, as its attribute says; an unreadable value is the
/// attribute's error, reported when it expands.
fn destructive(attr: Attr, options: &Options) -> bool {
    match options.destructive.as_ref().map(|o| &o.value) {
        Some(syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Bool(value), .. })) => value.value,
        _ => attr != Attr::Read,
    }
}

/// Adds `__idem_in_tools = ("Type::method", name)` to our attribute on a method, before the
/// user's options, so that its key and record take the block's names.
fn tell_the_attribute(attr: &mut Attribute, function: &str, name: Option<&syn::Expr>) {
    let name = match name {
        Some(name) => name.to_token_stream(),
        None => quote!(_),
    };
    let told = quote!(__idem_in_tools = (#function, #name));
    let path = attr.path().clone();
    attr.meta = match &attr.meta {
        Meta::List(list) => {
            let written = &list.tokens;
            syn::parse_quote!(#path(#told, #written))
        }
        _ => syn::parse_quote!(#path(#told)),
    };
}

/// Hands the transaction parameter taken out of a method's signature on to its attribute.
fn hand_on_the_transaction(attr: &mut Attribute, taken: &TxParam) {
    let (name, ty) = (&taken.name, &taken.ty);
    let told = quote!(__idem_transaction = (#name: #ty));
    let path = attr.path().clone();
    if let Meta::List(list) = &attr.meta {
        let written = &list.tokens;
        attr.meta = syn::parse_quote!(#path(#told, #written));
    }
}

/// The self type's name as a record names it: `Bank` for `Bank<T>` or `crate::Bank`.
fn type_name(self_ty: &syn::Type) -> String {
    match self_ty {
        syn::Type::Path(path) if path.qself.is_none() => match path.path.segments.last() {
            Some(last) => last.ident.unraw().to_string(),
            None => String::new(),
        },
        other => other.to_token_stream().to_string().replace(' ', ""),
    }
}

/// The `impl` block and the facade's path, or the error that `item` is not a block or the
/// options are not `crate = "path"`.
fn parse(options: TokenStream, item: TokenStream) -> syn::Result<(ItemImpl, Path)> {
    let block: ItemImpl = syn::parse2(item).map_err(|_| {
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
    name: &TokenStream,
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

/// The method's classification attribute (its index), its options, and whether an `async fn` is
/// boxed by rmcp's `#[tool]` written above it before ours expands. Options that do not parse are
/// the attribute's own error, reported when it expands.
fn classification(attrs: &[Attribute]) -> Option<(usize, Attr, Options, bool)> {
    attrs.iter().enumerate().find_map(|(index, attr)| {
        let kind = Attr::named_by(attr.path())?;
        let options = match &attr.meta {
            syn::Meta::Path(_) => Options::default(),
            _ => attr.parse_args::<Options>().unwrap_or_default(),
        };
        let rewritten = attrs[..index].iter().any(is_rmcp_tool);
        Some((index, kind, options, rewritten))
    })
}
