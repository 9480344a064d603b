//! `idem`: the operator's command for an idem store. It lists, shows, settles and purges records,
//! counts them, computes the key the crate derives for a call, and serves an MCP proxy that runs
//! an upstream server's write tools once per intent (`idem mcp-proxy`).
//!
//! Exit status: 0 on success, 1 when the operation failed, 2 on bad usage. Every error is one
//! line on stderr that says what to do.

mod args;
mod cli;
mod commands;
mod duration;
mod failure;
mod mcp_proxy;
mod operator;
mod output;
mod store;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::failure::Failure;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    // Not locked for the whole command: `mcp-proxy` writes the protocol through tokio's stdout,
    // from another thread, which a lock held here would block forever.
    let mut stdout = std::io::stdout();
    let outcome = commands::run(cli, &mut stdout).and_then(|()| {
        stdout.flush().map_err(|e| Failure::failed(format!("cannot write the output: {e}")))
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("idem: {}", failure.message());
            ExitCode::from(failure.exit_code())
        }
    }
}

/// Prints clap's help and version as clap would, and its errors as one line, exiting 2.
fn usage_error(error: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(error.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        // Help was asked for: print it in full, successfully.
        let _ = error.print();
        return ExitCode::SUCCESS;
    }
    if error.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        eprintln!(
            "idem: no command given: use one of key, ls, show, resolve, approve, deny, purge, stats, mcp-proxy (see `idem --help`)"
        );
        return ExitCode::from(failure::USAGE);
    }
    eprintln!("idem: {}", failure::one_line_clap_error(&error.render().to_string()));
    ExitCode::from(failure::USAGE)
}
