//! Starting workflows: recovery of in-flight runs when the worker starts, and starts with
//! request-id dedupe (a known request id answers with its run, or a conflict).

use super::*;
use crate::namespace;

impl WorkerState {
    /// Rebuilds every workflow that has not ended, but those `parked` (see
    /// [`crate::store::Store::mark_parked`]) under the code this worker hosts: they stay out
    /// of memory until what they wait for comes, as they were before the worker stopped. One
    /// whose code changed, one this worker does not host and one recorded as stuck are
    /// rebuilt, so that a journal the code no longer matches shows at start.
    pub(super) fn recover(
        &self,
        listing: crate::store::SummaryListing,
        parked: &HashMap<String, u64>,
    ) {
        let mut errors = Vec::new();
        let (mut resumed, mut left_parked) = (0, 0);
        for (id, summary) in listing {
            match summary {
                Ok(summary) if self.stays_parked(&id, &summary, parked) => left_parked += 1,
                Ok(summary) if !summary.status.is_terminal() => {
                    let wake = Wake::Recovered {
                        since: self.started_at,
                    };
                    self.router.ensure_running(self, &id, wake);
                    resumed += 1;
                }
                Ok(_) => {}
                Err(e) => {
                    error!(workflow_id = %id, error = %e, "cannot recover workflow");
                    errors.push((id, RunError::Store(e)));
                }
            }
        }
        info!(
            resumed,
            parked = left_parked,
            failed = errors.len(),
            "recovery scheduled"
        );
        lock(&self.recovery_errors).extend(errors);
    }

    fn stays_parked(
        &self,
        id: &str,
        summary: &crate::store::WorkflowSummary,
        parked: &HashMap<String, u64>,
    ) -> bool {
        let hosted = self.registry.workflow(&summary.workflow_name);
        let code_digest = hosted.and_then(|workflow| workflow.code_digest);
        parked
            .get(id)
            .is_some_and(|parked_with| Some(*parked_with) == code_digest)
            && !summary.status.is_terminal()
            && summary.status != WorkflowStatus::Stuck
    }

    pub(super) async fn start_workflow(
        &self,
        name: &str,
        input: Payload,
        options: StartOptions,
    ) -> Result<Started, StartError> {
        let options = qualified(options)?;
        let workflow = self
            .registry
            .workflow(name)
            .ok_or_else(|| StartError::UnknownWorkflow(name.to_owned()))?;
        (workflow.check_input)(&input).map_err(|message| StartError::InvalidInput {
            workflow: name.to_owned(),
            message,
        })?;
        let what = || format!("the input of workflow `{name}`");
        if let Some(message) = crate::journal::oversized(&input, self.max_payload_bytes, what) {
            return Err(StartError::PayloadTooLarge(message));
        }
        if let Some(request_id) = &options.request_id {
            check_id("request id", request_id)?;
            if let Some(found) = self.existing_for_request(request_id, name, &input).await? {
                return Ok(found);
            }
        }
        let workflow_id = match options.workflow_id.clone().or(options.request_id.clone()) {
            Some(id) => id,
            None => {
                let generated = format!("{name}-{:016x}", rand::random::<u64>());
                let namespace = options.namespace.as_deref().unwrap_or(namespace::DEFAULT);
                namespace::qualify(namespace, "workflow id", &generated)?
            }
        };
        check_id("workflow id", &workflow_id)?;
        check_not_kept_run(&workflow_id)?;
        let transition = self.start_transition(name, &workflow_id, input.clone(), &options);
        let transition = Arc::new(transition);
        let held_before = self.owns_on_shared_store(&workflow_id);
        match self.store.commit_shared(transition.clone()).await {
            Ok(()) => {}
            Err(StoreError::Conflict { .. }) => {
                return self
                    .resolve_start_race(name, &workflow_id, &input, &options)
                    .await;
            }
            Err(failed @ StoreError::Backend(_)) => {
                // The commit's answer may be what failed: if its lease came back this worker's
                // (a shared store reads it back), the start happened, and the workflow is let go
                // for the next claim to run, as a run stopped by a failed write is. A lease held
                // before is a workflow already running here under that id, not this start's.
                let started_here = !held_before && self.owns_on_shared_store(&workflow_id);
                if started_here && !self.router.is_resident(&workflow_id) {
                    self.let_go_after_failed_write(&workflow_id, &failed).await;
                }
                return Err(failed.into());
            }
            Err(e) => return Err(e.into()),
        }
        // What the start wrote is what its executor would read back: it takes it instead. The
        // built-in stores let go of their handle before they answer, so nothing is copied (one
        // that keeps it, like `Store::commit_shared`'s default, gives back a copy).
        let Transition { record, append, .. } = Arc::unwrap_or_clone(transition);
        let fresh = Loaded::fresh(record, append);
        self.router
            .ensure_running_from(self, &workflow_id, Wake::Started, fresh);
        Ok(Started {
            workflow_id,
            existed: false,
        })
    }

    /// Two starts raced for the same request or workflow id; the loser reports the winner.
    pub(super) async fn resolve_start_race(
        &self,
        name: &str,
        workflow_id: &str,
        input: &Payload,
        options: &StartOptions,
    ) -> Result<Started, StartError> {
        if let Some(request_id) = &options.request_id {
            if let Some(found) = self.existing_for_request(request_id, name, input).await? {
                return Ok(found);
            }
        }
        Err(StartError::IdInUse(workflow_id.to_owned()))
    }

    /// The workflow `request_id` started, read as one pair: the request, then its record.
    async fn request_owner(
        &self,
        request_id: &str,
    ) -> Result<Option<(String, Option<WorkflowRecord>)>, StoreError> {
        let request = request_id.to_owned();
        self.read(move |store| {
            let Some(workflow_id) = store.request(&request)? else {
                return Ok(None);
            };
            let record = store.workflow(&workflow_id)?;
            Ok(Some((workflow_id, record)))
        })
        .await
    }

    pub(super) async fn existing_for_request(
        &self,
        request_id: &str,
        name: &str,
        input: &Payload,
    ) -> Result<Option<Started>, StartError> {
        let mut owner = self.request_owner(request_id).await?;
        // A record missing behind its request: a deletion took both between the two reads
        // (it writes them in one batch), after which the request is free or started another
        // workflow; read once more. Missing again, the store is corrupt.
        if let Some((_, None)) = &owner {
            owner = self.request_owner(request_id).await?;
        }
        let Some((workflow_id, record)) = owner else {
            return Ok(None);
        };
        let record = record.ok_or_else(|| {
            StartError::Store(StoreError::Corrupt {
                table: crate::store::Table::Requests,
                key: request_id.to_owned(),
                source: crate::journal::DecodeError::Malformed(format!(
                    "the request points at workflow `{workflow_id}`, which the store does not have"
                )),
            })
        })?;
        let conflict = |what| StartError::RequestConflict {
            request_id: request_id.to_owned(),
            workflow_id: workflow_id.clone(),
            what,
        };
        if &*record.workflow_name != name {
            return Err(conflict("name"));
        }
        if record.input_digest != input.digest() {
            return Err(conflict("input"));
        }
        Ok(Some(Started {
            workflow_id,
            existed: true,
        }))
    }

    pub(super) fn start_transition(
        &self,
        name: &str,
        workflow_id: &str,
        input: Payload,
        options: &StartOptions,
    ) -> Transition {
        let record = WorkflowRecord::new(name, options.request_id.clone(), input.digest());
        let started = Entry::WorkflowStarted(WorkflowStarted {
            workflow_name: name.to_owned(),
            input,
            request_id: options.request_id.clone(),
            started_at_ms: self.clock.now_ms(),
        });
        let by = options.started_by.clone();
        let by = by.map(|caller| Entry::StartedBy { caller });
        let entries = std::iter::once(started).chain(by).collect();
        let mut transition = Transition::append(workflow_id, &record, entries);
        transition.claim_request = options.request_id.clone();
        // A new workflow has no parked mark: an earlier one of its id took it when deleted.
        transition.unpark = false;
        transition
    }
}

/// `options` with its workflow id and request id in their stored form, qualified with its
/// namespace.
fn qualified(mut options: StartOptions) -> Result<StartOptions, StartError> {
    let namespace = options.namespace.as_deref().unwrap_or(namespace::DEFAULT);
    let qualify = |what, id: Option<String>| {
        id.map(|id| namespace::qualify(namespace, what, &id))
            .transpose()
    };
    let workflow_id = qualify("workflow id", options.workflow_id.take())?;
    let request_id = qualify("request id", options.request_id.take())?;
    Ok(StartOptions {
        workflow_id,
        request_id,
        ..options
    })
}

/// A workflow is never started under an id that names a kept run (`ID#run-N`).
pub(super) fn check_not_kept_run(workflow_id: &str) -> Result<(), StartError> {
    match crate::executor::kept_run_owner(workflow_id) {
        Some(_) => Err(StartError::ReservedId(namespace::display(workflow_id))),
        None => Ok(()),
    }
}

pub(super) fn check_id(what: &'static str, id: &str) -> Result<(), StartError> {
    if id.is_empty() || id.len() > MAX_ID_LEN {
        return Err(StartError::BadId {
            what,
            len: id.len(),
            max: MAX_ID_LEN,
        });
    }
    Ok(())
}
