//! `#[key]` on the parameters of an effect: the arguments that name its business target, from
//! which its idempotency key is derived.
//!
//! `#[key]` is not a real attribute, only a marker read by `#[activity]`: it is taken off the
//! parameters before anything is emitted, otherwise rustc would reject it ("cannot find
//! attribute `key`") on top of whatever the macro reports.

use syn::{Attribute, FnArg, Ident, ItemFn, Meta};

use crate::diagnostics::Diagnostics;

const KEY: &str = "key";

/// Removes every `#[key]` from the function's parameters and returns them, one list per
/// parameter (receivers included, so the positions match `sig.inputs`).
pub(crate) fn take_markers(function: &mut ItemFn) -> Vec<Vec<Attribute>> {
    function
        .sig
        .inputs
        .iter_mut()
        .map(|input| match input {
            FnArg::Typed(param) => take_from(&mut param.attrs),
            FnArg::Receiver(receiver) => take_from(&mut receiver.attrs),
        })
        .collect()
}

fn take_from(attributes: &mut Vec<Attribute>) -> Vec<Attribute> {
    let (markers, others) = std::mem::take(attributes)
        .into_iter()
        .partition(|attribute| attribute.path().is_ident(KEY));
    *attributes = others;
    markers
}

/// Reports malformed or repeated markers on one parameter and returns the marker that stands
/// for it, if it has any.
pub(crate) fn check_markers<'a>(
    markers: &'a [Attribute],
    diagnostics: &mut Diagnostics,
) -> Option<&'a Attribute> {
    for marker in markers {
        if !matches!(marker.meta, Meta::Path(_)) {
            diagnostics.error_at(
                &marker.meta,
                "`#[key]` takes no arguments: the whole argument is part of the key; \
                 write just `#[key]`",
            );
        }
    }
    if let Some(repeated) = markers.get(1) {
        diagnostics.error_at(
            repeated,
            "`#[key]` is repeated on this argument; keep only one",
        );
    }
    markers.first()
}

/// `#[key]` on a parameter that can never be part of a key.
pub(crate) fn report_on_context(marker: &Attribute, diagnostics: &mut Diagnostics) {
    diagnostics.error_at(
        marker,
        "`#[key]` cannot mark the ActivityContext: the key is derived from the journaled \
         arguments that name the business target; move `#[key]` to one of those",
    );
}

/// `#[key]` on an activity that is not an effect, which has no idempotency key.
pub(crate) fn report_without_effect(marker: &Attribute, diagnostics: &mut Diagnostics) {
    diagnostics.error_at(
        marker,
        "`#[key]` only applies to `#[activity(effect)]`; \
         add `effect` to the attribute or remove `#[key]`",
    );
}

/// `#[key]` on a workflow parameter: workflows are identified by their id, not a key.
pub(crate) fn report_on_workflow(marker: &Attribute, diagnostics: &mut Diagnostics) {
    diagnostics.error_at(
        marker,
        "`#[key]` only applies to the arguments of an `#[activity(effect)]`, \
         not to a #[workflow] input; remove `#[key]`",
    );
}

/// An effect with no `#[key]`: every call from one workflow would get the same key, and the
/// downstream would take the second for a retry of the first.
pub(crate) fn report_missing(function: &Ident, diagnostics: &mut Diagnostics) {
    let message = format!(
        "effect activity `{function}` has no `#[key]` argument: its idempotency key is derived \
         from the arguments that name its business target; mark them with `#[key]`, \
         like `#[key] order_id: OrderId`"
    );
    diagnostics.error_at(function, message);
}
