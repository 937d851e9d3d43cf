//! One agent run: the loop of model calls and tool calls, each a journaled step.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::UNIX_EPOCH;

use futures::future::{maybe_done, BoxFuture, MaybeDone};
use futures::FutureExt;
use serde_json::json;
use waymark_runtime::journal::Digest;
use waymark_runtime::llm::{
    LlmResponse, Message, ToolCall, TranscriptPart, TOOLSET_KIND, TRANSCRIPT_KIND,
};

use super::budget::Exhausted;
use super::tool::{Authority, Decoded, Tool, ToolIntent};
use super::turn::{self, Refusal};
use super::{Agent, AgentAnswer, AgentError, Spent};
use crate::artifacts::{ApprovalOutcome, ArtifactMeta};
use crate::llm::Llm;
use crate::WorkflowContext;

pub(super) struct AgentRun<'a> {
    ctx: &'a WorkflowContext,
    agent: &'a Agent,
    /// The agent's tools and those its MCP servers listed for this run.
    tools: Vec<Tool>,
    transcript: Vec<Message>,
    /// How many messages of the transcript are committed as parts, and the last part's hash.
    committed: usize,
    history: Option<String>,
    toolset: Option<String>,
    spent: Spent,
    /// Intents a person approved that then ran: the same call again is answered by the
    /// operation log (the key is committed), so it is not put to a person again.
    approved_and_run: HashSet<Digest>,
}

/// What one tool call came to, for the transcript and the budget.
struct CallOutcome {
    /// The `tool` message's content.
    text: String,
    ran: bool,
    refused: bool,
    /// The approved intent, when the call ran under an approval and succeeded.
    approved_intent: Option<Digest>,
}

impl<'a> AgentRun<'a> {
    pub(super) fn new(ctx: &'a WorkflowContext, agent: &'a Agent, messages: Vec<Message>) -> Self {
        let system = agent.system.iter().map(|s| Message::system(s.clone()));
        Self {
            ctx,
            agent,
            tools: agent.tools.clone(),
            transcript: system.chain(messages).collect(),
            committed: 0,
            history: None,
            toolset: None,
            spent: Spent::default(),
            approved_and_run: HashSet::new(),
        }
    }

    pub(super) async fn run(mut self) -> Result<AgentAnswer, AgentError> {
        if let Some(why) = &self.agent.misdeclared {
            return Err(AgentError::Declaration(why.clone()));
        }
        self.list_mcp_tools().await?;
        let started_ms = self.now_ms();
        loop {
            if let Some(started_ms) = started_ms {
                let now = self.now_ms().unwrap_or(started_ms);
                self.spent.elapsed_ms = now.saturating_sub(started_ms);
            }
            if let Some(exhausted) = self.agent.budget.before_model_call(&self.spent) {
                return Err(self.exhausted(exhausted));
            }
            let request = self.request()?;
            let response = self.ctx.llm(request).await;
            let response = response.map_err(AgentError::Model)?;
            self.spent.add_answer(&response);
            let calls = response.tool_calls.clone();
            self.transcript
                .push(Message::assistant(response.text.clone(), calls.clone()));
            if calls.is_empty() {
                return Ok(self.answer(response));
            }
            self.run_calls(&calls).await?;
        }
    }

    /// Adds the tools of the agent's MCP servers, each server's list a journaled step.
    #[cfg(feature = "mcp")]
    async fn list_mcp_tools(&mut self) -> Result<(), AgentError> {
        use crate::mcp::{McpTool, MCP_TOOLS_ACTIVITY};
        for server in &self.agent.mcp_servers {
            let listed = self
                .ctx
                .schedule_builtin::<_, Vec<McpTool>>(MCP_TOOLS_ACTIVITY, server);
            let listed = listed.await.map_err(AgentError::McpTools)?;
            for tool in &listed {
                let tool = Tool::mcp(tool).map_err(AgentError::Declaration)?;
                if self.tools.iter().any(|t| t.spec.name == tool.spec.name) {
                    let why = format!("the tool `{}` is offered twice", tool.spec.name);
                    return Err(AgentError::Declaration(why));
                }
                self.tools.push(tool);
            }
        }
        Ok(())
    }

    #[cfg(not(feature = "mcp"))]
    async fn list_mcp_tools(&mut self) -> Result<(), AgentError> {
        Ok(())
    }

    /// Workflow time in milliseconds, journaled; only read when the budget bounds time, so an
    /// agent without a time bound adds no entries for it.
    fn now_ms(&self) -> Option<u64> {
        if !self.agent.budget.measures_time() {
            return None;
        }
        let since_epoch = self
            .ctx
            .now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Some(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX))
    }

    /// The next model call. The messages since the last call are committed as one transcript
    /// part and the call names the chain by its last hash: the journal grows with the text of
    /// the conversation, not with its text times its turns.
    fn request(&mut self) -> Result<Llm, AgentError> {
        let toolset = self.toolset()?;
        if self.committed < self.transcript.len() {
            let part = TranscriptPart {
                previous: self.history.take(),
                messages: self.transcript[self.committed..].to_vec(),
            };
            let meta = ArtifactMeta::new(TRANSCRIPT_KIND);
            let part = self.ctx.artifact_with(part, meta);
            let part = part.map_err(|e| AgentError::Transcript(e.to_string()))?;
            self.history = Some(part.hash());
            self.committed = self.transcript.len();
        }
        let request = Llm::new(&self.agent.model).after_history(self.history.clone());
        Ok(match toolset {
            Some(toolset) => request.toolset(toolset),
            None => request,
        })
    }

    /// The agent's tools, committed as one artifact per run (the same content, so the same
    /// hash and one stored copy, for every run of the agent).
    fn toolset(&mut self) -> Result<Option<String>, AgentError> {
        if self.tools.is_empty() {
            return Ok(None);
        }
        if self.toolset.is_none() {
            let tools: Vec<_> = self.tools.iter().map(|t| t.spec.clone()).collect();
            let tools = self
                .ctx
                .artifact_with(tools, ArtifactMeta::new(TOOLSET_KIND));
            let tools = tools.map_err(|e| AgentError::Transcript(e.to_string()))?;
            self.toolset = Some(tools.hash());
        }
        Ok(self.toolset.clone())
    }

    fn answer(self, response: LlmResponse) -> AgentAnswer {
        AgentAnswer {
            text: response.text.clone(),
            response,
            transcript: self.transcript,
            spent: self.spent,
        }
    }

    /// Runs one answer's calls: all checked first, then the runnable ones concurrently, their
    /// results appended in the model's call order.
    async fn run_calls(&mut self, calls: &[ToolCall]) -> Result<(), AgentError> {
        let checked: Vec<_> = calls
            .iter()
            .map(|call| turn::check(&self.tools, call))
            .collect();
        let runnable = checked.iter().filter(|c| c.is_ok()).count() as u64;
        if let Some(exhausted) = self.agent.budget.before_tool_calls(&self.spent, runnable) {
            return Err(self.exhausted(exhausted));
        }
        let outcomes = {
            let this = &*self;
            let pending = calls
                .iter()
                .zip(checked)
                .map(|(call, checked)| match checked {
                    Ok(checked) => this.call(checked.tool, checked.decoded).boxed(),
                    Err(refusal) => futures::future::ready(this.refuse(call, refusal)).boxed(),
                });
            join_in_order(pending.collect()).await
        };
        for (call, outcome) in calls.iter().zip(outcomes) {
            self.spent.tool_calls += u64::from(outcome.ran);
            self.spent.refused_calls += u64::from(outcome.refused);
            self.approved_and_run.extend(outcome.approved_intent);
            self.transcript
                .push(Message::tool_result(&call.id, outcome.text));
        }
        match self.agent.budget.after_refusals(&self.spent) {
            Some(exhausted) => Err(self.exhausted(exhausted)),
            None => Ok(()),
        }
    }

    /// A call that may run: after a person approved it when its tool needs that.
    async fn call(&self, tool: usize, decoded: Decoded) -> CallOutcome {
        let tool = &self.tools[tool];
        let intent = tool.intent(self.ctx.core().key_root(&tool.operation), &decoded);
        let digest = intent.digest();
        let asks = tool.needs_approval && !self.approved_and_run.contains(&digest);
        let authority = match asks {
            true => match self.approve(tool, intent, &decoded).await {
                Ok(authority) => Some(authority),
                Err(declined) => return not_run(declined),
            },
            false => None,
        };
        let result = tool.run(self.ctx, &decoded, authority.as_ref()).await;
        // Only an effect's repeat is answered by the operation log; a read runs again, so it is
        // put to a person again.
        let approved_intent = (authority.is_some() && decoded.key.is_some()).then_some(digest);
        match result {
            Ok(text) => CallOutcome {
                text,
                ran: true,
                refused: false,
                approved_intent,
            },
            Err(error) => CallOutcome {
                text: format!("error: {error}"),
                ..not_run(String::new())
            }
            .ran(),
        }
    }

    /// Puts the exact call to a person: the intent is committed as an artifact (kind
    /// `tool_call`), and its tool, arguments and key are what the approver is shown. For an
    /// effect, the approval authorises the intent the runtime computes from the same input,
    /// which it checks again right before the call.
    async fn approve(
        &self,
        tool: &Tool,
        intent: ToolIntent,
        decoded: &Decoded,
    ) -> Result<Authority, String> {
        let shown = json!({
            "tool": intent.tool,
            "arguments": intent.arguments,
            "idempotency_key": intent.idempotency_key,
        });
        let authorised = decoded.key.as_ref().map(|_| {
            let intent = self.ctx.intent_named(&tool.operation, &decoded.input);
            intent.map_err(|e| format!("error: {e}"))
        });
        let authorised = authorised.transpose()?;
        let meta = ArtifactMeta::new("tool_call").with("tool", &tool.spec.name);
        let artifact = self.ctx.artifact_with(intent, meta);
        let artifact = artifact.map_err(|e| format!("error: {e}"))?;
        let mut request = self.ctx.approval(&artifact).risk(shown);
        if let Some(authorised) = &authorised {
            request = request.authorises(authorised);
        }
        let request = match self.agent.approval_expires_in {
            Some(expiry) => request.expires_in(expiry),
            None => request,
        };
        match request.await {
            ApprovalOutcome::Approved(approval) => Ok(Authority { approval }),
            ApprovalOutcome::Rejected { approver, reason } => {
                Err(format!("not run: {approver} rejected this call: {reason}"))
            }
            ApprovalOutcome::Expired => {
                Err("not run: nobody approved this call in time".to_owned())
            }
        }
    }

    /// Journals the refusal as a verdict (counted once, when first written) and tells the
    /// model. On replay the recorded message is what the model is told again.
    fn refuse(&self, call: &ToolCall, refusal: Refusal) -> CallOutcome {
        let verdict = json!({
            "call_id": call.id,
            "reason": refusal.reason,
            "message": refusal.message,
        });
        let (tool, reason) = (call.name.clone(), refusal.reason);
        let note = move |telemetry: &waymark_runtime::telemetry::Telemetry| {
            telemetry.agent_tool_call_refused(&tool, reason)
        };
        let name = format!("agent.refused:{}", call.name);
        let recorded = self.ctx.record_verdict(&name, verdict, note);
        let message = recorded
            .as_ref()
            .and_then(|v| v["message"].as_str())
            .map_or(refusal.message, str::to_owned);
        CallOutcome {
            text: format!("refused: {message}"),
            refused: true,
            ..not_run(String::new())
        }
    }

    /// Journals the exhausted bound as a verdict (counted once) and ends the run with it.
    fn exhausted(&self, exhausted: Exhausted) -> AgentError {
        let Exhausted {
            budget,
            limit,
            used,
        } = exhausted;
        let verdict = json!({"budget": budget.name(), "limit": limit, "used": used});
        let note = move |telemetry: &waymark_runtime::telemetry::Telemetry| {
            telemetry.agent_budget_exhausted(budget.name())
        };
        self.ctx.record_verdict("agent.budget", verdict, note);
        AgentError::BudgetExhausted {
            budget,
            limit,
            used,
        }
    }
}

fn not_run(text: String) -> CallOutcome {
    CallOutcome {
        text,
        ran: false,
        refused: false,
        approved_intent: None,
    }
}

impl CallOutcome {
    /// A call that ran and failed: it counts against the tool-call budget all the same.
    fn ran(mut self) -> Self {
        self.ran = true;
        self
    }
}

/// Awaits every future, polling them in the given order on each wake, and returns their
/// outputs in that order. The order of polls decides the order of the commands they issue, so
/// it must not depend on which woke first.
async fn join_in_order<T>(futures: Vec<BoxFuture<'_, T>>) -> Vec<T> {
    let mut slots: Vec<MaybeDone<BoxFuture<'_, T>>> = futures.into_iter().map(maybe_done).collect();
    futures::future::poll_fn(|cx| {
        let mut all_done = true;
        for slot in &mut slots {
            all_done &= Pin::new(slot).poll(cx).is_ready();
        }
        match all_done {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    })
    .await;
    // Every slot is done here, so each holds its output.
    let outputs = slots.iter_mut().map(|slot| Pin::new(slot).take_output());
    outputs.flatten().collect()
}
