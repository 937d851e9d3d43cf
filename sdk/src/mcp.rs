//! Tools from MCP servers, made journaled steps of an agent.
//!
//! ```ignore
//! let carrier = McpServer::stdio("carrier", "/usr/local/bin/carrier-mcp")
//!     .effect("book", &["order_id"])       // changes the world: keyed by `order_id`
//!     .reconcile_with("find_booking")      // asked when a booking's outcome is unknown
//!     .connect()
//!     .await?;                             // lists the tools, refuses undeclared effects
//! let worker = Worker::builder().mcp(carrier.clone()) /* … */ .build().await?;
//! // in a workflow:
//! let agent = Agent::new("planner").mcp("carrier");
//! ```
//!
//! [`McpServer::connect`] starts (or reaches) the server, lists its tools and classifies each:
//! annotated read-only or declared [`McpServer::read`], it is a read; declared
//! [`McpServer::effect`], it is an effect whose idempotency key is built from the named
//! arguments, sent to the server as `_meta.idempotency_key`, and whose unknown outcome is
//! settled by the declared lookup tool (or by an operator). A tool that may change the world
//! and is declared neither way refuses the connection: the model must never reach a side
//! effect Waymark cannot key.
//!
//! The worker registers each tool as an activity named `mcp.{server}.{tool}`. An agent lists a
//! server's tools at its start as a journaled step (`waymark.mcp.tools`), so a replay offers
//! the model the tools the original offered, and each call is journaled like any activity.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use futures::FutureExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::ServiceExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use waymark_runtime::journal::{Failure, FailureKind, Payload};
use waymark_runtime::registry::{
    self as rt, ActivityInfo, EffectRegistration, ReconcileOutcome, RegisteredActivity,
};

use crate::{ActivityError, ActivityOptions};

/// The built-in activity that answers the tools a connected server offers.
pub const MCP_TOOLS_ACTIVITY: &str = "waymark.mcp.tools";

/// An MCP server to connect to, and what its tools that change the world are.
#[derive(Debug, Clone)]
pub struct McpServer {
    name: String,
    transport: Transport,
    reads: BTreeSet<String>,
    effects: BTreeMap<String, EffectDeclaration>,
    last_effect: Option<String>,
}

#[derive(Debug, Clone)]
enum Transport {
    Stdio {
        program: PathBuf,
        args: Vec<String>,
        envs: Vec<(String, String)>,
    },
    StreamableHttp {
        url: String,
    },
}

#[derive(Debug, Clone, Default)]
struct EffectDeclaration {
    key: Vec<String>,
    reconcile: Option<String>,
}

impl McpServer {
    /// A server started as a child process speaking MCP over its stdin and stdout, known to
    /// agents as `name`.
    pub fn stdio(name: &str, program: impl Into<PathBuf>) -> Self {
        let transport = Transport::Stdio {
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
        };
        Self::over(name, transport)
    }

    /// A server already running, reached over MCP's streamable HTTP transport at `url`
    /// (`http://host:port/mcp`), known to agents as `name`.
    pub fn streamable_http(name: &str, url: &str) -> Self {
        let transport = Transport::StreamableHttp {
            url: url.to_owned(),
        };
        Self::over(name, transport)
    }

    fn over(name: &str, transport: Transport) -> Self {
        Self {
            name: name.to_owned(),
            transport,
            reads: BTreeSet::new(),
            effects: BTreeMap::new(),
            last_effect: None,
        }
    }

    /// An argument of the server's command (a stdio server's; ignored over HTTP).
    pub fn arg(mut self, arg: &str) -> Self {
        if let Transport::Stdio { args, .. } = &mut self.transport {
            args.push(arg.to_owned());
        }
        self
    }

    /// An environment variable of the server's process (a stdio server's; ignored over HTTP).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        if let Transport::Stdio { envs, .. } = &mut self.transport {
            envs.push((key.to_owned(), value.to_owned()));
        }
        self
    }

    /// `tool` only reads, though the server does not annotate it read-only.
    pub fn read(mut self, tool: &str) -> Self {
        self.reads.insert(tool.to_owned());
        self
    }

    /// `tool` changes the world: it runs as an effect whose idempotency key is built from the
    /// arguments named `key`, in that order (the ones that name its business target).
    pub fn effect(mut self, tool: &str, key: &[&str]) -> Self {
        let key = key.iter().map(|k| (*k).to_owned()).collect();
        let declaration = EffectDeclaration {
            key,
            reconcile: None,
        };
        self.effects.insert(tool.to_owned(), declaration);
        self.last_effect = Some(tool.to_owned());
        self
    }

    /// The effect declared last is reconciled by calling the read tool `lookup` with the same
    /// arguments and key: it answers what the key did, or nothing (an empty text or `null`)
    /// when the key was never applied.
    pub fn reconcile_with(mut self, lookup: &str) -> Self {
        let effect = self.last_effect.as_ref();
        if let Some(declaration) = effect.and_then(|tool| self.effects.get_mut(tool)) {
            declaration.reconcile = Some(lookup.to_owned());
        }
        self
    }

    /// Starts the server, lists its tools and checks the declarations against them.
    pub async fn connect(self) -> Result<McpTools, McpError> {
        self.check_name()?;
        let client = self.start().await?;
        let listed = client
            .list_all_tools()
            .await
            .map_err(|e| McpError::Protocol {
                server: self.name.clone(),
                message: e.to_string(),
            })?;
        let tools = self.classify(&listed)?;
        Ok(McpTools {
            server: self.name,
            client: Arc::new(client),
            tools: Arc::new(tools),
        })
    }

    /// The server's name is part of activity names (`mcp.{server}.{tool}`): a `.` in it could
    /// make two servers' tools one activity.
    fn check_name(&self) -> Result<(), McpError> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        match !self.name.is_empty() && self.name.chars().all(allowed) {
            true => Ok(()),
            false => Err(McpError::Declaration {
                server: self.name.clone(),
                message: "a server's name is letters, digits, `_` and `-`".to_owned(),
            }),
        }
    }

    async fn start(&self) -> Result<RunningService<RoleClient, ()>, McpError> {
        let unreachable = |message: String| McpError::Unreachable {
            server: self.name.clone(),
            message,
        };
        let served = match &self.transport {
            Transport::Stdio {
                program,
                args,
                envs,
            } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).envs(envs.iter().cloned());
                let transport = rmcp::transport::TokioChildProcess::new(command)
                    .map_err(|e| unreachable(format!("{}: {e}", program.display())))?;
                ().serve(transport).await
            }
            Transport::StreamableHttp { url } => {
                let transport =
                    rmcp::transport::StreamableHttpClientTransport::from_uri(url.clone());
                ().serve(transport).await
            }
        };
        served.map_err(|e| unreachable(e.to_string()))
    }

    /// Each listed tool as a read or a declared effect; an undeclared tool that may change the
    /// world, or a declaration that names what the server does not have, is refused.
    fn classify(&self, listed: &[rmcp::model::Tool]) -> Result<Vec<McpTool>, McpError> {
        let refuse = |message: String| McpError::Declaration {
            server: self.name.clone(),
            message,
        };
        let names: BTreeSet<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
        for (tool, declaration) in &self.effects {
            let lookup = declaration.reconcile.iter();
            if let Some(missing) = std::iter::once(tool)
                .chain(lookup)
                .find(|t| !names.contains(t.as_str()))
            {
                return Err(refuse(format!("the server has no tool `{missing}`")));
            }
        }
        let tools: Result<Vec<McpTool>, McpError> = listed
            .iter()
            .map(|tool| self.classify_one(tool).map_err(refuse))
            .collect();
        // By name, so the order the model sees does not depend on the server's.
        let mut tools = tools?;
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(tools)
    }

    fn classify_one(&self, tool: &rmcp::model::Tool) -> Result<McpTool, String> {
        let name = tool.name.to_string();
        let input_schema = Value::Object((*tool.input_schema).clone());
        let read_only = tool.annotations.as_ref().and_then(|a| a.read_only_hint);
        let effect = match self.effects.get(&name) {
            Some(declaration) => Some(checked_key(&name, declaration, &input_schema)?),
            None if read_only == Some(true) || self.reads.contains(&name) => None,
            None => {
                return Err(format!(
                    "the tool `{name}` may change the world (it is not annotated read-only): \
                     declare it with `.effect(\"{name}\", &[..])`, naming the arguments its \
                     idempotency key is built from, or with `.read(\"{name}\")` if it only reads"
                ))
            }
        };
        Ok(McpTool {
            server: self.name.clone(),
            name,
            description: tool.description.as_deref().unwrap_or_default().to_owned(),
            input_schema,
            effect,
        })
    }
}

/// An effect's key arguments, each one the tool takes.
fn checked_key(
    tool: &str,
    declaration: &EffectDeclaration,
    schema: &Value,
) -> Result<McpEffect, String> {
    if declaration.key.is_empty() {
        return Err(format!(
            "the effect `{tool}` names no key argument: name the arguments that say which \
             business target it changes"
        ));
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let unknown = declaration
        .key
        .iter()
        .find(|k| !properties.is_some_and(|p| p.contains_key(*k)));
    if let Some(unknown) = unknown {
        return Err(format!(
            "the effect `{tool}` takes no argument `{unknown}` for its key"
        ));
    }
    // An optional key argument left out would give two targets one key: the second would be
    // answered with the first's result, or refused as a conflict.
    let required = schema.get("required").and_then(Value::as_array);
    let is_required = |k: &String| required.is_some_and(|r| r.iter().any(|n| n == k.as_str()));
    if let Some(optional) = declaration.key.iter().find(|k| !is_required(k)) {
        return Err(format!(
            "the effect `{tool}`'s key argument `{optional}` is optional in its schema: a key \
             is built from arguments every call carries"
        ));
    }
    Ok(McpEffect {
        key: declaration.key.clone(),
        reconcile: declaration.reconcile.clone(),
    })
}

/// Why an MCP server could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    /// It could not be started or reached.
    #[error("MCP server `{server}` could not be reached: {message}")]
    Unreachable {
        /// The server.
        server: String,
        /// Why.
        message: String,
    },
    /// It answered something that is not MCP.
    #[error("MCP server `{server}` failed: {message}")]
    Protocol {
        /// The server.
        server: String,
        /// Why.
        message: String,
    },
    /// Its tools do not match what was declared about them.
    #[error("MCP server `{server}`: {message}")]
    Declaration {
        /// The server.
        server: String,
        /// What is wrong.
        message: String,
    },
}

/// One tool of a connected server, as an agent lists it (journaled).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpTool {
    /// The server's name.
    pub server: String,
    /// The tool's name on the server.
    pub name: String,
    /// What it does, as the server says.
    pub description: String,
    /// The JSON schema of its arguments.
    pub input_schema: Value,
    /// For a tool that changes the world: its key and reconciler.
    pub effect: Option<McpEffect>,
}

impl McpTool {
    /// The activity it runs as: `mcp.{server}.{tool}`.
    pub fn activity_name(&self) -> String {
        format!("mcp.{}.{}", self.server, self.name)
    }
}

/// What was declared about a tool that changes the world.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpEffect {
    /// The arguments its idempotency key is built from, in order.
    pub key: Vec<String>,
    /// The read tool that answers what a key did.
    pub reconcile: Option<String>,
}

impl McpEffect {
    /// The key arguments of `arguments`: the named values, in order; a missing one is `null`
    /// (the model must write it for the call to pass the schema, which requires it).
    pub(crate) fn key_arguments(&self, arguments: &Value) -> Value {
        let values = self
            .key
            .iter()
            .map(|k| arguments.get(k).cloned().unwrap_or(Value::Null));
        Value::Array(values.collect())
    }
}

/// A connected server and its classified tools. Clones share the connection; the server runs
/// as long as a clone is alive, across restarts of the workers that use it.
#[derive(Clone)]
pub struct McpTools {
    server: String,
    client: Arc<RunningService<RoleClient, ()>>,
    tools: Arc<Vec<McpTool>>,
}

impl std::fmt::Debug for McpTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTools")
            .field("server", &self.server)
            .field("tools", &self.tools)
            .finish()
    }
}

impl McpTools {
    /// The server's name.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Its tools.
    pub fn tools(&self) -> &[McpTool] {
        &self.tools
    }

    /// Each tool as the activity the worker registers.
    pub(crate) fn registrations(&self) -> Vec<(String, RegisteredActivity)> {
        let tools = self.tools.iter();
        tools
            .map(|tool| (tool.activity_name(), self.registration(tool)))
            .collect()
    }

    fn registration(&self, tool: &McpTool) -> RegisteredActivity {
        let run = call_fn(
            self.client.clone(),
            tool.name.clone(),
            tool.effect.is_some(),
        );
        let effect = tool.effect.as_ref().map(|effect| EffectRegistration {
            version: 1,
            at_most_once: false,
            key_arguments: key_arguments_fn(effect.clone()),
            reconcile: reconcile_fn(self.client.clone(), effect.reconcile.clone()),
            check_output: Arc::new(|_| Ok(())),
        });
        RegisteredActivity {
            run,
            options: ActivityOptions::default().max_attempts(3),
            effect,
            cached: false,
        }
    }
}

/// The built-in activity answering the tools of each connected server, by name.
pub(crate) fn tools_registration(servers: &[McpTools]) -> RegisteredActivity {
    let listed: BTreeMap<String, Vec<McpTool>> = servers
        .iter()
        .map(|s| (s.server.clone(), s.tools.as_ref().clone()))
        .collect();
    let listed = Arc::new(listed);
    let run: rt::ActivityFn = Arc::new(move |_info, input: Payload| {
        let listed = listed.clone();
        async move {
            let server: String = input.decode().map_err(|e| terminal(e.to_string()))?;
            let tools = listed.get(&server).ok_or_else(|| {
                terminal(format!(
                    "this worker is connected to no MCP server `{server}`"
                ))
            })?;
            Payload::encode(tools).map_err(|e| terminal(e.to_string()))
        }
        .boxed()
    });
    RegisteredActivity {
        run,
        options: ActivityOptions::default(),
        effect: None,
        cached: false,
    }
}

fn terminal(message: String) -> Failure {
    Failure::new(FailureKind::Terminal, message)
}

fn key_arguments_fn(effect: McpEffect) -> rt::KeyArgumentsFn {
    Arc::new(move |input: &Payload| {
        let arguments: Value = input.decode().map_err(|e| e.to_string())?;
        Ok(Payload::from_value(&effect.key_arguments(&arguments)))
    })
}

type Client = Arc<RunningService<RoleClient, ()>>;

fn call_fn(client: Client, tool: String, effect: bool) -> rt::ActivityFn {
    Arc::new(move |info: ActivityInfo, input: Payload| {
        let (client, tool) = (client.clone(), tool.clone());
        async move {
            let result = call(&client, &tool, &info, &input).await;
            let result = result.map_err(|e| failure(e, effect).to_failure())?;
            match result.is_error {
                Some(true) => Err(ActivityError::terminal(result_text(&result)).to_failure()),
                _ => Ok(Payload::from_value(&result_value(&result))),
            }
        }
        .boxed()
    })
}

fn reconcile_fn(client: Client, lookup: Option<String>) -> rt::ReconcileFn {
    Arc::new(move |info: ActivityInfo, input: Payload| {
        let lookup = lookup.clone()?;
        let client = client.clone();
        Some(
            async move {
                let result = call(&client, &lookup, &info, &input).await;
                let result = result.map_err(|e| failure(e, false).to_failure())?;
                if result.is_error == Some(true) {
                    let why = format!("`{lookup}` failed: {}", result_text(&result));
                    return Ok(ReconcileOutcome::StillUnknown(why));
                }
                Ok(match result_value(&result) {
                    Value::Null => ReconcileOutcome::NotFound,
                    Value::String(text) if text.trim().is_empty() => ReconcileOutcome::NotFound,
                    found => ReconcileOutcome::Committed(Payload::from_value(&found)),
                })
            }
            .boxed(),
        )
    })
}

/// One `tools/call`, with the attempt's idempotency key in `_meta` when it has one.
async fn call(
    client: &RunningService<RoleClient, ()>,
    tool: &str,
    info: &ActivityInfo,
    input: &Payload,
) -> Result<CallToolResult, ServiceError> {
    let arguments: JsonObject = input.decode().map_err(|e| {
        ServiceError::McpError(rmcp::model::ErrorData::invalid_params(
            format!("the call's input is not a JSON object: {e}"),
            None,
        ))
    })?;
    let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
    if let Some(key) = &info.idempotency_key {
        let mut meta = JsonObject::new();
        meta.insert("idempotency_key".into(), Value::String(key.clone()));
        params.meta = Some(meta.into());
    }
    client.call_tool(params).await
}

/// What a failed call may mean: never sent is retriable; sent with no answer leaves an effect
/// unknown (a read is asked again); refused by the server is final.
fn failure(error: ServiceError, effect: bool) -> ActivityError {
    let message = format!("MCP call failed: {error}");
    match error {
        ServiceError::McpError(_) => ActivityError::terminal(message),
        // Over streamable HTTP a POST that failed after the server read it is reported as a
        // send failure too: for an effect, it may have happened.
        ServiceError::TransportSend(_) if !effect => ActivityError::retriable(message),
        _ if effect => ActivityError::uncertain(message),
        _ => ActivityError::retriable(message),
    }
}

/// The result as one JSON value: the structured content when the server gave one, else the
/// text content (parsed when it is JSON).
fn result_value(result: &CallToolResult) -> Value {
    if let Some(structured) = &result.structured_content {
        return structured.clone();
    }
    let text = result_text(result);
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

fn result_text(result: &CallToolResult) -> String {
    let texts = result.content.iter().filter_map(|c| c.as_text());
    texts
        .map(|t| t.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_key_is_built_from_arguments_every_call_carries() {
        let schema = json!({"type": "object",
            "properties": {"order_id": {"type": "string"}, "note": {"type": "string"}},
            "required": ["order_id"]});
        let declared = |key: &[&str]| EffectDeclaration {
            key: key.iter().map(|k| (*k).to_owned()).collect(),
            reconcile: None,
        };
        assert!(checked_key("book", &declared(&["order_id"]), &schema).is_ok());
        assert_eq!(
            checked_key("book", &declared(&["note"]), &schema).unwrap_err(),
            "the effect `book`'s key argument `note` is optional in its schema: a key is built \
             from arguments every call carries"
        );
    }

    #[tokio::test]
    async fn a_server_name_that_could_make_two_tools_one_activity_is_refused() {
        let refused = McpServer::stdio("a.b", "/nonexistent")
            .connect()
            .await
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "MCP server `a.b`: a server's name is letters, digits, `_` and `-`"
        );
    }
}
