//! A tool as validation leaves it: the view of the user's function and options that `expand`
//! turns into code. Everything here has been checked; expansion refuses nothing.

use std::time::Duration;

use proc_macro2::Span;
use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::{Attribute, Expr, Ident, LitStr, Member, Path, Type};

use crate::attr::Attr;
use crate::signature::Shape;

/// A validated tool, ready to expand.
pub(crate) struct Tool {
    pub(crate) attr: Attr,
    /// The tool's name: the function's, or the one pinned with `tool = "…"`. Where a framework
    /// names the tool (`named_by`), that name wins, and this one is only for messages.
    pub(crate) name: String,
    /// The framework's name for the tool, an expression of type `&'static str`
    /// (`<Self as Tool>::NAME`, `"refundOrder"`), written by `#[idem::tools]`.
    pub(crate) named_by: Option<Expr>,
    /// The path the records name after the module's (`send`, `OpenTicket::call`), or none when
    /// `tool = "…"` pinned the name: then the user chose it, and records are not tied to the
    /// function's path (which a move to another module changes).
    pub(crate) function: Option<String>,
    /// Whether the tool may change or delete what is already there (`destructiveHint`).
    pub(crate) destructive: bool,
    pub(crate) krate: Path,
    pub(crate) scope: Option<Scope>,
    pub(crate) key_params: Vec<KeyParam>,
    /// The parameter whose fields are the key's arguments, if one is marked so; then it is the
    /// only one in the key.
    pub(crate) flatten: Option<Flatten>,
    pub(crate) store: Option<Path>,
    pub(crate) wait: Option<Duration>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) rerun: bool,
    /// The function named by `reconcile = "…"`, if any.
    pub(crate) reconcile: Option<Reconciler>,
    /// What `approve` or `approve_if` asks, if either is given.
    pub(crate) approval: Option<Approval>,
    pub(crate) shape: Shape,
    /// The `Result<T, E>` the body produces.
    pub(crate) output: Option<Type>,
    /// The transaction parameter of a `transactional` tool, taken out of its signature.
    pub(crate) transaction: Option<crate::attr::TxParam>,
    /// A method (its signature says so) that `#[idem::tools]` did not mark: its body checks that
    /// it is not an rmcp `#[tool]`, whose attribute, written above ours, has expanded unseen.
    pub(crate) unmarked_method: bool,
}

impl Tool {
    /// The tool's name as the generated code spells it: the framework's expression, or a literal.
    pub(crate) fn name_tokens(&self) -> TokenStream {
        match &self.named_by {
            Some(name) => name.to_token_stream(),
            None => LitStr::new(&self.name, Span::mixed_site()).to_token_stream(),
        }
    }
}

/// The value a `scope = "param.field"` names.
pub(crate) struct Scope {
    /// The path as data (in `Kind::Idempotent` and messages), raw identifiers written plain.
    pub(crate) text: String,
    pub(crate) param: Ident,
    pub(crate) fields: Vec<Member>,
}

/// A parameter that enters the key.
pub(crate) struct KeyParam {
    pub(crate) name: Ident,
    /// Its name in the key: `type` for `r#type`, as a Python service spells it.
    pub(crate) label: String,
    pub(crate) ty: Type,
    /// Its `#[cfg]` attributes, carried onto its use so that a parameter compiled out leaves
    /// the key with it.
    pub(crate) cfgs: Vec<Attribute>,
}

/// The parameter marked `#[idem(flatten)]`: the tool's whole argument object.
pub(crate) struct Flatten {
    /// The name bound to the object: the parameter's, or the one inside its pattern
    /// (`req` in `Parameters(req)`).
    pub(crate) name: Ident,
    /// The parameter's type, for spans.
    pub(crate) ty: Type,
    /// Its fields named by `ignore = […]`, left out of the key.
    pub(crate) ignore: Vec<Ignored>,
}

/// A field of the argument object named by `ignore = […]`.
pub(crate) struct Ignored {
    /// The field, spanned on the literal, so that a name that is not a field is reported there.
    pub(crate) field: Ident,
    /// Its name in the arguments: `type` for `r#type`.
    pub(crate) label: String,
}

/// The reconciler named by `reconcile = "…"`.
pub(crate) struct Reconciler {
    /// Its path, spanned on the literal.
    pub(crate) path: Path,
    /// Whether it is a method of the tool's type, called with the tool's `&self`: the tool takes
    /// `&self` and the path is one name.
    pub(crate) method: bool,
    /// The literal, for spans.
    pub(crate) span: Span,
}

/// A tool that needs a person's approval: always, or when a condition over its arguments holds.
pub(crate) struct Approval {
    /// The condition of `approve_if = "…"`, spanned on the literal; `None` for `approve`.
    pub(crate) condition: Option<Expr>,
    /// The literal's span, for the condition's check.
    pub(crate) span: Span,
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
}
