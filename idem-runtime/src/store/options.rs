//! The options every store's builder offers, written once: [`CommonOptions`] holds them with
//! their defaults, and `store_options!` writes a builder's setters for those that apply to its
//! backend, each with its one doc. A builder keeps a `CommonOptions` in its field `common`;
//! its backend reads durability, creation and access from it as it opens its storage, and the
//! engine's opener (`engine/open/`, [`Beside::start`](super::Beside::start)) reads retention.

use super::access::Access;
use super::Durability;

/// What every store's builder keeps of the options all backends share, with their defaults:
/// [`Durability::Fsync`], creating a store that is missing, files its user's alone, and
/// retention as `$IDEM_RETAIN` says. A builder offers the setters of those that apply to its
/// backend, written by `idem_runtime::store_options!`, which holds their docs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CommonOptions {
    /// How far a write goes before it counts as done (`durability`).
    pub durability: Durability,
    /// Whether to create the store when there is none (`create`); `true` by default.
    pub create: bool,
    /// Whether what the store creates on disk is its group's too (`group_access`).
    pub group_access: bool,
    /// The retention policy (`retain`, `retention`); `None` until one of them is called, so
    /// that `$IDEM_RETAIN` decides at open.
    pub retention: Option<Option<Retention>>,
}

/// The retention policy, as the setters `store_options!` writes name it: defined here, so that
/// the macro reaches it from another crate by a path of the store's module.
#[doc(hidden)]
pub type Retention = crate::lifecycle::retention::Retention;

impl Default for CommonOptions {
    fn default() -> CommonOptions {
        CommonOptions {
            durability: Durability::Fsync,
            create: true,
            group_access: false,
            retention: None,
        }
    }
}

impl CommonOptions {
    /// Who may read and write what the store creates on disk.
    pub(crate) fn access(&self) -> Access {
        Access::with_group(self.group_access)
    }
}

/// Writes the setters of a store builder for the [`CommonOptions`] it names, on the field
/// `common` that holds them; each setter gets the doc written here, then the lines the
/// invocation writes above its name (what is particular to the backend):
///
/// ```text
/// idem_runtime::store_options! {
///     PgStoreBuilder {
///         /// PostgreSQL creates the schema and the table.
///         create,
///         retention,
///     }
/// }
/// ```
///
/// `retention` writes `retain` and `retention`. An option that does not apply to a backend is
/// left out, so that no setter silently does nothing.
#[doc(hidden)]
#[macro_export]
macro_rules! store_options {
    ($builder:ty { $($(#[$doc:meta])* $option:ident),* $(,)? }) => {
        impl $builder {
            $($crate::store_options!(@setter $option $(#[$doc])*);)*
        }
    };
    (@setter durability $(#[$doc:meta])*) => {
        /// How far a write goes before it is reported done (see
        /// [`Durability`](idem_runtime::store::Durability)); `Fsync` by default.
        ///
        $(#[$doc])*
        pub fn durability(mut self, durability: $crate::store::Durability) -> Self {
            self.common.durability = durability;
            self
        }
    };
    (@setter create $(#[$doc:meta])*) => {
        /// Whether to create the store when there is none (the default). The `idem` command
        /// opens with `false`, so that a mistyped path is an error, not a new empty store.
        ///
        $(#[$doc])*
        pub fn create(mut self, create: bool) -> Self {
            self.common.create = create;
            self
        }
    };
    (@setter group_access $(#[$doc:meta])*) => {
        /// Whether the files and directories the store creates are its group's too (0660 and
        /// 0770) rather than its user's alone (0600 and 0700, the default), for processes of
        /// several users of one group that share the store: whatever the umask says. Files and
        /// directories that exist are left as they are.
        ///
        $(#[$doc])*
        pub fn group_access(mut self, group: bool) -> Self {
            self.common.group_access = group;
            self
        }
    };
    (@setter retention $(#[$doc:meta])*) => {
        /// Removes finished records, with their histories, and the histories of released
        /// keys, once they are older than `keep`, in the background, in small batches (see
        /// [`Retention`](idem_runtime::retention::Retention)); the same as
        /// `retention(Some(Retention::new(keep)))`. Keys in flight, in doubt or waiting for a
        /// person are never removed. Unless this or [`retention`](Self::retention) is called,
        /// `$IDEM_RETAIN` decides (a duration such as `30d`, or `off`), and without it nothing
        /// is removed. Every process that opens a shared store with a policy runs its own
        /// passes; they may overlap, since every removal is fenced on the record it read.
        ///
        $(#[$doc])*
        pub fn retain(self, keep: std::time::Duration) -> Self {
            self.retention(Some($crate::store::Retention::new(keep)))
        }

        /// The retention policy, with its batch size and pace (see
        /// [`Retention`](idem_runtime::retention::Retention)); `None` for none, whatever
        /// `$IDEM_RETAIN` says.
        pub fn retention(mut self, policy: Option<$crate::store::Retention>) -> Self {
            self.common.retention = Some(policy);
            self
        }
    };
}
