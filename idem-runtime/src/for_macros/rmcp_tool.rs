//! The check that a method classified by idem, in a block without `#[idem::tools]`, is not an
//! rmcp `#[tool]`. rmcp's `#[tool]` written above ours expands first and takes itself off the
//! method, so our attribute cannot see it; what it leaves is the inherent function
//! `<method>_tool_attr()` it adds beside the method. The generated check names
//! `Self::<method>_tool_attr` with a fallback of its own declared by a trait, which an inherent
//! function shadows: the fallback gives a [`NoToolAttr`], rmcp's function an `rmcp::model::Tool`,
//! which does not satisfy [`NotAnRmcpTool`], so the build fails with our message.

/// What the check's fallback `<method>_tool_attr()` gives where rmcp's `#[tool]` wrote none.
pub struct NoToolAttr;

/// A method's `<method>_tool_attr()` is not rmcp's; `M` is a type named after the method, so
/// that the message names it.
#[diagnostic::on_unimplemented(
    message = "`{M}` is an rmcp `#[tool]` in an `impl` block without `#[idem::tools]`",
    label = "rmcp's `#[tool]` made `{M}` a tool here, and its block has no `#[idem::tools]`",
    note = "put `#[idem::tools]` on the `impl` block that holds `{M}`, above `#[tool_router]`: \
            it names the tool as rmcp does (in its key and record), writes idem's MCP hints into \
            its `#[tool]`, and makes the router answer idem's outcomes (in doubt, in flight) as \
            tool results the model reads"
)]
pub trait NotAnRmcpTool<M> {}

#[diagnostic::do_not_recommend]
impl<M> NotAnRmcpTool<M> for NoToolAttr {}

/// Checks, at compile time only, that `tool_attr` is the check's fallback rather than rmcp's:
/// the generated code names it in a closure that is never called.
pub fn not_an_rmcp_tool<M, T: NotAnRmcpTool<M>>(_method: M, _tool_attr: impl FnOnce() -> T) {}
