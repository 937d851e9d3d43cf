//! An activity or effect offered to a model: its spec (name, description, the JSON schema of
//! its arguments object), how a call's arguments become its typed input, and how it runs.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use serde::Serialize;
use serde_json::{Map, Value};
use waymark_runtime::journal::{Digest, Payload};
use waymark_runtime::llm::ToolSpec;

use crate::artifacts::Approval;
use crate::{Activity, ActivityError, WorkflowContext};

/// A model's call, checked: the tool's typed input as canonical JSON and, for an effect, its
/// version and key arguments.
#[derive(Debug, Clone)]
pub(crate) struct Decoded {
    pub(crate) arguments: Value,
    pub(crate) input: Payload,
    pub(crate) key: Option<(u32, Payload)>,
}

/// What a person approved for one call: the run refuses the call unless the approval names
/// this very intent.
pub(crate) struct Authority {
    pub(crate) approval: Approval,
}

type DecodeFn = Arc<dyn Fn(&Map<String, Value>) -> Result<Decoded, String> + Send + Sync>;
type RunFn = Arc<
    dyn Fn(&WorkflowContext, &Decoded, Option<&Authority>) -> BoxFuture<'static, ToolResult>
        + Send
        + Sync,
>;

/// A tool's answer as the model reads it (JSON of the output), or its error.
pub(crate) type ToolResult = Result<String, ActivityError>;

/// One tool of an agent.
#[derive(Clone)]
pub(crate) struct Tool {
    pub(crate) spec: ToolSpec,
    /// The activity it runs as (the model may know it by another name).
    pub(crate) operation: String,
    pub(crate) needs_approval: bool,
    decode: DecodeFn,
    run: RunFn,
}

impl Tool {
    /// `activity` as a tool; `Err` says why it cannot be one.
    pub(crate) fn of<A>(activity: A) -> Result<Self, String>
    where
        A: Activity,
        A::Input: schemars::JsonSchema,
    {
        check_name(A::NAME)?;
        let parameters = parameters_schema::<A::Input>(A::NAME, A::PARAMETERS)?;
        // The schema's own digest: it changes exactly when what the model may write does.
        let version = Payload::from_value(&parameters).digest().short();
        let spec = ToolSpec {
            name: A::NAME.to_owned(),
            description: A::DESCRIPTION.to_owned(),
            parameters,
            version,
        };
        let decode: DecodeFn = Arc::new(|arguments| decode_arguments::<A>(arguments));
        let run: RunFn = Arc::new(move |ctx, decoded, authority| {
            run_call(ctx, activity.clone(), decoded, authority)
        });
        Ok(Self {
            spec,
            operation: A::NAME.to_owned(),
            needs_approval: false,
            decode,
            run,
        })
    }

    pub(crate) fn decode(&self, arguments: &Map<String, Value>) -> Result<Decoded, String> {
        (self.decode)(arguments)
    }

    pub(crate) fn run(
        &self,
        ctx: &WorkflowContext,
        decoded: &Decoded,
        authority: Option<&Authority>,
    ) -> BoxFuture<'static, ToolResult> {
        (self.run)(ctx, decoded, authority)
    }

    /// What a person approves for `decoded`: this tool, at its effect version, under its
    /// idempotency key (derived from `key_root`, the workflow's id or a fork's source's), with
    /// exactly these arguments.
    pub(crate) fn intent(&self, key_root: &str, decoded: &Decoded) -> ToolIntent {
        let (version, idempotency_key) = match &decoded.key {
            Some((version, key_arguments)) => {
                let key = waymark_runtime::operations::idempotency_key(
                    key_root,
                    &self.operation,
                    key_arguments,
                    *version,
                );
                (Some(*version), Some(key))
            }
            None => (None, None),
        };
        ToolIntent {
            tool: self.spec.name.clone(),
            version,
            idempotency_key,
            arguments: decoded.arguments.clone(),
        }
    }
}

/// The intent of one tool call: what an approval is bound to. Its digest (the hash of its
/// canonical content, which is the hash of the artifact it is committed as) changes with any
/// argument, so an approval of one call never covers another.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ToolIntent {
    /// The tool.
    pub tool: String,
    /// The effect's semantics version; `None` for a read.
    pub version: Option<u32>,
    /// The effect's idempotency key; `None` for a read.
    pub idempotency_key: Option<String>,
    /// The arguments exactly as they will execute, by parameter name: the tool's typed input,
    /// encoded again from its type.
    pub arguments: Value,
}

impl ToolIntent {
    /// The digest an approval of this intent names.
    pub(crate) fn digest(&self) -> Digest {
        match Payload::encode(self) {
            Ok(content) => waymark_runtime::artifacts::artifact_hash(&content),
            // A struct of strings, numbers and a JSON value always encodes.
            Err(_) => Digest::of(self.tool.as_bytes()),
        }
    }
}

#[cfg(feature = "mcp")]
impl Tool {
    /// An MCP server's tool, offered to the model as `{server}__{tool}`: its arguments checked
    /// against the server's schema, run as the activity the worker registered for it.
    pub(crate) fn mcp(tool: &crate::mcp::McpTool) -> Result<Self, String> {
        let name = model_name(&tool.server, &tool.name);
        check_name(&name)?;
        let mut parameters = tool.input_schema.clone();
        if let Some(schema) = parameters.as_object_mut() {
            schema.remove("$schema");
        }
        let spec = ToolSpec {
            name,
            description: tool.description.clone(),
            version: Payload::from_value(&parameters).digest().short(),
            parameters: parameters.clone(),
        };
        let effect = tool.effect.clone();
        let decode: DecodeFn = Arc::new(move |arguments| {
            let arguments = Value::Object(arguments.clone());
            super::schema::check(&parameters, &arguments)?;
            let key = effect.as_ref().map(|effect| {
                let key_arguments = effect.key_arguments(&arguments);
                (1, Payload::from_value(&key_arguments))
            });
            let input = Payload::from_value(&arguments);
            Ok(Decoded {
                arguments,
                input,
                key,
            })
        });
        let operation = tool.activity_name();
        let activity = operation.clone();
        let run: RunFn = Arc::new(move |ctx, decoded, authority| {
            let call = ctx.effect_named(&activity, &decoded.arguments);
            run_under(call, decoded, authority)
        });
        Ok(Self {
            spec,
            operation,
            needs_approval: false,
            decode,
            run,
        })
    }
}

/// `{server}__{tool}`, with what a model's function name may not hold made `_`.
#[cfg(feature = "mcp")]
fn model_name(server: &str, tool: &str) -> String {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let name = format!("{server}__{tool}");
    name.chars()
        .map(|c| if allowed(c) { c } else { '_' })
        .collect()
}

/// Runs one checked call: the input decoded again (it was checked, so this only fails on a
/// bug), scheduled as the activity, under the approval when there is one.
fn run_call<A: Activity>(
    ctx: &WorkflowContext,
    activity: A,
    decoded: &Decoded,
    authority: Option<&Authority>,
) -> BoxFuture<'static, ToolResult> {
    let input: A::Input = match decoded.input.decode() {
        Ok(input) => input,
        Err(error) => {
            let error =
                ActivityError::terminal(format!("checked arguments do not decode: {error}"));
            return futures::future::ready(Err(error)).boxed();
        }
    };
    run_under(ctx.effect_of(activity, input), decoded, authority)
}

/// Awaits a scheduled call, under the approval when there is one, as the model reads it.
fn run_under<T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static>(
    call: crate::EffectCall<T>,
    decoded: &Decoded,
    authority: Option<&Authority>,
) -> BoxFuture<'static, ToolResult> {
    let call = match (authority, decoded.key.is_some()) {
        (Some(authority), true) => call.under(&authority.approval),
        _ => call,
    };
    async move {
        let output = call.await?;
        serde_json::to_string(&output)
            .map_err(|e| ActivityError::terminal(format!("the tool's output does not encode: {e}")))
    }
    .boxed()
}

/// Providers accept `^[a-zA-Z0-9_-]{1,64}$` as a function name.
fn check_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    match !name.is_empty() && name.len() <= 64 && name.chars().all(allowed) {
        true => Ok(()),
        false => Err(format!(
            "`{name}` cannot be a tool name: models accept 1 to 64 letters, digits, `_` and `-`"
        )),
    }
}

/// The JSON schema of the arguments object: one property per parameter, each with the schema
/// of its type, all required, nothing else allowed. Definitions stay at the root, where the
/// properties' references point.
fn parameters_schema<I: schemars::JsonSchema>(
    tool: &str,
    parameters: &[&str],
) -> Result<Value, String> {
    let root = serde_json::to_value(schemars::schema_for!(I))
        .map_err(|e| format!("the schema of `{tool}`'s input does not serialize: {e}"))?;
    let definitions = root.get("$defs").cloned();
    let schemas = parameter_schemas(tool, parameters, root)?;
    let properties: Map<String, Value> = parameters
        .iter()
        .map(|name| (*name).to_owned())
        .zip(schemas)
        .collect();
    let mut schema = serde_json::json!({
        "type": "object",
        "properties": properties,
        "required": parameters,
        "additionalProperties": false,
    });
    if let Some(definitions) = definitions {
        schema["$defs"] = definitions;
    }
    Ok(schema)
}

/// The schema of each parameter: the input's own for one, the tuple's items for several.
fn parameter_schemas(tool: &str, parameters: &[&str], root: Value) -> Result<Vec<Value>, String> {
    match parameters {
        [] => Ok(Vec::new()),
        [_] => {
            let mut schema = root;
            if let Some(object) = schema.as_object_mut() {
                // The type's name as a title says nothing the property's name does not.
                object.remove("$schema");
                object.remove("$defs");
                object.remove("title");
            }
            Ok(vec![schema])
        }
        several => {
            let items = root.get("prefixItems").or_else(|| root.get("items"));
            match items.and_then(Value::as_array) {
                Some(items) if items.len() == several.len() => Ok(items.clone()),
                _ => Err(format!(
                    "`{tool}` names {} parameters but its input is not a tuple of as many",
                    several.len()
                )),
            }
        }
    }
}

/// The arguments object as the tool's typed input: only its parameters, each decoding as its
/// type. The input is re-encoded from the typed value, so what runs (and what is approved) is
/// the canonical form of what the tool accepts.
fn decode_arguments<A: Activity>(arguments: &Map<String, Value>) -> Result<Decoded, String> {
    let parameters = A::PARAMETERS;
    if let Some(unknown) = arguments.keys().find(|k| !parameters.contains(&k.as_str())) {
        return Err(format!(
            "unknown argument `{unknown}`; `{}` takes {}",
            A::NAME,
            parameter_list(parameters)
        ));
    }
    let value = |name: &str| arguments.get(name).cloned().unwrap_or(Value::Null);
    let input = match parameters {
        [] => Value::Null,
        [single] => value(single),
        several => Value::Array(several.iter().map(|name| value(name)).collect()),
    };
    let input: A::Input = serde_json::from_value(input).map_err(|error| {
        match parameters
            .iter()
            .find(|name| !arguments.contains_key(**name))
        {
            Some(missing) => format!("missing argument `{missing}`"),
            None => format!("arguments do not fit `{}`: {error}", A::NAME),
        }
    })?;
    let typed = serde_json::to_value(&input).map_err(|e| e.to_string())?;
    let payload = Payload::from_value(&typed);
    let arguments = named(parameters, typed);
    let key = match A::effect_key(&input) {
        Some(key) => Some((key.version, key.arguments.into_payload()?)),
        None => None,
    };
    Ok(Decoded {
        arguments,
        input: payload,
        key,
    })
}

/// The typed input as an object of its parameters: what a person approving the call reads.
fn named(parameters: &[&str], typed: Value) -> Value {
    let values = match (parameters, typed) {
        ([], _) => Vec::new(),
        ([_], value) => vec![value],
        (_, Value::Array(values)) => values,
        (_, other) => vec![other],
    };
    let names = parameters.iter().map(|name| (*name).to_owned());
    Value::Object(names.zip(values).collect())
}

fn parameter_list(parameters: &[&str]) -> String {
    match parameters {
        [] => "no arguments".to_owned(),
        names => {
            let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            names.join(", ")
        }
    }
}
