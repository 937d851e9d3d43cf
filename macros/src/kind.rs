//! Which of the two attributes is being expanded; messages and accepted arguments depend on it.

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
}
