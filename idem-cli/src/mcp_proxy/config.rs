//! The proxy's configuration file, TOML:
//!
//! ```toml
//! server = "payments"
//! [tools.charge_card]
//! scope = "/order_id"     # a JSON pointer into the arguments, or a list of them
//! in_doubt = "fail"       # or "rerun"
//! ttl = "1d"
//! wait = "30s"
//! approve = true
//! [tools.lookup]
//! read = true
//! ```
//!
//! Every value is read here by hand, after serde has refused unknown keys, so that each error
//! names the tool and the key it is about.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use idem_runtime::mcp::ToolPolicy;
use idem_runtime::InDoubtPolicy;
use serde::Deserialize;
use toml::Value;

use crate::duration::parse_duration;
use crate::failure::Failure;

/// What the file says: the server's name in every key, and each configured tool's policy.
#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) server: String,
    pub(crate) tools: Vec<(String, ToolPolicy)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    server: Option<Value>,
    #[serde(default)]
    tools: BTreeMap<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Tool {
    scope: Option<Value>,
    in_doubt: Option<Value>,
    ttl: Option<Value>,
    wait: Option<Value>,
    approve: Option<Value>,
    read: Option<Value>,
}

/// Reads and checks the file at `path`.
pub(crate) fn load(path: &Path) -> Result<Config, Failure> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        Failure::failed(format!("cannot read the configuration {}: {error}", path.display()))
    })?;
    parse(&text).map_err(|why| Failure::usage(format!("{}: {why}", path.display())))
}

fn parse(text: &str) -> Result<Config, String> {
    let file: File = toml::from_str(text).map_err(|error| match error.span() {
        Some(span) => {
            let line = text[..span.start].matches('\n').count() + 1;
            format!("line {line}: {}", error.message())
        }
        None => error.message().to_owned(),
    })?;
    let server = match file.server {
        Some(Value::String(server)) if !server.trim().is_empty() => server,
        Some(other) => {
            return Err(format!("`server` must be a non-empty string, not {}", kind(&other)));
        }
        None => {
            return Err("`server = \"…\"` is missing: name the upstream server (its name is in \
                        every key, so keep it stable)"
                .to_owned())
        }
    };
    let mut tools = Vec::with_capacity(file.tools.len());
    for (name, entry) in file.tools {
        let policy = tool(entry).map_err(|why| format!("tool `{name}`: {why}"))?;
        tools.push((name, policy));
    }
    Ok(Config { server, tools })
}

fn tool(entry: Value) -> Result<ToolPolicy, String> {
    if !entry.is_table() {
        return Err(format!("must be a table such as `scope = \"/id\"`, not {}", kind(&entry)));
    }
    let tool: Tool = entry.try_into().map_err(|error| error.message().to_owned())?;
    let read = boolean("read", tool.read)?;
    let scope = match tool.scope {
        None => Vec::new(),
        Some(Value::String(pointer)) => vec![pointer],
        Some(Value::Array(pointers)) if !pointers.is_empty() => pointers
            .into_iter()
            .map(|pointer| match pointer {
                Value::String(pointer) => Ok(pointer),
                other => {
                    Err(format!("`scope` must list JSON pointers (strings), not {}", kind(&other)))
                }
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(format!(
                "`scope` must be a JSON pointer such as \"/order_id\", or a non-empty list of \
                 them, not {}",
                kind(&other)
            ))
        }
    };
    if let Some(bad) = scope.iter().find(|pointer| !pointer.starts_with('/')) {
        return Err(format!(
            "`scope` \"{bad}\" is not a JSON pointer: write \"/{bad}\" for a top-level argument"
        ));
    }
    if read && !scope.is_empty() {
        return Err("`read = true` and `scope` contradict each other: a read has no key".into());
    }
    let mut policy = if read { ToolPolicy::read() } else { ToolPolicy::scope(scope) };
    match tool.in_doubt {
        None => {}
        Some(Value::String(text)) if text == "fail" => {
            policy = policy.in_doubt(InDoubtPolicy::Fail);
        }
        Some(Value::String(text)) if text == "rerun" => {
            policy = policy.in_doubt(InDoubtPolicy::Rerun);
        }
        Some(other) => {
            return Err(format!("`in_doubt` must be \"fail\" or \"rerun\", not {}", kind(&other)))
        }
    }
    if let Some(ttl) = duration("ttl", tool.ttl)? {
        policy = policy.ttl(ttl);
    }
    if let Some(wait) = duration("wait", tool.wait)? {
        policy = policy.wait(wait);
    }
    Ok(policy.approve(boolean("approve", tool.approve)?))
}

/// What a value is, for an error: `the string "…"`, `the integer 7`, `a list`.
fn kind(value: &Value) -> String {
    match value {
        Value::String(text) => format!("the string {text:?}"),
        Value::Integer(n) => format!("the integer {n}"),
        Value::Float(n) => format!("the number {n}"),
        Value::Boolean(b) => format!("{b}"),
        Value::Datetime(_) => "a date".to_owned(),
        Value::Array(items) if items.is_empty() => "an empty list".to_owned(),
        Value::Array(_) => "a list".to_owned(),
        Value::Table(_) => "a table".to_owned(),
    }
}

fn boolean(key: &str, value: Option<Value>) -> Result<bool, String> {
    match value {
        None => Ok(false),
        Some(Value::Boolean(value)) => Ok(value),
        Some(other) => Err(format!("`{key}` must be true or false, not {}", kind(&other))),
    }
}

fn duration(key: &str, value: Option<Value>) -> Result<Option<Duration>, String> {
    match value {
        None => Ok(None),
        Some(Value::String(text)) => {
            parse_duration(&text).map(Some).map_err(|why| format!("`{key}`: {why}"))
        }
        Some(other) => {
            Err(format!("`{key}` must be a duration such as \"30s\", not {}", kind(&other)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fails(text: &str) -> String {
        parse(text).expect_err(text)
    }

    #[test]
    fn reads_every_key() {
        let config = parse(
            r#"
            server = "payments"
            [tools.charge_card]
            scope = "/order_id"
            in_doubt = "rerun"
            ttl = "1d"
            wait = "30s"
            approve = true
            [tools.refund]
            scope = ["/order_id", "/line"]
            [tools.lookup]
            read = true
            "#,
        )
        .unwrap();
        assert_eq!(config.server, "payments");
        let names: Vec<&str> = config.tools.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["charge_card", "lookup", "refund"]);
        let charge = format!("{:?}", config.tools[0].1);
        for part in ["\"/order_id\"", "Rerun", "86400s", "30s", "approve: true"] {
            assert!(charge.contains(part), "{part} in {charge}");
        }
        assert!(format!("{:?}", config.tools[1].1).contains("read: true"));
        assert!(format!("{:?}", config.tools[2].1).contains(r#"["/order_id", "/line"]"#));
    }

    #[test]
    fn errors_name_the_tool_and_the_key() {
        let head = "server = \"payments\"\n[tools.charge_card]\n";
        let cases = [
            ("scop = \"/order_id\"", "tool `charge_card`: unknown field `scop`"),
            ("scope = \"order_id\"", "tool `charge_card`: `scope` \"order_id\" is not a JSON"),
            ("scope = 7", "tool `charge_card`: `scope` must be a JSON pointer"),
            ("scope = []", "tool `charge_card`: `scope` must be a JSON pointer"),
            ("scope = [\"/a\", 1]", "tool `charge_card`: `scope` must list JSON pointers"),
            ("in_doubt = \"maybe\"", "tool `charge_card`: `in_doubt` must be \"fail\" or"),
            ("ttl = \"1 fortnight\"", "tool `charge_card`: `ttl`: `1 fortnight` is not a"),
            ("wait = 30", "tool `charge_card`: `wait` must be a duration"),
            ("approve = \"yes\"", "tool `charge_card`: `approve` must be true or false"),
            ("read = true\nscope = \"/a\"", "tool `charge_card`: `read = true` and `scope`"),
        ];
        for (body, expected) in cases {
            let error = fails(&format!("{head}{body}\n"));
            assert!(error.starts_with(expected), "{body}: {error}");
        }
    }

    #[test]
    fn the_server_name_is_required() {
        assert!(fails("[tools.a]\nscope = \"/id\"\n").contains("`server = \"…\"` is missing"));
        assert!(fails("server = \"\"\n").contains("`server` must be a non-empty string"));
        assert!(fails("server = \"p\"\nservers = 1\n").contains("unknown field `servers`"));
        assert!(fails("server = \"p\"\ntools = 1\n").contains("invalid type"));
        assert!(fails("server = \"p\"\n[tools]\na = 1\n").contains("tool `a`: must be a table"));
        let duplicate = fails("server = \"p\"\nserver = \"q\"\n");
        assert!(duplicate.starts_with("line 2: duplicate key"), "{duplicate}");
    }
}
