//! The prompts, the scripted model the demo uses by default (no network), and the stall the
//! demo injects: the model times out while writing the customer message.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use waymark::llm::{
    ChunkSink, Completion, LlmError, LlmProvider, LlmRequest, ModelPrice, OpenAiCompatible,
    PriceParseError, PriceTable, Role, ToolCall, Usage,
};

use super::systems::Order;
use super::{ActionPlan, Models};

pub(super) const CLASSIFY_PROMPT: &str = "You route operations requests. Answer only JSON: \
    {\"intent\": \"rebook_delayed_shipment\" or \"other\", \"order_id\": \"ORD-…\"}.";

pub(super) const PLAN_PROMPT: &str = "You plan the rebooking of a delayed order. Follow the \
    policy exactly. Answer only JSON: {\"carrier\": string, \"new_eta_days\": number, \
    \"warehouse_note\": string, \"cost_cents\": number}.";

pub(super) const MESSAGE_PROMPT: &str = "You write short, warm messages to customers about \
    their deliveries. Plain text, three sentences at most.";

pub(super) fn plan_request(order: &Order, policy: &[&str]) -> String {
    format!(
        "Order {} for {} ships with {} and arrives in {} days; {} days were promised. \
         It leaves warehouse {}. Policy: {}",
        order.order_id,
        order.customer,
        order.carrier,
        order.eta_days,
        order.promised_days,
        order.warehouse,
        policy.join(" ")
    )
}

pub(super) fn message_request(order: &Order, plan: &ActionPlan, booking: &str) -> String {
    format!(
        "Tell {} that order {} was late with {}, is now rebooked onto {} (booking {}) and \
         arrives in {} days.",
        order.customer, order.order_id, order.carrier, plan.carrier, booking, plan.new_eta_days
    )
}

/// The scripted model: answers by prompt, deterministically. Its first plan picks a carrier
/// the policy does not approve, so the validator rejects it and the repair prompt fixes it.
#[derive(Debug, Default, Clone, Copy)]
pub struct ScriptedModel;

impl ScriptedModel {
    fn answer(request: &LlmRequest) -> Result<String, LlmError> {
        let prompt = request.prompt.as_ref().map(|p| p.id.as_str());
        let last = request.messages.last().map_or("", |m| m.content.as_str());
        let repairing = request.messages.len() > 2;
        let text = match prompt {
            Some("classify") => {
                let order = last.split_whitespace().find(|w| w.starts_with("ORD-"));
                let order = order.unwrap_or("ORD-?").trim_end_matches([',', '.']);
                format!(r#"{{"intent":"rebook_delayed_shipment","order_id":"{order}"}}"#)
            }
            Some("plan") if !repairing => r#"{"carrier":"cheapship","new_eta_days":3,"warehouse_note":"Hold for cheapship pickup","cost_cents":600}"#.into(),
            Some("plan") => r#"{"carrier":"rapidpost","new_eta_days":3,"warehouse_note":"Hand over to rapidpost at 14:00","cost_cents":1400}"#.into(),
            Some("customer_message") => customer_message(last),
            _ => {
                return Err(LlmError::Refused {
                    status: 400,
                    message: "the scripted model has no answer for this prompt".into(),
                })
            }
        };
        Ok(text)
    }
}

fn customer_message(request: &str) -> String {
    let booking = request
        .split("(booking ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or("pending");
    format!(
        "Hi Ada, your order was running late with slowship, so we moved it to rapidpost \
         (booking {booking}). It now arrives in 3 days, and the warehouse is preparing the \
         handover. Sorry for the wait, and thank you for your patience."
    )
}

fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

impl LlmProvider for ScriptedModel {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let answer = Self::answer(&request).map(|text| Completion {
            usage: Usage {
                prompt_tokens: request.messages.iter().map(|m| words(&m.content)).sum(),
                completion_tokens: words(&text),
            },
            provider_model: format!("{}@scripted", request.model),
            finish_reason: Some("stop".into()),
            tool_calls: Vec::new(),
            text,
        });
        Box::pin(futures::future::ready(answer))
    }

    fn stream(
        &self,
        request: LlmRequest,
        mut chunks: ChunkSink,
    ) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let call = self.complete(request);
        Box::pin(async move {
            let completion = call.await?;
            for word in completion.text.split_inclusive(' ') {
                chunks(word);
            }
            Ok(completion)
        })
    }
}

/// How many chunks of the stalled message readers see before the timeout.
const SHOWN_CHUNKS: usize = 12;

/// Wraps a provider so that the first streamed customer message stops partway and times out:
/// the reader has seen part of a message that will never be committed.
pub struct StallsOnce<P> {
    inner: P,
    stalled: Arc<AtomicBool>,
}

impl<P> StallsOnce<P> {
    /// `inner`, stalling once.
    pub fn new(inner: P) -> Self {
        Self {
            inner,
            stalled: Arc::default(),
        }
    }
}

impl<P: LlmProvider> LlmProvider for StallsOnce<P> {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        self.inner.complete(request)
    }

    fn stream(
        &self,
        request: LlmRequest,
        mut chunks: ChunkSink,
    ) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let is_message = request
            .prompt
            .as_ref()
            .is_some_and(|p| p.id == "customer_message");
        if !is_message || self.stalled.swap(true, Ordering::SeqCst) {
            return self.inner.stream(request, chunks);
        }
        // Forward the first words the model writes, then give up as a timeout would: the call
        // is dropped there (a real server's request is cancelled, not waited for).
        let (cut, cut_reached) = futures::channel::oneshot::channel::<()>();
        let mut cut = Some(cut);
        let mut seen = 0;
        let partial: ChunkSink = Box::new(move |text: &str| {
            seen += 1;
            if seen <= SHOWN_CHUNKS {
                chunks(text);
            } else if let Some(cut) = cut.take() {
                let _ = cut.send(());
            }
        });
        let call = self.inner.stream(request, partial);
        Box::pin(async move {
            let _ = futures::future::select(call, cut_reached).await;
            Err(LlmError::Timeout)
        })
    }
}

/// The provider: an OpenAI-compatible server when `WAYMARK_LLM_BASE_URL` is set (models from
/// `WAYMARK_LLM_MODEL`, default `gpt-4o-mini`), else the scripted model; with `stall`, its first
/// customer message times out partway.
pub fn provider_from_env(stall: bool) -> (Arc<dyn LlmProvider>, Models, &'static str) {
    match OpenAiCompatible::from_env() {
        Some(server) => {
            let model = std::env::var("WAYMARK_LLM_MODEL").unwrap_or_else(|_| "gpt-4o-mini".into());
            (
                stalling(server, stall),
                Models::all(&model),
                "OpenAI-compatible server",
            )
        }
        None => (scripted(stall), scripted_models(), "scripted model"),
    }
}

/// The scripted model, stalling once if `stall`.
pub fn scripted(stall: bool) -> Arc<dyn LlmProvider> {
    stalling(ScriptedModel, stall)
}

fn stalling(provider: impl LlmProvider, stall: bool) -> Arc<dyn LlmProvider> {
    match stall {
        true => Arc::new(StallsOnce::new(provider)),
        false => Arc::new(provider),
    }
}

/// The scripted model's role names.
pub fn scripted_models() -> Models {
    Models {
        classifier: "router-small".into(),
        planner: "planner".into(),
        fallback: "planner-large".into(),
        writer: "writer".into(),
    }
}

/// The prices in `WAYMARK_LLM_PRICES` when it is set (a real model is priced that way), else
/// the demo's.
pub fn prices() -> Result<PriceTable, PriceParseError> {
    match std::env::var_os("WAYMARK_LLM_PRICES") {
        Some(_) => PriceTable::from_env(),
        None => Ok(demo_prices()),
    }
}

/// Demo prices (micro-units per million tokens), so cost shows up in the figures.
pub fn demo_prices() -> PriceTable {
    let price = |prompt: u64, completion: u64| ModelPrice {
        prompt_micros_per_mtok: prompt,
        completion_micros_per_mtok: completion,
    };
    PriceTable::default()
        .with("router-small", price(150_000, 600_000))
        .with("planner", price(2_500_000, 10_000_000))
        .with("planner-large", price(10_000_000, 30_000_000))
        .with("writer", price(2_500_000, 10_000_000))
}

/// The scripted agent: chooses its tools from what the conversation already holds, as a
/// model would, deterministically. Load the order and read the policy (two calls in one
/// answer); rebook; notify the warehouse and update the ETA (two calls again); then write to
/// the customer.
#[derive(Debug, Default, Clone, Copy)]
pub struct ScriptedAgent;

impl ScriptedAgent {
    fn answer(request: &LlmRequest) -> Completion {
        let order = first_order_id(request);
        let booking = tool_result(request, "rebook_carrier");
        let notified = tool_result(request, "notify_warehouse").is_some();
        let calls: Vec<(&str, String)> = match (tool_result(request, "load_order"), &booking) {
            (None, _) => vec![
                ("load_order", format!(r#"{{"order_id":"{order}"}}"#)),
                (
                    "search_policy",
                    r#"{"query":"rebooking policy for late orders"}"#.to_owned(),
                ),
            ],
            (Some(_), None) => vec![(
                "rebook_carrier",
                format!(r#"{{"order_id":"{order}","carrier":"rapidpost"}}"#),
            )],
            (Some(_), Some(booking)) if !notified => vec![
                (
                    "notify_warehouse",
                    format!(
                        r#"{{"order_id":"{order}","booking":"{booking}","note":"Hand over to rapidpost at 14:00"}}"#
                    ),
                ),
                (
                    "update_customer_eta",
                    format!(r#"{{"order_id":"{order}","eta_days":3}}"#),
                ),
            ],
            (Some(_), Some(booking)) => {
                let text = customer_message(&format!("(booking {booking})"));
                return completion(request, text, Vec::new());
            }
        };
        let turn = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let calls = calls
            .into_iter()
            .enumerate()
            .map(|(i, (name, arguments))| ToolCall {
                id: format!("call_{}_{}", turn + 1, i + 1),
                name: name.to_owned(),
                arguments,
            });
        completion(request, String::new(), calls.collect())
    }
}

fn first_order_id(request: &LlmRequest) -> String {
    let user = request.messages.iter().find(|m| m.role == Role::User);
    let words = user.map_or("", |m| m.content.as_str()).split_whitespace();
    let order = words.into_iter().find(|w| w.starts_with("ORD-"));
    order
        .unwrap_or("ORD-?")
        .trim_end_matches([',', '.'])
        .to_owned()
}

fn tool_result(request: &LlmRequest, tool: &str) -> Option<String> {
    super::agent::last_tool_result(&request.messages, tool)
}

fn completion(request: &LlmRequest, text: String, tool_calls: Vec<ToolCall>) -> Completion {
    let written = words(&text) + tool_calls.iter().map(|c| words(&c.arguments)).sum::<u64>();
    Completion {
        usage: Usage {
            prompt_tokens: request.messages.iter().map(|m| words(&m.content)).sum(),
            completion_tokens: written,
        },
        provider_model: format!("{}@scripted", request.model),
        finish_reason: Some(
            if tool_calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            }
            .into(),
        ),
        tool_calls,
        text,
    }
}

impl LlmProvider for ScriptedAgent {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        Box::pin(futures::future::ready(Ok(Self::answer(&request))))
    }
}

/// Wraps a provider so that the first final answer (one that calls no tool) is lost to a
/// timeout: the model wrote it after every tool ran, and the call gave up before it arrived.
pub struct FinalAnswerTimesOutOnce<P> {
    inner: Arc<P>,
    timed_out: Arc<AtomicBool>,
}

impl<P: LlmProvider> LlmProvider for FinalAnswerTimesOutOnce<P> {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let call = self.inner.complete(request);
        let timed_out = self.timed_out.clone();
        Box::pin(async move {
            let completion = call.await?;
            let is_final = completion.tool_calls.is_empty();
            match is_final && !timed_out.swap(true, Ordering::SeqCst) {
                true => Err(LlmError::Timeout),
                false => Ok(completion),
            }
        })
    }
}

/// The agent's provider: an OpenAI-compatible server when `WAYMARK_LLM_BASE_URL` is set, else
/// the scripted agent; with `stall`, its first final answer times out.
pub fn agent_provider_from_env(stall: bool) -> (Arc<dyn LlmProvider>, Models, &'static str) {
    match OpenAiCompatible::from_env() {
        Some(server) => {
            let model = std::env::var("WAYMARK_LLM_MODEL").unwrap_or_else(|_| "gpt-4o-mini".into());
            let provider = timing_out_once(server, stall);
            (provider, Models::all(&model), "OpenAI-compatible server")
        }
        None => (scripted_agent(stall), scripted_models(), "scripted agent"),
    }
}

/// The scripted agent, its first final answer timing out if `stall`.
pub fn scripted_agent(stall: bool) -> Arc<dyn LlmProvider> {
    timing_out_once(ScriptedAgent, stall)
}

fn timing_out_once(provider: impl LlmProvider, stall: bool) -> Arc<dyn LlmProvider> {
    match stall {
        true => Arc::new(FinalAnswerTimesOutOnce {
            inner: Arc::new(provider),
            timed_out: Arc::default(),
        }),
        false => Arc::new(provider),
    }
}
