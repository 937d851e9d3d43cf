//! A readable timeline of what ran and what was replayed, built from Waymark's own step spans
//! (`waymark.step`: `replay_mode`, `executed`, `outcome`): install [`Timeline::layer`] in the
//! subscriber and read a workflow's lines when it is done.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Closed step spans and markers, in order.
#[derive(Clone, Default)]
pub struct Timeline {
    lines: Arc<Mutex<Vec<(String, String)>>>,
}

impl Timeline {
    /// The layer that feeds this timeline.
    pub fn layer(&self) -> TimelineLayer {
        TimelineLayer {
            timeline: self.clone(),
        }
    }

    /// Adds a line of the demo's own (a crash, a restart) to `workflow_id`'s timeline.
    pub fn mark(&self, workflow_id: &str, line: impl Into<String>) {
        self.push(workflow_id.to_owned(), line.into());
    }

    /// `workflow_id`'s lines.
    pub fn lines(&self, workflow_id: &str) -> Vec<String> {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let of_workflow = lines.iter().filter(|(id, _)| id == workflow_id);
        of_workflow.map(|(_, line)| line.clone()).collect()
    }

    fn push(&self, workflow_id: String, line: String) {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        lines.push((workflow_id, line));
    }
}

/// See [`Timeline::layer`].
pub struct TimelineLayer {
    timeline: Timeline,
}

#[derive(Default)]
struct Fields(BTreeMap<&'static str, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
}

impl Fields {
    fn get(&self, name: &str) -> &str {
        self.0.get(name).map_or("-", String::as_str)
    }

    /// `ran      #4 llm waymark.llm attempt 1 (first_execution) → ok`
    fn line(&self) -> String {
        let verb = match self.get("executed") {
            "false" => "replayed",
            _ => "ran",
        };
        format!(
            "{verb:<8} #{:<2} {:<9} {:<20} attempt {} ({}) -> {}",
            self.get("seq"),
            self.get("kind"),
            self.get("name"),
            self.get("attempt"),
            self.get("replay_mode"),
            self.get("outcome"),
        )
    }
}

impl TimelineLayer {
    /// A run that starts from a journal replays it first: say why it started.
    fn run_started(&self, fields: &Fields) {
        let why = match fields.get("wake") {
            "recovered" => "recovered from the journal by a new worker",
            "event" => "rebuilt from the journal: it was evicted while waiting, an event arrived",
            _ => return,
        };
        let workflow_id = fields.get("workflow_id").to_owned();
        self.timeline.push(workflow_id, format!("---- {why} ----"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for TimelineLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if attrs.metadata().name() == "waymark.run" {
            self.run_started(&fields);
            return;
        }
        if attrs.metadata().name() != "waymark.step" {
            return;
        }
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(fields) = extensions.get_mut::<Fields>() {
            values.record(fields);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let fields = span.extensions_mut().remove::<Fields>();
        if let Some(fields) = fields {
            let workflow_id = fields.get("workflow_id").to_owned();
            self.timeline.push(workflow_id, fields.line());
        }
    }
}
