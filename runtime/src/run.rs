//! A workflow's body and the one replay loop, shared by the executor and the `Replayer`.
//!
//! The body is polled here and nowhere else, never spawned, after every delivered outcome and
//! with a waker that does nothing: the order in which it observes outcomes is the order in
//! which they are delivered, which is the journal's.

use std::panic::AssertUnwindSafe;
use std::task::{Context, Poll};

use futures::future::BoxFuture;

use crate::context::compensate::with_undo_failures;
use crate::context::WorkflowCore;
use crate::error::RunError;
use crate::journal::{Failure, Payload, Seq};
use crate::machines::Resolution;
use crate::replay::ReplayEvent;

/// What the body returned.
pub(crate) type Output = Result<Payload, Failure>;

/// A workflow's code, with the core its ctx calls reach.
pub(crate) struct Body {
    core: WorkflowCore,
    /// `None` once the code returned.
    future: Option<BoxFuture<'static, Output>>,
    /// The code was replaced by its undos.
    cancelled: bool,
}

/// Where replay left the run.
pub(crate) enum Replayed {
    /// The journal records the end; `returned` is what the code returned by then, if it did.
    Ended {
        /// The recorded end.
        recorded: Output,
        /// The code's own output.
        returned: Option<Output>,
    },
    /// Live from here; `Some` if the body already returned.
    Live(Option<Output>),
}

impl Body {
    pub(crate) fn new(core: WorkflowCore, future: BoxFuture<'static, Output>) -> Self {
        Self {
            core,
            future: Some(future),
            cancelled: false,
        }
    }

    /// Whether the run was cancelled and its undos run in the code's place.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled
    }

    /// The run is cancelled: the code stops here (its future is dropped, and with it every wait
    /// it held), and the undos of its effects run in its place; the run then ends with
    /// `failure`.
    pub(crate) fn cancel(&mut self, failure: Failure) {
        drop(self.future.take());
        self.cancelled = true;
        let core = self.core.clone();
        self.future = Some(Box::pin(async move {
            let failures = core.compensate().await;
            Err(with_undo_failures(failure, &failures))
        }));
    }

    /// Polls the body once. `Some` when it returned. A panic in the code, and a stop a ctx call
    /// set (a divergence, a value that no longer decodes), end the poll as an error.
    pub(crate) fn poll(&mut self) -> Result<Option<Output>, RunError> {
        // An outcome delivered after the code returned is taken like any other, one per poll,
        // though nothing is left to see it.
        self.core.begin_poll();
        let Some(future) = self.future.as_mut() else {
            return Ok(None);
        };
        // Wake-ups are not how the body is driven (it is polled after every delivery), so the
        // top-level waker does nothing; ctx futures still wake their own parents.
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx)));
        let polled = polled.map_err(|panic| RunError::Panicked(panic_message(&panic)))?;
        if let Some(stop) = self.core.take_stop() {
            return Err(stop);
        }
        match polled {
            Poll::Ready(output) => {
                self.future = None;
                Ok(Some(output))
            }
            Poll::Pending => Ok(None),
        }
    }

    /// Replays recorded history: the first poll, then one delivered outcome and one poll at a
    /// time, in journal order. `deliverable` turns a recorded resolution into what the code
    /// receives (a snapshot's content, read from the store) and sees each replayed step.
    pub(crate) fn replay<E: From<RunError>>(
        &mut self,
        mut deliverable: impl FnMut(Seq, Resolution) -> Result<Resolution, E>,
    ) -> Result<Replayed, E> {
        let mut output = self.poll()?;
        loop {
            let event = self.core.lock().next_replay_event();
            match event.map_err(RunError::from)? {
                Some(ReplayEvent::Resolve { seq, resolution }) => {
                    let resolution = deliverable(seq, resolution)?;
                    self.core.deliver(seq, resolution)?;
                    output = output.or(self.poll()?);
                }
                Some(ReplayEvent::Cancelled(failure)) => {
                    self.cancel(failure);
                    output = output.or(self.poll()?);
                }
                Some(ReplayEvent::Ended(recorded)) => {
                    let returned = output;
                    return Ok(Replayed::Ended { recorded, returned });
                }
                None => return Ok(Replayed::Live(output)),
            }
        }
    }
}

/// A panic's message, for the error that reports it.
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
