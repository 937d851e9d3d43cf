//! Attribute arguments: the `effect, name = "...", max_attempts = 3` inside `#[activity(...)]`.
//!
//! Each attribute accepts the keys listed in its table of `KeySpec`s; accepting a new key is
//! one row here plus reading it in `expand`. Anything not in the table is an error that lists
//! the valid keys, so a typo or a feature this version does not have is never silently ignored.
//!
//! A key is a bare flag (`effect`), or takes a string, an integer or a path
//! (`reconcile = find_booking`). Keys that only mean something for effects (`version`,
//! `reconcile`) are rejected unless `effect` is given too, rather than silently ignored.

use proc_macro2::TokenStream;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprPath, Lit, LitInt, LitStr, Meta, Path, Token};

use crate::diagnostics::Diagnostics;
use crate::kind::MacroKind;

/// One accepted `key = value` argument.
pub(crate) struct KeySpec {
    name: &'static str,
    value: ValueKind,
    /// A valid value, quoted in "expects ..." messages so the fix can be copied.
    example: &'static str,
    /// Meaningful only on an effect: given without `effect`, it is an error.
    effect_only: bool,
}

/// What a key takes, and the field of [`Attrs`] it sets: a value of the wrong kind cannot
/// reach a field.
enum ValueKind {
    /// No value: present or absent, like `effect`.
    Flag(fn(&mut Attrs) -> &mut bool),
    /// A path expression naming an item, like `reconcile = bookings::find`.
    Path(fn(&mut Attrs) -> &mut Option<ExprPath>),
    /// A non-empty string literal.
    Str(fn(&mut Attrs) -> &mut Option<LitStr>),
    /// An integer literal no greater than `max` and, when given, no less than `lower`.
    Int {
        max: u64,
        lower: Option<LowerBound>,
        field: fn(&mut Attrs) -> &mut Option<LitInt>,
    },
}

/// The arguments of one attribute, validated and typed: all the expansion reads. Invalid
/// arguments were reported and left out.
#[derive(Default)]
pub(crate) struct Attrs {
    /// `name = "..."`: the stable name recorded in the journal.
    pub(crate) name: Option<LitStr>,
    /// `effect`: the activity changes the world and carries an idempotency key.
    pub(crate) effect: bool,
    /// `version = N`: the effect's semantics version, part of its key.
    pub(crate) version: Option<LitInt>,
    /// `reconcile = path`: the effect's reconciler.
    pub(crate) reconcile: Option<ExprPath>,
    /// `at_most_once`: every failure of a started call leaves the effect's outcome unknown.
    pub(crate) at_most_once: bool,
    /// `cache`: a pure stage, answered from an earlier call with the same input in one run.
    pub(crate) cache: bool,
    /// `max_attempts = N`.
    pub(crate) max_attempts: Option<LitInt>,
    /// `timeout_ms = N`: each attempt's start-to-close timeout.
    pub(crate) timeout_ms: Option<LitInt>,
    /// `initial_backoff_ms = N`.
    pub(crate) initial_backoff_ms: Option<LitInt>,
    /// `max_backoff_ms = N`.
    pub(crate) max_backoff_ms: Option<LitInt>,
    /// `deadline_ms = N`: the time all attempts together may take.
    pub(crate) deadline_ms: Option<LitInt>,
}

/// The field each key sets (named functions: a closure cannot say that the field borrows from
/// the attributes it is given).
mod field {
    use super::Attrs;
    use syn::{ExprPath, LitInt, LitStr};

    pub(super) fn name(attrs: &mut Attrs) -> &mut Option<LitStr> {
        &mut attrs.name
    }
    pub(super) fn effect(attrs: &mut Attrs) -> &mut bool {
        &mut attrs.effect
    }
    pub(super) fn version(attrs: &mut Attrs) -> &mut Option<LitInt> {
        &mut attrs.version
    }
    pub(super) fn reconcile(attrs: &mut Attrs) -> &mut Option<ExprPath> {
        &mut attrs.reconcile
    }
    pub(super) fn at_most_once(attrs: &mut Attrs) -> &mut bool {
        &mut attrs.at_most_once
    }

    pub(super) fn cache(attrs: &mut Attrs) -> &mut bool {
        &mut attrs.cache
    }
    pub(super) fn max_attempts(attrs: &mut Attrs) -> &mut Option<LitInt> {
        &mut attrs.max_attempts
    }
    pub(super) fn timeout_ms(attrs: &mut Attrs) -> &mut Option<LitInt> {
        &mut attrs.timeout_ms
    }
    pub(super) fn initial_backoff_ms(attrs: &mut Attrs) -> &mut Option<LitInt> {
        &mut attrs.initial_backoff_ms
    }
    pub(super) fn max_backoff_ms(attrs: &mut Attrs) -> &mut Option<LitInt> {
        &mut attrs.max_backoff_ms
    }
    pub(super) fn deadline_ms(attrs: &mut Attrs) -> &mut Option<LitInt> {
        &mut attrs.deadline_ms
    }
}

/// The smallest meaningful value of an integer argument, with the reason shown to the user.
struct LowerBound {
    min: u64,
    reason: &'static str,
}

const NAME: KeySpec = KeySpec {
    name: "name",
    value: ValueKind::Str(field::name),
    example: "\"charge_card\"",
    effect_only: false,
};

/// The flag that makes an activity an effect.
pub(crate) const EFFECT: &str = "effect";

pub(crate) const ACTIVITY_KEYS: &[KeySpec] = &[
    NAME,
    KeySpec {
        name: EFFECT,
        value: ValueKind::Flag(field::effect),
        // Unused: a flag is written without a value.
        example: "",
        effect_only: false,
    },
    KeySpec {
        name: "version",
        value: ValueKind::Int {
            max: u32::MAX as u64,
            lower: Some(LowerBound {
                min: 1,
                reason: "versions count from 1, the default",
            }),
            field: field::version,
        },
        example: "2",
        effect_only: true,
    },
    KeySpec {
        name: "reconcile",
        value: ValueKind::Path(field::reconcile),
        example: "find_booking",
        effect_only: true,
    },
    KeySpec {
        name: "at_most_once",
        value: ValueKind::Flag(field::at_most_once),
        // Unused: a flag is written without a value.
        example: "",
        effect_only: true,
    },
    KeySpec {
        name: "cache",
        value: ValueKind::Flag(field::cache),
        // Unused: a flag is written without a value.
        example: "",
        effect_only: false,
    },
    KeySpec {
        name: "max_attempts",
        value: ValueKind::Int {
            max: u32::MAX as u64,
            lower: Some(LowerBound {
                min: 1,
                reason: "it counts the first attempt, so 1 means no retries",
            }),
            field: field::max_attempts,
        },
        example: "3",
        effect_only: false,
    },
    KeySpec {
        name: "timeout_ms",
        value: ValueKind::Int {
            max: u64::MAX,
            lower: Some(LowerBound {
                min: 1,
                reason: "a zero timeout would fail every attempt",
            }),
            field: field::timeout_ms,
        },
        example: "30000",
        effect_only: false,
    },
    KeySpec {
        name: "initial_backoff_ms",
        value: ValueKind::Int {
            max: u64::MAX,
            lower: None,
            field: field::initial_backoff_ms,
        },
        example: "200",
        effect_only: false,
    },
    KeySpec {
        name: "max_backoff_ms",
        value: ValueKind::Int {
            max: u64::MAX,
            lower: Some(LowerBound {
                min: 1,
                reason: "a zero cap would retry without any delay",
            }),
            field: field::max_backoff_ms,
        },
        example: "60000",
        effect_only: false,
    },
    KeySpec {
        name: "deadline_ms",
        value: ValueKind::Int {
            max: u64::MAX,
            lower: Some(LowerBound {
                min: 1,
                reason: "a zero deadline leaves no time for retries; use `max_attempts = 1`",
            }),
            field: field::deadline_ms,
        },
        example: "600000",
        effect_only: false,
    },
];

pub(crate) const WORKFLOW_KEYS: &[KeySpec] = &[NAME];

/// An argument as given, kept to report duplicates and effect-only keys against it.
struct Given {
    spec: &'static KeySpec,
    /// The key as written, for errors about the argument as a whole.
    key: Path,
}

/// The attribute's keys as known to [`parse`].
fn known_keys(kind: MacroKind) -> &'static [KeySpec] {
    match kind {
        MacroKind::Activity => ACTIVITY_KEYS,
        MacroKind::Workflow => WORKFLOW_KEYS,
    }
}

/// Parses the attribute's arguments, reporting every invalid one.
pub(crate) fn parse(kind: MacroKind, tokens: TokenStream, diagnostics: &mut Diagnostics) -> Attrs {
    let mut attrs = Attrs::default();
    let mut given = Vec::new();
    match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(tokens) {
        Ok(metas) => {
            for meta in metas {
                parse_one(kind, meta, &mut attrs, &mut given, diagnostics);
            }
        }
        // Not even `key = value` syntax: syn's error already points at the bad token.
        Err(error) => diagnostics.push(error),
    }
    check_effect_only(&attrs, &given, diagnostics);
    check_cache_is_a_read(&attrs, &given, diagnostics);
    attrs
}

fn parse_one(
    kind: MacroKind,
    meta: Meta,
    attrs: &mut Attrs,
    given: &mut Vec<Given>,
    diagnostics: &mut Diagnostics,
) {
    let Some(spec) = lookup_key(kind, meta.path(), diagnostics) else {
        return;
    };
    if given.iter().any(|earlier| earlier.spec.name == spec.name) {
        let message = format!(
            "duplicate {} argument `{}`; keep only one",
            kind.attribute(),
            spec.name
        );
        diagnostics.error_at(meta.path(), message);
        return;
    }
    if let Err(error) = spec.apply(&meta, attrs) {
        diagnostics.push(error);
        // `effect = true` still clearly asks for the flag: keeping it spares the user the
        // errors that checks depending on it would add.
        if let ValueKind::Flag(field) = spec.value {
            *field(attrs) = true;
        } else {
            return;
        }
    }
    let key = meta.path().clone();
    given.push(Given { spec, key });
}

/// Reports the effect-only arguments given without `effect`: they would otherwise do nothing.
fn check_effect_only(attrs: &Attrs, given: &[Given], diagnostics: &mut Diagnostics) {
    if attrs.effect {
        return;
    }
    for arg in given.iter().filter(|arg| arg.spec.effect_only) {
        let message = format!(
            "`{}` only applies to effect activities; add `{EFFECT}` to the attribute, \
             like `#[activity({EFFECT}, {})]`",
            arg.spec.name,
            arg.spec.usage_unquoted()
        );
        diagnostics.error_at(&arg.key, message);
    }
}

/// A cached stage must be a read: an effect's second call is the operation log's to answer
/// (by key), and caching it would hide a key conflict.
fn check_cache_is_a_read(attrs: &Attrs, given: &[Given], diagnostics: &mut Diagnostics) {
    if !(attrs.cache && attrs.effect) {
        return;
    }
    if let Some(arg) = given.iter().find(|arg| arg.spec.name == "cache") {
        let message = format!(
            "`cache` applies to reads only: a second call of an effect is answered by the \
             operation log under its idempotency key; remove `cache` or `{EFFECT}`"
        );
        diagnostics.error_at(&arg.key, message);
    }
}

/// Finds the spec for `path`, or reports it as unknown with the list of valid keys.
fn lookup_key(
    kind: MacroKind,
    path: &Path,
    diagnostics: &mut Diagnostics,
) -> Option<&'static KeySpec> {
    let known = known_keys(kind);
    let spec = path
        .get_ident()
        .and_then(|ident| known.iter().find(|spec| ident == spec.name));
    if spec.is_none() {
        let expected: Vec<&str> = known.iter().map(|spec| spec.name).collect();
        let message = format!(
            "unknown {} argument `{}`; expected one of: {}",
            kind.attribute(),
            path_to_string(path),
            expected.join(", ")
        );
        diagnostics.error_at(path, message);
    }
    spec
}

impl KeySpec {
    /// Checks `meta` against the kind this key expects and sets its field of `attrs`.
    fn apply(&self, meta: &Meta, attrs: &mut Attrs) -> syn::Result<()> {
        let value = match meta {
            Meta::NameValue(name_value) => Some(&name_value.value),
            Meta::Path(_) | Meta::List(_) => None,
        };
        match (&self.value, value) {
            (ValueKind::Flag(field), None) if matches!(meta, Meta::Path(_)) => *field(attrs) = true,
            (ValueKind::Flag(_), _) => {
                let message = format!("`{}` takes no value; write just `{}`", self.name, self.name);
                return Err(syn::Error::new_spanned(meta, message));
            }
            (ValueKind::Path(field), Some(value)) => *field(attrs) = Some(self.parse_path(value)?),
            (ValueKind::Str(field), Some(value)) => *field(attrs) = Some(self.parse_str(value)?),
            (ValueKind::Int { max, lower, field }, Some(value)) => {
                *field(attrs) = Some(self.parse_int(value, *max, lower.as_ref())?)
            }
            (_, None) => {
                let message = format!("`{}` expects a value, like {}", self.name, self.usage());
                return Err(syn::Error::new_spanned(meta, message));
            }
        }
        Ok(())
    }

    fn parse_path(&self, value: &Expr) -> syn::Result<ExprPath> {
        match peel_groups(value) {
            Expr::Path(path) => Ok(path.clone()),
            _ => Err(self.expects(value, "a path to an `async fn`")),
        }
    }

    fn parse_str(&self, value: &Expr) -> syn::Result<LitStr> {
        let Some(Lit::Str(lit)) = literal(value) else {
            return Err(self.expects(value, "a string literal"));
        };
        if lit.value().is_empty() {
            let message = format!(
                "`{}` must not be empty: it is the stable name recorded in the journal",
                self.name
            );
            return Err(syn::Error::new_spanned(lit, message));
        }
        Ok(lit.clone())
    }

    fn parse_int(&self, value: &Expr, max: u64, lower: Option<&LowerBound>) -> syn::Result<LitInt> {
        let Some(Lit::Int(lit)) = literal(value) else {
            return Err(self.expects(value, "an integer literal"));
        };
        let too_large = || {
            let message = format!("`{}` must be at most {max}", self.name);
            syn::Error::new_spanned(lit, message)
        };
        let number = lit.base10_parse::<u64>().map_err(|_| too_large())?;
        if number > max {
            return Err(too_large());
        }
        if let Some(LowerBound { min, reason }) = lower.filter(|bound| number < bound.min) {
            let message = format!("`{}` must be at least {min}: {reason}", self.name);
            return Err(syn::Error::new_spanned(lit, message));
        }
        // Re-emitted without the user's suffix so it always matches the builder's parameter
        // type, but with their span.
        Ok(LitInt::new(&number.to_string(), lit.span()))
    }

    fn expects(&self, value: &Expr, what: &str) -> syn::Error {
        let message = format!("`{}` expects {what}, like {}", self.name, self.usage());
        syn::Error::new_spanned(value, message)
    }

    /// `name = example`, in backquotes, ready to paste.
    fn usage(&self) -> String {
        format!("`{}`", self.usage_unquoted())
    }

    fn usage_unquoted(&self) -> String {
        match self.value {
            ValueKind::Flag(_) => self.name.to_owned(),
            _ => format!("{} = {}", self.name, self.example),
        }
    }
}

/// The literal in `value`, if it is one.
fn literal(value: &Expr) -> Option<&Lit> {
    match peel_groups(value) {
        Expr::Lit(expr) => Some(&expr.lit),
        _ => None,
    }
}

/// Looks through the invisible groups `macro_rules!` wraps around `$value:expr` fragments.
fn peel_groups(value: &Expr) -> &Expr {
    match value {
        Expr::Group(group) => peel_groups(&group.expr),
        other => other,
    }
}

fn path_to_string(path: &Path) -> String {
    let segments: Vec<String> = path
        .segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect();
    segments.join("::")
}
