//! `ctx.agent(..)`: a model that chooses tool calls, made durable step by step.
//!
//! ```ignore
//! let agent = Agent::new("planner")
//!     .system(POLICY)
//!     .tool(search_policy)            // #[activity]: a read
//!     .tool(rebook).needs_approval()  // #[activity(effect)] with #[key] order_id
//!     .tool(notify_warehouse)
//!     .budget(Budget::default().model_calls(8).cost_micros(500_000));
//! let answer = ctx.agent(&agent, vec![Message::user(question)]).await?;
//! ```
//!
//! The loop is workflow code over journaled steps. Each model answer is a `ctx.llm` call; each
//! tool call it chose is checked against the tool (an unknown name or arguments that do not
//! fit are refused, the refusal journaled as a verdict and sent back to the model), then runs
//! as that tool's activity or effect. An effect runs under its business-intent idempotency
//! key, so a model that re-plans after a crash and picks the same intent is answered from the
//! operation log and the downstream is not called again. A tool that needs approval waits for
//! a person to approve the exact call (its [`ToolIntent`]); a rejection goes back to the model
//! with the approver's reason. The results go back as `tool` messages under the calls' ids, in
//! the order the model made the calls, and the next model call follows, until the model
//! answers without calling a tool or a [`Budget`] bound is reached.
//!
//! On resume everything recorded is replayed: the answers, the verdicts, the tool results and
//! what the budget counted from them. Only the unrecorded remainder runs.

mod budget;
mod run;
#[cfg(feature = "mcp")]
mod schema;
mod tool;
mod turn;

use std::time::Duration;

use waymark_runtime::llm::{LlmResponse, Message, ToolSpec};

pub use budget::{Budget, BudgetKind, Spent};
pub use tool::ToolIntent;

use crate::{Activity, ActivityError, WorkflowContext, WorkflowError};
use tool::Tool;

/// A model and the tools it may call, declared once and run with [`WorkflowContext::agent`].
#[derive(Clone)]
pub struct Agent {
    model: String,
    system: Option<String>,
    tools: Vec<Tool>,
    budget: Budget,
    approval_expires_in: Option<Duration>,
    /// MCP servers whose tools are offered too, listed when a run begins.
    #[cfg(feature = "mcp")]
    mcp_servers: Vec<String>,
    /// Whether the last tool declaration was an MCP server (`needs_approval` cannot follow it).
    #[cfg(feature = "mcp")]
    mcp_last: bool,
    /// The first mistake in the declaration; running the agent reports it.
    misdeclared: Option<String>,
}

impl Agent {
    /// An agent on `model`, with no tools yet and the default [`Budget`].
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_owned(),
            system: None,
            tools: Vec::new(),
            budget: Budget::default(),
            approval_expires_in: None,
            #[cfg(feature = "mcp")]
            mcp_servers: Vec::new(),
            #[cfg(feature = "mcp")]
            mcp_last: false,
            misdeclared: None,
        }
    }

    /// The system prompt, sent first in every model call.
    pub fn system(mut self, prompt: impl Into<String>) -> Self {
        self.system = Some(prompt.into());
        self
    }

    /// Offers `activity` as a tool: an `#[activity]` (a read) or an `#[activity(effect)]`, named
    /// by its stable name, described by its doc comment, its arguments an object of its
    /// parameters with the JSON schema of their types.
    pub fn tool<A>(mut self, activity: A) -> Self
    where
        A: Activity,
        A::Input: schemars::JsonSchema,
    {
        #[cfg(feature = "mcp")]
        {
            self.mcp_last = false;
        }
        match Tool::of(activity) {
            Ok(_) if self.tools.iter().any(|t| t.spec.name == A::NAME) => {
                self.misdeclare(format!("the tool `{}` is offered twice", A::NAME));
            }
            Ok(tool) => self.tools.push(tool),
            Err(why) => self.misdeclare(why),
        }
        self
    }

    /// The tool added last runs only once a person approves the exact call: tool, effect
    /// version, idempotency key and arguments.
    pub fn needs_approval(mut self) -> Self {
        #[cfg(feature = "mcp")]
        if self.mcp_last {
            let why = "`needs_approval` follows `mcp`: an MCP server's tools cannot be put to a \
                       person yet";
            self.misdeclare(why.to_owned());
            return self;
        }
        match self.tools.last_mut() {
            Some(tool) => tool.needs_approval = true,
            None => self.misdeclare("`needs_approval` follows no `tool`".to_owned()),
        }
        self
    }

    /// An approval request nobody decides within `duration` expires; the model is told the
    /// call did not run.
    pub fn approval_expires_in(mut self, duration: Duration) -> Self {
        self.approval_expires_in = Some(duration);
        self
    }

    /// Offers the tools of the MCP server connected to the worker as `server`
    /// ([`crate::WorkerBuilder::mcp`]), as `{server}__{tool}`. They are listed when a run
    /// begins, as a journaled step, so a resumed run offers the ones the original did.
    #[cfg(feature = "mcp")]
    pub fn mcp(mut self, server: &str) -> Self {
        self.mcp_servers.push(server.to_owned());
        self.mcp_last = true;
        self
    }

    /// The run's bounds.
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// What the model is offered, as sent in every model call.
    pub fn tool_specs(&self) -> Vec<ToolSpec> {
        self.tools.iter().map(|t| t.spec.clone()).collect()
    }

    fn misdeclare(&mut self, why: String) {
        self.misdeclared.get_or_insert(why);
    }
}

/// How an agent run ended: the model's final answer.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentAnswer {
    /// The last answer's text.
    pub text: String,
    /// The last answer as journaled.
    pub response: LlmResponse,
    /// The whole conversation: the messages given, every answer and every tool result.
    pub transcript: Vec<Message>,
    /// What the run spent.
    pub spent: Spent,
}

/// Why an agent run ended without a final answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// A bound of the [`Budget`] was reached (journaled as a verdict, counted once).
    #[error("the agent's {budget} budget is exhausted: {used} reached, {limit} allowed")]
    BudgetExhausted {
        /// Which bound.
        budget: BudgetKind,
        /// The bound.
        limit: u64,
        /// What the run reached (for tool calls: what the next batch would have).
        used: u64,
    },
    /// A model call failed for good (its retry policy gave up).
    #[error("the agent's model call failed: {0}")]
    Model(ActivityError),
    /// The tools of an MCP server could not be listed.
    #[error("the agent's MCP tools could not be listed: {0}")]
    McpTools(ActivityError),
    /// The conversation could not be committed as transcript parts.
    #[error("the agent's transcript could not be committed: {0}")]
    Transcript(String),
    /// The agent was declared wrongly (a tool that cannot be one, a tool offered twice).
    #[error("the agent is declared wrongly: {0}")]
    Declaration(String),
}

impl From<AgentError> for WorkflowError {
    fn from(error: AgentError) -> Self {
        match error {
            AgentError::Model(error) => WorkflowError::Activity(error),
            other => WorkflowError::Failed(other.to_string()),
        }
    }
}

impl WorkflowContext {
    /// Runs `agent` on `messages` until the model answers without calling a tool, durably: see
    /// the [`agent`](crate::agent) module.
    pub async fn agent(
        &self,
        agent: &Agent,
        messages: Vec<Message>,
    ) -> Result<AgentAnswer, AgentError> {
        run::AgentRun::new(self, agent, messages).run().await
    }
}

#[cfg(all(test, feature = "mcp"))]
mod tests {
    use super::*;

    #[test]
    fn needs_approval_after_an_mcp_server_is_a_declaration_error_not_another_tools_gate() {
        let agent = Agent::new("m").mcp("carrier").needs_approval();
        let why = agent.misdeclared.as_deref().unwrap_or_default();
        assert!(why.starts_with("`needs_approval` follows `mcp`"), "{why}");
    }
}
