//! The web UI, served by the worker under `/ui`: workflows, the journal as a timeline,
//! approvals that show exactly what is approved, operations awaiting a decision, and the
//! replay-safety figures. Server-rendered HTML (maud) with htmx and its SSE extension, both
//! embedded in the binary, so there is no build step and nothing is fetched from elsewhere.
//!
//! A person logs in with their API token's secret and gets a session ([`session`]); every page
//! acts with that token's identity and roles, in its first namespace, through the same worker
//! calls as the JSON API. An approval is decided on the exact request and scope hash the page
//! showed: if the workflow moved on since, the decision is refused and nothing changes.

mod charts;
mod pages;
mod session;
mod timeline;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::ExtensionRejection;
use axum::extract::{ConnectInfo, Form, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use waymark_runtime::artifacts::ApprovalVerdict;
use waymark_runtime::namespace;
use waymark_runtime::operations::{DecidedOn, OperatorDecision};

use super::auth::Role;
use super::paging::{keyed_after, take_page};
use super::Api;
pub(crate) use session::Sessions;
use session::{Session, COOKIE, LOGIN_COOKIE};

type UiState = State<Arc<Api>>;

/// The UI's routes, all under `/ui` (outside the JSON API and its OpenAPI document).
pub(crate) fn routes() -> Router<Arc<Api>> {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/workflows") }))
        .route("/ui/login", get(login_page).post(log_in))
        .route("/ui/logout", post(log_out))
        .route("/ui/workflows", get(workflows))
        .route("/ui/workflows/{id}", get(workflow))
        .route("/ui/workflows/{id}/live", get(live))
        .route(
            "/ui/workflows/{id}/approvals/{request}",
            get(approval).post(decide),
        )
        .route("/ui/artifacts/{hash}", get(artifact))
        .route("/ui/operations", get(operations))
        .route("/ui/operations/resolve", post(resolve))
        .route("/ui/metrics", get(metrics))
        .route("/ui/assets/{name}", get(asset))
}

/// A page, or why it cannot be shown: both are HTML with the headers every UI answer carries.
struct Page {
    status: StatusCode,
    html: String,
}

impl Page {
    fn ok(html: maud::Markup) -> Self {
        Self {
            status: StatusCode::OK,
            html: html.into_string(),
        }
    }

    fn refused(status: StatusCode, session: Option<&Session>, message: &str) -> Self {
        Self {
            status,
            html: pages::refusal(session, status, message).into_string(),
        }
    }
}

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        let mut response = (self.status, Html(self.html)).into_response();
        secure_headers(response.headers_mut());
        response
    }
}

/// What no UI answer goes without: no script but ours, no framing, no caching of pages that
/// show workflows, no referrer carrying ids elsewhere.
fn secure_headers(headers: &mut HeaderMap) {
    let policy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                  connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    let set = [
        (header::CONTENT_SECURITY_POLICY, policy),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

/// Why a page is not shown to a request.
enum Denied {
    /// No session: log in first.
    LogIn,
    Refused(Page),
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        match self {
            Denied::LogIn => Redirect::to("/ui/login").into_response(),
            Denied::Refused(page) => page.into_response(),
        }
    }
}

/// The request's session, or a redirect to the login page; counted against its token's
/// requests a minute, as the API's requests are.
fn session(api: &Api, headers: &HeaderMap) -> Result<Session, Denied> {
    let session = api.sessions.find(headers).ok_or(Denied::LogIn)?;
    let taken = api
        .per_token
        .take(&session.caller.name, "requests for this token");
    if let Err(limited) = taken {
        let page = Page::refused(limited.status, Some(&session), &limited.message);
        return Err(Denied::Refused(page));
    }
    Ok(session)
}

/// The session, which must hold one of `roles`.
fn session_with(api: &Api, headers: &HeaderMap, roles: &[Role]) -> Result<Session, Denied> {
    let session = session(api, headers)?;
    if let Err(refused) = session.caller.require_any(roles) {
        let page = Page::refused(StatusCode::FORBIDDEN, Some(&session), &refused.message);
        return Err(Denied::Refused(page));
    }
    Ok(session)
}

/// Who may see workflows and their pages: readers, and approvers, who must see what they
/// decide.
const SEES_WORKFLOWS: [Role; 2] = [Role::Read, Role::Approve];

/// The session of a person who may see workflows, and the workflow `id` they ask for, as
/// stored.
fn seeing_workflow(api: &Api, headers: &HeaderMap, id: &str) -> Result<(Session, String), Denied> {
    let session = session_with(api, headers, &SEES_WORKFLOWS)?;
    let stored = stored(&session, "workflow id", id)?;
    Ok((session, stored))
}

/// The session, which must hold `role` and have sent its CSRF token with the form.
fn session_for_form(
    api: &Api,
    headers: &HeaderMap,
    csrf: &str,
    role: Option<Role>,
) -> Result<Session, Denied> {
    let session = session(api, headers)?;
    if !session::same_token(csrf, &session.csrf) {
        let message = "this form did not come from a page of this session: nothing changed";
        let page = Page::refused(StatusCode::FORBIDDEN, Some(&session), message);
        return Err(Denied::Refused(page));
    }
    if let Some(Err(refused)) = role.map(|role| session.caller.require(role)) {
        let page = Page::refused(StatusCode::FORBIDDEN, Some(&session), &refused.message);
        return Err(Denied::Refused(page));
    }
    Ok(session)
}

/// Adds cookie `name` to `response` (a `max_age` of 0 forgets it).
fn set_cookie(api: &Api, response: &mut Response, name: &str, value: &str, max_age: Option<u64>) {
    let cookie = session::set_cookie(name, value, api.secure_cookies, max_age);
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
}

/// Where a caller lands: the list, or for an operator alone the operations awaiting one.
fn landing(caller: &super::auth::Caller) -> &'static str {
    match caller.require_any(&SEES_WORKFLOWS) {
        Ok(_) => "/ui/workflows",
        Err(_) => "/ui/operations",
    }
}

/// The stored form of `id` in the session's namespace.
fn stored(session: &Session, what: &'static str, id: &str) -> Result<String, Denied> {
    let namespace = namespace_of(session)?;
    namespace::qualify(&namespace, what, id).map_err(|e| {
        Denied::Refused(Page::refused(
            StatusCode::BAD_REQUEST,
            Some(session),
            &e.to_string(),
        ))
    })
}

/// The namespace the session acts in: its token's first.
fn namespace_of(session: &Session) -> Result<String, Denied> {
    let namespace = session.caller.namespace(&HeaderMap::new());
    namespace.map_err(|e| Denied::Refused(Page::refused(e.status, Some(session), &e.message)))
}

/// Runs a read of the worker's store for `session` on the blocking pool; a store that fails
/// is a page that says so.
async fn read_for<T, F>(api: &Api, session: &Session, read: F) -> Result<T, Denied>
where
    T: Send + 'static,
    F: FnOnce(&crate::Worker) -> Result<T, waymark_runtime::store::StoreError> + Send + 'static,
{
    match api.read(read).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(internal(session, &error.to_string())),
        Err(error) => Err(internal(session, &error.message)),
    }
}

async fn login_page(State(api): UiState, headers: HeaderMap) -> Response {
    if let Some(session) = api.sessions.find(&headers) {
        return Redirect::to(landing(&session.caller)).into_response();
    }
    let csrf = session::random_token();
    let mut response = Page::ok(pages::login(&csrf, None)).into_response();
    set_cookie(&api, &mut response, LOGIN_COOKIE, &csrf, Some(600));
    response
}

#[derive(Deserialize)]
struct LoginForm {
    secret: String,
    csrf: String,
}

async fn log_in(
    State(api): UiState,
    peer: Result<ConnectInfo<std::net::SocketAddr>, ExtensionRejection>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let expected = session::cookie(&headers, LOGIN_COOKIE).unwrap_or_default();
    if !session::same_token(&form.csrf, &expected) {
        let message = "the login form expired or did not come from this worker: load it again";
        return Page::refused(StatusCode::FORBIDDEN, None, message).into_response();
    }
    let peer = peer.map_or_else(
        |_| "unknown".to_owned(),
        |ConnectInfo(a)| a.ip().to_string(),
    );
    let guessing = "login failures from this address";
    if api.auth_failures.is_exhausted(&peer) {
        let message = "too many failed logins from this address: wait a minute";
        return Page::refused(StatusCode::TOO_MANY_REQUESTS, None, message).into_response();
    }
    let Some(caller) = api.tokens.caller_for_secret(&form.secret) else {
        let _ = api.auth_failures.take(&peer, guessing);
        tracing::warn!(%peer, "UI login refused: unknown token");
        let page = pages::login(&form.csrf, Some("That token is not known to this worker."));
        let mut page = Page::ok(page);
        page.status = StatusCode::UNAUTHORIZED;
        return page.into_response();
    };
    // A session the browser already held ends: the new one starts fresh.
    api.sessions.close(&headers);
    let landing = landing(&caller);
    let id = api.sessions.open(caller);
    let mut response = Redirect::to(landing).into_response();
    set_cookie(&api, &mut response, COOKIE, &id, None);
    set_cookie(&api, &mut response, LOGIN_COOKIE, "", Some(0));
    response
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: String,
}

async fn log_out(State(api): UiState, headers: HeaderMap, Form(form): Form<CsrfForm>) -> Response {
    if let Err(denied) = session_for_form(&api, &headers, &form.csrf, None) {
        return denied.into_response();
    }
    api.sessions.close(&headers);
    let mut response = Redirect::to("/ui/login").into_response();
    set_cookie(&api, &mut response, COOKIE, "", Some(0));
    response
}

/// The list's filters, search and page.
#[derive(Deserialize, Default)]
pub(crate) struct ListFilter {
    /// A status name, or empty for all.
    #[serde(default)]
    pub(crate) status: String,
    /// Part of a workflow id or request id.
    #[serde(default)]
    pub(crate) q: String,
    /// The last id of the page before.
    #[serde(default)]
    pub(crate) after: String,
}

/// Rows on one page of the list.
const LIST_PAGE: usize = 50;

async fn workflows(
    State(api): UiState,
    headers: HeaderMap,
    Query(filter): Query<ListFilter>,
) -> Response {
    let session = match session_with(&api, &headers, &SEES_WORKFLOWS) {
        Ok(session) => session,
        Err(denied) => return denied.into_response(),
    };
    let namespace = match namespace_of(&session) {
        Ok(namespace) => namespace,
        Err(denied) => return denied.into_response(),
    };
    // Filtered and paged on summaries, which read no journal; only the page's records are read
    // whole, with their journal lengths.
    let read = read_for(&api, &session, move |worker| {
        let runtime = worker.runtime();
        let listing = runtime.workflow_summaries()?;
        let page = pages::ListPage::from_listing(listing, &namespace, &filter, LIST_PAGE);
        Ok((page.next, runtime.records_of(page.rows), filter))
    });
    let (next, records, filter) = match read.await {
        Ok(read) => read,
        Err(denied) => return denied.into_response(),
    };
    let rows = pages::ListRows::of(records, next);
    Page::ok(pages::workflows(&session, &filter, &rows)).into_response()
}

fn internal(session: &Session, message: &str) -> Denied {
    let message = format!("the store could not answer: {message}");
    Denied::Refused(Page::refused(
        StatusCode::INTERNAL_SERVER_ERROR,
        Some(session),
        &message,
    ))
}

async fn workflow(State(api): UiState, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let (session, stored) = match seeing_workflow(&api, &headers, &id) {
        Ok(seen) => seen,
        Err(denied) => return denied.into_response(),
    };
    match read_view(&api, stored).await {
        Ok(Some(view)) => Page::ok(pages::workflow(&session, &id, &view)).into_response(),
        Ok(None) => {
            let message = format!("no workflow `{id}`");
            Page::refused(StatusCode::NOT_FOUND, Some(&session), &message).into_response()
        }
        Err(message) => internal(&session, &message).into_response(),
    }
}

/// Everything the workflow page shows, read in one go on the blocking pool.
async fn read_view(api: &Api, stored: String) -> Result<Option<timeline::View>, String> {
    let read = api
        .read(move |worker| timeline::View::read(worker, &stored))
        .await;
    read.map_err(|e| e.message)?.map_err(|e| e.to_string())
}

/// The workflow page's live parts, as Server-Sent Events: `status` and `timeline` (with the
/// stream) sent again when they change, read at most twice a second, then `done` once the
/// workflow ended, or is gone, or the session ended, which closes the page's connection (so a
/// browser does not reconnect and read it all again). A reader takes one of the workflow's
/// stream-reader places, and the stream ends when the server shuts down.
async fn live(State(api): UiState, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let (_, stored) = match seeing_workflow(&api, &headers, &id) {
        Ok(seen) => seen,
        Err(denied) => return denied.into_response(),
    };
    let slot = match api.readers.open(&stored, api.max_stream_readers) {
        Ok(slot) => slot,
        Err(refused) => return refused.into_response(),
    };
    let reader = LiveReader {
        changes: api.worker.runtime().watch_stream(&stored),
        shutdown: api.shutdown.clone(),
        api,
        headers,
        stored,
        id,
        sent: (String::new(), String::new()),
        pending: Vec::new(),
        read_once: false,
        over: false,
        _slot: slot,
    };
    let events = futures::stream::unfold(reader, |mut reader| async move {
        let event = reader.next_event().await?;
        Some((Ok::<_, std::convert::Infallible>(event), reader))
    });
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response();
    secure_headers(response.headers_mut());
    response
}

/// One open workflow page's live connection.
struct LiveReader {
    api: Arc<Api>,
    /// The request's, to find its session again before each read.
    headers: HeaderMap,
    stored: String,
    id: String,
    changes: Option<tokio::sync::watch::Receiver<()>>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    /// The status and timeline last sent.
    sent: (String, String),
    /// Events read and not sent yet.
    pending: Vec<Event>,
    read_once: bool,
    /// `done` was sent.
    over: bool,
    _slot: super::limits::ReaderSlot,
}

impl LiveReader {
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.pending.pop() {
                return Some(event);
            }
            if self.over {
                return None;
            }
            if self.read_once {
                tokio::select! {
                    () = wait_for_change(&mut self.changes) => {}
                    _ = self.shutdown.wait_for(|stopping| *stopping) => return None,
                }
            }
            self.read_once = true;
            self.read().await;
        }
    }

    /// Reads the workflow and queues what changed since the last read (`pending` is sent from
    /// its end), and `done` if nothing more will.
    async fn read(&mut self) {
        let view = match self.api.sessions.find(&self.headers) {
            Some(_) => read_view(&self.api, self.stored.clone()).await,
            None => Ok(None),
        };
        let Ok(Some(view)) = view else {
            self.finish();
            return;
        };
        let status = pages::status_text(&view).into_string();
        let timeline = pages::live_parts(&self.id, &view).into_string();
        let ended = view.record.status.is_terminal();
        if ended {
            self.finish();
        }
        if timeline != self.sent.1 {
            self.pending
                .push(Event::default().event("timeline").data(&timeline));
            self.sent.1 = timeline;
        }
        if status != self.sent.0 {
            self.pending
                .push(Event::default().event("status").data(&status));
            self.sent.0 = status;
        }
    }

    fn finish(&mut self) {
        self.pending
            .push(Event::default().event("done").data("done"));
        self.over = true;
    }
}

/// Returns once the workflow may have changed (woken by the store, or after a second), and
/// no sooner than half a second after the last read: a page is not re-rendered per chunk.
async fn wait_for_change(changes: &mut Option<tokio::sync::watch::Receiver<()>>) {
    let (half, second) = (
        std::time::Duration::from_millis(500),
        std::time::Duration::from_secs(1),
    );
    let earliest = tokio::time::Instant::now() + half;
    match changes {
        Some(receiver) => match tokio::time::timeout(second, receiver.changed()).await {
            Ok(Ok(())) | Err(_) => {}
            Ok(Err(_closed)) => *changes = None,
        },
        None => tokio::time::sleep(second).await,
    }
    tokio::time::sleep_until(earliest).await;
}

async fn approval(
    State(api): UiState,
    headers: HeaderMap,
    Path((id, request)): Path<(String, u32)>,
) -> Response {
    let (session, stored) = match seeing_workflow(&api, &headers, &id) {
        Ok(seen) => seen,
        Err(denied) => return denied.into_response(),
    };
    let read = move |worker: &crate::Worker| timeline::ApprovalView::read(worker, &stored, request);
    match read_for(&api, &session, read).await {
        Ok(Some(view)) => Page::ok(pages::approval(&session, &id, &view)).into_response(),
        Ok(None) => {
            let message = format!("`{id}` has no pending approval request {request}");
            Page::refused(StatusCode::NOT_FOUND, Some(&session), &message).into_response()
        }
        Err(denied) => denied.into_response(),
    }
}

#[derive(Deserialize)]
struct DecisionForm {
    csrf: String,
    /// The scope hash the page showed.
    hash: String,
    decision: String,
    #[serde(default)]
    reason: String,
}

async fn decide(
    State(api): UiState,
    headers: HeaderMap,
    Path((id, request)): Path<(String, u32)>,
    Form(form): Form<DecisionForm>,
) -> Response {
    let session = match session_for_form(&api, &headers, &form.csrf, Some(Role::Approve)) {
        Ok(session) => session,
        Err(denied) => return denied.into_response(),
    };
    let stored = match stored(&session, "workflow id", &id) {
        Ok(stored) => stored,
        Err(denied) => return denied.into_response(),
    };
    let verdict = match (form.decision.as_str(), form.reason.trim()) {
        ("approve", _) => ApprovalVerdict::Approve,
        ("reject", "") => {
            let message = "a rejection needs a reason: nothing changed";
            return Page::refused(StatusCode::BAD_REQUEST, Some(&session), message).into_response();
        }
        ("reject", reason) => ApprovalVerdict::Reject(reason.to_owned()),
        _ => {
            let message = "the decision is approve or reject: nothing changed";
            return Page::refused(StatusCode::BAD_REQUEST, Some(&session), message).into_response();
        }
    };
    let approver = session.caller.name.clone();
    let runtime = api.worker.runtime();
    // The request and hash the page showed: a request since replaced, or a scope that is not
    // the one shown, is refused by the worker and nothing changes.
    let decided = runtime.decide_approval(&stored, Some(request), &form.hash, &approver, verdict);
    match decided.await {
        Ok(()) => {
            Redirect::to(&format!("/ui/workflows/{}", pages::path_segment(&id))).into_response()
        }
        Err(error) => {
            let message = format!(
                "not decided: the request changed since the page was loaded, or cannot be \
                 decided ({})",
                namespace::display(&error.to_string())
            );
            Page::refused(StatusCode::CONFLICT, Some(&session), &message).into_response()
        }
    }
}

async fn artifact(State(api): UiState, headers: HeaderMap, Path(hash): Path<String>) -> Response {
    let session = match session_with(&api, &headers, &SEES_WORKFLOWS) {
        Ok(session) => session,
        Err(denied) => return denied.into_response(),
    };
    let namespace = match namespace_of(&session) {
        Ok(namespace) => namespace,
        Err(denied) => return denied.into_response(),
    };
    let wanted = hash.clone();
    let read = move |worker: &crate::Worker| worker.artifact_in(&namespace, &wanted);
    match read_for(&api, &session, read).await {
        Ok(Some(record)) => Page::ok(pages::artifact(&session, &hash, &record)).into_response(),
        Ok(None) => {
            let message = format!("no artifact `{hash}`");
            Page::refused(StatusCode::NOT_FOUND, Some(&session), &message).into_response()
        }
        Err(denied) => denied.into_response(),
    }
}

/// Where a page of operations starts.
#[derive(Deserialize, Default)]
pub(crate) struct AfterKey {
    /// The last idempotency key of the page before.
    #[serde(default)]
    pub(crate) after: String,
}

async fn operations(
    State(api): UiState,
    headers: HeaderMap,
    Query(place): Query<AfterKey>,
) -> Response {
    let session = match session_with(&api, &headers, &[Role::Read, Role::Operate]) {
        Ok(session) => session,
        Err(denied) => return denied.into_response(),
    };
    let namespace = match namespace_of(&session) {
        Ok(namespace) => namespace,
        Err(denied) => return denied.into_response(),
    };
    let read = move |worker: &crate::Worker| awaiting_decision(worker, &namespace, &place.after);
    match read_for(&api, &session, read).await {
        Ok((waiting, next)) => {
            Page::ok(pages::operations(&session, &waiting, next.as_deref())).into_response()
        }
        Err(denied) => denied.into_response(),
    }
}

/// An operation waiting for a person: its workflow, key and record.
pub(crate) struct Waiting {
    pub(crate) workflow_id: String,
    pub(crate) key: String,
    pub(crate) record: waymark_runtime::operations::OperationRecord,
}

/// A page of what `namespace`'s operators are asked to decide, after the key `after` (bare;
/// empty for the first page): every operation a decision is taken about now (one left by an
/// earlier run, or by a workflow that ended, as well as one its run waits for; not one of a
/// stuck workflow). With the `after` of the next page, if there is one.
fn awaiting_decision(
    worker: &crate::Worker,
    namespace: &str,
    after: &str,
) -> Result<(Vec<Waiting>, Option<String>), waymark_runtime::store::StoreError> {
    let listed = worker.operations_awaiting_decision(Some(namespace))?;
    // A malformed `after` (only a hand-made link has one) shows the first page.
    let after = (!after.is_empty())
        .then(|| namespace::qualify(namespace, "`after`", after).ok())
        .flatten();
    let (page, next) = take_page(keyed_after(listed, after), LIST_PAGE);
    let waiting = page.into_iter().map(|(key, record)| Waiting {
        workflow_id: namespace::split(&record.workflow_id).1.to_owned(),
        key: namespace::split(&key).1.to_owned(),
        record,
    });
    Ok((waiting.collect(), next))
}

#[derive(Deserialize)]
struct ResolveForm {
    csrf: String,
    key: String,
    attempt: u32,
    /// The record's revision the page showed (a page served before revisions has none).
    #[serde(default)]
    revision: Option<u32>,
    decision: String,
    #[serde(default)]
    result: String,
    #[serde(default)]
    reason: String,
}

async fn resolve(
    State(api): UiState,
    headers: HeaderMap,
    Form(form): Form<ResolveForm>,
) -> Response {
    let session = match session_for_form(&api, &headers, &form.csrf, Some(Role::Operate)) {
        Ok(session) => session,
        Err(denied) => return denied.into_response(),
    };
    let key = match stored(&session, "idempotency key", &form.key) {
        Ok(key) => key,
        Err(denied) => return denied.into_response(),
    };
    let decision = match operator_decision(&form) {
        Ok(decision) => decision,
        Err(message) => {
            return Page::refused(StatusCode::BAD_REQUEST, Some(&session), &message).into_response()
        }
    };
    let operator = session.caller.name.clone();
    // Decided on the record the page showed: refused if it moved on since, even to a later
    // call of the key at the same attempt number.
    let on = DecidedOn {
        attempt: Some(form.attempt),
        revision: form.revision,
    };
    let runtime = api.worker.runtime();
    let resolved = runtime.resolve_operation(&key, on, decision, &operator);
    match resolved.await {
        Ok(()) => Redirect::to("/ui/operations").into_response(),
        Err(error) => {
            let message = format!("not resolved: {}", namespace::display(&error.to_string()));
            Page::refused(StatusCode::CONFLICT, Some(&session), &message).into_response()
        }
    }
}

fn operator_decision(form: &ResolveForm) -> Result<OperatorDecision, String> {
    match form.decision.as_str() {
        "committed" => {
            let result: serde_json::Value = serde_json::from_str(form.result.trim())
                .map_err(|e| format!("the result is not JSON ({e}): nothing changed"))?;
            let payload = waymark_runtime::journal::Payload::encode(&result)
                .map_err(|e| format!("the result does not encode ({e}): nothing changed"))?;
            Ok(OperatorDecision::Committed(payload))
        }
        "not_found" => Ok(OperatorDecision::NotFound),
        "failed" if form.reason.trim().is_empty() => {
            Err("a failure needs a reason: nothing changed".to_owned())
        }
        "failed" => Ok(OperatorDecision::Failed(form.reason.trim().to_owned())),
        _ => Err("the decision is committed, not_found or failed: nothing changed".to_owned()),
    }
}

async fn metrics(State(api): UiState, headers: HeaderMap) -> Response {
    let session = match session_with(&api, &headers, &[Role::Read]) {
        Ok(session) => session,
        Err(denied) => return denied.into_response(),
    };
    let text = api.worker.runtime().telemetry().render();
    let families = charts::families(&text);
    Page::ok(pages::metrics(&session, &families)).into_response()
}

/// The embedded assets, by name.
fn assets() -> HashMap<&'static str, (&'static str, &'static [u8])> {
    HashMap::from([
        (
            "htmx.min.js",
            (
                "text/javascript",
                include_bytes!("assets/htmx.min.js").as_slice(),
            ),
        ),
        (
            "sse.min.js",
            (
                "text/javascript",
                include_bytes!("assets/sse.min.js").as_slice(),
            ),
        ),
        (
            "waymark.css",
            ("text/css", include_bytes!("assets/waymark.css").as_slice()),
        ),
    ])
}

async fn asset(Path(name): Path<String>) -> Response {
    let Some((content_type, bytes)) = assets().get(name.as_str()).copied() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}
