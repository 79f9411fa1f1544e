//! Naming JSON values in error messages: which kind of value was found where another was
//! expected ("expected a string, found an array"). Shared by every crate that reads user JSON
//! (datasets, task files, the Spider data); `agl-gov`, which depends on no other agl crate,
//! keeps its own.

use serde_json::Value;

/// What kind of JSON value `v` is, for error messages: `null`, `a boolean`, `a number`, `a
/// string`, `an array`, `an object`.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_kind_has_its_article() {
        let kinds: Vec<_> = [
            json!(null),
            json!(true),
            json!(1.5),
            json!("s"),
            json!([1]),
            json!({"a": 1}),
        ]
        .iter()
        .map(json_kind)
        .collect();
        assert_eq!(
            kinds,
            [
                "null",
                "a boolean",
                "a number",
                "a string",
                "an array",
                "an object"
            ]
        );
    }
}
