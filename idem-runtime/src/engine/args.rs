//! The argument tree of a call, built one parameter at a time.

use serde::Serialize;

use crate::canonical::canonical_json_for;
use crate::error::Error;

/// Builds the canonical arguments of a call one parameter at a time, so that generated code
/// needs no struct of its own (and works for generic parameters).
#[derive(Debug)]
pub struct Args {
    tool: String,
    fields: Vec<(&'static str, String)>,
}

impl Args {
    /// Arguments of `tool`, none yet.
    pub fn new(tool: &str) -> Args {
        Args { tool: tool.to_owned(), fields: Vec::new() }
    }

    /// Adds parameter `name` (an identifier: it needs no escaping).
    pub fn arg<V: Serialize + ?Sized>(
        mut self,
        name: &'static str,
        value: &V,
    ) -> Result<Args, Error> {
        let text = canonical_json_for(&self.tool, value).map_err(|e| match e {
            Error::Key { tool, reason } => {
                Error::Key { tool, reason: format!("parameter `{name}`: {reason}") }
            }
            other => other,
        })?;
        self.fields.push((name, text));
        Ok(self)
    }

    /// The canonical JSON object of all parameters, keys sorted.
    pub fn canonical(mut self) -> String {
        self.fields.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = String::from("{");
        for (i, (name, text)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push('"');
            out.push_str(name);
            out.push_str("\":");
            out.push_str(text);
        }
        out.push('}');
        out
    }
}
