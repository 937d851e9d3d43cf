//! A carrier's booking API as a small MCP server over stdio, built on `rmcp`'s server side: the
//! server the agent's MCP tests start, and one to try `McpServer` against.
//!
//! Tools: `track` (annotated read-only), `book` (changes the world; not idempotent, so a
//! duplicate call shows as a second booking) and `find_booking` (read-only: the booking made
//! under the idempotency key in the request's `_meta`, or nothing). Every booking is appended
//! to the file `MCP_CARRIER_LEDGER` names, so a test sees what the carrier did across restarts
//! of the worker that calls it.

use std::io::Write as _;
use std::path::PathBuf;

use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::RequestMetaObject;
use rmcp::{tool, tool_handler, tool_router, ServerHandler, ServiceExt};
use serde::Deserialize;

/// A booking request.
#[derive(Deserialize, schemars::JsonSchema)]
struct Booking {
    /// The order to book.
    order_id: String,
    /// The carrier to book it with.
    carrier: String,
}

/// A tracking request.
#[derive(Deserialize, schemars::JsonSchema)]
struct Tracking {
    /// The order to track.
    order_id: String,
}

#[derive(Clone)]
struct Carrier {
    ledger: PathBuf,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Carrier {
    /// Where a parcel is now.
    #[tool(annotations(read_only_hint = true))]
    fn track(&self, Parameters(request): Parameters<Tracking>) -> String {
        format!("{} is at the depot, 2 days late", request.order_id)
    }

    /// Books a parcel with a carrier; answers the booking reference.
    #[tool]
    fn book(
        &self,
        meta: RequestMetaObject,
        Parameters(request): Parameters<Booking>,
    ) -> Result<String, String> {
        let key = idempotency_key(&meta);
        let bookings = self.bookings()?;
        let reference = format!("MCP-BK-{}", bookings.len() + 1);
        let line = format!(
            "{reference}\t{key}\t{}\t{}\n",
            request.order_id, request.carrier
        );
        let mut ledger = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.ledger)
            .map_err(|e| e.to_string())?;
        ledger
            .write_all(line.as_bytes())
            .map_err(|e| e.to_string())?;
        Ok(reference)
    }

    /// The booking made under the request's idempotency key, or nothing.
    #[tool(annotations(read_only_hint = true))]
    fn find_booking(
        &self,
        meta: RequestMetaObject,
        Parameters(_request): Parameters<Booking>,
    ) -> Result<String, String> {
        let key = idempotency_key(&meta);
        let bookings = self.bookings()?;
        let found = bookings
            .iter()
            .find(|line| line.split('\t').nth(1) == Some(key.as_str()));
        Ok(found
            .and_then(|line| line.split('\t').next())
            .unwrap_or_default()
            .to_owned())
    }
}

impl Carrier {
    fn bookings(&self) -> Result<Vec<String>, String> {
        match std::fs::read_to_string(&self.ledger) {
            Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e.to_string()),
        }
    }
}

fn idempotency_key(meta: &RequestMetaObject) -> String {
    let key = meta.get("idempotency_key").and_then(|k| k.as_str());
    key.unwrap_or("-").to_owned()
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Carrier {}

/// Serves over stdio, or with `--http ADDR` over streamable HTTP at `http://ADDR/mcp`,
/// printing that URL (with the port bound, for `ADDR` `127.0.0.1:0`) as its first line.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let ledger = std::env::var_os("MCP_CARRIER_LEDGER")
        .map(PathBuf::from)
        .ok_or_else(|| anyhow::anyhow!("set MCP_CARRIER_LEDGER to the bookings file"))?;
    let carrier = Carrier {
        ledger,
        tool_router: Carrier::tool_router(),
    };
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next()) {
        (None, _) => {
            let running = carrier.serve(rmcp::transport::stdio()).await?;
            running.waiting().await?;
        }
        (Some("--http"), Some(address)) => serve_http(carrier, &address).await?,
        _ => anyhow::bail!("usage: mcp_carrier [--http ADDR]"),
    };
    Ok(())
}

async fn serve_http(carrier: Carrier, address: &str) -> anyhow::Result<()> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    let service: StreamableHttpService<Carrier, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(carrier.clone()),
        Default::default(),
        StreamableHttpServerConfig::default(),
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(address).await?;
    println!("http://{}/mcp", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}
