//! Procedural macros for Waymark: `#[activity]` and `#[workflow]`.
//!
//! Both attributes turn an `async fn` into a unit struct of the same name that implements
//! `Activity` / `Workflow` and `Register`, so the function's name becomes a value that can be
//! registered on a worker and scheduled from a workflow. The original body is kept as a
//! private associated function so type errors still point at the user's code.
//!
//! Each expansion runs in three phases: parse (attribute arguments and the function), validate
//! (the rules the journal imposes on the signature) and expand. The first two accumulate every
//! error instead of stopping at the first one; on error the user's item is emitted unchanged
//! next to the `compile_error!`s, so the function still exists for the IDE and the rest of
//! the crate type-checks as far as it can.
//!
//! Generated code only names items through `::waymark::__private`, which the SDK re-exports
//! for this purpose; users depend on `waymark`, never on this crate directly.

use proc_macro::TokenStream;

mod args;
mod diagnostics;
mod expand;
mod kind;
mod signature;

use kind::MacroKind;

/// Turns an `async fn` returning `Result<T, E>` (with `E: Into<ActivityError>`) into an
/// activity: a unit struct implementing `Activity` and `Register`.
///
/// Arguments (all optional): `name = "..."`, `max_attempts = N`, `timeout_ms = N`,
/// `initial_backoff_ms = N`. An optional first parameter of type `ActivityContext` receives
/// the attempt's context; the other parameters form the journaled input.
#[proc_macro_attribute]
pub fn activity(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(MacroKind::Activity, args.into(), item.into()).into()
}

/// Turns `async fn(ctx: WorkflowContext, input: I) -> Result<T, E>` (with
/// `E: Into<WorkflowError>`, and the input optional) into a workflow: a unit struct
/// implementing `Workflow` and `Register`.
///
/// Arguments (optional): `name = "..."`.
#[proc_macro_attribute]
pub fn workflow(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::expand(MacroKind::Workflow, args.into(), item.into()).into()
}
