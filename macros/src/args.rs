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

enum ValueKind {
    /// No value: present or absent, like `effect`.
    Flag,
    /// A path expression naming an item, like `reconcile = bookings::find`.
    Path,
    /// A non-empty string literal.
    Str,
    /// An integer literal no greater than `max` and, when given, no less than `lower`.
    Int { max: u64, lower: Option<LowerBound> },
}

/// The smallest meaningful value of an integer argument, with the reason shown to the user.
struct LowerBound {
    min: u64,
    reason: &'static str,
}

const NAME: KeySpec = KeySpec {
    name: "name",
    value: ValueKind::Str,
    example: "\"charge_card\"",
    effect_only: false,
};

/// The flag that makes an activity an effect.
pub(crate) const EFFECT: &str = "effect";

pub(crate) const ACTIVITY_KEYS: &[KeySpec] = &[
    NAME,
    KeySpec {
        name: EFFECT,
        value: ValueKind::Flag,
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
        },
        example: "2",
        effect_only: true,
    },
    KeySpec {
        name: "reconcile",
        value: ValueKind::Path,
        example: "find_booking",
        effect_only: true,
    },
    KeySpec {
        name: "max_attempts",
        value: ValueKind::Int {
            max: u32::MAX as u64,
            lower: Some(LowerBound {
                min: 1,
                reason: "it counts the first attempt, so 1 means no retries",
            }),
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
        },
        example: "30000",
        effect_only: false,
    },
    KeySpec {
        name: "initial_backoff_ms",
        value: ValueKind::Int {
            max: u64::MAX,
            lower: None,
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
        },
        example: "600000",
        effect_only: false,
    },
];

pub(crate) const WORKFLOW_KEYS: &[KeySpec] = &[NAME];

/// A validated argument value, carrying the user's span so generated code points back at it.
enum Value {
    Flag,
    Path(ExprPath),
    Str(LitStr),
    Int(LitInt),
}

/// One argument that parsed and validated.
struct Arg {
    spec: &'static KeySpec,
    /// The key as written, for errors about the argument as a whole.
    key: Path,
    value: Value,
}

/// The arguments that parsed and validated; invalid ones were reported and left out.
#[derive(Default)]
pub(crate) struct Args {
    values: Vec<Arg>,
}

impl Args {
    /// Whether the flag `key` was given.
    pub(crate) fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some(Value::Flag))
    }

    /// The path given for `key`, if any.
    pub(crate) fn path(&self, key: &str) -> Option<&ExprPath> {
        match self.get(key)? {
            Value::Path(path) => Some(path),
            _ => None,
        }
    }

    /// The string given for `key`, if any.
    pub(crate) fn string(&self, key: &str) -> Option<&LitStr> {
        match self.get(key)? {
            Value::Str(lit) => Some(lit),
            _ => None,
        }
    }

    /// The integer given for `key` as an unsuffixed literal, so it takes the type the
    /// builder method expects.
    pub(crate) fn int(&self, key: &str) -> Option<&LitInt> {
        match self.get(key)? {
            Value::Int(lit) => Some(lit),
            _ => None,
        }
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.values
            .iter()
            .find(|arg| arg.spec.name == key)
            .map(|arg| &arg.value)
    }
}

/// Parses the attribute's arguments, reporting every invalid one.
pub(crate) fn parse(kind: MacroKind, tokens: TokenStream, diagnostics: &mut Diagnostics) -> Args {
    let mut args = Args::default();
    match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(tokens) {
        Ok(metas) => {
            for meta in metas {
                parse_one(kind, meta, &mut args, diagnostics);
            }
        }
        // Not even `key = value` syntax: syn's error already points at the bad token.
        Err(error) => diagnostics.push(error),
    }
    check_effect_only(&args, diagnostics);
    args
}

fn parse_one(kind: MacroKind, meta: Meta, args: &mut Args, diagnostics: &mut Diagnostics) {
    let Some(spec) = lookup_key(kind, meta.path(), diagnostics) else {
        return;
    };
    if args.get(spec.name).is_some() {
        let message = format!(
            "duplicate {} argument `{}`; keep only one",
            kind.attribute(),
            spec.name
        );
        diagnostics.error_at(meta.path(), message);
        return;
    }
    let value = match spec.parse_meta(&meta) {
        Ok(value) => value,
        // `effect = true` still clearly asks for the flag: keeping it spares the user the
        // errors that checks depending on it would add.
        Err(error) if matches!(spec.value, ValueKind::Flag) => {
            diagnostics.push(error);
            Value::Flag
        }
        Err(error) => return diagnostics.push(error),
    };
    let key = meta.path().clone();
    args.values.push(Arg { spec, key, value });
}

/// Reports the effect-only arguments given without `effect`: they would otherwise do nothing.
fn check_effect_only(args: &Args, diagnostics: &mut Diagnostics) {
    if args.flag(EFFECT) {
        return;
    }
    for arg in args.values.iter().filter(|arg| arg.spec.effect_only) {
        let message = format!(
            "`{}` only applies to effect activities; add `{EFFECT}` to the attribute, \
             like `#[activity({EFFECT}, {})]`",
            arg.spec.name,
            arg.spec.usage_unquoted()
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
    let known = kind.known_keys();
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
    /// The value of `meta`, checked against the kind this key expects.
    fn parse_meta(&self, meta: &Meta) -> syn::Result<Value> {
        let value = match meta {
            Meta::NameValue(name_value) => Some(&name_value.value),
            Meta::Path(_) | Meta::List(_) => None,
        };
        match (&self.value, value) {
            (ValueKind::Flag, None) if matches!(meta, Meta::Path(_)) => Ok(Value::Flag),
            (ValueKind::Flag, _) => {
                let message = format!("`{}` takes no value; write just `{}`", self.name, self.name);
                Err(syn::Error::new_spanned(meta, message))
            }
            (ValueKind::Path, Some(value)) => self.parse_path(value),
            (ValueKind::Str, Some(value)) => self.parse_str(value),
            (ValueKind::Int { max, lower }, Some(value)) => {
                self.parse_int(value, *max, lower.as_ref())
            }
            (_, None) => {
                let message = format!("`{}` expects a value, like {}", self.name, self.usage());
                Err(syn::Error::new_spanned(meta, message))
            }
        }
    }

    fn parse_path(&self, value: &Expr) -> syn::Result<Value> {
        match peel_groups(value) {
            Expr::Path(path) => Ok(Value::Path(path.clone())),
            _ => Err(self.expects(value, "a path to an `async fn`")),
        }
    }

    fn parse_str(&self, value: &Expr) -> syn::Result<Value> {
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
        Ok(Value::Str(lit.clone()))
    }

    fn parse_int(&self, value: &Expr, max: u64, lower: Option<&LowerBound>) -> syn::Result<Value> {
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
        Ok(Value::Int(LitInt::new(&number.to_string(), lit.span())))
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
            ValueKind::Flag => self.name.to_owned(),
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
