//! Canonical JSON and keys stay the same when serde_json's `preserve_order`,
//! `arbitrary_precision`, `float_roundtrip` and `raw_value` features are on, as feature
//! unification turns them on in many users' builds.
//!
//! Expected texts not taken from the key vectors (`vectors/keys.jsonl`) were produced with
//! `python3 -c 'import json; print(json.dumps(json.loads(t), sort_keys=True, separators=(",", ":")))'`.

use idem_runtime::{canonical_json, Error, Key};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../vectors/keys.jsonl");

fn lines() -> Vec<Value> {
    let text = std::fs::read_to_string(VECTORS).unwrap_or_else(|e| {
        panic!(
            "cannot read the key vectors at {VECTORS}: {e}; they are part of the repository \
             (vectors/keys.jsonl): restore the file from git"
        )
    });
    let lines: Vec<Value> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(lines.len() >= 10, "{VECTORS} holds only {} vectors", lines.len());
    lines
}

fn field<'a>(line: &'a Value, name: &str) -> &'a str {
    line[name].as_str().unwrap_or_else(|| panic!("`{name}` is not a string in {line}"))
}

fn canonical(value: &Value) -> String {
    canonical_json(value).unwrap()
}

/// The same value with every object's keys inserted in reverse sorted order.
fn reversed(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| b.0.cmp(a.0));
            let mut out = Map::new();
            for (k, v) in entries {
                out.insert(k.clone(), reversed(v));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(reversed).collect()),
        other => other.clone(),
    }
}

#[test]
fn serde_json_features_are_really_on() {
    let ordered: Value = serde_json::from_str(r#"{"b":1,"a":2}"#).unwrap();
    assert_eq!(ordered.to_string(), r#"{"b":1,"a":2}"#, "preserve_order is off");
    let big: Value = serde_json::from_str("123456789012345678901234567890").unwrap();
    assert_eq!(big.to_string(), "123456789012345678901234567890", "arbitrary_precision is off");
}

#[test]
fn every_vector_matches_with_args_parsed_from_text() {
    for line in lines() {
        // Parsed under arbitrary_precision, every number is a serde_json Number token.
        let args = &line["args"];
        let (tool, scope) = (field(&line, "tool"), field(&line, "scope"));
        assert_eq!(canonical(args), field(&line, "canonical"), "canonical JSON of {args}");
        let key = Key::derive(tool, scope, args).unwrap();
        assert_eq!(key.as_str(), field(&line, "key"), "key of {tool} / {scope} / {args}");
    }
}

#[test]
fn every_vector_matches_with_keys_inserted_in_reverse_order() {
    for line in lines() {
        let args = reversed(&line["args"]);
        let (tool, scope) = (field(&line, "tool"), field(&line, "scope"));
        assert_eq!(canonical(&args), field(&line, "canonical"), "canonical JSON of {args}");
        assert_eq!(Key::derive(tool, scope, &args).unwrap().as_str(), field(&line, "key"));
    }
}

#[test]
fn reversed_insertion_order_is_really_kept_by_the_value() {
    let args = reversed(&serde_json::json!({"amount": 4200, "customer": "cus_123"}));
    assert_eq!(args.to_string(), r#"{"customer":"cus_123","amount":4200}"#);
    assert_eq!(canonical(&args), r#"{"amount":4200,"customer":"cus_123"}"#);
}

#[test]
fn floats_parsed_from_text_are_written_as_python_repr() {
    let text = "[100.0, 0.1, 1e-07, 1E16, 1e16, -0.0, 1e15, 1000000000000000.0, 0.0001, 1e-05, \
                1.5e300, 5e-324, 0.10000000149011612, 2.5E-5, 1e+2]";
    let value: Value = serde_json::from_str(text).unwrap();
    assert_eq!(
        canonical(&value),
        "[100.0,0.1,1e-07,1e+16,1e+16,-0.0,1000000000000000.0,1000000000000000.0,0.0001,1e-05,\
         1.5e+300,5e-324,0.10000000149011612,2.5e-05,100.0]"
    );
}

#[test]
fn floats_built_in_rust_are_written_as_python_repr() {
    let value = serde_json::json!({"a": 1e16, "b": 0.1, "c": 100.0, "d": 1e-7, "e": -0.0});
    assert_eq!(canonical(&value), r#"{"a":1e+16,"b":0.1,"c":100.0,"d":1e-07,"e":-0.0}"#);
    assert_eq!(canonical_json(&[1e16, 1e15, 0.1]).unwrap(), "[1e+16,1000000000000000.0,0.1]");
    assert_eq!(canonical_json(&0.1f32).unwrap(), "0.10000000149011612");
}

#[test]
fn big_integers_parsed_from_text_are_written_as_python_ints() {
    let text = "[340282366920938463463374607431768211455, \
                -170141183460469231731687303715884105728, 12345678901234567890123456789, -0, \
                18446744073709551616]";
    let value: Value = serde_json::from_str(text).unwrap();
    assert_eq!(
        canonical(&value),
        "[340282366920938463463374607431768211455,-170141183460469231731687303715884105728,\
         12345678901234567890123456789,0,18446744073709551616]"
    );
}

#[test]
fn big_integers_built_in_rust_are_written_as_they_are() {
    assert_eq!(canonical_json(&u128::MAX).unwrap(), "340282366920938463463374607431768211455");
    assert_eq!(canonical_json(&i128::MIN).unwrap(), "-170141183460469231731687303715884105728");
    assert_eq!(canonical(&serde_json::json!(u64::MAX)), "18446744073709551615");
    assert_eq!(canonical(&serde_json::json!(i64::MIN)), "-9223372036854775808");
}

#[test]
fn raw_values_are_canonicalized_like_parsed_values() {
    let raw =
        RawValue::from_string(r#"{"b": 1.0, "a": [1e16, {"z": null, "y": "é"}]}"#.into()).unwrap();
    assert_eq!(canonical_json(&raw).unwrap(), r#"{"a":[1e+16,{"y":"\u00e9","z":null}],"b":1.0}"#);
    let nested = std::collections::BTreeMap::from([("payload", raw)]);
    assert_eq!(
        canonical_json(&nested).unwrap(),
        r#"{"payload":{"a":[1e+16,{"y":"\u00e9","z":null}],"b":1.0}}"#
    );
}

#[test]
fn numbers_beyond_a_double_and_nan_are_refused() {
    let huge: Value = serde_json::from_str("[1e400]").unwrap();
    assert!(matches!(canonical_json(&huge), Err(Error::Key { .. })));
    let err = Key::derive("weigh", "s", &[f64::NAN]).unwrap_err();
    assert!(matches!(&err, Error::Key { tool, .. } if tool == "weigh"), "{err:?}");
}
