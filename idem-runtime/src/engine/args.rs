//! The argument tree of a call, built one parameter at a time.

use serde::Serialize;

use crate::canonical::{arguments_for, canonical_json_for, Arguments, Object};
use crate::error::Error;

/// Builds the canonical arguments of a call one parameter at a time, so that generated code
/// needs no struct of its own (and works for generic parameters).
#[derive(Debug)]
pub struct Args {
    tool: String,
    fields: Vec<(&'static str, String)>,
    /// The argument object of a parameter that is the whole argument object
    /// (`#[idem(flatten)]`): its fields are the arguments, so it stands alone.
    whole: Option<Object>,
    /// Members of the whole argument object left out of the key (`ignore = […]`).
    ignore: Vec<String>,
}

impl Args {
    /// Arguments of `tool`, none yet.
    pub fn new(tool: &str) -> Args {
        Args { tool: tool.to_owned(), fields: Vec::new(), whole: None, ignore: Vec::new() }
    }

    /// Adds parameter `name` (an identifier: it needs no escaping).
    pub fn arg<V: Serialize + ?Sized>(
        mut self,
        name: &'static str,
        value: &V,
    ) -> Result<Args, Error> {
        if self.whole.is_some() {
            return Err(self.beside_whole(name));
        }
        let text = canonical_json_for(&self.tool, value).map_err(|e| match e {
            Error::Key { tool, reason } => {
                Error::Key { tool, reason: format!("parameter `{name}`: {reason}") }
            }
            other => other,
        })?;
        self.fields.push((name, text));
        Ok(self)
    }

    /// Makes parameter `name` the whole argument object (`#[idem(flatten)]`): the key is derived
    /// over its fields, the `arguments` of a `tools/call` as the parameter's type reads and
    /// writes them, with every member whose value is `null` left out at every depth (see
    /// DESIGN.md, "Keys"). It must serialize as a JSON object and be the only parameter in the key.
    pub fn flatten<V: Serialize + ?Sized>(
        mut self,
        name: &'static str,
        value: &V,
    ) -> Result<Args, Error> {
        if let Some((other, _)) = self.fields.first() {
            return Err(self.beside_whole(other));
        }
        let arguments = arguments_for(&self.tool, value).map_err(|e| match e {
            Error::Key { tool, reason } => {
                Error::Key { tool, reason: format!("parameter `{name}`: {reason}") }
            }
            other => other,
        })?;
        match arguments {
            Arguments::Object(object) => {
                self.whole = Some(object);
                Ok(self)
            }
            Arguments::Other(text) => Err(Error::Key {
                tool: self.tool,
                reason: format!(
                    "parameter `{name}` is marked #[idem(flatten)], so its fields are the \
                     arguments, but it serializes as `{text}`, not as a JSON object; flatten a \
                     struct (or a map), or drop #[idem(flatten)] to key it by its name"
                ),
            }),
        }
    }

    /// Leaves the members named in `fields` out of the whole argument object's key
    /// (`#[idempotent(ignore = ["body"])]`): text that is not part of the intent, which a model
    /// may reword on a retry. It only applies to a parameter made the whole object by
    /// [`Args::flatten`], before or after this call.
    pub fn ignoring<S: AsRef<str>>(mut self, fields: &[S]) -> Args {
        self.ignore.extend(fields.iter().map(|field| field.as_ref().to_owned()));
        self
    }

    fn beside_whole(&self, name: &str) -> Error {
        Error::Key {
            tool: self.tool.clone(),
            reason: format!(
                "parameter `{name}` cannot enter the key beside a #[idem(flatten)] parameter, \
                 whose fields are the whole argument object; mark it #[idem(skip)] or make it the \
                 scope"
            ),
        }
    }

    /// The canonical JSON object of all parameters, keys sorted.
    pub fn canonical(mut self) -> String {
        if let Some(whole) = &self.whole {
            return whole.write(&self.ignore);
        }
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
