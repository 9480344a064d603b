//! `#[idem::tools]` on an `impl` block: the compile-time classification of its methods. An item
//! cannot be added inside a trait impl, and a type cannot sit inside any impl, so the companions
//! go in a second, inherent impl of the same type beside the block: one constant per classified
//! method, and `idem_tools()` listing them.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Ident, ImplItem, ItemImpl, LitStr, Path, Token};

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
    let block: ItemImpl = match syn::parse2(item.clone()) {
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

    let mut consts = Vec::new();
    let mut listed = Vec::new();
    for member in &block.items {
        let ImplItem::Fn(method) = member else { continue };
        let Some((attr, options)) = classification(&method.attrs) else { continue };
        let ident = &method.sig.ident;
        let name = options
            .tool
            .as_ref()
            .map(|tool| tool.value.value())
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| unraw(ident));
        let (kind, marker) = match (attr, &options.scope) {
            (Attr::Read, _) => (quote!(#krate::__private::Kind::Read), quote!(IsRead)),
            (Attr::Idempotent, Some(scope)) => {
                let scope = scope.value.value();
                (
                    quote!(#krate::__private::Kind::Idempotent { scope: #scope }),
                    quote!(IsIdempotent),
                )
            }
            // No scope is the attribute's own error; classify it as what it would do now.
            (Attr::Idempotent, None) | (Attr::Write, _) => {
                (quote!(#krate::__private::Kind::Write), quote!(IsWrite))
            }
        };
        let info = companion(ident, "tool");
        let kind_const = companion(ident, "kind");
        consts.push(quote! {
            #[doc(hidden)]
            #[allow(non_upper_case_globals)]
            pub const #info: #krate::__private::ToolInfo =
                #krate::__private::ToolInfo { name: #name, kind: #kind };
            #[doc(hidden)]
            #[allow(non_upper_case_globals)]
            pub const #kind_const: #krate::__private::#marker = #krate::__private::#marker;
        });
        listed.push(info);
    }

    let (impl_generics, _, where_clause) = block.generics.split_for_impl();
    let self_ty = &block.self_ty;
    quote! {
        #block

        impl #impl_generics #self_ty #where_clause {
            #(#consts)*

            #[doc(hidden)]
            #[allow(non_upper_case_globals)]
            pub const __idem_tools: &'static [#krate::__private::ToolInfo] = &[#(Self::#listed),*];

            /// The idem classification of the tools of this type's `#[idem::tools]` block, in
            /// the block's order: their names and kinds, and the MCP hints that follow.
            #[allow(dead_code)]
            pub fn idem_tools() -> &'static [#krate::__private::ToolInfo] {
                Self::__idem_tools
            }
        }
    }
}

/// The hidden constant `#[idem::tools]` gives `method` (`__idem_tool_send_payment`), which
/// `tool_info!` and `retry!` name.
pub(crate) fn companion(method: &Ident, what: &str) -> Ident {
    format_ident!("__idem_{}_{}", what, unraw(method), span = method.span())
}

fn unraw(ident: &Ident) -> String {
    let text = ident.to_string();
    text.strip_prefix("r#").map(str::to_owned).unwrap_or(text)
}

/// The method's classification attribute and its options, if it has one. Options that do not
/// parse are the attribute's own error, reported when it expands.
fn classification(attrs: &[Attribute]) -> Option<(Attr, Options)> {
    attrs.iter().find_map(|attr| {
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
        Some((kind, options))
    })
}

/// The type and method a call's path names, when it names a method: `<Adder as Tool>::call`, or
/// a path whose second-to-last segment is a type (`Bank::send_payment`, `Self::send_payment`).
/// Rust's naming conventions tell a type (`CamelCase`) from a module (`snake_case`) here: a
/// macro sees names, not what they resolve to.
pub(crate) fn method_path(qself: Option<&syn::QSelf>, path: &Path) -> Option<(TokenStream, Ident)> {
    let method = path.segments.last()?.ident.clone();
    if let Some(qself) = qself {
        return Some((qself.ty.to_token_stream(), method));
    }
    let count = path.segments.len();
    if count < 2 {
        return None;
    }
    let owner = &path.segments[count - 2].ident;
    let is_type =
        owner == "Self" || owner.to_string().starts_with(|c: char| c.is_ascii_uppercase());
    if !is_type {
        return None;
    }
    let leading = path.leading_colon;
    let segments = path.segments.iter().take(count - 1);
    Some((quote!(#leading #(#segments)::*), method))
}
