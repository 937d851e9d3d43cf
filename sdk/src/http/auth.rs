//! Bearer-token authentication with roles. The caller's identity (an approver's name, an
//! operator's name) comes from the token, never from the request body.

use axum::http::HeaderMap;
use waymark_runtime::namespace::{self, DEFAULT};

use super::error::ApiError;

/// The request header naming the namespace a request acts in.
pub(crate) const NAMESPACE_HEADER: &str = "waymark-namespace";

/// The namespaces a token acts in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    /// Every namespace (`@*`): an operator across tenants.
    All,
    /// These, the first when a request names none.
    Only(Vec<String>),
}

impl Default for Namespaces {
    fn default() -> Self {
        Namespaces::Only(vec![DEFAULT.to_owned()])
    }
}

impl Namespaces {
    fn parse(name: &str, text: &str) -> Result<Self, String> {
        if text == "*" {
            return Ok(Namespaces::All);
        }
        let names = text.split('|').map(|ns| {
            // Not quoted: with its fields swapped, a spec's namespace is its secret.
            namespace::check_name(ns)
                .map(|()| ns.to_owned())
                .map_err(|_| {
                    format!("a namespace of token `{name}` is not 1 to 64 of A-Z a-z 0-9 - _ .")
                })
        });
        names.collect::<Result<Vec<_>, _>>().map(Namespaces::Only)
    }

    fn holds(&self, namespace: &str) -> bool {
        match self {
            Namespaces::All => true,
            Namespaces::Only(names) => names.iter().any(|n| n == namespace),
        }
    }

    fn first(&self) -> &str {
        match self {
            Namespaces::All => DEFAULT,
            Namespaces::Only(names) => names.first().map_or(DEFAULT, String::as_str),
        }
    }
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read workflows, journals, streams, metrics.
    Read,
    /// Start, signal and cancel workflows.
    Write,
    /// Decide approvals.
    Approve,
    /// Resolve operations awaiting an operator.
    Operate,
    /// Report an operation's outcome as its downstream (a webhook): `settle` only, so a
    /// downstream's token can neither read workflows nor act as an operator.
    Settle,
}

impl Role {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "read" => Some(Role::Read),
            "write" => Some(Role::Write),
            "approve" => Some(Role::Approve),
            "operate" => Some(Role::Operate),
            "settle" => Some(Role::Settle),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Approve => "approve",
            Role::Operate => "operate",
            Role::Settle => "settle",
        }
    }
}

/// A bearer token, the identity it stands for, its roles and its namespaces. Its `Debug` never
/// shows the secret; the API holds only the secret's SHA-256.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// Who presents it (recorded as the approver or operator).
    pub name: String,
    /// The secret.
    pub secret: String,
    /// What it may do.
    pub roles: Vec<Role>,
    /// Where it may do it (default: the `default` namespace only).
    pub namespaces: Namespaces,
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiToken")
            .field("name", &self.name)
            .field("secret", &"<redacted>")
            .field("roles", &self.roles)
            .field("namespaces", &self.namespaces)
            .finish()
    }
}

impl ApiToken {
    /// Parses `name:role+role:secret`, or `name:role+role@ns|ns:secret` for a token of those
    /// namespaces (`@*`: of every one). An error names the token by its name, never quoting
    /// the secret.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut parts = spec.splitn(3, ':');
        let (Some(name), Some(roles), Some(secret)) = (parts.next(), parts.next(), parts.next())
        else {
            // Without a `:` the whole spec may be the secret: none of it is shown.
            let named = spec.split_once(':').map(|(name, _)| format!(" `{name}`"));
            let named = named.unwrap_or_default();
            return Err(format!(
                "token{named} is not `name:role+role:secret` (the spec is not shown)"
            ));
        };
        let (roles, namespaces) = match roles.split_once('@') {
            Some((roles, namespaces)) => (roles, Namespaces::parse(name, namespaces)?),
            None => (roles, Namespaces::default()),
        };
        let roles = roles
            .split('+')
            .map(|r| {
                // Not quoted: with its fields swapped, a spec's "role" is its secret.
                let known = "read, write, approve, operate, settle";
                Role::parse(r)
                    .ok_or_else(|| format!("a role of token `{name}` is not one of {known}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if name.is_empty() || secret.is_empty() {
            return Err(format!("token `{name}` needs a name and a secret"));
        }
        let (name, secret) = (name.to_owned(), secret.to_owned());
        Ok(Self {
            name,
            secret,
            roles,
            namespaces,
        })
    }

    /// Parses a comma- or newline-separated list of token specs; blank lines and `#` comments
    /// are skipped (the format of `WAYMARK_TOKENS` and of `WAYMARK_TOKENS_FILE`).
    pub fn parse_list(text: &str) -> Result<Vec<Self>, String> {
        // Only a whole line is a comment: a `#` inside a secret is part of it.
        text.lines()
            .filter(|line| !line.trim_start().starts_with('#'))
            .flat_map(|line| line.split(','))
            .map(str::trim)
            .filter(|spec| !spec.is_empty())
            .map(Self::parse)
            .collect()
    }
}

/// Why the API refuses to start with a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpConfigError {
    /// No tokens, and no explicit opt-in to an unauthenticated local worker.
    #[error(
        "no API tokens configured: set WAYMARK_TOKENS=name:role+role:secret (comma-separated) or \
         WAYMARK_TOKENS_FILE=path (one per line); roles are read, write, approve, operate, \
         settle. For a worker only this machine can reach, opt in to no authentication with \
         `HttpConfig::insecure_local()` (the worker example's `--insecure-local`) on a loopback \
         address"
    )]
    NoTokens,
    /// The unauthenticated opt-in on a listener others can reach.
    #[error(
        "an unauthenticated API (insecure_local) may only listen on a loopback address, not on \
         {0}: configure tokens to listen there"
    )]
    InsecureNotLoopback(std::net::SocketAddr),
    /// Two tokens with one secret: a caller could not be told apart.
    #[error("tokens `{0}` and `{1}` have the same secret: give each its own")]
    DuplicateSecret(String, String),
}

/// Who made a request.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) name: String,
    roles: Vec<Role>,
    namespaces: Namespaces,
}

impl Caller {
    /// The namespace the request acts in: the one its header names, else the token's first.
    /// One the token does not hold answers 404, as if it did not exist.
    pub(crate) fn namespace(&self, headers: &HeaderMap) -> Result<String, ApiError> {
        let named = headers.get(NAMESPACE_HEADER).map(|v| v.to_str());
        let namespace = match named {
            None => self.namespaces.first(),
            Some(Ok(named)) => named,
            Some(Err(_)) => return Err(ApiError::bad_request("the namespace header is not text")),
        };
        namespace::check_name(namespace).map_err(|e| ApiError::bad_request(e.to_string()))?;
        match self.namespaces.holds(namespace) {
            true => Ok(namespace.to_owned()),
            false => Err(ApiError::not_found(format!("no namespace `{namespace}`"))),
        }
    }

    /// The namespaces the token holds, as JSON (`"*"` for all).
    pub(crate) fn namespace_names(&self) -> serde_json::Value {
        match &self.namespaces {
            Namespaces::All => serde_json::json!("*"),
            Namespaces::Only(names) => serde_json::json!(names),
        }
    }

    pub(crate) fn role_names(&self) -> Vec<&'static str> {
        self.roles.iter().map(|r| r.name()).collect()
    }

    /// The caller holds one of `roles`.
    pub(crate) fn require_any(&self, roles: &[Role]) -> Result<&Self, ApiError> {
        if roles.iter().any(|role| self.roles.contains(role)) {
            return Ok(self);
        }
        let names: Vec<&str> = roles.iter().map(|role| role.name()).collect();
        let message = format!(
            "`{}` needs one of the roles {}",
            self.name,
            names.join(", ")
        );
        Err(ApiError::forbidden(message))
    }

    pub(crate) fn require(&self, role: Role) -> Result<&Self, ApiError> {
        match self.roles.contains(&role) {
            true => Ok(self),
            false => Err(ApiError::forbidden(format!(
                "`{}` lacks the `{}` role",
                self.name,
                role.name()
            ))),
        }
    }
}

/// A configured token as the API holds it: the secret's digest, not the secret.
#[derive(Clone)]
struct KnownToken {
    name: String,
    roles: Vec<Role>,
    namespaces: Namespaces,
    digest: [u8; 32],
}

/// The configured tokens; with none, only an explicit local opt-in lets requests in, each as
/// `anonymous` with every role.
#[derive(Clone)]
pub(crate) struct Tokens {
    known: Vec<KnownToken>,
    anonymous: bool,
}

impl Tokens {
    /// The table for `tokens`; with none, `insecure_local` must say so.
    pub(crate) fn new(tokens: &[ApiToken], insecure_local: bool) -> Result<Self, HttpConfigError> {
        if tokens.is_empty() && !insecure_local {
            return Err(HttpConfigError::NoTokens);
        }
        warn_of_short_secrets(tokens);
        let known: Vec<KnownToken> = tokens
            .iter()
            .map(|token| KnownToken {
                name: token.name.clone(),
                roles: token.roles.clone(),
                namespaces: token.namespaces.clone(),
                digest: digest(&token.secret),
            })
            .collect();
        for (at, token) in known.iter().enumerate() {
            if let Some(twin) = known[..at].iter().find(|t| t.digest == token.digest) {
                let names = (twin.name.clone(), token.name.clone());
                return Err(HttpConfigError::DuplicateSecret(names.0, names.1));
            }
        }
        let anonymous = known.is_empty();
        Ok(Self { known, anonymous })
    }

    /// No tokens: every caller is `anonymous` (the local opt-in).
    pub(crate) fn is_anonymous(&self) -> bool {
        self.anonymous
    }

    pub(crate) fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let header = headers.get("authorization").and_then(|v| v.to_str().ok());
        let secret = header.and_then(|h| h.strip_prefix("Bearer "));
        if secret.is_none() && !self.anonymous {
            return Err(ApiError::unauthorized("a bearer token is required"));
        }
        self.caller_for_secret(secret.unwrap_or_default())
            .ok_or_else(|| ApiError::unauthorized("unknown token"))
    }

    /// The caller whose token has `secret` (any secret, without tokens: the local opt-in).
    pub(crate) fn caller_for_secret(&self, secret: &str) -> Option<Caller> {
        if self.anonymous {
            let roles = vec![
                Role::Read,
                Role::Write,
                Role::Approve,
                Role::Operate,
                Role::Settle,
            ];
            let name = "anonymous".to_owned();
            let namespaces = Namespaces::All;
            return Some(Caller {
                name,
                roles,
                namespaces,
            });
        }
        // Digests have one length, and every token is compared: the time taken says nothing
        // of how close a guess was, nor of which token it matched.
        let presented = digest(secret);
        let matched = self.known.iter().fold(None, |found, token| {
            match constant_time_eq(&token.digest, &presented) {
                true => Some(token),
                false => found,
            }
        });
        let token = matched?;
        let (name, roles) = (token.name.clone(), token.roles.clone());
        let namespaces = token.namespaces.clone();
        Some(Caller {
            name,
            roles,
            namespaces,
        })
    }
}

/// Secrets shorter than this are guessable enough to say so at start.
const SHORT_SECRET: usize = 16;

/// Logs each token whose secret is short, by name and length only. Not refused: a secret's
/// strength is the operator's to choose, and test and local setups use short ones.
fn warn_of_short_secrets(tokens: &[ApiToken]) {
    for token in tokens.iter().filter(|t| t.secret.len() < SHORT_SECRET) {
        tracing::warn!(
            token = %token.name,
            bytes = token.secret.len(),
            "short token secret: use at least {SHORT_SECRET} random bytes (`openssl rand -hex 32`)"
        );
    }
}

fn digest(secret: &str) -> [u8; 32] {
    use sha2::{Digest as _, Sha256};
    Sha256::digest(secret.as_bytes()).into()
}

/// Compares two digests without returning early on the first differing byte.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_with_roles_and_reject_garbage() {
        let token = ApiToken::parse("dana:read+approve:s3cret").unwrap();
        assert_eq!(token.name, "dana");
        assert_eq!(token.roles, [Role::Read, Role::Approve]);
        assert_eq!(token.secret, "s3cret");
        assert!(ApiToken::parse("dana:admin:x").is_err());
        assert!(ApiToken::parse("dana:read").is_err());
        assert!(ApiToken::parse(":read:x").is_err());
        assert_eq!(token.namespaces, Namespaces::default());
    }

    #[test]
    fn tokens_name_their_namespaces() {
        let token = ApiToken::parse("dana:read+approve@billing|support:s3:cret").unwrap();
        assert_eq!(token.roles, [Role::Read, Role::Approve]);
        let expected = Namespaces::Only(vec!["billing".into(), "support".into()]);
        assert_eq!(token.namespaces, expected);
        assert_eq!(token.secret, "s3:cret");
        let every = ApiToken::parse("ops:operate@*:x").unwrap();
        assert_eq!(every.namespaces, Namespaces::All);
        let bad = ApiToken::parse("dana:read@bad name:s3cret").unwrap_err();
        assert!(
            bad.contains("namespace") && !bad.contains("bad name"),
            "{bad}"
        );
        let swapped = ApiToken::parse("dana:read@s3cr3t!:billing").unwrap_err();
        assert!(!swapped.contains("s3cr3t"), "{swapped}");
        assert!(ApiToken::parse("dana:read@:x").is_err());
    }

    #[test]
    fn secrets_are_never_shown_and_never_shared() {
        let token = ApiToken::parse("dana:read:s3cret-value").unwrap();
        assert!(!format!("{token:?}").contains("s3cret-value"));
        let malformed = ApiToken::parse("dana-s3cret-value").unwrap_err();
        assert!(!malformed.contains("s3cret"), "{malformed}");
        let twins = ApiToken::parse_list("a:read:same\nb:write:same").unwrap();
        assert_eq!(
            Tokens::new(&twins, false).err(),
            Some(HttpConfigError::DuplicateSecret("a".into(), "b".into()))
        );
        assert_eq!(
            Tokens::new(&[], false).err(),
            Some(HttpConfigError::NoTokens)
        );
        let listed = ApiToken::parse_list("# ops\na:read:x, b:write:y#z\n\n").unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[1].secret, "y#z", "a `#` inside a secret is kept");
        let swapped = ApiToken::parse("dana:s3cret-value:read").unwrap_err();
        assert!(!swapped.contains("s3cret"), "{swapped}");
    }
}
