//! Waymark's own spans as data, for tests and timelines: which steps ran, which were replayed
//! from the journal, and why each live attempt ran.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The fields of one span, as their values were last recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpanFields(BTreeMap<&'static str, String>);

impl SpanFields {
    /// The field's value, or `-` when the span has no such field (or it was never recorded).
    pub fn get(&self, name: &str) -> &str {
        self.0.get(name).map_or("-", String::as_str)
    }
}

impl Visit for SpanFields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name(), value.to_owned());
    }
}

/// What a [`SpanLog`] keeps, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpanEvent {
    /// A `waymark.run` span opened: a run started (`wake` says how: started, recovered, event).
    Run(SpanFields),
    /// A `waymark.step` span closed, with its final fields (`replay_mode`, `executed`,
    /// `outcome`, …).
    Step(SpanFields),
    /// A line added with [`SpanLog::mark`] (a crash a test caused, say).
    Mark(String),
}

/// Collects Waymark's run and step spans, per workflow. Install [`SpanLog::layer`] in the
/// subscriber; a clone of the log reads what was collected.
///
/// ```ignore
/// let log = SpanLog::default();
/// tracing::subscriber::set_global_default(tracing_subscriber::registry().with(log.layer()))?;
/// // … run the workflow …
/// let replayed = log.steps("wf-1").iter().filter(|s| s.get("executed") == "false").count();
/// ```
#[derive(Clone, Default)]
pub struct SpanLog {
    events: Arc<Mutex<Vec<(String, SpanEvent)>>>,
}

impl SpanLog {
    /// The layer that feeds this log.
    pub fn layer(&self) -> SpanLogLayer {
        SpanLogLayer { log: self.clone() }
    }

    /// Adds a line of the caller's own to `workflow_id`'s events.
    pub fn mark(&self, workflow_id: &str, line: impl Into<String>) {
        self.push(workflow_id.to_owned(), SpanEvent::Mark(line.into()));
    }

    /// `workflow_id`'s events, in order.
    pub fn events(&self, workflow_id: &str) -> Vec<SpanEvent> {
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let of_workflow = events.iter().filter(|(id, _)| id == workflow_id);
        of_workflow.map(|(_, event)| event.clone()).collect()
    }

    /// `workflow_id`'s closed step spans, in closing order.
    pub fn steps(&self, workflow_id: &str) -> Vec<SpanFields> {
        let events = self.events(workflow_id).into_iter();
        let steps = events.filter_map(|event| match event {
            SpanEvent::Step(fields) => Some(fields),
            _ => None,
        });
        steps.collect()
    }

    fn push(&self, workflow_id: String, event: SpanEvent) {
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        events.push((workflow_id, event));
    }
}

/// See [`SpanLog::layer`].
pub struct SpanLogLayer {
    log: SpanLog,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SpanLogLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let name = attrs.metadata().name();
        if name != "waymark.run" && name != "waymark.step" {
            return;
        }
        let mut fields = SpanFields::default();
        attrs.record(&mut fields);
        if name == "waymark.run" {
            let workflow_id = fields.get("workflow_id").to_owned();
            self.log.push(workflow_id, SpanEvent::Run(fields));
        } else if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(fields) = extensions.get_mut::<SpanFields>() {
            values.record(fields);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let fields = span.extensions_mut().remove::<SpanFields>();
        if let Some(fields) = fields {
            let workflow_id = fields.get("workflow_id").to_owned();
            self.log.push(workflow_id, SpanEvent::Step(fields));
        }
    }
}
