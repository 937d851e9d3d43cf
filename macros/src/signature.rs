//! The function under the attribute: parsing it, and checking its signature against the rules
//! the journal imposes (concrete, serializable inputs and outputs; a context in a known place).
//!
//! Every check reports into `Diagnostics` and carries on, so one mistake does not hide the
//! next; the caller expands only when nothing was reported.
//!
//! The `#[key]` markers have already been taken off the parameters (see `keys`); they arrive
//! here separately, one list per parameter, to be checked against where they were put.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{
    Attribute, FnArg, GenericArgument, Item, ItemFn, Pat, PatIdent, PatType, PathArguments,
    ReturnType, Signature, Type,
};

use crate::diagnostics::Diagnostics;
use crate::keys;
use crate::kind::MacroKind;

/// A function that passed every check, reduced to what expansion needs.
pub(crate) struct CheckedFn {
    pub(crate) function: ItemFn,
    /// The first parameter is the context (always true for a workflow, optional for an
    /// activity); it is passed through by the runtime rather than journaled.
    pub(crate) takes_context: bool,
    /// The journaled inputs, in declaration order, context excluded.
    pub(crate) inputs: Vec<Type>,
    /// Positions in `inputs` of the `#[key]` arguments, in declaration order.
    pub(crate) key_positions: Vec<usize>,
    /// `T` in `Result<T, E>`.
    pub(crate) ok_type: Type,
    /// `E` in `Result<T, E>`; must convert into the kind's error type.
    pub(crate) err_type: Type,
}

/// Parses the annotated item, which must be a function.
pub(crate) fn parse(
    kind: MacroKind,
    item: TokenStream,
    diagnostics: &mut Diagnostics,
) -> Option<ItemFn> {
    match syn::parse2::<Item>(item) {
        Ok(Item::Fn(function)) => Some(function),
        Ok(other) => {
            let message = format!("{} can only be applied to an `async fn`", kind.attribute());
            diagnostics.error_at(other, message);
            None
        }
        // Syntax newer than syn understands: its error points at the token it stopped on.
        Err(error) => {
            diagnostics.push(error);
            None
        }
    }
}

/// What the attribute's arguments ask of the function.
#[derive(Clone, Copy)]
pub(crate) struct Expected {
    /// `#[activity(effect)]`: at least one argument must be marked `#[key]`.
    pub(crate) effect: bool,
}

/// Runs every signature check; returns `None` if the return type cannot be understood.
/// Other failures are only reported, so the caller must also consult `diagnostics`.
///
/// `key_markers` holds the `#[key]` attributes taken off each parameter of `function`.
pub(crate) fn check(
    kind: MacroKind,
    expected: Expected,
    function: ItemFn,
    key_markers: &[Vec<Attribute>],
    diagnostics: &mut Diagnostics,
) -> Option<CheckedFn> {
    let sig = &function.sig;
    check_async(kind, sig, diagnostics);
    check_not_generic(kind, sig, diagnostics);
    let params = typed_params(kind, sig, key_markers, diagnostics);
    check_key_placement(kind, expected, sig, &params, diagnostics);
    let inputs = match kind {
        MacroKind::Activity => activity_inputs(&params, diagnostics),
        MacroKind::Workflow => workflow_inputs(sig, &params, diagnostics),
    };
    let (ok_type, err_type) = result_types(kind, sig, diagnostics)?;
    Some(CheckedFn {
        function,
        takes_context: inputs.takes_context,
        inputs: inputs.types,
        key_positions: inputs.key_positions,
        ok_type,
        err_type,
    })
}

/// A typed parameter and the `#[key]` marker it had, if any.
struct Param<'a> {
    typed: &'a PatType,
    key: Option<&'a Attribute>,
}

/// The parameters split into context and journaled inputs.
struct Inputs {
    takes_context: bool,
    types: Vec<Type>,
    key_positions: Vec<usize>,
}

impl Inputs {
    fn none(takes_context: bool) -> Self {
        Inputs {
            takes_context,
            types: Vec::new(),
            key_positions: Vec::new(),
        }
    }
}

/// The generated `run` returns a boxed future, which only an `async fn` body can fill.
fn check_async(kind: MacroKind, sig: &Signature, diagnostics: &mut Diagnostics) {
    if sig.asyncness.is_none() {
        let message = format!(
            "{} requires an `async fn`; add `async` before `fn`",
            kind.attribute()
        );
        diagnostics.error_at(sig.fn_token, message);
    }
}

fn check_not_generic(kind: MacroKind, sig: &Signature, diagnostics: &mut Diagnostics) {
    let generics = &sig.generics;
    if !generics.params.is_empty() {
        diagnostics.error_at(
            generics,
            not_generic_message(kind, "remove the generic parameters"),
        );
    } else if let Some(where_clause) = &generics.where_clause {
        diagnostics.error_at(
            where_clause,
            not_generic_message(kind, "remove the `where` clause"),
        );
    }
}

fn not_generic_message(kind: MacroKind, fix: &str) -> String {
    format!(
        "{} functions cannot be generic: inputs and outputs are serialized into the journal, \
         so their types must be concrete; {fix}",
        kind.attribute()
    )
}

/// The parameters as `name: Type` pairs with their `#[key]` marker; reports receivers,
/// patterns that are not plain identifiers, types that cannot be journaled and malformed
/// markers.
fn typed_params<'a>(
    kind: MacroKind,
    sig: &'a Signature,
    key_markers: &'a [Vec<Attribute>],
    diagnostics: &mut Diagnostics,
) -> Vec<Param<'a>> {
    let mut params = Vec::new();
    for (input, markers) in sig.inputs.iter().zip(key_markers) {
        match input {
            FnArg::Receiver(receiver) => {
                let message = format!(
                    "{} must be a free function, not a method; move it out of the `impl` block",
                    kind.attribute()
                );
                diagnostics.error_at(receiver, message);
            }
            FnArg::Typed(param) => {
                check_plain_identifier(kind, param, diagnostics);
                check_journalable(kind, &param.ty, diagnostics);
                let key = keys::check_markers(markers, diagnostics);
                params.push(Param { typed: param, key });
            }
        }
    }
    params
}

fn check_plain_identifier(kind: MacroKind, param: &PatType, diagnostics: &mut Diagnostics) {
    let plain = matches!(
        &*param.pat,
        Pat::Ident(PatIdent {
            by_ref: None,
            subpat: None,
            ..
        })
    );
    if !plain {
        let message = format!(
            "{} arguments must be plain identifiers, like `order_id: OrderId`; \
             bind the whole value to a name and destructure it in the body",
            kind.attribute()
        );
        diagnostics.error_at(&param.pat, message);
    }
}

/// Rejects the types that can never be journaled, with a better message than the trait-bound
/// errors rustc would give on the generated impl.
fn check_journalable(kind: MacroKind, ty: &Type, diagnostics: &mut Diagnostics) {
    match peel(ty) {
        // An anonymous generic parameter.
        Type::ImplTrait(impl_trait) => {
            let message = not_generic_message(kind, "replace `impl Trait` with a concrete type");
            diagnostics.error_at(impl_trait, message);
        }
        // Values are rebuilt from the journal, so there is nothing for them to borrow from.
        Type::Reference(reference) => {
            let message = format!(
                "{} inputs and outputs are serialized into the journal, so they cannot borrow; \
                 use an owned type, like `String` instead of `&str` or `Vec<T>` instead of `&[T]`",
                kind.attribute()
            );
            diagnostics.error_at(reference, message);
        }
        _ => {}
    }
}

/// Reports `#[key]` markers where they mean nothing, and an effect without any.
fn check_key_placement(
    kind: MacroKind,
    expected: Expected,
    sig: &Signature,
    params: &[Param<'_>],
    diagnostics: &mut Diagnostics,
) {
    let marked = || {
        params
            .iter()
            .filter_map(|param| Some((param.typed, param.key?)))
    };
    for (typed, marker) in marked() {
        match kind {
            MacroKind::Workflow => keys::report_on_workflow(marker, diagnostics),
            MacroKind::Activity if is_named(&typed.ty, "ActivityContext") => {
                keys::report_on_context(marker, diagnostics);
            }
            MacroKind::Activity if !expected.effect => {
                keys::report_without_effect(marker, diagnostics);
            }
            MacroKind::Activity => {}
        }
    }
    // A misplaced marker was already reported with its own fix; don't pile on.
    if kind == MacroKind::Activity && expected.effect && marked().next().is_none() {
        keys::report_missing(&sig.ident, diagnostics);
    }
}

/// Splits an activity's parameters into the optional leading context and the inputs.
fn activity_inputs(params: &[Param<'_>], diagnostics: &mut Diagnostics) -> Inputs {
    let mut inputs = Inputs::none(false);
    for (position, param) in params.iter().enumerate() {
        let typed = param.typed;
        if !is_named(&typed.ty, "ActivityContext") {
            if param.key.is_some() {
                inputs.key_positions.push(inputs.types.len());
            }
            inputs.types.push((*typed.ty).clone());
        } else if position == 0 {
            inputs.takes_context = true;
        } else {
            diagnostics.error_at(
                typed,
                "the ActivityContext parameter must come first; \
                 move it to the start of the argument list, like `cx: ActivityContext`",
            );
        }
    }
    inputs
}

/// Checks that a workflow is `(ctx: WorkflowContext[, input: I])` and returns its input.
fn workflow_inputs(sig: &Signature, params: &[Param<'_>], diagnostics: &mut Diagnostics) -> Inputs {
    const CONTEXT_FIRST: &str =
        "the first argument of a #[workflow] must be the context: `ctx: WorkflowContext`; \
         the input, if any, comes second";
    let typed: Vec<&PatType> = params.iter().map(|param| param.typed).collect();
    let mut inputs = Inputs::none(true);
    let Some((context, rest)) = typed.split_first() else {
        diagnostics.error_at(&sig.ident, CONTEXT_FIRST);
        return inputs;
    };
    if !is_named(&context.ty, "WorkflowContext") {
        // Counting inputs is meaningless once the context is missing: report only this.
        diagnostics.error_at(context, CONTEXT_FIRST);
        return inputs;
    }
    if let Some(extra) = rest.get(1..).filter(|extra| !extra.is_empty()) {
        diagnostics.error_at(
            quote!(#(#extra),*),
            "a #[workflow] takes the context and at most one input; group the inputs in a struct",
        );
    }
    inputs.types = rest
        .iter()
        .take(1)
        .map(|param| (*param.ty).clone())
        .collect();
    inputs
}

/// `T` and `E` from a `-> Result<T, E>` return type, or an error saying what to write.
fn result_types(
    kind: MacroKind,
    sig: &Signature,
    diagnostics: &mut Diagnostics,
) -> Option<(Type, Type)> {
    let expected = format!(
        "{attribute} must return `Result<T, {error}>` (any error type that implements \
         `Into<{error}>` also works), so the journal can record either outcome",
        attribute = kind.attribute(),
        error = kind.error_type(),
    );
    let ReturnType::Type(_, ty) = &sig.output else {
        let message = format!("{expected}; add `-> Result<T, {}>`", kind.error_type());
        diagnostics.error_at(&sig.ident, message);
        return None;
    };
    let Some((ok_type, err_type)) = result_arguments(ty) else {
        diagnostics.error_at(ty, format!("{expected}; change the return type"));
        return None;
    };
    check_journalable(kind, ok_type, diagnostics);
    Some((ok_type.clone(), err_type.clone()))
}

/// The two type arguments of a path type whose last segment is `Result`.
fn result_arguments(ty: &Type) -> Option<(&Type, &Type)> {
    let Type::Path(path) = peel(ty) else {
        return None;
    };
    let last = path.path.segments.last()?;
    if path.qself.is_some() || last.ident != "Result" {
        return None;
    }
    let PathArguments::AngleBracketed(arguments) = &last.arguments else {
        return None;
    };
    let mut types = arguments.args.iter().map(|argument| match argument {
        GenericArgument::Type(ty) => Some(ty),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(Some(ok)), Some(Some(err)), None) => Some((ok, err)),
        _ => None,
    }
}

/// Whether `ty` is a path whose last segment is `name`, whatever module it is reached through
/// (`ActivityContext`, `waymark::ActivityContext`, ...).
fn is_named(ty: &Type, name: &str) -> bool {
    match peel(ty) {
        Type::Path(path) if path.qself.is_none() => path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident == name),
        _ => false,
    }
}

/// Looks through parentheses and the invisible groups `macro_rules!` puts around `$t:ty`.
fn peel(ty: &Type) -> &Type {
    match ty {
        Type::Group(group) => peel(&group.elem),
        Type::Paren(paren) => peel(&paren.elem),
        other => other,
    }
}
