//! Attribute arguments: the `name = "...", max_attempts = 3` inside `#[activity(...)]`.
//!
//! Each attribute accepts the keys listed in its table of `KeySpec`s; accepting a new key is
//! one row here plus reading it in `expand`. Anything not in the table is an error that lists
//! the valid keys, so a typo or a feature this version does not have is never silently ignored.

use proc_macro2::TokenStream;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, Lit, LitInt, LitStr, Meta, Path, Token};

use crate::diagnostics::Diagnostics;
use crate::kind::MacroKind;

/// One accepted `key = value` argument.
pub(crate) struct KeySpec {
    name: &'static str,
    value: ValueKind,
    /// A valid value, quoted in "expects ..." messages so the fix can be copied.
    example: &'static str,
}

enum ValueKind {
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
};

pub(crate) const ACTIVITY_KEYS: &[KeySpec] = &[
    NAME,
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
    },
    KeySpec {
        name: "initial_backoff_ms",
        value: ValueKind::Int {
            max: u64::MAX,
            lower: None,
        },
        example: "200",
    },
];

pub(crate) const WORKFLOW_KEYS: &[KeySpec] = &[NAME];

/// A validated argument value, carrying the user's span so generated code points back at it.
enum Value {
    Str(LitStr),
    Int(LitInt),
}

/// The arguments that parsed and validated; invalid ones were reported and left out.
#[derive(Default)]
pub(crate) struct Args {
    values: Vec<(&'static str, Value)>,
}

impl Args {
    /// The string given for `key`, if any.
    pub(crate) fn string(&self, key: &str) -> Option<&LitStr> {
        match self.get(key)? {
            Value::Str(lit) => Some(lit),
            Value::Int(_) => None,
        }
    }

    /// The integer given for `key` as an unsuffixed literal, so it takes the type the
    /// builder method expects.
    pub(crate) fn int(&self, key: &str) -> Option<&LitInt> {
        match self.get(key)? {
            Value::Int(lit) => Some(lit),
            Value::Str(_) => None,
        }
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.values
            .iter()
            .find(|(name, _)| *name == key)
            .map(|(_, value)| value)
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
    args
}

fn parse_one(kind: MacroKind, meta: Meta, args: &mut Args, diagnostics: &mut Diagnostics) {
    let Some(spec) = lookup_key(kind, meta.path(), diagnostics) else {
        return;
    };
    let Meta::NameValue(name_value) = meta else {
        let message = format!("`{}` expects a value, like {}", spec.name, spec.usage());
        diagnostics.error_at(meta, message);
        return;
    };
    if args.get(spec.name).is_some() {
        let message = format!(
            "duplicate {} argument `{}`; keep only one",
            kind.attribute(),
            spec.name
        );
        diagnostics.error_at(&name_value.path, message);
        return;
    }
    match spec.parse_value(&name_value.value) {
        Ok(value) => args.values.push((spec.name, value)),
        Err(error) => diagnostics.push(error),
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
    fn parse_value(&self, value: &Expr) -> syn::Result<Value> {
        match self.value {
            ValueKind::Str => self.parse_str(value),
            ValueKind::Int { max, ref lower } => self.parse_int(value, max, lower.as_ref()),
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
        format!("`{} = {}`", self.name, self.example)
    }
}

/// The literal in `value`, looking through the invisible groups `macro_rules!` wraps around
/// `$value:expr` fragments.
fn literal(value: &Expr) -> Option<&Lit> {
    match value {
        Expr::Lit(expr) => Some(&expr.lit),
        Expr::Group(group) => literal(&group.expr),
        _ => None,
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
