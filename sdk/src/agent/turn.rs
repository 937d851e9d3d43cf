//! The decisions of an agent turn, without I/O: which tool a model's call names, whether its
//! arguments fit, and the refusal sent back to the model when they do not. Deterministic in the
//! recorded answer, so replay decides what the original decided.

use serde_json::{Map, Value};
use waymark_runtime::llm::ToolCall;

use super::tool::{Decoded, Tool};

/// A call that may run: which tool, with which checked input.
pub(crate) struct Checked {
    pub(crate) tool: usize,
    pub(crate) decoded: Decoded,
}

/// A call that must not run, and what the model is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// `unknown_tool` or `invalid_arguments`: the metric label and the verdict's reason.
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// Checks `call` against the agent's tools. Nothing runs for a refused call.
pub(crate) fn check(tools: &[Tool], call: &ToolCall) -> Result<Checked, Refusal> {
    let Some(tool) = tools.iter().position(|t| t.spec.name == call.name) else {
        let offered: Vec<&str> = tools.iter().map(|t| t.spec.name.as_str()).collect();
        return Err(Refusal {
            reason: "unknown_tool",
            message: format!(
                "there is no tool `{}`; the tools are: {}",
                call.name,
                offered.join(", ")
            ),
        });
    };
    let invalid = |message| Refusal {
        reason: "invalid_arguments",
        message,
    };
    let arguments = arguments_object(&call.arguments).map_err(invalid)?;
    let decoded = tools[tool].decode(&arguments).map_err(invalid)?;
    Ok(Checked { tool, decoded })
}

/// The arguments a model wrote, which must be one JSON object (an empty text is `{}`: some
/// models write nothing for a tool without parameters).
fn arguments_object(text: &str) -> Result<Map<String, Value>, String> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(arguments)) => Ok(arguments),
        Ok(other) => Err(format!(
            "the arguments must be a JSON object, not {}",
            kind_of(&other)
        )),
        Err(error) => Err(format!("the arguments are not JSON: {error}")),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
