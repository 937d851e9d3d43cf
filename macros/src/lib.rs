//! Procedural macros for Waymark: `#[activity]` and `#[workflow]`.
//!
//! Both attributes turn an `async fn` into a unit struct of the same name that implements
//! `Activity` / `Workflow` and `Register`, so the function's name becomes a value that can be
//! registered on a worker and scheduled from a workflow. The original body is kept as a
//! private associated function so type errors still point at the user's code.
//! `#[activity(effect)]` also implements `Effect`, from the parameters marked `#[key]`; the
//! macro reads those markers and removes them, since `key` is not an attribute rustc knows.
//!
//! Each expansion runs in three phases: parse (attribute arguments and the function), validate
//! (the rules the journal imposes on the signature) and expand. The first two accumulate every
//! error instead of stopping at the first one; on error the user's item is emitted unchanged
//! next to the `compile_error!`s, so the function still exists for the IDE and the rest of
//! the crate type-checks as far as it can.
//!
//! Generated code only names items through `::waymark::__private`, which the SDK re-exports
//! for this purpose; users depend on `waymark`, never on this crate directly.
#![forbid(unsafe_code)]

use proc_macro::TokenStream;

mod args;
mod diagnostics;
mod expand;
mod keys;
mod kind;
mod signature;

use kind::MacroKind;

/// Turns an `async fn` returning `Result<T, E>` (with `E: Into<ActivityError>`) into an
/// activity: a unit struct implementing `Activity` and `Register`.
///
/// An optional first parameter of type `ActivityContext` receives the attempt's context; the
/// other parameters form the journaled input.
///
/// Arguments (all optional):
/// - `name = "..."`: the stable journal name; default the function's name.
/// - `max_attempts = N`: attempts in all, at least 1.
/// - `timeout_ms = N`: how long one attempt may run (start to close).
/// - `initial_backoff_ms = N`, `max_backoff_ms = N`: the first delay between attempts, and
///   the cap on any one delay.
/// - `deadline_ms = N`: from scheduling, after which no retry starts.
/// - `effect`: the activity changes the world (books, sends, charges). It then also
///   implements `Effect` and runs under an idempotency key derived from its `#[key]`
///   arguments, the ones that name its business target; at least one is required.
/// - `version = N` (effects only, default 1): bump it when the same key arguments should now
///   mean a different effect; it changes the key.
/// - `reconcile = path::to_fn` (effects only): asks the downstream whether an attempt whose
///   outcome is unknown took effect. It is an `async fn` that takes `cx: ActivityContext`
///   first (even if the activity does not), then the activity's other arguments, and returns
///   `Result<Reconciled<T>, E>` with `E: Into<ActivityError>`.
/// - `at_most_once` (effects only): for a downstream that may act and still answer with an
///   error. Once a call started, every failure but a `Terminal` one leaves the outcome unknown:
///   the effect is reconciled, or waits for an operator, and is never retried blindly.
/// - `cache` (reads only): an expensive, pure stage. A second call with the same canonical input
///   in one run is answered with the first call's result, without calling it.
///
/// ```ignore
/// #[activity(effect, version = 2, reconcile = find_booking, max_attempts = 5)]
/// async fn book(
///     cx: ActivityContext,
///     #[key] order_id: OrderId,
///     #[key] flight: Flight,
///     note: String,
/// ) -> Result<Booking, ActivityError> { .. }
///
/// async fn find_booking(
///     cx: ActivityContext,
///     order_id: OrderId,
///     flight: Flight,
///     note: String,
/// ) -> Result<Reconciled<Booking>, ActivityError> { .. }
/// ```
#[proc_macro_attribute]
pub fn activity(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(MacroKind::Activity, args.into(), item.into()).into()
}

/// Turns `async fn(ctx: WorkflowContext, input: I) -> Result<T, E>` (with
/// `E: Into<WorkflowError>`, and the input optional) into a workflow: a unit struct
/// implementing `Workflow` and `Register`.
///
/// Arguments (optional): `name = "..."`. The effect arguments (`effect`, `version`,
/// `reconcile`, `#[key]`) belong to activities and are errors here.
#[proc_macro_attribute]
pub fn workflow(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(MacroKind::Workflow, args.into(), item.into()).into()
}
