//! How a command fails: bad usage (exit 2) or a failed operation (exit 1), each with a one-line
//! message that says what to do.

use idem_runtime::Error;

/// Exit status of a failed operation.
pub(crate) const FAILED: u8 = 1;
/// Exit status of bad usage.
pub(crate) const USAGE: u8 = 2;

#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// The command line was wrong: the operator must change it.
    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure { code: USAGE, message: message.into() }
    }

    /// The command line was right but the operation could not be done.
    pub(crate) fn failed(message: impl Into<String>) -> Failure {
        Failure { code: FAILED, message: message.into() }
    }

    pub(crate) fn exit_code(&self) -> u8 {
        self.code
    }

    /// The message on one line: a multi-line source error must not break scripts that read the
    /// first line of stderr.
    pub(crate) fn message(&self) -> String {
        one_line(&self.message)
    }
}

/// Runtime errors are failed operations, except a malformed key, which is the operator's typo.
impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        match error {
            // The operator's typo: the message says what a key looks like.
            error @ Error::NotAKey { .. } => Failure::usage(error.to_string()),
            Error::Key { tool, reason } => {
                Failure::usage(format!("tool `{tool}`: cannot derive a key: {reason}"))
            }
            // Outside a call the runtime has no key or tool to name: the store's own message
            // (which says what to do) is the whole story.
            Error::Store { key: None, source, .. } => Failure::failed(source.to_string()),
            Error::Store { key: Some(key), source, .. } => {
                Failure::failed(format!("key {key}: {source}"))
            }
            other => Failure::failed(other.to_string()),
        }
    }
}

/// Joins the lines of `text` into one.
fn one_line(text: &str) -> String {
    text.split(['\n', '\r']).map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

/// clap's rendered error as one line: its message (the first paragraph, without the `error:`
/// prefix) and the usage line, which shows the operator the shape the command expects.
pub(crate) fn one_line_clap_error(rendered: &str) -> String {
    let message = rendered.split("\n\n").next().unwrap_or(rendered);
    let message = one_line(message.trim_start_matches("error:"));
    let usage = rendered.lines().find_map(|line| line.strip_prefix("Usage: ")).map(str::trim);
    match usage {
        Some(usage) => format!("{message}; usage: {usage} (see --help)"),
        None => format!("{message}; see `idem --help`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_errors_become_one_line_with_the_usage() {
        let rendered =
            "error: the following required arguments were not provided:\n  --tool <T>\n\n\
                        Usage: idem key --tool <T> --scope <S> --args <JSON>\n\n\
                        For more information, try '--help'.\n";
        assert_eq!(
            one_line_clap_error(rendered),
            "the following required arguments were not provided: --tool <T>; \
             usage: idem key --tool <T> --scope <S> --args <JSON> (see --help)"
        );
    }
}
