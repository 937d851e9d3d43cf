//! Checks a tool call's arguments against a JSON schema the tool's server gave (MCP tools,
//! whose input has no Rust type to decode into). The common part of JSON Schema is checked:
//! `type`, `enum`, `const`, `required`, `properties`, `additionalProperties: false` and
//! `items`, at any depth. Composition (`$ref`, `anyOf`, `oneOf`, `allOf`) is not followed: what
//! it allows, the server checks.

use serde_json::Value;

/// `Ok` when `value` fits `schema`; otherwise what does not, at which path.
pub(crate) fn check(schema: &Value, value: &Value) -> Result<(), String> {
    check_at(schema, value, "arguments")
}

fn check_at(schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    let Some(schema) = schema.as_object() else {
        return Ok(()); // `true` or a schema this check does not read: anything goes
    };
    if let Some(kind) = schema.get("type") {
        check_type(kind, value, path)?;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            return Err(format!(
                "{path} must be one of {}",
                Value::Array(allowed.clone())
            ));
        }
    }
    if let Some(constant) = schema.get("const") {
        if constant != value {
            return Err(format!("{path} must be {constant}"));
        }
    }
    match value {
        Value::Object(object) => check_object(schema, object, path),
        Value::Array(items) => check_items(schema, items, path),
        _ => Ok(()),
    }
}

fn check_type(kind: &Value, value: &Value, path: &str) -> Result<(), String> {
    let kinds: Vec<&str> = match kind {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => return Ok(()),
    };
    match kinds.iter().any(|kind| is_of_type(kind, value)) {
        true => Ok(()),
        false => Err(format!(
            "{path} must be {}, not {}",
            kinds.join(" or "),
            type_of(value)
        )),
    }
}

fn is_of_type(kind: &str, value: &Value) -> bool {
    match kind {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64(),
        _ => true, // a type this check does not know is the server's to check
    }
}

fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn check_object(
    schema: &serde_json::Map<String, Value>,
    object: &serde_json::Map<String, Value>,
    path: &str,
) -> Result<(), String> {
    let required = schema.get("required").and_then(Value::as_array);
    let required = required.into_iter().flatten().filter_map(Value::as_str);
    if let Some(missing) = required
        .into_iter()
        .find(|name| !object.contains_key(*name))
    {
        return Err(format!("{path} lacks `{missing}`"));
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
    for (name, value) in object {
        match properties.and_then(|p| p.get(name)) {
            Some(property) => check_at(property, value, &format!("{path}.{name}"))?,
            None if closed => return Err(format!("{path} has no `{name}`")),
            None => {}
        }
    }
    Ok(())
}

fn check_items(
    schema: &serde_json::Map<String, Value>,
    items: &[Value],
    path: &str,
) -> Result<(), String> {
    let Some(item) = schema.get("items") else {
        return Ok(());
    };
    let mut checked = items.iter().enumerate();
    checked.try_for_each(|(i, value)| check_at(item, value, &format!("{path}[{i}]")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn booking() -> Value {
        json!({
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "days": {"type": "integer"},
                "mode": {"enum": ["air", "road"]},
                "stops": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["order_id"],
            "additionalProperties": false,
        })
    }

    #[test]
    fn arguments_that_fit_pass_and_each_misfit_is_named_with_its_path() {
        let schema = booking();
        let fits = json!({"order_id": "ORD-1", "days": 2, "mode": "air", "stops": ["A"]});
        assert_eq!(check(&schema, &fits), Ok(()));
        let misfits = [
            (json!({"days": 2}), "arguments lacks `order_id`"),
            (
                json!({"order_id": 7}),
                "arguments.order_id must be string, not integer",
            ),
            (
                json!({"order_id": "x", "days": 1.5}),
                "arguments.days must be integer, not number",
            ),
            (
                json!({"order_id": "x", "mode": "sea"}),
                r#"arguments.mode must be one of ["air","road"]"#,
            ),
            (
                json!({"order_id": "x", "stops": ["A", 3]}),
                "arguments.stops[1] must be string, not integer",
            ),
            (
                json!({"order_id": "x", "force": true}),
                "arguments has no `force`",
            ),
            (json!(["ORD-1"]), "arguments must be object, not array"),
        ];
        for (value, expected) in misfits {
            assert_eq!(check(&schema, &value), Err(expected.to_owned()), "{value}");
        }
    }

    #[test]
    fn what_the_check_does_not_read_is_left_to_the_server() {
        let open = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}});
        assert_eq!(check(&open, &json!({"a": 1, "b": 2})), Ok(()));
        assert_eq!(check(&json!(true), &json!(null)), Ok(()));
    }
}
