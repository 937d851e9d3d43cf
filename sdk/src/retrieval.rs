//! Retrieval snapshots: `ctx.retrieve(retriever, query)` runs a retrieval activity once and
//! keeps its result as an immutable `retrieval` artifact. The journal holds only the snapshot's
//! hash; a resumed workflow gets the snapshot back and the retriever is not called again.

use std::collections::BTreeSet;
use std::future::IntoFuture;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use waymark_runtime::context::TelemetryNote;
use waymark_runtime::journal::{CommandKind, Payload};
use waymark_runtime::telemetry::Telemetry;

use crate::artifacts::Artifact;
use crate::{Activity, ActivityCall, ActivityError, WorkflowContext};

/// What a retrieval step found: the snapshot's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Retrieval {
    /// The query as asked.
    pub query: String,
    /// The query as rewritten for the index, if it was.
    pub rewritten_query: Option<String>,
    /// What came back, best first.
    pub documents: Vec<RetrievedDocument>,
    /// The corpus or index version searched.
    pub index_version: String,
}

/// One retrieved document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrievedDocument {
    /// Its id in the corpus.
    pub id: String,
    /// Its version there.
    pub version: String,
    /// The retriever's score.
    pub score: f64,
    /// The passage used.
    pub text: String,
}

impl Retrieval {
    fn document_versions(&self) -> BTreeSet<(String, String)> {
        let versions = self
            .documents
            .iter()
            .map(|d| (d.id.clone(), d.version.clone()));
        versions.collect()
    }
}

impl WorkflowContext {
    /// Runs `retriever` once and keeps its result as a snapshot artifact; on resume the
    /// snapshot is delivered and the retriever is not called. `retrieval_complete` is published
    /// on the workflow's stream.
    pub fn retrieve<A>(&self, _retriever: A, input: A::Input) -> RetrievalCall
    where
        A: Activity<Output = Retrieval>,
    {
        RetrievalCall {
            ctx: self.clone(),
            call: self.schedule_retrieval(A::NAME, &input),
            previous: None,
        }
    }
}

/// A pending retrieval; await it for the snapshot.
#[must_use = "a retrieval does nothing for the workflow unless awaited"]
pub struct RetrievalCall {
    ctx: WorkflowContext,
    call: ActivityCall<Retrieval>,
    previous: Option<Artifact<Retrieval>>,
}

impl RetrievalCall {
    /// This retrieval deliberately re-fetches what `previous` already holds (new evidence may
    /// exist). If the documents or their versions differ, that is snapshot drift: recorded in
    /// the journal (`verdict snapshot_drift`), counted and logged, never silent.
    pub fn refreshing(mut self, previous: &Artifact<Retrieval>) -> Self {
        self.previous = Some(previous.clone());
        self
    }

    async fn run(self) -> Result<Artifact<Retrieval>, ActivityError> {
        let retrieval = self.call.await?;
        let snapshot = Artifact::snapshot(retrieval).map_err(ActivityError::terminal)?;
        if let Some(previous) = &self.previous {
            record_drift(&self.ctx, previous, &snapshot);
        }
        Ok(snapshot)
    }
}

impl IntoFuture for RetrievalCall {
    type Output = Result<Artifact<Retrieval>, ActivityError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.run())
    }
}

/// Journals (and, the first time only, counts and logs) how a refreshed snapshot differs.
fn record_drift(ctx: &WorkflowContext, previous: &Artifact<Retrieval>, now: &Artifact<Retrieval>) {
    let (before, after) = (
        previous.value().document_versions(),
        now.value().document_versions(),
    );
    if before == after {
        return;
    }
    let detail = serde_json::json!({
        "previous": previous.hash(),
        "current": now.hash(),
        "removed": before.difference(&after).collect::<Vec<_>>(),
        "added": after.difference(&before).collect::<Vec<_>>(),
    });
    let fresh = |_: &waymark_runtime::context::Fresh<'_>| {
        tracing::warn!(target: "waymark::snapshots", %detail, "retrieval snapshot drift");
        Payload::from_value(&detail)
    };
    // Counted once the drift is journaled, so replay (even after a crash before the write)
    // counts it once.
    let note: TelemetryNote = Box::new(|telemetry: &Telemetry| telemetry.snapshot_drift());
    ctx.core()
        .record_noted_value(CommandKind::Verdict, "snapshot_drift", fresh, Some(note));
}
