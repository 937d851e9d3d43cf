//! A readable timeline of what ran and what was replayed, built from Waymark's own spans
//! (`waymark.step`: `replay_mode`, `executed`, `outcome`) as a [`SpanLog`] collects them:
//! install [`Timeline::layer`] in the subscriber and read a workflow's lines when it is done.

use waymark::testing::{SpanEvent, SpanFields, SpanLog, SpanLogLayer};

/// Closed step spans, run starts and the demo's own markers, in order.
#[derive(Clone, Default)]
pub struct Timeline {
    log: SpanLog,
}

impl Timeline {
    /// The layer that feeds this timeline.
    pub fn layer(&self) -> SpanLogLayer {
        self.log.layer()
    }

    /// Adds a line of the demo's own (a crash, a restart) to `workflow_id`'s timeline.
    pub fn mark(&self, workflow_id: &str, line: impl Into<String>) {
        self.log.mark(workflow_id, line);
    }

    /// `workflow_id`'s lines.
    pub fn lines(&self, workflow_id: &str) -> Vec<String> {
        let events = self.log.events(workflow_id).into_iter();
        events.filter_map(line_of).collect()
    }
}

fn line_of(event: SpanEvent) -> Option<String> {
    match event {
        SpanEvent::Run(fields) => run_started(&fields),
        SpanEvent::Step(fields) => Some(step_line(&fields)),
        SpanEvent::Mark(line) => Some(line),
    }
}

/// A run that starts from a journal replays it first: say why it started.
fn run_started(fields: &SpanFields) -> Option<String> {
    let why = match fields.get("wake") {
        "recovered" => "recovered from the journal by a new worker",
        "event" => "rebuilt from the journal: it was evicted while waiting, an event arrived",
        _ => return None,
    };
    Some(format!("---- {why} ----"))
}

/// `ran      #4 llm waymark.llm attempt 1 (first_execution) -> ok`
fn step_line(fields: &SpanFields) -> String {
    let verb = match fields.get("executed") {
        "false" => "replayed",
        _ => "ran",
    };
    format!(
        "{verb:<8} #{:<2} {:<9} {:<20} attempt {} ({}) -> {}",
        fields.get("seq"),
        fields.get("kind"),
        fields.get("name"),
        fields.get("attempt"),
        fields.get("replay_mode"),
        fields.get("outcome"),
    )
}
