//! The compile-time classification: a hidden companion type beside each tool function, named
//! like it (types and functions live in different namespaces), that carries its `ToolInfo`.

use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemFn;

use crate::args::Attr;
use crate::validate::Tool;

/// The companion of a free function; nothing for a method, whose `impl` block cannot hold one.
pub(crate) fn companion(tool: &Tool, item: &ItemFn) -> TokenStream {
    if !tool.companion {
        return TokenStream::new();
    }
    let krate = &tool.krate;
    let vis = &item.vis;
    let ident = &item.sig.ident;
    let name = &tool.name;
    let kind = match (tool.attr, &tool.scope) {
        (Attr::Read, _) => quote!(#krate::__private::Kind::Read),
        (Attr::Idempotent, Some(scope)) => {
            let scope = &scope.text;
            quote!(#krate::__private::Kind::Idempotent { scope: #scope })
        }
        (Attr::Idempotent, None) | (Attr::Write, _) => quote!(#krate::__private::Kind::Write),
    };
    let retry_safe = match tool.attr {
        Attr::Read | Attr::Idempotent => quote!(impl #krate::__private::RetrySafe for #ident {}),
        Attr::Write => TokenStream::new(),
    };
    quote! {
        #[doc(hidden)]
        #[allow(non_camel_case_types, dead_code)]
        #vis struct #ident {}

        impl #krate::__private::Classified for #ident {
            const INFO: #krate::__private::ToolInfo =
                #krate::__private::ToolInfo { name: #name, kind: #kind };
        }

        #retry_safe
    }
}
