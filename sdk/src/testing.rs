//! Testing workflows: a temporary store, a manual clock, and real restarts.
//!
//! A "crash" here is a real one as far as the store is concerned: the worker's tasks are
//! aborted wherever they are, the store is closed, and a new worker opens the same directory and
//! recovers from what was synced, exactly as after a killed process.

use std::path::Path;

use waymark_runtime::journal::Entry;

#[cfg(feature = "rocksdb")]
mod env;
mod spans;

#[cfg(feature = "rocksdb")]
pub use env::TestEnv;

pub use spans::{SpanEvent, SpanFields, SpanLog, SpanLogLayer};
pub use waymark_runtime::faults::{Boundary, Fault, FaultPlan, FiredFault, PlannedFault};
pub use waymark_runtime::replayer::{ReplayError, ReplayReport};

/// Replays workflow code against exported journals, without a worker or a store: keep
/// production journals (`waymark export ID > tests/journals/ID.journal`) as fixtures and run
/// them in CI before deploying changed workflow code. The first divergence is reported with
/// its seq, the recorded command and the one the code issued.
///
/// ```ignore
/// Replayer::new()
///     .register(rebook_delayed)
///     .register(load_order)
///     .replay_file("tests/journals/rebook-A-1042.journal")?;
/// ```
#[derive(Default)]
pub struct Replayer {
    registry: crate::Registry,
    codec: Option<std::sync::Arc<dyn crate::codec::Codec>>,
}

impl Replayer {
    /// A replayer with nothing registered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a workflow or an activity (every activity the journal's workflow calls).
    pub fn register(mut self, item: impl crate::Register) -> Self {
        item.register_into(&mut self.registry);
        self
    }

    /// Opens sealed exports (those of a worker that encrypts at rest) with `codec`.
    pub fn codec(mut self, codec: std::sync::Arc<dyn crate::codec::Codec>) -> Self {
        self.codec = Some(codec);
        self
    }

    /// Replays the export in `path`.
    pub fn replay_file(&self, path: impl AsRef<Path>) -> Result<ReplayReport, ReplayError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| ReplayError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        self.replay_bytes(&bytes)
    }

    /// Replays an export held in memory.
    pub fn replay_bytes(&self, export: &[u8]) -> Result<ReplayReport, ReplayError> {
        let read = waymark_runtime::export::Export::read(export, self.codec.as_deref());
        let entries = read
            .map_err(|(index, source)| ReplayError::Decode { index, source })?
            .entries;
        self.replay_journal(entries)
    }

    /// Replays journal entries already read: a stopped worker's, say, from
    /// [`DataDir::journal`](crate::inspect::DataDir::journal), without writing them out as an
    /// export first.
    pub fn replay_journal(&self, entries: Vec<Entry>) -> Result<ReplayReport, ReplayError> {
        let registry = self.registry.clone().into_runtime();
        waymark_runtime::replayer::Replayer::new(registry).replay(entries)
    }
}

/// The PostgreSQL database a test may create schemas in: `WAYMARK_TEST_DATABASE_URL`. Without
/// it, a test says on stderr that it was skipped and how to run it, and gets `None`; with
/// `WAYMARK_REQUIRE_DATABASE` set (as CI does), a missing database fails the test instead.
///
/// # Panics
/// If `WAYMARK_REQUIRE_DATABASE` is set and `WAYMARK_TEST_DATABASE_URL` is not.
#[cfg(feature = "postgres")]
pub fn test_database_url() -> Option<String> {
    let url = std::env::var("WAYMARK_TEST_DATABASE_URL").ok();
    let url = url.filter(|url| !url.is_empty());
    if url.is_none() {
        assert!(
            std::env::var_os("WAYMARK_REQUIRE_DATABASE").is_none(),
            "WAYMARK_REQUIRE_DATABASE is set but WAYMARK_TEST_DATABASE_URL is not"
        );
        eprintln!(
            "skipped: no PostgreSQL database; run with \
             WAYMARK_TEST_DATABASE_URL=postgres://user@localhost/db to include it"
        );
    }
    url
}
