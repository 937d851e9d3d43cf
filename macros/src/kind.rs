//! Which of the two attributes is being expanded; messages and accepted arguments depend on it.

use crate::args::{KeySpec, ACTIVITY_KEYS, WORKFLOW_KEYS};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MacroKind {
    Activity,
    Workflow,
}

impl MacroKind {
    /// The attribute as the user wrote it, for error messages: `#[activity]`.
    pub(crate) fn attribute(self) -> &'static str {
        match self {
            MacroKind::Activity => "#[activity]",
            MacroKind::Workflow => "#[workflow]",
        }
    }

    /// The error type the body's error must convert into, as named in messages.
    pub(crate) fn error_type(self) -> &'static str {
        match self {
            MacroKind::Activity => "ActivityError",
            MacroKind::Workflow => "WorkflowError",
        }
    }

    /// The `key = value` arguments this attribute accepts.
    pub(crate) fn known_keys(self) -> &'static [KeySpec] {
        match self {
            MacroKind::Activity => ACTIVITY_KEYS,
            MacroKind::Workflow => WORKFLOW_KEYS,
        }
    }
}
