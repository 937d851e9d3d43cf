//! Field redaction: named JSON fields of the inputs of activities, effects and model calls are
//! journaled as their digest only.
//!
//! Only what the runtime never hands back to anyone is redacted: a command's input as
//! journaled (replay checks the command's identity, whose digest is of the whole input, and the
//! code passes the input again). The workflow's input, outputs and signals come back to the
//! code on replay, and an effect's arguments in the operation log go to its reconciler and are
//! the record of what ran: those are kept whole, and encrypting the store protects them.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;

use crate::journal::Payload;

/// The fields to journal as a digest only, by name, at any depth.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Redaction {
    fields: Arc<BTreeSet<String>>,
}

/// What a redacted field's value becomes: this prefix, then the digest of the value's
/// canonical JSON.
pub const REDACTED_PREFIX: &str = "redacted:";

impl Redaction {
    /// Redacts every field named in `fields`.
    pub fn fields<S: Into<String>>(fields: impl IntoIterator<Item = S>) -> Self {
        let fields = fields.into_iter().map(Into::into).collect();
        Self {
            fields: Arc::new(fields),
        }
    }

    /// Whether nothing is redacted.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// `payload` with every named field's value replaced by `redacted:sha256:…`. The digest is
    /// of the value alone and unkeyed: the same value always gives the same digest, so an
    /// operator holding a value can check it, and a value with few possibilities (a PIN) can be
    /// guessed from it.
    pub fn apply(&self, payload: Payload) -> Payload {
        if self.is_empty() {
            return payload;
        }
        let Ok(mut value) = serde_json::from_slice::<Value>(payload.as_bytes()) else {
            return payload;
        };
        if self.redact(&mut value) {
            Payload::from_value(&value)
        } else {
            payload
        }
    }

    /// Redacts in place; whether anything was.
    fn redact(&self, value: &mut Value) -> bool {
        match value {
            Value::Object(fields) => {
                let mut changed = false;
                for (name, field) in fields.iter_mut() {
                    if self.fields.contains(name) {
                        let digest = Payload::from_value(field).digest().hex();
                        *field = Value::String(format!("{REDACTED_PREFIX}{digest}"));
                        changed = true;
                    } else {
                        changed |= self.redact(field);
                    }
                }
                changed
            }
            Value::Array(items) => items
                .iter_mut()
                .fold(false, |changed, item| self.redact(item) | changed),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn payload(value: Value) -> Payload {
        Payload::from_value(&value)
    }

    #[test]
    fn named_fields_at_any_depth_become_their_digest() {
        let redaction = Redaction::fields(["card"]);
        let input = payload(json!({"order": "o-1", "card": "4111", "items": [{"card": {"n": 1}}]}));
        let redacted: Value = redaction.apply(input).decode().unwrap();
        let digest = |v: Value| format!("redacted:{}", payload(v).digest().hex());
        assert_eq!(
            redacted,
            json!({"order": "o-1", "card": digest(json!("4111")),
                   "items": [{"card": digest(json!({"n": 1}))}]})
        );
    }

    #[test]
    fn the_same_value_redacts_the_same_and_another_differently() {
        let redaction = Redaction::fields(["card"]);
        let a = redaction.apply(payload(json!({"card": "4111"})));
        let again = redaction.apply(payload(json!({"card": "4111"})));
        let other = redaction.apply(payload(json!({"card": "4242"})));
        assert_eq!(a, again);
        assert_ne!(a, other);
    }

    #[test]
    fn a_payload_without_the_fields_is_unchanged() {
        let redaction = Redaction::fields(["card"]);
        let input = payload(json!({"order": "o-1", "cards": 2}));
        assert_eq!(redaction.apply(input.clone()), input);
        assert_eq!(Redaction::default().apply(input.clone()), input);
    }
}
