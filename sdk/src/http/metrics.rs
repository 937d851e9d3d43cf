//! `GET /metrics`: Prometheus text exposition of what the worker counts.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use waymark_runtime::telemetry::StoreState;

use super::auth::Role;
use super::error::ApiError;
use super::handlers::status_name;
use super::Api;

/// What the worker counts, as Prometheus text. Role read.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics",
    responses((status = 200, description = "Prometheus text exposition.", content_type = "text/plain", body = String)))]
pub(crate) async fn metrics(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    api.caller(&headers)?.require(Role::Read)?;
    let listing = api
        .read(|worker| worker.runtime().workflow_summaries())
        .await??;
    let text = render(&api, listing);
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    Ok(([(header::CONTENT_TYPE, content_type)], text).into_response())
}

/// The worker's telemetry, with the store's state set just before rendering.
fn render(api: &Api, listing: waymark_runtime::store::SummaryListing) -> String {
    let worker = api.worker.runtime();
    let mut by_status = BTreeMap::<&'static str, u64>::new();
    for (_, record) in listing {
        let status = record.map_or("unreadable", |r| status_name(r.status));
        *by_status.entry(status).or_default() += 1;
    }
    let state = StoreState {
        workflows_by_status: by_status,
        resident: worker.resident_workflows() as u64,
        writes: worker.write_stats(),
    };
    worker.observe_leases();
    let telemetry = worker.telemetry();
    telemetry.observe_store(&state);
    telemetry.render()
}
