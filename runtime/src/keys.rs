//! Typed keys for the store's tables.
//!
//! A workflow id is written length-prefixed so that one workflow's keys are a prefix range no
//! other id can fall into (`ab` + `c…` never collides with `abc`). Integers are big-endian so
//! byte order is numeric order: a workflow's journal iterates in index order and the timer table
//! in due-time order.

use crate::journal::Seq;

/// Longest workflow id or request id accepted, in bytes.
pub const MAX_ID_LEN: usize = 512;

/// A key that could not be parsed back (only possible on a corrupt store).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed key {0:02x?}")]
pub struct KeyError(pub Vec<u8>);

fn push_id(out: &mut Vec<u8>, id: &str) {
    // Ids are checked against MAX_ID_LEN at the API boundary, so the length fits in a u16.
    let len = u16::try_from(id.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(id.as_bytes());
}

fn take_id(bytes: &[u8]) -> Option<(String, &[u8])> {
    let (len, rest) = bytes.split_first_chunk::<2>()?;
    let len = u16::from_be_bytes(*len) as usize;
    let id = std::str::from_utf8(rest.get(..len)?).ok()?;
    Some((id.to_owned(), &rest[len..]))
}

/// `workflows` and `requests`: the id alone.
/// An artifact's key: its hash, behind its namespace's name for any but the default one, so
/// that each namespace holds its own artifacts (the same content committed in two is two
/// rows, each readable in its own namespace only).
pub fn artifact_key(namespace: &str, hash: &crate::journal::Digest) -> Vec<u8> {
    if namespace == crate::namespace::DEFAULT {
        return hash.0.to_vec();
    }
    let mut out = Vec::with_capacity(namespace.len() + 1 + hash.0.len());
    out.extend_from_slice(namespace.as_bytes());
    out.push(crate::namespace::SEPARATOR as u8);
    out.extend_from_slice(&hash.0);
    out
}

pub fn id_key(id: &str) -> Vec<u8> {
    id_key_with_room(id, 0)
}

/// An [`id_key`] with room for `room` more bytes: a key built on it grows without a
/// reallocation (two a step, one per journal row, on the store's writer thread).
fn id_key_with_room(id: &str, room: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + id.len() + room);
    push_id(&mut out, id);
    out
}

/// Parses an [`id_key`].
pub fn parse_id_key(bytes: &[u8]) -> Result<String, KeyError> {
    match take_id(bytes) {
        Some((id, [])) => Ok(id),
        _ => Err(KeyError(bytes.to_vec())),
    }
}

/// `journal`: `(workflow_id, entry index)`.
pub fn journal_key(workflow_id: &str, index: u64) -> Vec<u8> {
    let mut out = id_key_with_room(workflow_id, 8);
    out.extend_from_slice(&index.to_be_bytes());
    out
}

/// Parses a [`journal_key`].
pub fn parse_journal_key(bytes: &[u8]) -> Result<(String, u64), KeyError> {
    let parsed = take_id(bytes).and_then(|(id, rest)| {
        let index = u64::from_be_bytes(rest.try_into().ok()?);
        Some((id, index))
    });
    parsed.ok_or_else(|| KeyError(bytes.to_vec()))
}

/// `streams`: `(workflow_id, event number)`, the same layout as the journal.
pub fn stream_key(workflow_id: &str, seq: u64) -> Vec<u8> {
    journal_key(workflow_id, seq)
}

/// `stream_acks`: `(workflow_id, channel)`, the last stream event a reader on that channel
/// acknowledged. A workflow's rows share the prefix [`id_key`]`(workflow_id)`.
pub fn stream_ack_key(workflow_id: &str, channel: &str) -> Vec<u8> {
    let mut out = id_key_with_room(workflow_id, channel.len());
    out.extend_from_slice(channel.as_bytes());
    out
}

/// `artifact_refs`: `(artifact key, workflow_id)`, the artifact key length-prefixed like an
/// id, so that one artifact's rows are a prefix range ([`artifact_refs_prefix`]).
pub fn artifact_ref_key(artifact_key: &[u8], workflow_id: &str) -> Vec<u8> {
    let mut out = artifact_refs_prefix(artifact_key);
    push_id(&mut out, workflow_id);
    out
}

/// The prefix of every [`artifact_ref_key`] of one artifact.
pub fn artifact_refs_prefix(artifact_key: &[u8]) -> Vec<u8> {
    let len = u16::try_from(artifact_key.len()).unwrap_or(u16::MAX);
    let mut out = Vec::with_capacity(2 + artifact_key.len() + 2);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(artifact_key);
    out
}

/// `ended` rows: by end time (`0`, ended_at_ms, workflow_id), so that the workflows ended
/// before a time are a range from the start, and by workflow (`1`, workflow_id: its end time),
/// so that a deletion finds its row by time.
const ENDED_BY_TIME: u8 = 0;
const ENDED_BY_ID: u8 = 1;

/// A workflow's row in the `ended` list by time.
pub fn ended_key(ended_at_ms: u64, workflow_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 8 + 2 + workflow_id.len());
    out.push(ENDED_BY_TIME);
    out.extend_from_slice(&ended_at_ms.to_be_bytes());
    push_id(&mut out, workflow_id);
    out
}

/// The prefix of every [`ended_key`].
pub fn ended_by_time_prefix() -> Vec<u8> {
    vec![ENDED_BY_TIME]
}

/// Parses an [`ended_key`].
pub fn parse_ended_key(bytes: &[u8]) -> Result<(u64, String), KeyError> {
    let parsed = bytes
        .strip_prefix(&[ENDED_BY_TIME])
        .and_then(|rest| rest.split_first_chunk::<8>())
        .and_then(|(at, rest)| {
            let (workflow_id, rest) = take_id(rest)?;
            rest.is_empty()
                .then(|| (u64::from_be_bytes(*at), workflow_id))
        });
    parsed.ok_or_else(|| KeyError(bytes.to_vec()))
}

/// A workflow's row by id in the `ended` table, whose value is its end time (big-endian).
pub fn ended_at_key(workflow_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 2 + workflow_id.len());
    out.push(ENDED_BY_ID);
    push_id(&mut out, workflow_id);
    out
}

/// The first key past every key that starts with `prefix` (the end of a prefix range), or
/// `None` if no key is past them (the prefix is all `0xff`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// `inbox` rows of a workflow: messages (`0`, arrival number), seen ids (`1`, signal id) and
/// the last arrival number given (`2`).
const INBOX_MESSAGE: u8 = 0;
const INBOX_SEEN: u8 = 1;
const INBOX_COUNTER: u8 = 2;
const INBOX_NAMED: u8 = 3;

/// The prefix of a workflow's inbox messages, in arrival order.
pub fn inbox_messages_prefix(workflow_id: &str) -> Vec<u8> {
    let mut out = id_key_with_room(workflow_id, 1);
    out.push(INBOX_MESSAGE);
    out
}

/// An inbox message: `(workflow_id, 0, arrival number)`.
pub fn inbox_message_key(workflow_id: &str, arrival: u64) -> Vec<u8> {
    let mut out = id_key_with_room(workflow_id, 1 + 8);
    out.push(INBOX_MESSAGE);
    out.extend_from_slice(&arrival.to_be_bytes());
    out
}

/// The arrival number of an [`inbox_message_key`] under `prefix`.
pub fn parse_inbox_arrival(prefix: &[u8], key: &[u8]) -> Result<u64, KeyError> {
    let rest = key
        .strip_prefix(prefix)
        .and_then(|r| <[u8; 8]>::try_from(r).ok());
    rest.map(u64::from_be_bytes)
        .ok_or_else(|| KeyError(key.to_vec()))
}

/// The marker that `signal_id` was received: `(workflow_id, 1, signal_id)`.
pub fn inbox_seen_key(workflow_id: &str, signal_id: &str) -> Vec<u8> {
    let mut out = id_key_with_room(workflow_id, 1 + signal_id.len());
    out.push(INBOX_SEEN);
    out.extend_from_slice(signal_id.as_bytes());
    out
}

/// The last arrival number given to a signal of `workflow_id`: `(workflow_id, 2)`.
pub fn inbox_counter_key(workflow_id: &str) -> Vec<u8> {
    let mut out = id_key_with_room(workflow_id, 1);
    out.push(INBOX_COUNTER);
    out
}

/// A message's row in the index of a workflow's inbox by name: `(workflow_id, 3, name,
/// arrival number)`, empty. A run rebuilt by replay reads the messages of the names it waits
/// for through it, not the whole inbox.
pub fn inbox_named_key(workflow_id: &str, name: &str, arrival: u64) -> Vec<u8> {
    let mut out = inbox_named_prefix(workflow_id, name);
    out.extend_from_slice(&arrival.to_be_bytes());
    out
}

/// The prefix of the index rows of a workflow's messages named `name`, in arrival order.
pub fn inbox_named_prefix(workflow_id: &str, name: &str) -> Vec<u8> {
    let mut out = inbox_names_prefix(workflow_id);
    out.reserve(4 + name.len() + 8);
    // Its length first, so that no name's rows fall among a longer name's that begins alike.
    let len = u32::try_from(name.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

/// The prefix of every index row of a workflow's inbox by name.
pub fn inbox_names_prefix(workflow_id: &str) -> Vec<u8> {
    let mut out = id_key_with_room(workflow_id, 1);
    out.push(INBOX_NAMED);
    out
}

/// A parsed key of the `inbox` family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxKey {
    /// A message not yet delivered.
    Message {
        /// Its workflow.
        workflow_id: String,
        /// Its arrival number.
        arrival: u64,
    },
    /// The marker that a signal id was received.
    Seen {
        /// Its workflow.
        workflow_id: String,
    },
    /// The last arrival number given.
    Counter {
        /// Its workflow.
        workflow_id: String,
    },
    /// A message's row in the index by name ([`inbox_named_key`]).
    Named {
        /// Its workflow.
        workflow_id: String,
    },
}

/// Parses any key of the `inbox` family; `None` for bytes no build writes.
pub fn parse_inbox_key(bytes: &[u8]) -> Option<InboxKey> {
    let (workflow_id, rest) = take_id(bytes)?;
    match rest.split_first()? {
        (&INBOX_MESSAGE, arrival) => {
            let arrival = u64::from_be_bytes(arrival.try_into().ok()?);
            Some(InboxKey::Message {
                workflow_id,
                arrival,
            })
        }
        (&INBOX_SEEN, _) => Some(InboxKey::Seen { workflow_id }),
        (&INBOX_COUNTER, []) => Some(InboxKey::Counter { workflow_id }),
        (&INBOX_NAMED, _) => Some(InboxKey::Named { workflow_id }),
        _ => None,
    }
}

/// A durable timer: due time first so the table iterates in firing order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimerKey {
    /// Clock time at which it fires.
    pub fire_at_ms: u64,
    /// Owner.
    pub workflow_id: String,
    /// The `ctx.sleep` command.
    pub seq: Seq,
}

impl TimerKey {
    /// Encodes as `(fire_at_ms, workflow_id, seq)`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 2 + self.workflow_id.len() + 4);
        out.extend_from_slice(&self.fire_at_ms.to_be_bytes());
        push_id(&mut out, &self.workflow_id);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out
    }

    /// Parses an encoded timer key.
    pub fn decode(bytes: &[u8]) -> Result<Self, KeyError> {
        let parsed = bytes.split_first_chunk::<8>().and_then(|(at, rest)| {
            let (workflow_id, rest) = take_id(rest)?;
            Some(TimerKey {
                fire_at_ms: u64::from_be_bytes(*at),
                workflow_id,
                seq: Seq::from_be_bytes(rest.try_into().ok()?),
            })
        });
        parsed.ok_or_else(|| KeyError(bytes.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each key the writer builds a step's rows with is made at its size: none is reallocated
    /// as it grows.
    #[test]
    fn every_key_is_made_at_its_size() {
        let id = "a-workflow-id-of-some-length";
        let timer = TimerKey {
            fire_at_ms: 1,
            workflow_id: id.into(),
            seq: 2,
        };
        let keys = [
            id_key(id),
            journal_key(id, 3),
            stream_ack_key(id, "channel"),
            ended_key(4, id),
            ended_at_key(id),
            inbox_messages_prefix(id),
            inbox_message_key(id, 5),
            inbox_seen_key(id, "signal"),
            inbox_counter_key(id),
            timer.encode(),
        ];
        for key in keys {
            assert_eq!(key.capacity(), key.len(), "{key:?}");
        }
    }

    #[test]
    fn every_key_kind_round_trips() {
        assert_eq!(parse_id_key(&id_key("wf-1")), Ok("wf-1".to_owned()));
        assert_eq!(
            parse_journal_key(&journal_key("wf-1", 258)),
            Ok(("wf-1".to_owned(), 258))
        );
        let timer = TimerKey {
            fire_at_ms: 99,
            workflow_id: "wf-ü".into(),
            seq: 7,
        };
        assert_eq!(TimerKey::decode(&timer.encode()), Ok(timer));
    }

    #[test]
    fn byte_order_is_logical_order() {
        assert!(journal_key("a", 255) < journal_key("a", 256));
        // A longer id never lands inside a shorter id's range.
        let range = id_key("ab");
        assert!(!journal_key("abc", 0).starts_with(&range));
        let early = TimerKey {
            fire_at_ms: 5,
            workflow_id: "zzz".into(),
            seq: 9,
        };
        let late = TimerKey {
            fire_at_ms: 6,
            workflow_id: "a".into(),
            seq: 0,
        };
        assert!(early.encode() < late.encode());
    }

    #[test]
    fn malformed_keys_are_errors() {
        assert!(parse_id_key(&[0, 9, b'a']).is_err());
        assert!(parse_journal_key(&id_key("a")).is_err());
        assert!(TimerKey::decode(&[1, 2]).is_err());
    }
}
