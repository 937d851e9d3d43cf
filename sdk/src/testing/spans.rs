//! Waymark's own spans as data, for tests and timelines: which steps ran, which were replayed
//! from the journal, and why each live attempt ran.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::Context;
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
        SpanLogLayer {
            log: self.clone(),
            open_steps: Mutex::default(),
        }
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
    /// Step spans still open, by span id. Kept by the layer rather than in the span's
    /// extensions, so that two logs in one subscriber do not share (or fight over) a slot.
    open_steps: Mutex<HashMap<u64, SpanFields>>,
}

impl SpanLogLayer {
    fn open_steps(&self) -> std::sync::MutexGuard<'_, HashMap<u64, SpanFields>> {
        self.open_steps.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<S: Subscriber> Layer<S> for SpanLogLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let name = attrs.metadata().name();
        if name != "waymark.run" && name != "waymark.step" {
            return;
        }
        let mut fields = SpanFields::default();
        attrs.record(&mut fields);
        if name == "waymark.run" {
            let workflow_id = fields.get("workflow_id").to_owned();
            self.log.push(workflow_id, SpanEvent::Run(fields));
        } else {
            self.open_steps().insert(id.into_u64(), fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        if let Some(fields) = self.open_steps().get_mut(&id.into_u64()) {
            values.record(fields);
        }
    }

    fn on_close(&self, id: Id, _ctx: Context<'_, S>) {
        let fields = self.open_steps().remove(&id.into_u64());
        if let Some(fields) = fields {
            let workflow_id = fields.get("workflow_id").to_owned();
            self.log.push(workflow_id, SpanEvent::Step(fields));
        }
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[test]
    fn two_logs_in_one_subscriber_each_see_every_step() {
        let (first, second) = (SpanLog::default(), SpanLog::default());
        let subscriber = tracing_subscriber::registry()
            .with(first.layer())
            .with(second.layer());
        tracing::subscriber::with_default(subscriber, || {
            let run = tracing::info_span!("waymark.run", workflow_id = "wf", wake = "started");
            let _run = run.enter();
            let step = tracing::info_span!(
                "waymark.step",
                workflow_id = "wf",
                name = "fetch",
                outcome = tracing::field::Empty
            );
            step.record("outcome", "ok");
        });
        first.mark("wf", "after");
        for log in [&first, &second] {
            let steps = log.steps("wf");
            assert_eq!(steps.len(), 1);
            assert_eq!(
                (steps[0].get("name"), steps[0].get("outcome")),
                ("fetch", "ok")
            );
            assert!(matches!(log.events("wf")[0], SpanEvent::Run(_)));
        }
        assert_eq!(first.events("wf").len(), 3, "run, step, mark");
        assert_eq!(second.events("wf").len(), 2);
        assert!(first.events("other").is_empty());
    }
}
