//! `GET /metrics`: Prometheus text exposition of what the worker counts.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};

use super::auth::Role;
use super::error::ApiError;
use super::handlers::status_name;
use super::Api;

pub(crate) async fn metrics(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    api.caller(&headers)?.require(Role::Read)?;
    let text = render(&api)?;
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    Ok(([(header::CONTENT_TYPE, content_type)], text).into_response())
}

fn render(api: &Api) -> Result<String, ApiError> {
    let worker = api.worker.runtime();
    let mut out = String::new();
    let mut by_status = std::collections::BTreeMap::<&str, u64>::new();
    for (_, record) in worker.workflows()? {
        let status = record.map_or("unreadable", |r| status_name(r.status));
        *by_status.entry(status).or_default() += 1;
    }
    gauge(
        &mut out,
        "waymark_workflows",
        "Workflows in the store, by status.",
    );
    for (status, count) in by_status {
        let _ = writeln!(out, "waymark_workflows{{status=\"{status}\"}} {count}");
    }
    let resident = worker.resident_workflows();
    gauge(
        &mut out,
        "waymark_resident_workflows",
        "Workflows held in memory.",
    );
    let _ = writeln!(out, "waymark_resident_workflows {resident}");
    let counters = worker.counters();
    let mismatches = counters.approval_hash_mismatches.load(Ordering::Relaxed);
    counter(
        &mut out,
        "waymark_approval_hash_mismatches_total",
        "Effects refused because the approved artifact is not the executed one.",
        mismatches,
    );
    let drift = counters.snapshot_drift.load(Ordering::Relaxed);
    counter(
        &mut out,
        "waymark_snapshot_drift_total",
        "Deliberate retrieval refreshes that found other documents than their snapshot.",
        drift,
    );
    if let Some(stats) = worker.write_stats() {
        let help = "Synced store write batches (group commits).";
        counter(
            &mut out,
            "waymark_store_synced_batches_total",
            help,
            stats.batches,
        );
        let help = "Workflow transitions written.";
        counter(
            &mut out,
            "waymark_store_transitions_total",
            help,
            stats.transitions,
        );
    }
    Ok(out)
}

fn gauge(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}
