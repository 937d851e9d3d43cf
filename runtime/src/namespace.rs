//! Namespaces: a workflow belongs to one, and a caller scoped to some never reaches the others.
//!
//! A namespace is part of a workflow's id in the store: the workflows of namespace `billing`
//! are stored as `billing` [`SEPARATOR`] `id`, their request ids likewise, and so the idempotency
//! keys derived from their ids start with the same prefix. Ids within one namespace are
//! therefore independent of every other's (the same request id in two namespaces starts two
//! workflows), and a lookup in one namespace cannot find another's workflow, operation or
//! request. The namespace [`DEFAULT`] adds no prefix, so stores written before namespaces keep
//! their ids. The separator is a control character, which no id given through the API may
//! hold.

/// The namespace of callers that name none, and of every workflow written before namespaces.
pub const DEFAULT: &str = "default";

/// Between a namespace and the id within it.
pub const SEPARATOR: char = '\u{1f}';

/// Most bytes in a namespace's name.
const MAX_NAME_LEN: usize = 64;

/// A namespace name or an id that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceError {
    /// Not 1 to 64 of `a-z A-Z 0-9 - _ .`.
    #[error("namespace `{0}` must be 1 to 64 of A-Z a-z 0-9 - _ .")]
    BadName(String),
    /// An id with a control character (which would also break logs and listings).
    #[error("the {0} holds a control character")]
    ControlCharacter(&'static str),
}

/// Checks a namespace's name.
pub fn check_name(namespace: &str) -> Result<(), NamespaceError> {
    let valid = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    if namespace.is_empty() || namespace.len() > MAX_NAME_LEN || !namespace.chars().all(valid) {
        let shown: String = namespace.chars().take(MAX_NAME_LEN).collect();
        return Err(NamespaceError::BadName(shown.escape_default().to_string()));
    }
    Ok(())
}

/// The stored form of `id` (a workflow id, request id or idempotency key, named `what` in
/// errors) of `namespace`.
pub fn qualify(namespace: &str, what: &'static str, id: &str) -> Result<String, NamespaceError> {
    check_name(namespace)?;
    if id.chars().any(char::is_control) {
        return Err(NamespaceError::ControlCharacter(what));
    }
    Ok(match namespace {
        DEFAULT => id.to_owned(),
        _ => format!("{namespace}{SEPARATOR}{id}"),
    })
}

/// The namespace and the id within it of a stored id.
pub fn split(stored: &str) -> (&str, &str) {
    match stored.split_once(SEPARATOR) {
        Some((namespace, id)) if check_name(namespace).is_ok() => (namespace, id),
        _ => (DEFAULT, stored),
    }
}

/// A stored id as shown to people: `namespace/id`, or the bare id in [`DEFAULT`].
pub fn display(stored: &str) -> String {
    match split(stored) {
        (DEFAULT, id) => id.to_owned(),
        (namespace, id) => format!("{namespace}/{id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_the_default_namespace_adds_nothing() {
        assert_eq!(qualify(DEFAULT, "id", "order-1").unwrap(), "order-1");
        let stored = qualify("billing", "id", "order-1").unwrap();
        assert_eq!(split(&stored), ("billing", "order-1"));
        assert_eq!(split("order-1"), (DEFAULT, "order-1"));
        assert_eq!(display(&stored), "billing/order-1");
    }

    #[test]
    fn a_caller_cannot_name_another_namespace_through_an_id() {
        let forged = format!("billing{SEPARATOR}order-1");
        assert_eq!(
            qualify(DEFAULT, "workflow id", &forged),
            Err(NamespaceError::ControlCharacter("workflow id"))
        );
        assert!(qualify("bad name", "id", "x").is_err());
        assert!(qualify("", "id", "x").is_err());
        assert!(qualify(DEFAULT, "id", "line\nbreak").is_err());
    }
}
