//! What a worker hosts, type-erased: the typed SDK turns each `#[workflow]` and `#[activity]`
//! into closures over payloads.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::context::WorkflowCore;
use crate::error::RunError;
use crate::journal::{Failure, Payload, Seq};
use crate::options::ActivityOptions;

/// Starts a workflow body: decodes the input and returns the body's future.
pub type WorkflowFn = Arc<
    dyn Fn(WorkflowCore, Payload) -> Result<BoxFuture<'static, Result<Payload, Failure>>, RunError>
        + Send
        + Sync,
>;

/// Checks a start input before anything is written.
pub type InputCheck = Arc<dyn Fn(&Payload) -> Result<(), String> + Send + Sync>;

/// Runs one activity attempt.
pub type ActivityFn = Arc<
    dyn Fn(ActivityInfo, Payload) -> BoxFuture<'static, Result<Payload, Failure>> + Send + Sync,
>;

/// What an activity attempt knows about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityInfo {
    /// The workflow that scheduled it.
    pub workflow_id: String,
    /// The activity name.
    pub activity_name: String,
    /// The command's position.
    pub seq: Seq,
    /// 1-based attempt.
    pub attempt: u32,
}

/// A registered workflow.
#[derive(Clone)]
pub struct RegisteredWorkflow {
    /// The body.
    pub run: WorkflowFn,
    /// Input validation.
    pub check_input: InputCheck,
}

/// A registered activity.
#[derive(Clone)]
pub struct RegisteredActivity {
    /// One attempt.
    pub run: ActivityFn,
    /// Defaults applied when a workflow schedules it.
    pub options: ActivityOptions,
}

/// Everything a worker hosts, by stable name.
#[derive(Clone, Default)]
pub struct Registry {
    workflows: HashMap<String, RegisteredWorkflow>,
    activities: HashMap<String, RegisteredActivity>,
}

impl Registry {
    /// Adds (or replaces) a workflow.
    pub fn add_workflow(&mut self, name: &str, workflow: RegisteredWorkflow) {
        self.workflows.insert(name.to_owned(), workflow);
    }

    /// Adds (or replaces) an activity.
    pub fn add_activity(&mut self, name: &str, activity: RegisteredActivity) {
        self.activities.insert(name.to_owned(), activity);
    }

    /// The workflow named `name`.
    pub fn workflow(&self, name: &str) -> Option<&RegisteredWorkflow> {
        self.workflows.get(name)
    }

    /// The activity named `name`.
    pub fn activity(&self, name: &str) -> Option<&RegisteredActivity> {
        self.activities.get(name)
    }

    /// Registered workflow names, sorted.
    pub fn workflow_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.workflows.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }
}
