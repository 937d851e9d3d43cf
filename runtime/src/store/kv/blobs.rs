//! Large strings of journaled payloads, stored once per workflow by their content.
//!
//! A model call's prompt repeats the same long context (a policy, a document, the transcript
//! so far) in step after step; journaled whole, each step would store it again. A payload of at
//! least [`PAYLOAD_THRESHOLD`] bytes is stored as a *split* payload instead: its JSON with every
//! string of at least [`STRING_THRESHOLD`] bytes left empty, and where each goes (a JSON
//! pointer) with the SHA-256 of its bytes; the strings are rows of [`Table::Blobs`], keyed by
//! workflow and hash, written once. A split payload's stored bytes begin with [`SPLIT`], which
//! no JSON begins with, so a stored payload says which it is; the store puts the strings back
//! before any entry leaves it, so nothing above the store sees one. The rows are the
//! workflow's own, deleted with it (a fork or a kept run writes its own).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::*;
use crate::journal::{decode_exact, Payload};
use crate::keys::id_key;

/// A payload this long or longer is looked into.
pub(super) const PAYLOAD_THRESHOLD: usize = 16 * 1024;
/// A string this long or longer, in a payload looked into, is stored apart.
pub(super) const STRING_THRESHOLD: usize = 4 * 1024;
/// The first byte of a split payload's stored bytes.
const SPLIT: u8 = 0;

/// A payload as stored when split: its JSON with the long strings left empty, and where each
/// goes. Append-only (postcard).
#[derive(Serialize, Deserialize)]
struct Split {
    skeleton: Vec<u8>,
    parts: Vec<(String, Digest)>,
}

/// The row key of `workflow_id`'s string `hash`.
pub(super) fn blob_key(workflow_id: &str, hash: &Digest) -> Vec<u8> {
    let mut key = id_key(workflow_id);
    key.extend_from_slice(&hash.0);
    key
}

/// `entry` as stored: its payload split if large; the strings it keeps apart, by hash.
pub(super) fn split_entry(entry: &Entry) -> (Option<Entry>, Vec<(Digest, Vec<u8>)>) {
    let mut parts = Vec::new();
    let mut stored = entry.clone();
    let Some(payload) = payload_mut(&mut stored) else {
        return (None, parts);
    };
    match split_payload(payload, &mut parts) {
        Some(split) => {
            *payload = split;
            (Some(stored), parts)
        }
        None => (None, parts),
    }
}

/// Strings read so far for one read of a journal: the same prompt in a thousand entries is
/// read once.
pub(super) type Parts = HashMap<Digest, String>;

/// Puts `entry`'s split payload, if it has one, back together from `workflow_id`'s strings,
/// in place: most entries have none, and a journal's read moves none of them.
pub(super) fn join_entry(
    engine: &dyn Reads,
    workflow_id: &str,
    index: u64,
    entry: &mut Entry,
    cache: &mut Parts,
) -> Result<(), StoreError> {
    if let Some(payload) = payload_mut(entry) {
        if payload.as_bytes().first() == Some(&SPLIT) {
            let key = format!("{workflow_id}#{index}");
            *payload = join_payload(engine, workflow_id, &key, payload.as_bytes(), cache)?;
        }
    }
    Ok(())
}

fn split_payload(payload: &Payload, parts: &mut Vec<(Digest, Vec<u8>)>) -> Option<Payload> {
    if payload.as_bytes().len() < PAYLOAD_THRESHOLD {
        return None;
    }
    let mut value: Value = serde_json::from_slice(payload.as_bytes()).ok()?;
    let mut holes = Vec::new();
    take_long_strings(&mut value, &mut String::new(), &mut holes);
    if holes.is_empty() {
        return None;
    }
    let skeleton = Payload::from_value(&value).as_bytes().to_vec();
    let mut refs = Vec::with_capacity(holes.len());
    for (pointer, text) in holes {
        let hash = Digest::of(text.as_bytes());
        refs.push((pointer.clone(), hash));
        if let Some(slot) = value.pointer_mut(&pointer) {
            *slot = Value::String(text.clone());
        }
        parts.push((hash, text.into_bytes()));
    }
    // Only a payload that comes back byte for byte is split (one in canonical form).
    if Payload::from_value(&value).as_bytes() != payload.as_bytes() {
        parts.truncate(parts.len() - refs.len());
        return None;
    }
    let mut stored = vec![SPLIT];
    let split = Split {
        skeleton,
        parts: refs,
    };
    stored.extend(postcard::to_allocvec(&split).ok()?);
    Some(Payload::from_stored(stored))
}

/// Empties every string of at least [`STRING_THRESHOLD`] bytes under `value` (at `pointer`),
/// noting where it was and what it held.
fn take_long_strings(value: &mut Value, pointer: &mut String, holes: &mut Vec<(String, String)>) {
    let depth = pointer.len();
    match value {
        Value::String(text) if text.len() >= STRING_THRESHOLD => {
            holes.push((pointer.clone(), std::mem::take(text)));
        }
        Value::Array(items) => {
            for (index, item) in items.iter_mut().enumerate() {
                pointer.push('/');
                pointer.push_str(&index.to_string());
                take_long_strings(item, pointer, holes);
                pointer.truncate(depth);
            }
        }
        Value::Object(fields) => {
            for (name, field) in fields.iter_mut() {
                pointer.push('/');
                pointer.push_str(&name.replace('~', "~0").replace('/', "~1"));
                take_long_strings(field, pointer, holes);
                pointer.truncate(depth);
            }
        }
        _ => {}
    }
}

fn join_payload(
    engine: &dyn Reads,
    workflow_id: &str,
    key: &str,
    stored: &[u8],
    cache: &mut Parts,
) -> Result<Payload, StoreError> {
    let corrupt = |message: String| StoreError::Corrupt {
        table: Table::Journal,
        key: key.to_owned(),
        source: DecodeError::Malformed(message),
    };
    let split: Split = decode_exact(&stored[1..]).map_err(|e| corrupt(e.to_string()))?;
    let mut value: Value = serde_json::from_slice(&split.skeleton)
        .map_err(|e| corrupt(format!("a split payload's skeleton: {e}")))?;
    for (pointer, hash) in split.parts {
        let text = match cache.get(&hash) {
            Some(text) => text.clone(),
            None => {
                let bytes = engine.get(Table::Blobs, &blob_key(workflow_id, &hash))?;
                let bytes =
                    bytes.ok_or_else(|| corrupt(format!("the part {} is missing", hash.hex())))?;
                if Digest::of(&bytes) != hash {
                    return Err(corrupt(format!(
                        "the part {} does not hash to it",
                        hash.hex()
                    )));
                }
                let text = String::from_utf8(bytes)
                    .map_err(|_| corrupt(format!("the part {} is not text", hash.hex())))?;
                cache.insert(hash, text.clone());
                text
            }
        };
        let slot = value.pointer_mut(&pointer);
        let slot = slot.ok_or_else(|| corrupt(format!("no place `{pointer}` for a part")))?;
        *slot = Value::String(text);
    }
    Ok(Payload::from_value(&value))
}

/// A rewind kept `kept_rows` of `workflow_id`'s journal and appended `appended`: the strings
/// none of those name any more go (the run that named them was kept as a workflow of its own,
/// with its own copies).
pub(super) fn release_rewound(
    view: &mut View<'_>,
    workflow_id: &str,
    kept_rows: u64,
    appended: &[Entry],
) -> Result<(), StoreError> {
    let own = id_key(workflow_id);
    let stored = view.engine.scan(Table::Blobs, &own, &own, usize::MAX)?;
    if stored.is_empty() {
        return Ok(());
    }
    let mut named = HashSet::new();
    let kept = usize::try_from(kept_rows).unwrap_or(usize::MAX);
    for (key, value) in view.engine.scan(Table::Journal, &own, &own, kept)? {
        let shown = String::from_utf8_lossy(&key).into_owned();
        let mut entry: Entry = decode_at(Table::Journal, &shown, &value)?;
        named.extend(split_parts(&mut entry));
    }
    for entry in appended {
        named.extend(split_entry(entry).1.into_iter().map(|(hash, _)| hash));
    }
    for (key, _) in stored {
        let hash = key
            .get(own.len()..)
            .and_then(|h| <[u8; 32]>::try_from(h).ok());
        if hash.is_some_and(|h| !named.contains(&Digest(h))) {
            view.writes.delete(Table::Blobs, key.to_vec());
        }
    }
    Ok(())
}

/// The strings `entry`'s split payloads name.
fn split_parts(entry: &mut Entry) -> Vec<Digest> {
    let Some(bytes) = payload_mut(entry).map(|payload| payload.as_bytes()) else {
        return Vec::new();
    };
    if bytes.first() != Some(&SPLIT) {
        return Vec::new();
    }
    match decode_exact::<Split>(&bytes[1..]) {
        Ok(split) => split.parts.into_iter().map(|(_, hash)| hash).collect(),
        Err(_) => Vec::new(),
    }
}

/// The payload of `entry`, if it has one (no kind of entry has two).
fn payload_mut(entry: &mut Entry) -> Option<&mut Payload> {
    match entry {
        Entry::WorkflowStarted(started) => Some(&mut started.input),
        Entry::ActivityScheduled { input, .. } | Entry::ActivityScheduledAt { input, .. } => {
            Some(input)
        }
        Entry::ActivityCompleted { output, .. }
        | Entry::ActivityCompletedAt { output, .. }
        | Entry::WorkflowCompleted { output } => Some(output),
        Entry::ValueRecorded { value, .. } => Some(value),
        Entry::SignalReceived { payload, .. }
        | Entry::SignalReceivedFrom { payload, .. }
        | Entry::SignalReceivedAt { payload, .. } => Some(payload),
        Entry::ApprovalRequested { risk, .. } | Entry::ApprovalRequestedAt { risk, .. } => {
            Some(risk)
        }
        Entry::EffectReconciled {
            verdict: crate::journal::Reconciliation::Committed(result),
            ..
        } => Some(result),
        Entry::EffectReconciled { .. }
        | Entry::ActivityAttemptFailed { .. }
        | Entry::ActivityFailed { .. }
        | Entry::ActivityFailedAt { .. }
        | Entry::TimerStarted { .. }
        | Entry::TimerFired { .. }
        | Entry::TimerFiredAt { .. }
        | Entry::WorkflowFailed { .. }
        | Entry::EffectUncertain { .. }
        | Entry::SignalAwaited { .. }
        | Entry::SignalAwaitedAt { .. }
        | Entry::ArtifactCommitted { .. }
        | Entry::ApprovalDecided { .. }
        | Entry::SnapshotCompleted { .. }
        | Entry::SnapshotCompletedAt { .. }
        | Entry::WaitDropped { .. }
        | Entry::CancelRequested { .. }
        | Entry::StartedBy { .. }
        | Entry::Forked(_) => None,
    }
}
