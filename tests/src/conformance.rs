//! Checks an answer of the worker's API against its generated OpenAPI document: the status must
//! be one the operation documents, and a JSON body must fit the documented schema. The HTTP
//! tests run every answer they get through it, so an answer the handlers give and the document
//! does not describe fails the test that provoked it.

use std::sync::OnceLock;

use serde_json::Value;

fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(waymark::http::openapi_document)
}

/// `Err` with what does not fit, for `method` on `path` (query string allowed) answering
/// `status` with `body` (`Value::String` for a body that is not JSON).
pub fn check_answer(method: &str, path: &str, status: u16, body: &Value) -> Result<(), String> {
    let path = path.split('?').next().unwrap_or(path);
    let Some(operation) = operation(method, path) else {
        // The fallbacks' answers: no such route, or not this method on it.
        return match status {
            404 | 405 => fits(body, &error_body(), "body"),
            _ => Err(format!("{method} {path} is not documented")),
        };
    };
    let response = &operation["responses"][status.to_string()];
    if response.is_null() {
        return Err(format!(
            "{method} {path} answered {status}, not documented: {body}"
        ));
    }
    let schema = &response["content"]["application/json"]["schema"];
    if schema.is_null() || body.is_string() && status == 200 && !schema.is_object() {
        return Ok(());
    }
    fits(body, schema, "body").map_err(|e| format!("{method} {path} {status}: {e}"))
}

fn error_body() -> Value {
    serde_json::json!({"$ref": "#/components/schemas/ErrorBody"})
}

fn operation(method: &str, path: &str) -> Option<&'static Value> {
    let paths = document()["paths"].as_object()?;
    let wanted: Vec<&str> = path.split('/').collect();
    let (_, item) = paths.iter().find(|(template, _)| {
        let template: Vec<&str> = template.split('/').collect();
        template.len() == wanted.len()
            && template
                .iter()
                .zip(&wanted)
                .all(|(t, w)| t.starts_with('{') || t == w)
    })?;
    let operation = &item[method.to_ascii_lowercase()];
    (!operation.is_null()).then_some(operation)
}

fn resolve(schema: &Value) -> &Value {
    match schema["$ref"].as_str().and_then(|r| r.rsplit('/').next()) {
        Some(name) => &document()["components"]["schemas"][name],
        None => schema,
    }
}

/// Whether `value` fits `schema`, for the JSON Schema the document uses: `$ref`, `type` (one or
/// several), `properties` with `required`, `items`, `additionalProperties`, `oneOf`.
fn fits(value: &Value, schema: &Value, at: &str) -> Result<(), String> {
    let schema = resolve(schema);
    if let Some(choices) = schema["oneOf"].as_array() {
        let fitting = choices
            .iter()
            .filter(|c| fits(value, c, at).is_ok())
            .count();
        return match fitting {
            1 => Ok(()),
            n => Err(format!("{at}: {value} fits {n} of the oneOf choices")),
        };
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => return Ok(()),
    };
    if !types.iter().any(|t| is_type(value, t)) {
        return Err(format!("{at}: {value} is not {types:?}"));
    }
    if let Value::Object(fields) = value {
        for required in schema["required"].as_array().into_iter().flatten() {
            let name = required.as_str().unwrap_or_default();
            if !fields.contains_key(name) {
                return Err(format!("{at}: `{name}` is missing from {value}"));
            }
        }
        for (name, field) in fields {
            let declared = &schema["properties"][name];
            let field_schema = match declared.is_null() {
                true => &schema["additionalProperties"],
                false => declared,
            };
            if field_schema.is_object() {
                fits(field, field_schema, &format!("{at}.{name}"))?;
            }
        }
    }
    if let (Value::Array(items), Some(item)) = (value, schema.get("items")) {
        for (i, element) in items.iter().enumerate() {
            fits(element, item, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

fn is_type(value: &Value, name: &str) -> bool {
    match name {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => false,
    }
}
