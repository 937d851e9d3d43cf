//! What a model attempt costs when it journals no response: an error, a timeout, or a process
//! that stopped while it was in flight. The provider reports no usage for those, so the
//! attempt is priced from its size (about four characters a token: the messages' text, and
//! what it streamed before it ended), and counted as an estimate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use waymark_runtime::llm::{ChunkSink, LlmRequest, PriceTable, Usage};
use waymark_runtime::registry::{ActivityInfo, TimedOut};
use waymark_runtime::streams::StepStream;
use waymark_runtime::telemetry::{AttemptEnd, LlmSpend, Priced, Telemetry};

/// Characters per token, for an estimate.
const CHARS_PER_TOKEN: u64 = 4;

/// One attempt's cost, reported when it ends without a response.
pub(super) struct AttemptCost {
    telemetry: Telemetry,
    prices: PriceTable,
    model: String,
    /// The call's prompt id (or its model), as failure locations name a model call.
    step: String,
    prompt_tokens: u64,
    streamed_chars: Arc<AtomicU64>,
    timed_out: TimedOut,
    /// The response came back: the journal prices it.
    answered: bool,
}

impl AttemptCost {
    pub(super) fn new(prices: &PriceTable, info: &ActivityInfo, request: &LlmRequest) -> Self {
        // Counted, not serialized: this runs before every model call, answered or not.
        let sent: usize = request.messages.iter().map(|m| m.content.len()).sum();
        let step = request.prompt.as_ref().map(|prompt| prompt.id.clone());
        Self {
            telemetry: info.telemetry.clone(),
            prices: prices.clone(),
            model: request.model.clone(),
            step: step.unwrap_or_else(|| request.model.clone()),
            prompt_tokens: tokens(sent as u64),
            streamed_chars: Arc::default(),
            timed_out: info.timed_out.clone(),
            answered: false,
        }
    }

    /// An attempt of this call was in flight when the previous process stopped (this one runs
    /// because of it): that one's request was sent, and is priced now. What it generated
    /// before the stop is not known here.
    pub(super) fn price_interrupted_before(&self, info: &ActivityInfo) {
        if info.interrupted {
            self.report(AttemptEnd::Interrupted, 0);
        }
    }

    /// Where the attempt streams its tokens, counting them for an estimate.
    pub(super) fn counting_sink(&self, stream: StepStream) -> ChunkSink {
        let streamed = self.streamed_chars.clone();
        Box::new(move |text: &str| {
            streamed.fetch_add(text.len() as u64, Ordering::Relaxed);
            stream.chunk(text)
        })
    }

    /// The provider answered: the journaled response carries the reported usage.
    pub(super) fn answered(mut self) {
        self.answered = true;
    }

    /// The provider answered with an error.
    pub(super) fn failed(mut self) {
        self.answered = true;
        self.report(AttemptEnd::Failed, self.streamed());
    }

    fn streamed(&self) -> u64 {
        tokens(self.streamed_chars.load(Ordering::Relaxed))
    }

    fn report(&self, end: AttemptEnd, completion_tokens: u64) {
        let usage = Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens,
        };
        let spend = LlmSpend {
            model: &self.model,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            cost_micros: self.prices.cost_micros(&self.model, usage),
        };
        let telemetry = &self.telemetry;
        telemetry.llm_attempt_lost(spend, &self.step, end, Priced::Estimated);
    }
}

impl Drop for AttemptCost {
    /// Dropped before an answer: at its timeout it is priced here. Dropped because the worker
    /// stops, it is priced by the process that runs the call again
    /// ([`AttemptCost::price_interrupted_before`]), so it is not counted twice.
    fn drop(&mut self) {
        if !self.answered && self.timed_out.is_set() {
            self.report(AttemptEnd::TimedOut, self.streamed());
        }
    }
}

fn tokens(chars: u64) -> u64 {
    chars.div_ceil(CHARS_PER_TOKEN)
}
