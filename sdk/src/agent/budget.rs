//! What an agent run may spend, and what it has spent: counted from the journaled answers and
//! tool results, so a resumed run counts what the original spent and a restart resets nothing.

use std::time::Duration;

use waymark_runtime::llm::LlmResponse;

/// The bounds of one agent run. Exhausting one ends the run with
/// [`AgentError::BudgetExhausted`](super::AgentError::BudgetExhausted) naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    model_calls: u64,
    tool_calls: Option<u64>,
    tokens: Option<u64>,
    cost_micros: Option<u64>,
    wall_time: Option<Duration>,
    refused_calls: u64,
}

impl Default for Budget {
    /// Ten model calls and three refused tool calls; tools, tokens, cost and time unbounded. A
    /// model that never stops calling tools is the common runaway, so the turns are always
    /// bounded.
    fn default() -> Self {
        Self {
            model_calls: 10,
            tool_calls: None,
            tokens: None,
            cost_micros: None,
            wall_time: None,
            refused_calls: 3,
        }
    }
}

impl Budget {
    /// At most `calls` model calls (turns).
    pub fn model_calls(mut self, calls: u64) -> Self {
        self.model_calls = calls;
        self
    }

    /// At most `calls` tool calls run, over all turns.
    pub fn tool_calls(mut self, calls: u64) -> Self {
        self.tool_calls = Some(calls);
        self
    }

    /// No model call once `tokens` (prompt and completion) were used.
    pub fn tokens(mut self, tokens: u64) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// No model call once `micros` of cost (the worker's price table) were spent.
    pub fn cost_micros(mut self, micros: u64) -> Self {
        self.cost_micros = Some(micros);
        self
    }

    /// No model call once `duration` of workflow time passed since the run began (measured
    /// with `ctx.now()`, so replay measures what the original measured).
    pub fn wall_time(mut self, duration: Duration) -> Self {
        self.wall_time = Some(duration);
        self
    }

    /// The run ends once more than `calls` tool calls were refused (unknown tool, arguments
    /// that do not fit): a model that keeps writing bad calls is not converging.
    pub fn refused_calls(mut self, calls: u64) -> Self {
        self.refused_calls = calls;
        self
    }

    pub(crate) fn measures_time(&self) -> bool {
        self.wall_time.is_some()
    }

    /// The first bound another model call would break.
    pub(crate) fn before_model_call(&self, spent: &Spent) -> Option<Exhausted> {
        let wall_time_ms = self.wall_time.map(millis);
        let checks = [
            (
                BudgetKind::ModelCalls,
                Some(self.model_calls),
                spent.model_calls,
            ),
            (BudgetKind::Tokens, self.tokens, spent.tokens),
            (BudgetKind::CostMicros, self.cost_micros, spent.cost_micros),
            (BudgetKind::WallTime, wall_time_ms, spent.elapsed_ms),
        ];
        checks.into_iter().find_map(|(budget, limit, used)| {
            let limit = limit?;
            (used >= limit).then_some(Exhausted {
                budget,
                limit,
                used,
            })
        })
    }

    /// Whether running `calls` more tool calls would break the tool-call bound.
    pub(crate) fn before_tool_calls(&self, spent: &Spent, calls: u64) -> Option<Exhausted> {
        let limit = self.tool_calls?;
        let used = spent.tool_calls.saturating_add(calls);
        (used > limit).then_some(Exhausted {
            budget: BudgetKind::ToolCalls,
            limit,
            used,
        })
    }

    /// Whether the refused calls so far are too many.
    pub(crate) fn after_refusals(&self, spent: &Spent) -> Option<Exhausted> {
        let (limit, used) = (self.refused_calls, spent.refused_calls);
        (used > limit).then_some(Exhausted {
            budget: BudgetKind::RefusedCalls,
            limit,
            used,
        })
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Which bound of a [`Budget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BudgetKind {
    /// Model calls.
    ModelCalls,
    /// Tool calls run.
    ToolCalls,
    /// Tokens, prompt and completion.
    Tokens,
    /// Cost in micro-units.
    CostMicros,
    /// Workflow time since the run began, in milliseconds.
    WallTime,
    /// Tool calls refused before they ran.
    RefusedCalls,
}

impl BudgetKind {
    /// Its name in errors, verdicts and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            BudgetKind::ModelCalls => "model_calls",
            BudgetKind::ToolCalls => "tool_calls",
            BudgetKind::Tokens => "tokens",
            BudgetKind::CostMicros => "cost_micros",
            BudgetKind::WallTime => "wall_time",
            BudgetKind::RefusedCalls => "refused_calls",
        }
    }
}

impl std::fmt::Display for BudgetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A bound that was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exhausted {
    pub(crate) budget: BudgetKind,
    pub(crate) limit: u64,
    pub(crate) used: u64,
}

/// What an agent run has spent so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Spent {
    /// Model calls answered.
    pub model_calls: u64,
    /// Tool calls run (refused ones not included).
    pub tool_calls: u64,
    /// Tool calls refused before they ran.
    pub refused_calls: u64,
    /// Tokens, prompt and completion.
    pub tokens: u64,
    /// Cost in micro-units.
    pub cost_micros: u64,
    /// Workflow time since the run began, in milliseconds (0 unless the budget bounds time).
    pub elapsed_ms: u64,
}

impl Spent {
    pub(crate) fn add_answer(&mut self, response: &LlmResponse) {
        self.model_calls += 1;
        let usage = response.usage;
        let tokens = usage.prompt_tokens.saturating_add(usage.completion_tokens);
        self.tokens = self.tokens.saturating_add(tokens);
        self.cost_micros = self.cost_micros.saturating_add(response.cost_micros);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spent(model_calls: u64, tokens: u64) -> Spent {
        Spent {
            model_calls,
            tokens,
            ..Spent::default()
        }
    }

    #[test]
    fn the_first_bound_reached_is_named_with_its_figures() {
        let budget = Budget::default().model_calls(3).tokens(100);
        assert_eq!(budget.before_model_call(&spent(2, 99)), None);
        let tokens = budget.before_model_call(&spent(2, 100)).unwrap();
        assert_eq!(
            (tokens.budget, tokens.limit, tokens.used),
            (BudgetKind::Tokens, 100, 100)
        );
        let calls = budget.before_model_call(&spent(3, 100)).unwrap();
        assert_eq!(calls.budget, BudgetKind::ModelCalls);
        let timed = Budget::default().wall_time(Duration::from_secs(2));
        let late = Spent {
            elapsed_ms: 2_000,
            ..Spent::default()
        };
        assert_eq!(
            timed.before_model_call(&late).map(|e| e.budget),
            Some(BudgetKind::WallTime)
        );
    }

    #[test]
    fn a_batch_of_tool_calls_runs_only_if_all_of_it_fits() {
        let budget = Budget::default().tool_calls(4);
        let two_run = Spent {
            tool_calls: 2,
            ..Spent::default()
        };
        assert_eq!(budget.before_tool_calls(&two_run, 2), None);
        let over = budget.before_tool_calls(&two_run, 3).unwrap();
        assert_eq!((over.limit, over.used), (4, 5));
        assert_eq!(Budget::default().before_tool_calls(&two_run, 100), None);
    }

    #[test]
    fn refusals_end_the_run_only_past_their_bound() {
        let budget = Budget::default().refused_calls(1);
        let refused = |refused_calls| Spent {
            refused_calls,
            ..Spent::default()
        };
        assert_eq!(budget.after_refusals(&refused(1)), None);
        assert_eq!(
            budget.after_refusals(&refused(2)).map(|e| e.budget),
            Some(BudgetKind::RefusedCalls)
        );
    }
}
