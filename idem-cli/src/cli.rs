//! The command line, as DESIGN.md lists it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Parser, Subcommand};
use idem_runtime::Status;

use crate::duration::parse_duration;

/// Inspect, settle and purge the records of an idem store; compute the key of a call.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about, max_term_width = 100)]
pub(crate) struct Cli {
    /// The store: sqlite:PATH (a SQLite file), a postgres:// URL, or a sled directory
    /// [default: $IDEM_STORE, read the same way, else ./idem.sled if one is there, else
    /// $XDG_DATA_HOME/idem/idem.sled or ~/.local/share/idem/idem.sled]
    #[arg(long, global = true, value_name = "STORE")]
    pub(crate) store: Option<OsString>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Print the key the crate derives for a call (needs no store)
    Key {
        /// The tool name that goes into the key
        #[arg(long, value_name = "T")]
        tool: String,
        /// The scope text that goes into the key
        #[arg(long, value_name = "S", allow_hyphen_values = true)]
        scope: String,
        /// The arguments as a JSON object, e.g. '{"amount":4200}'
        #[arg(long, value_name = "JSON", allow_hyphen_values = true)]
        args: String,
        /// The arguments are a flattened tool's argument object (`#[idem(flatten)]`, such as an
        /// rmcp `Parameters<T>`): members whose value is null are left out, at every depth
        #[arg(long)]
        flatten: bool,
        /// A field the tool's `ignore = [...]` leaves out of the key (repeatable)
        #[arg(long, value_name = "FIELD", requires = "flatten")]
        ignore: Vec<String>,
        /// Print an object with the key and the canonical JSON of the arguments
        #[arg(long)]
        json: bool,
    },

    /// List records, newest first
    Ls {
        /// Only records with this status
        #[arg(long, value_name = "STATUS", value_parser = parse_status)]
        status: Option<Status>,
        /// Only records of this tool
        #[arg(long, value_name = "T")]
        tool: Option<String>,
        /// One JSON object per line instead of a table
        #[arg(long)]
        json: bool,
    },

    /// Print one record with its result and its history
    Show {
        /// The key, as `idem ls` prints it
        key: String,
        /// Print the record as one JSON object
        #[arg(long)]
        json: bool,
    },

    /// Settle an in-doubt record: --release if the effect did not land, --done JSON if it did
    #[command(group(ArgGroup::new("resolution").required(true).args(["release", "done"])))]
    Resolve {
        /// The key, as `idem ls` prints it
        key: String,
        /// The effect did not land: delete the record so that the next call runs the body
        #[arg(long)]
        release: bool,
        /// The effect landed with this result (JSON): later calls replay it
        #[arg(long, value_name = "JSON", allow_hyphen_values = true)]
        done: Option<String>,
        /// Why, kept in the key's history with your user@host (one line, at most 1024 bytes)
        #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
        note: Option<String>,
        /// Settle it even though its owner is a process that still runs on this host (stopped
        /// or slow): only once you know that process will not run the effect
        #[arg(long)]
        force: bool,
    },

    /// Approve a key that awaits approval: the next call with the same arguments runs once
    Approve {
        /// The key, as `idem ls --status awaiting-approval` prints it
        key: String,
        /// Why, kept in the key's history with your user@host (one line, at most 1024 bytes)
        #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
        note: Option<String>,
    },

    /// Deny a key that awaits approval: every call with the same arguments is refused
    Deny {
        /// The key, as `idem ls --status awaiting-approval` prints it
        key: String,
        /// Why, kept in the key's history and given to every call (one line, at most 1024 bytes)
        #[arg(long, value_name = "TEXT", allow_hyphen_values = true, required = true)]
        note: String,
    },

    /// Remove finished records with their histories; never in-flight or in-doubt ones
    #[command(group(ArgGroup::new("which").required(true).args(["older_than", "expired"])))]
    Purge {
        /// Remove done and denied records finished longer ago than this (30d, 12h, 15m, 90s,
        /// 500ms)
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
        older_than: Option<Duration>,
        /// Remove done records whose ttl has passed
        #[arg(long)]
        expired: bool,
    },

    /// Count records by status and by tool, and give the store's size on disk
    Stats {
        /// Print the counts as one JSON object
        #[arg(long)]
        json: bool,
    },

    /// Serve MCP on stdio in front of an MCP server (the command COMMAND, or the one at
    /// --upstream URL), each write tool once per intent
    #[command(group(ArgGroup::new("upstream_server").required(true).args(["upstream", "command"])))]
    McpProxy {
        /// The TOML file that names the server and gives each write tool its scope
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Print each upstream tool with what idem does with it, and exit without serving
        #[arg(long)]
        check: bool,
        /// The upstream MCP server's streamable HTTP endpoint (http://HOST:PORT/mcp), in place
        /// of a COMMAND to start
        #[arg(long, value_name = "URL")]
        upstream: Option<String>,
        /// The upstream MCP server's command line, after `--`; it gets this environment
        #[arg(last = true, value_name = "COMMAND")]
        command: Vec<OsString>,
    },
}

/// Accepts a status in its one spelling, the one the command prints.
fn parse_status(text: &str) -> Result<Status, String> {
    text.parse()
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
