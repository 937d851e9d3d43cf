//! The UI's pages, as maud templates: every value is escaped on output, every form carries the
//! session's CSRF token, and every control is a link, a button or a form field, so each page
//! works with the keyboard alone.

use axum::http::StatusCode;
use maud::{html, Markup, DOCTYPE};
use waymark_runtime::artifacts::ArtifactRecord;
use waymark_runtime::namespace;
use waymark_runtime::operations::OperationStatus;
use waymark_runtime::store::{
    StoreError, SummaryListing, WorkflowListing, WorkflowRecord, WorkflowStatus,
};

use super::charts::{chart, Family};
use super::session::Session;
use super::timeline::{ApprovalView, View};
use super::{ListFilter, Waiting};
use crate::http::paging::take_page;

/// `text` as one path segment of a URL.
pub(crate) fn path_segment(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// A duration as a person reads it: `750 ms`, `2.4 s`, `4 min 12 s`, `3 h 2 min`.
pub(crate) fn took(ms: u64) -> String {
    let seconds = ms / 1000;
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{}.{} s", seconds, (ms % 1000) / 100),
        60_000..3_600_000 => format!("{} min {} s", seconds / 60, seconds % 60),
        _ => format!("{} h {} min", seconds / 3600, (seconds % 3600) / 60),
    }
}

/// Milliseconds since the Unix epoch as a UTC date and time (`2026-12-04 13:40:07 UTC`).
pub(crate) fn utc(ms: u64) -> String {
    let seconds = ms / 1000;
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    // Days to a civil date (proleptic Gregorian), after Howard Hinnant's algorithm.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let (hour, minute, second) = (rest / 3600, rest % 3600 / 60, rest % 60);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02} UTC")
}

fn layout(title: &str, session: Option<&Session>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                // htmx adds no inline style: the page's policy allows none.
                meta name="htmx-config" content=r#"{"includeIndicatorStyles":false,"allowEval":false}"#;
                title { (title) " · Waymark" }
                link rel="stylesheet" href="/ui/assets/waymark.css";
                script src="/ui/assets/htmx.min.js" defer {}
                script src="/ui/assets/sse.min.js" defer {}
            }
            body {
                a.skip href="#main" { "Skip to content" }
                header {
                    nav aria-label="Main" {
                        span.brand { "Waymark" }
                        @if let Some(session) = session {
                            a href="/ui/workflows" { "Workflows" }
                            a href="/ui/operations" { "Operations" }
                            a href="/ui/metrics" { "Metrics" }
                            span.who {
                                (session.caller.name) " (" (session.caller.role_names().join(", ")) ")"
                            }
                            form method="post" action="/ui/logout" {
                                input type="hidden" name="csrf" value=(session.csrf);
                                button type="submit" { "Log out" }
                            }
                        }
                    }
                }
                main id="main" tabindex="-1" {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

pub(crate) fn login(csrf: &str, problem: Option<&str>) -> Markup {
    let body = html! {
        @if let Some(problem) = problem {
            p.error role="alert" { (problem) }
        }
        form method="post" action="/ui/login" {
            input type="hidden" name="csrf" value=(csrf);
            label for="secret" { "API token secret" }
            input id="secret" name="secret" type="password" autocomplete="current-password" required autofocus;
            button type="submit" { "Log in" }
        }
        p.muted { "The session lasts while you use it (8 hours idle at most); the token's roles decide what you may do." }
    };
    layout("Log in", None, body)
}

pub(crate) fn refusal(session: Option<&Session>, status: StatusCode, message: &str) -> Markup {
    let body = html! {
        p.error role="alert" { (message) }
        p { a href="/ui/workflows" { "Back to the workflows" } }
    };
    let title = status.canonical_reason().unwrap_or("Refused");
    layout(title, session, body)
}

/// One page of the list, filtered.
pub(crate) struct ListRows {
    pub(crate) rows: Vec<(String, Result<WorkflowRecord, String>)>,
    /// The `after` of the next page.
    pub(crate) next: Option<String>,
}

impl ListRows {
    /// The rows of a page's records, by bare id.
    pub(crate) fn of(records: WorkflowListing, next: Option<String>) -> Self {
        let rows = records.into_iter().map(|(id, record)| {
            let bare = namespace::split(&id).1.to_owned();
            (bare, record.map_err(|e: StoreError| e.to_string()))
        });
        Self {
            rows: rows.collect(),
            next,
        }
    }
}

/// One page of the list, filtered on the workflows' summaries, by stored id.
pub(crate) struct ListPage {
    pub(crate) rows: SummaryListing,
    /// The `after` of the next page.
    pub(crate) next: Option<String>,
}

impl ListPage {
    pub(crate) fn from_listing(
        listing: SummaryListing,
        namespace: &str,
        filter: &ListFilter,
        page: usize,
    ) -> Self {
        let wanted = WorkflowStatus::ALL
            .iter()
            .find(|s| s.name() == filter.status);
        let query = filter.q.trim();
        // The store lists by key, an id length-prefixed: `after` compares the same way.
        let after = (!filter.after.is_empty())
            .then(|| namespace::qualify(namespace, "`after`", &filter.after).ok())
            .flatten()
            .map(|after| waymark_runtime::keys::id_key(&after));
        let rows = listing.into_iter().filter(|(id, summary)| {
            let (space, bare) = namespace::split(id);
            let before = after.as_ref().is_some_and(|after| waymark_runtime::keys::id_key(id) <= *after);
            if space != namespace || before {
                return false;
            }
            let status_fits = match (summary, wanted) {
                (_, None) => true,
                (Ok(summary), Some(wanted)) => summary.status == *wanted,
                (Err(_), Some(_)) => false,
            };
            let found = query.is_empty()
                || bare.contains(query)
                || matches!(summary, Ok(s) if s.request_id.as_deref().is_some_and(|r| r.contains(query)));
            status_fits && found
        });
        let (rows, next) = take_page(rows, page);
        Self { rows, next }
    }
}

fn list_link(status: &str, q: &str, after: &str) -> String {
    let mut link = format!(
        "/ui/workflows?status={}&q={}",
        path_segment(status),
        path_segment(q)
    );
    if !after.is_empty() {
        link.push_str(&format!("&after={}", path_segment(after)));
    }
    link
}

pub(crate) fn workflows(session: &Session, filter: &ListFilter, rows: &ListRows) -> Markup {
    let body = html! {
        nav aria-label="Filter by status" .filters {
            @let all = filter.status.is_empty();
            a href=(list_link("", &filter.q, "")) aria-current=[all.then_some("page")] { "All" }
            @for status in WorkflowStatus::ALL {
                @let current = filter.status == status.name();
                a href=(list_link(status.name(), &filter.q, "")) aria-current=[current.then_some("page")] {
                    (status.name().replace('_', " "))
                }
            }
        }
        form method="get" action="/ui/workflows" role="search" {
            input type="hidden" name="status" value=(filter.status);
            label for="q" { "Workflow id or request id" }
            input id="q" name="q" type="search" value=(filter.q);
            button type="submit" { "Search" }
        }
        @if rows.rows.is_empty() {
            p { "No workflow matches." }
        } @else {
            table {
                caption.visually-hidden { "Workflows" }
                thead { tr { th scope="col" { "Workflow" } th scope="col" { "Name" } th scope="col" { "Status" } th scope="col" { "Entries" } } }
                tbody {
                    @for (id, record) in &rows.rows {
                        tr {
                            td { a href=(format!("/ui/workflows/{}", path_segment(id))) { (id) } }
                            @match record {
                                Ok(record) => {
                                    td { (record.workflow_name) }
                                    td { span class=(format!("status {}", record.status.name())) { (record.status.name().replace('_', " ")) } }
                                    td { (record.journal_len) }
                                }
                                Err(error) => {
                                    td colspan="3" .error { "unreadable: " (error) }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if let Some(next) = &rows.next {
            p { a href=(list_link(&filter.status, &filter.q, next)) rel="next" { "Next page" } }
        }
    };
    layout("Workflows", Some(session), body)
}

pub(crate) fn workflow(session: &Session, id: &str, view: &View) -> Markup {
    let live = format!("/ui/workflows/{}/live", path_segment(id));
    let body = html! {
        p {
            "Runs " strong { (view.record.workflow_name) } ". "
            a href=(format!("/ui/workflows/{}", path_segment(id))) { "Reload" }
        }
        @if !view.pending.is_empty() {
            section aria-labelledby="pending" {
                h2 id="pending" { "Waiting for approval" }
                ul {
                    @for pending in &view.pending {
                        li {
                            a href=(format!("/ui/workflows/{}/approvals/{}", path_segment(id), pending.request)) {
                                "Approval request " (pending.request)
                            }
                            " for " code { (pending.artifact_hash) }
                        }
                    }
                }
            }
        }
        div hx-ext="sse" sse-connect=(live) sse-close="done" {
            p aria-live="polite" {
                "Status: " span id="status" sse-swap="status" hx-swap="innerHTML" { (status_text(view)) }
            }
            div sse-swap="timeline" hx-swap="innerHTML" {
                (live_parts(id, view))
            }
        }
        section aria-labelledby="operations" {
            h2 id="operations" { "Operations" }
            (operations_table(&view.operations))
        }
        section aria-labelledby="artifacts" {
            h2 id="artifacts" { "Artifacts" }
            @if view.artifacts.is_empty() { p { "None committed." } }
            ul {
                @for (hash, kind) in &view.artifacts {
                    li { (kind) ": " a href=(format!("/ui/artifacts/{}", path_segment(hash))) { code { (hash) } } }
                }
            }
        }
    };
    layout(&format!("Workflow {id}"), Some(session), body)
}

/// The workflow's status and length, as the page's live status line shows them.
pub(crate) fn status_text(view: &View) -> Markup {
    let status = view.record.status.name();
    html! {
        span class=(format!("status {status}")) { (status.replace('_', " ")) }
        " · " (view.record.journal_len) " entries"
    }
}

/// The parts of the workflow page that change while it runs: a stop, the timeline, the stream.
pub(crate) fn live_parts(id: &str, view: &View) -> Markup {
    html! {
        @if let Some(stop) = &view.record.stop {
            section.stuck aria-labelledby="stuck" {
                h2 id="stuck" { "Stuck: " (stop.code.name()) }
                @if let Some(seq) = stop.seq { p { "At command " (seq) "." } }
                pre { (stop.message) }
                p.muted { "Deploy code that issues what the journal recorded, or reset the run (waymark reset " (id) " --at N)." }
            }
        }
        section aria-labelledby="timeline" {
            h2 id="timeline" { "Timeline" }
            ol.timeline {
                @for step in &view.steps {
                    li id=(format!("step-{}", step.seq)) {
                        details {
                            summary {
                                span.kind { (step.kind) } " "
                                strong { (step.name) }
                                " — " span class=(format!("outcome {}", step.outcome)) { (step.outcome) }
                                @if step.attempts > 1 { " after " (step.attempts) " attempts" }
                                " · " span.origin { (step.origin) }
                                @if let Some(ms) = step.took_ms { " · took " (took(ms)) }
                            }
                            @if let Some(at) = step.issued_at_ms {
                                p.muted {
                                    "Issued " (utc(at))
                                    @if let Some(ended) = step.ended_at_ms { " · ended " (utc(ended)) }
                                }
                            }
                            @if !step.causes.is_empty() {
                                ul.causes { @for cause in &step.causes { li { (cause) } } }
                            }
                            ol.entries {
                                @for (index, line) in &step.entries {
                                    li value=(index) { code { (line) } }
                                }
                            }
                        }
                    }
                }
            }
            @if !view.others.is_empty() {
                h3 { "Run" }
                ol.entries {
                    @for (index, line) in &view.others { li value=(index) { code { (line) } } }
                }
            }
        }
        section aria-labelledby="stream" {
            h2 id="stream" { "Stream" }
            @if view.versions.is_empty() && view.progress.is_empty() { p { "Nothing streamed." } }
            @for version in &view.versions {
                div.version {
                    p.muted {
                        "Step " (version.step) ", response version " (version.version)
                        @if version.superseded { " — superseded" }
                        @if version.committed { " — committed" }
                    }
                    @if version.superseded {
                        p { del { (version.text) } }
                    } @else {
                        p { (version.text) }
                    }
                }
            }
            @if !view.progress.is_empty() {
                h3 { "Progress" }
                ol.entries {
                    @for (seq, name, detail) in &view.progress {
                        li value=(seq) { strong { (name) } " " code { (detail) } }
                    }
                }
            }
        }
    }
}

fn operations_table(
    operations: &[(String, waymark_runtime::operations::OperationRecord)],
) -> Markup {
    html! {
        @if operations.is_empty() {
            p { "No effect ran." }
        } @else {
            table {
                caption.visually-hidden { "Operations" }
                thead { tr { th scope="col" { "Key" } th scope="col" { "Effect" } th scope="col" { "State" } th scope="col" { "Attempt" } th scope="col" { "External reference" } th scope="col" { "History" } } }
                tbody {
                    @for (key, record) in operations {
                        tr {
                            td { code { (key) } }
                            td { (record.operation) " v" (record.version) }
                            td { (record.status.name()) }
                            td { (record.attempt) }
                            td { (record.external_ref.as_deref().unwrap_or("—")) }
                            td {
                                ol.history {
                                    @for event in &record.history {
                                        li {
                                            (event.status) " at " (utc(event.at_ms))
                                            @if let Some(by) = &event.by { " by " (by) }
                                            @if !event.note.is_empty() { ": " (event.note) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn json_pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// A JSON value as nested definition lists: readable, every key and value shown.
fn readable(value: &serde_json::Value) -> Markup {
    match value {
        serde_json::Value::Object(map) => html! {
            dl {
                @for (key, inner) in map {
                    dt { (key) }
                    dd { (readable(inner)) }
                }
            }
        },
        serde_json::Value::Array(items) => html! {
            ol { @for item in items { li { (readable(item)) } } }
        },
        serde_json::Value::String(text) => html! { (text) },
        other => html! { code { (other) } },
    }
}

fn artifact_content(record: &ArtifactRecord) -> serde_json::Value {
    record.content.decode().unwrap_or_else(
        |error| serde_json::json!({"the content does not decode": error.to_string()}),
    )
}

pub(crate) fn approval(session: &Session, id: &str, view: &ApprovalView) -> Markup {
    let pending = &view.pending;
    let may_approve = session.caller.require(super::Role::Approve).is_ok();
    // What cannot be shown is not approved: rejecting it stays possible.
    let shown_whole = view.shown.is_some();
    let action = format!(
        "/ui/workflows/{}/approvals/{}",
        path_segment(id),
        pending.request
    );
    let body = html! {
        p {
            "Workflow " a href=(format!("/ui/workflows/{}", path_segment(id))) { (id) }
            " asks request " strong { (pending.request) } " on scope " code { (pending.artifact_hash) } "."
        }
        p {
            "Expires: "
            @match pending.expires_at_ms { Some(at) => { (utc(at)) " (worker clock)" } None => { "never" } }
        }
        section aria-labelledby="risk" {
            h2 id="risk" { "Risk" }
            (readable(&pending.risk))
        }
        section aria-labelledby="shown" {
            h2 id="shown" { "What is shown" }
            @match &view.shown {
                Some(record) => {
                    p { (record.kind) " " (record.version) }
                    (readable(&artifact_content(record)))
                    details { summary { "Exact JSON" } pre { (json_pretty(&artifact_content(record))) } }
                }
                None => { p.error { "The shown artifact is not stored." } }
            }
        }
        section aria-labelledby="intents" {
            h2 id="intents" { "What will run if approved" }
            @match &pending.scope {
                Some(scope) if !scope.intents.is_empty() => {
                    table {
                        caption.visually-hidden { "Authorised calls" }
                        thead { tr { th scope="col" { "Effect" } th scope="col" { "Idempotency key" } th scope="col" { "Arguments" } } }
                        tbody {
                            @for authorised in &scope.intents {
                                tr.intent {
                                    td { (authorised.intent.operation) " v" (authorised.intent.version) }
                                    td { code { (authorised.intent.idempotency_key) } }
                                    td {
                                        (readable(&authorised.intent.arguments))
                                        details { summary { "Exact JSON" } pre.arguments { (json_pretty(&authorised.intent.arguments)) } }
                                    }
                                }
                            }
                        }
                    }
                }
                _ => { p { "No effect is authorised by this approval." } }
            }
        }
        section aria-labelledby="evidence" {
            h2 id="evidence" { "Evidence" }
            @if view.evidence.is_empty() { p { "None named." } }
            ul {
                @for (hash, record) in &view.evidence {
                    li {
                        a href=(format!("/ui/artifacts/{}", path_segment(hash))) { code { (hash) } }
                        @if let Some(record) = record { " — " (record.kind) }
                    }
                }
            }
        }
        section aria-labelledby="decide" {
            h2 id="decide" { "Decide" }
            @if may_approve {
                form method="post" action=(action) {
                    input type="hidden" name="csrf" value=(session.csrf);
                    input type="hidden" name="hash" value=(pending.artifact_hash);
                    label for="reason" { "Reason (needed to reject)" }
                    textarea id="reason" name="reason" rows="2" {}
                    div.buttons {
                        @if shown_whole {
                            button type="submit" name="decision" value="approve" id="approve" { "Approve" }
                        }
                        button type="submit" name="decision" value="reject" id="reject" { "Reject" }
                    }
                    @if !shown_whole {
                        p.error { "What this request shows is not stored here: it can be rejected, not approved." }
                    }
                }
                p.muted { "The decision is for request " (pending.request) " and scope " code { (pending.artifact_hash) } " exactly: if the workflow asked again since this page was loaded, it is refused." }
            } @else {
                p { "Deciding needs the approve role; " (session.caller.name) " does not hold it." }
            }
        }
    };
    layout(
        &format!("Approval request {}", pending.request),
        Some(session),
        body,
    )
}

pub(crate) fn artifact(session: &Session, hash: &str, record: &ArtifactRecord) -> Markup {
    let content = artifact_content(record);
    let body = html! {
        p { code { (hash) } }
        p { (record.kind) " " (record.version) ", committed by " (namespace::display(&record.workflow_id)) " at " (utc(record.created_at_ms)) }
        @if !record.metadata.is_empty() {
            dl { @for (key, value) in &record.metadata { dt { (key) } dd { (value) } } }
        }
        h2 { "Content" }
        (readable(&content))
        details open { summary { "Exact JSON" } pre { (json_pretty(&content)) } }
    };
    layout("Artifact", Some(session), body)
}

pub(crate) fn operations(session: &Session, waiting: &[Waiting], next: Option<&str>) -> Markup {
    let may_resolve = session.caller.require(super::Role::Operate).is_ok();
    let body = html! {
        @if waiting.is_empty() { p { "No operation awaits a decision." } }
        @for (row, op) in waiting.iter().enumerate() {
            section.operation aria-labelledby=(format!("op-{row}")) {
                h2 id=(format!("op-{row}")) { code { (op.key) } }
                p {
                    (op.record.operation) " v" (op.record.version) " of workflow "
                    a href=(format!("/ui/workflows/{}", path_segment(&op.workflow_id))) { (op.workflow_id) }
                    ", attempt " (op.record.attempt)
                }
                p { "State: " (op.record.status.name()) }
                @match &op.record.status {
                    OperationStatus::Prepared => p { "No run will make or settle this call any more: say what became of it." },
                    OperationStatus::UnknownOutcome { .. } => p { "Its reconciler may still be checking; a decision settles it now." },
                    _ => {},
                }
                h3 { "Reconciler's notes" }
                ol.history {
                    @for event in &op.record.history {
                        li { (event.status) @if let Some(by) = &event.by { " by " (by) } @if !event.note.is_empty() { ": " (event.note) } }
                    }
                }
                h3 { "Arguments" }
                pre { (String::from_utf8_lossy(op.record.arguments.as_bytes())) }
                @if may_resolve {
                    form method="post" action="/ui/operations/resolve" {
                        input type="hidden" name="csrf" value=(session.csrf);
                        input type="hidden" name="key" value=(op.key);
                        input type="hidden" name="attempt" value=(op.record.attempt);
                        input type="hidden" name="revision" value=(op.record.revision());
                        fieldset {
                            legend { "Outcome" }
                            label { input type="radio" name="decision" value="committed" required; " Committed, with this result (JSON):" }
                            textarea name="result" rows="2" aria-label="Result as JSON" {}
                            label { input type="radio" name="decision" value="not_found"; " Not found: it did not happen" }
                            label { input type="radio" name="decision" value="failed"; " Failed, because:" }
                            input type="text" name="reason" aria-label="Why it failed";
                        }
                        button type="submit" { "Resolve" }
                    }
                }
            }
        }
        @if let Some(next) = next {
            p { a href=(format!("/ui/operations?after={}", path_segment(next))) rel="next" { "Next page" } }
        }
    };
    layout("Operations awaiting a decision", Some(session), body)
}

pub(crate) fn metrics(session: &Session, families: &[Family]) -> Markup {
    let body = html! {
        p.muted { "Counted since this worker started, as " code { "/metrics" } " serves them." }
        @for family in families {
            section aria-labelledby=(family.name) {
                h2 id=(family.name) { (family.title) }
                (chart(family))
            }
        }
    };
    layout("Replay safety", Some(session), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_the_largest_fitting_units() {
        let shown: Vec<String> = [0, 750, 2_450, 59_999, 252_000, 10_920_000]
            .into_iter()
            .map(took)
            .collect();
        assert_eq!(
            shown,
            [
                "0 ms",
                "750 ms",
                "2.4 s",
                "59.9 s",
                "4 min 12 s",
                "3 h 2 min"
            ]
        );
    }

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_796_477_799_450), "2026-12-05 13:36:39 UTC");
    }

    /// Pages follow the store's order (ids length-prefixed), so no id is skipped however its
    /// text compares.
    #[test]
    fn paging_the_list_shows_every_workflow_once() {
        let digest = waymark_runtime::journal::Payload::encode(&"x")
            .unwrap()
            .digest();
        let mut listing: SummaryListing = (1..=120)
            .map(|n| {
                let id = namespace::qualify("default", "id", &format!("rebook-{n}")).unwrap();
                (id, Ok(WorkflowRecord::new("rebook", None, digest).into()))
            })
            .collect();
        listing.sort_by_key(|(id, _)| waymark_runtime::keys::id_key(id));
        let mut filter = ListFilter::default();
        let mut seen = Vec::new();
        loop {
            let page = ListPage::from_listing(listing.clone(), "default", &filter, 50);
            seen.extend(
                page.rows
                    .iter()
                    .map(|(id, _)| namespace::split(id).1.to_owned()),
            );
            match page.next {
                Some(next) => filter.after = next,
                None => break,
            }
        }
        assert_eq!(seen.len(), 120, "{seen:?}");
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 120);
    }

    #[test]
    fn ids_are_one_path_segment() {
        assert_eq!(path_segment("a b/c#d"), "a%20b%2Fc%23d");
    }
}
