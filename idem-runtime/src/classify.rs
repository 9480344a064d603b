//! What each attribute says about a tool, known at compile time: its [`Kind`], and the MCP
//! annotation hints that follow from it.

/// How a tool touches the world, as its attribute declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// `#[idem::read]`: no effect; repeating it is harmless.
    Read,
    /// `#[idem::idempotent(scope = …)]`: an effect keyed by intent, applied once however often
    /// the call repeats.
    Idempotent {
        /// The scope as written in the attribute (`"order_id"`, `"req.order_id"`).
        scope: &'static str,
    },
    /// `#[idem::write]`: an effect with no key; repeating it repeats the effect.
    Write,
}

/// The classification of one tool: its name (the one in its keys), its [`Kind`], and whether it
/// may change or delete what is already there.
///
/// Every free or associated function under `#[idem::read]`, `#[idem::idempotent]` or
/// `#[idem::write]` has one (a method taking `self` has none), read with
/// [`tool_info!`](https://docs.rs/idem-agent/latest/idem/macro.tool_info.html):
///
/// ```ignore
/// #[idem::read]
/// fn get_balance(customer: &str) -> Result<u64, PayError> { Ok(customer.len() as u64) }
///
/// const INFO: idem::ToolInfo = idem::tool_info!(get_balance);
/// assert_eq!(INFO.kind, idem::Kind::Read);
/// assert!(INFO.annotations().read_only_hint);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ToolInfo {
    /// The tool's name: the one its framework gives it under `#[idem::tools]` (rig's
    /// `<T as Tool>::NAME`, rmcp's `#[tool(name = "…")]` or the method's name), else the
    /// function's, or the one pinned with `tool = "…"`.
    pub name: &'static str,
    /// How the tool touches the world.
    pub kind: Kind,
    /// Whether the tool may change or delete what is already there: false for a read and for a
    /// write declared `destructive = false` (it only adds: a new order, a new ticket).
    pub destructive: bool,
    /// Whether a person may have to approve a call before it runs (`approve`, or `approve_if`
    /// when its condition holds): the MCP tool's description says so (`idem::mcp::annotate`),
    /// since MCP has no hint for it.
    pub approval: bool,
}

impl ToolInfo {
    /// The classification of the tool `name` as `kind`: destructive unless it is a read (MCP's
    /// cautious default; [`ToolInfo::destructive`] says otherwise), needing no approval.
    ///
    /// ```
    /// use idem_runtime::{Kind, ToolInfo};
    ///
    /// const OPEN_TICKET: ToolInfo =
    ///     ToolInfo::new("open_ticket", Kind::Idempotent { scope: "request_id" }).destructive(false);
    /// assert!(OPEN_TICKET.annotations().idempotent_hint);
    /// assert!(!OPEN_TICKET.annotations().destructive_hint);
    /// ```
    pub const fn new(name: &'static str, kind: Kind) -> ToolInfo {
        ToolInfo { name, kind, destructive: !matches!(kind, Kind::Read), approval: false }
    }

    /// This classification, saying whether the tool may change or delete what is already there.
    #[must_use]
    pub const fn destructive(mut self, destructive: bool) -> ToolInfo {
        self.destructive = destructive;
        self
    }

    /// This classification, saying whether a person may have to approve a call first.
    #[must_use]
    pub const fn approval(mut self, approval: bool) -> ToolInfo {
        self.approval = approval;
        self
    }

    /// Whether repeating the call is harmless: true for reads and idempotent writes.
    pub const fn retry_safe(&self) -> bool {
        matches!(self.kind, Kind::Read | Kind::Idempotent { .. })
    }

    /// The MCP tool annotation hints (`readOnlyHint`, `idempotentHint`, `destructiveHint`) that
    /// this classification implies.
    pub const fn annotations(&self) -> Annotations {
        // An idempotent write still changes the world; whether that change only adds is for
        // the attribute to say (`destructive = false`), else MCP's cautious default holds.
        match self.kind {
            Kind::Read => {
                Annotations { read_only_hint: true, idempotent_hint: true, destructive_hint: false }
            }
            Kind::Idempotent { .. } => Annotations {
                read_only_hint: false,
                idempotent_hint: true,
                destructive_hint: self.destructive,
            },
            Kind::Write => Annotations {
                read_only_hint: false,
                idempotent_hint: false,
                destructive_hint: self.destructive,
            },
        }
    }
}

/// MCP tool annotation hints, as data: copy them into the tool's `annotations` when registering
/// it with an MCP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Annotations {
    /// `readOnlyHint`: the tool does not modify its environment.
    pub read_only_hint: bool,
    /// `idempotentHint`: calling it again with the same arguments has no further effect.
    pub idempotent_hint: bool,
    /// `destructiveHint`: the tool may change or delete what is already there.
    pub destructive_hint: bool,
}
