//! Tool schemas in standard JSON Schema: schemars writes `"format": "uint64"` (and
//! `uint16`, `int32`, `double`...) for Rust's number types, formats no JSON Schema
//! draft defines, which some clients warn about or reject. [`standardize`] removes
//! every format outside the standard vocabulary and keeps what it meant as a bound:
//! an unsigned type gets `"minimum": 0` (schemars already writes most of them).
//!
//! Applied once to every tool of the server's combined router (all routers, also
//! ones added later), in `SandboxServer::new`.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool};
use serde_json::Value;

/// The formats JSON Schema 2020-12 defines (§7.3); clients know these.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// `tool`'s input and output schemas with only standard formats.
pub fn standardize_tool(tool: &mut Tool) {
    tool.input_schema = Arc::new(standardized(&tool.input_schema));
    if let Some(output) = &tool.output_schema {
        tool.output_schema = Some(Arc::new(standardized(output)));
    }
}

fn standardized(schema: &JsonObject) -> JsonObject {
    let mut schema = schema.clone();
    standardize(&mut schema);
    schema
}

/// Removes non-standard `format`s from `schema` and every schema inside it.
pub fn standardize(schema: &mut JsonObject) {
    if let Some(Value::String(format)) = schema.get("format") {
        if !STANDARD_FORMATS.contains(&format.as_str()) {
            let unsigned = format.starts_with("uint");
            schema.remove("format");
            if unsigned && !schema.contains_key("minimum") {
                schema.insert("minimum".to_owned(), Value::from(0));
            }
        }
    }
    for value in schema.values_mut() {
        standardize_value(value);
    }
}

fn standardize_value(value: &mut Value) {
    match value {
        Value::Object(object) => standardize(object),
        Value::Array(items) => items.iter_mut().for_each(standardize_value),
        _ => {}
    }
}

/// Every `format` in `value`, for tests: what a client would see.
pub fn formats(value: &Value) -> Vec<String> {
    let mut found = Vec::new();
    collect_formats(value, &mut found);
    found
}

fn collect_formats(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            if let Some(Value::String(format)) = object.get("format") {
                found.push(format.clone());
            }
            object.values().for_each(|v| collect_formats(v, found));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_formats(v, found)),
        _ => {}
    }
}

/// Whether `format` is one JSON Schema defines.
pub fn is_standard(format: &str) -> bool {
    STANDARD_FORMATS.contains(&format)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn number_formats_become_bounds_and_standard_ones_stay() {
        let Value::Object(mut schema) = json!({
            "type": "object",
            "properties": {
                "count": {"type": "integer", "format": "uint64", "minimum": 0},
                "port": {"type": ["integer", "null"], "format": "uint16"},
                "signal": {"type": "integer", "format": "int32"},
                "when": {"type": "string", "format": "date-time"},
                "rows": {"type": "array", "items": {"type": "integer", "format": "uint8"}}
            },
            "$defs": {"X": {"anyOf": [{"type": "number", "format": "double"}]}}
        }) else {
            unreachable!()
        };
        standardize(&mut schema);
        let schema = Value::Object(schema);
        assert_eq!(formats(&schema), ["date-time"]);
        assert_eq!(schema["properties"]["port"]["minimum"], 0);
        assert!(schema["properties"]["signal"].get("minimum").is_none());
        assert_eq!(schema["properties"]["rows"]["items"]["minimum"], 0);
        assert_eq!(schema["properties"]["count"]["minimum"], 0);
    }
}
