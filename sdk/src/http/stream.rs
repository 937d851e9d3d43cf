//! `GET /workflows/{id}/stream`: the workflow's durable stream as Server-Sent Events.
//!
//! Every event's `id:` is its stream number, so a client that reconnects with `Last-Event-ID`
//! gets exactly the events after it. The number it sends back is also the delivery status: the
//! last event a reader on its channel (`?channel=`, `default` when not named) acknowledged,
//! recorded in the store apart from what was generated, so it survives a restart; a reader can
//! also acknowledge without reconnecting (`POST /workflows/{id}/stream/ack`). It never moves
//! back, and an event never generated is refused (409). Chunks of a response
//! version already superseded when they are sent carry `"superseded": true`; a `superseded`
//! event tells a client to drop what it showed of that version. The stream ends with an `end`
//! event once the workflow ended and everything was sent; its `id:` is the last event's
//! number, and a client closes the connection when it gets it. A browser `EventSource`
//! reconnects by itself all the same: a reconnection that has seen everything of an ended
//! workflow is answered `204 No Content`, which tells it to stop. A store that fails mid-stream
//! ends the stream with an `error` event.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use waymark_runtime::store::{StoreError, WorkflowRecord};
use waymark_runtime::streams::{StreamEvent, StreamItem};

use super::auth::Role;
use super::bodies::{AckRequest, Acknowledged, ChannelQuery, ErrorBody, WorkflowPath};
use super::error::ApiError;
use super::handlers::{body, path, status_name, stored_id};
use super::Api;

/// Events read from the store at once: a reader of a long stream holds one page.
const PAGE: usize = 256;

/// How often a stream with nothing new looks again when the store cannot wake it.
const POLL: Duration = Duration::from_millis(50);
/// How long a woken stream waits at most before it looks again anyway: a safety net, since
/// every write a reader needs wakes it.
const WAKE_AT_LEAST_EVERY: Duration = Duration::from_secs(5);

/// The channel a reader did not name.
const DEFAULT_CHANNEL: &str = "default";

/// A workflow's stream, as Server-Sent Events.
///
/// Each event's `id:` is its number; a reconnection with `Last-Event-ID` gets the events after
/// it and acknowledges them for its `channel`. Events: `chunk`, `superseded`, `committed`,
/// progress events (`approval_required`, `retrieval_complete`, …), and `end` once the workflow
/// ended. A reconnection that saw everything of an ended workflow is answered 204. Role read.
#[utoipa::path(get, path = "/workflows/{id}/stream", operation_id = "stream_workflow",
    params(WorkflowPath, ChannelQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "The last event the reader holds.")),
    responses(
        (status = 200, description = "The events, as they come.", content_type = "text/event-stream", body = String),
        (status = 204, description = "The workflow ended and the reader holds every event."),
        (status = 400, description = "A `Last-Event-ID` that is no event number.", body = ErrorBody),
        (status = 404, description = "No such workflow.", body = ErrorBody),
        (status = 409, description = "`Last-Event-ID` names an event never generated.", body = ErrorBody),
    ))]
pub(crate) async fn stream(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<ChannelQuery>, QueryRejection>,
) -> Result<Answer, ApiError> {
    let caller = api.caller(&headers)?;
    caller.require(Role::Read)?;
    let id = stored_id(&caller, &headers, "workflow id", &path(id)?)?;
    let Query(query) = query.map_err(|r| ApiError::bad_request(r.body_text()))?;
    let channel = query.channel.unwrap_or_else(|| DEFAULT_CHANNEL.to_owned());
    let last_seen = last_event_id(&headers)?;
    let after = last_seen.unwrap_or(0);
    // Subscribed before the first read: a write after that read wakes the reader.
    let changes = api.worker.runtime().watch_stream(&id);
    let workflow = id.clone();
    let (record, last, superseded) = api
        .read(move |worker| {
            let runtime = worker.runtime();
            let record = runtime.workflow(&workflow)?;
            let last = runtime.stream_last(&workflow)?;
            let superseded = superseded_versions(runtime, &workflow, last)?;
            Ok::<_, StoreError>((record, last, superseded))
        })
        .await??;
    let Some(record) = record else {
        return Err(ApiError::not_found(format!("no workflow `{id}`")));
    };
    // The reader's place first: a refused reader records nothing.
    let slot = api.readers.open(&id, api.max_stream_readers)?;
    if let Some(seen) = last_seen {
        api.worker
            .runtime()
            .acknowledge_stream(&id, &channel, seen)
            .await?;
    }
    if last_seen.is_some() && record.status.is_terminal() && last <= after {
        return Ok(Answer::Over(StatusCode::NO_CONTENT));
    }
    let reader = Reader {
        _slot: slot,
        shutdown: api.shutdown.clone(),
        api,
        id,
        after,
        superseded,
        changes,
        done: false,
    };
    let events = futures::stream::unfold(reader, |mut reader| async move {
        let batch = reader.next_batch().await?;
        Some((futures::stream::iter(batch), reader))
    });
    let events = futures::StreamExt::flatten(events);
    let sse = Sse::new(events).keep_alive(KeepAlive::default());
    Ok(Answer::Events(sse.into_response()))
}

/// The stream, or a status that says there is nothing more to stream.
pub(crate) enum Answer {
    Events(Response),
    Over(StatusCode),
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        match self {
            Answer::Events(response) => response,
            Answer::Over(status) => status.into_response(),
        }
    }
}

/// Acknowledge, durably, that a reader holds every event up to `event`.
///
/// For a reader on `channel` (default `default`), without reconnecting. Never moves back;
/// answers what the channel is now known to have received. Role read.
#[utoipa::path(post, path = "/workflows/{id}/stream/ack", operation_id = "acknowledge_stream", params(WorkflowPath),
    request_body(content = AckRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "What the channel is known to have received.", body = Acknowledged),
        (status = 400, description = "Malformed.", body = ErrorBody),
        (status = 404, description = "No such workflow.", body = ErrorBody),
        (status = 409, description = "`event` was never generated.", body = ErrorBody),
    ))]
pub(crate) async fn acknowledge(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Acknowledged>, ApiError> {
    let caller = api.caller(&headers)?;
    caller.require(Role::Read)?;
    let (id, raw) = (path(id)?, body(raw)?);
    let stored = stored_id(&caller, &headers, "workflow id", &id)?;
    let request: AckRequest = serde_json::from_slice(&raw)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))?;
    let channel = request
        .channel
        .unwrap_or_else(|| DEFAULT_CHANNEL.to_owned());
    let runtime = api.worker.runtime();
    let delivered = runtime.acknowledge_stream(&stored, &channel, request.event);
    let delivered = delivered.await?;
    Ok(Json(Acknowledged {
        workflow_id: id,
        channel,
        delivered,
    }))
}

/// The event number a reconnecting client saw last: `None` without the header; a value that
/// is not one (not a number, not even ASCII) is refused like any other malformed request.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let shown = String::from_utf8_lossy(value.as_bytes()).into_owned();
    let refused =
        || ApiError::bad_request(format!("Last-Event-ID `{shown}` is not an event number"));
    let text = value.to_str().map_err(|_| refused())?;
    let number = text.trim().parse::<u64>().map_err(|_| refused())?;
    Ok(Some(number))
}

struct Reader {
    /// Its place among the workflow's open readers, freed when the stream ends.
    _slot: super::limits::ReaderSlot,
    api: Arc<Api>,
    /// Becomes `true` when the server shuts down: open streams end so shutdown can finish.
    shutdown: tokio::sync::watch::Receiver<bool>,
    id: String,
    after: u64,
    superseded: HashSet<(u32, u32)>,
    /// Wakes the reader when its workflow's stream or status changed; `None`: poll.
    changes: Option<tokio::sync::watch::Receiver<()>>,
    done: bool,
}

impl Reader {
    /// The next events to send, waiting for new ones; `None` once the stream is over.
    async fn next_batch(&mut self) -> Option<Vec<Result<Event, Infallible>>> {
        if self.done {
            return None;
        }
        loop {
            let read = self.read().await;
            let (record, events) = match read {
                Ok(read) => read,
                Err(message) => {
                    self.done = true;
                    let error = json!({"message": message});
                    let event = Event::default().event("error").data(error.to_string());
                    return Some(vec![Ok(event)]);
                }
            };
            if !events.is_empty() {
                return Some(events.iter().map(|e| Ok(self.sse(e))).collect());
            }
            if record.status.is_terminal() {
                self.done = true;
                let end = json!({"status": status_name(record.status)});
                let event = Event::default()
                    .id(self.after.to_string())
                    .event("end")
                    .data(end.to_string());
                return Some(vec![Ok(event)]);
            }
            tokio::select! {
                () = wait_for_change(&mut self.changes) => {}
                _ = self.shutdown.wait_for(|stopping| *stopping) => return None,
            }
        }
    }

    /// The record, then a page of the events after the last one sent: read in that order,
    /// events written before the end are never missed (a full page is sent before the end is
    /// looked at again). `Err` says why the store could not answer.
    async fn read(&self) -> Result<(WorkflowRecord, Vec<StreamEvent>), String> {
        let (id, after) = (self.id.clone(), self.after);
        let read = self.api.read(move |worker| {
            let runtime = worker.runtime();
            let record = runtime.workflow(&id)?;
            Ok::<_, StoreError>((record, runtime.stream_page(&id, after, PAGE)?))
        });
        match read.await {
            Ok(Ok((Some(record), events))) => Ok((record, events)),
            Ok(Ok((None, _))) => Err(format!("workflow `{}` is gone from the store", self.id)),
            Ok(Err(error)) => Err(error.to_string()),
            Err(error) => Err(error.message),
        }
    }

    fn sse(&mut self, event: &StreamEvent) -> Event {
        self.after = event.seq;
        let (name, data) = match &event.item {
            StreamItem::Chunk {
                step,
                response_version,
                text,
            } => {
                let superseded = self.superseded.contains(&(*step, *response_version));
                let data = json!({"step": step, "response_version": response_version,
                    "text": text, "superseded": superseded});
                ("chunk", data)
            }
            StreamItem::Superseded {
                step,
                response_version,
                reason,
            } => {
                self.superseded.insert((*step, *response_version));
                let data =
                    json!({"step": step, "response_version": response_version, "reason": reason});
                ("superseded", data)
            }
            StreamItem::Committed {
                step,
                response_version,
            } => (
                "committed",
                json!({"step": step, "response_version": response_version}),
            ),
            StreamItem::Progress { step, name, detail } => {
                let detail: serde_json::Value = detail.decode().unwrap_or_default();
                let data = json!({"step": step, "detail": detail});
                return Event::default()
                    .id(event.seq.to_string())
                    .event(name.clone())
                    .data(data.to_string());
            }
        };
        Event::default()
            .id(event.seq.to_string())
            .event(name)
            .data(data.to_string())
    }
}

/// Returns once the stream may have changed: when woken, or after a poll interval without a
/// watch (or once the watch is gone with its store).
async fn wait_for_change(changes: &mut Option<tokio::sync::watch::Receiver<()>>) {
    let Some(receiver) = changes else {
        return tokio::time::sleep(POLL).await;
    };
    match tokio::time::timeout(WAKE_AT_LEAST_EVERY, receiver.changed()).await {
        Ok(Ok(())) | Err(_) => {}
        Ok(Err(_closed)) => *changes = None,
    }
}

/// The response versions superseded up to event `last`, read a page at a time: what a chunk
/// sent later is marked with, without holding the whole stream (and without chasing one that
/// grows while it is read: the reader marks what comes later itself).
fn superseded_versions(
    runtime: &waymark_runtime::worker::Worker,
    workflow_id: &str,
    last: u64,
) -> Result<HashSet<(u32, u32)>, StoreError> {
    let mut superseded = HashSet::new();
    let mut after = 0;
    while after < last {
        let page = runtime.stream_page(workflow_id, after, PAGE)?;
        let Some(newest) = page.last() else {
            break;
        };
        after = newest.seq;
        superseded.extend(page.iter().filter_map(|e| match e.item {
            StreamItem::Superseded {
                step,
                response_version,
                ..
            } => Some((step, response_version)),
            _ => None,
        }));
    }
    Ok(superseded)
}
