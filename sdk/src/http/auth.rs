//! Bearer-token authentication with roles. The caller's identity (an approver's name, an
//! operator's name) comes from the token, never from the request body.

use axum::http::HeaderMap;

use super::error::ApiError;

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

/// A bearer token, the identity it stands for and its roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiToken {
    /// Who presents it (recorded as the approver or operator).
    pub name: String,
    /// The secret.
    pub secret: String,
    /// What it may do.
    pub roles: Vec<Role>,
}

impl ApiToken {
    /// Parses `name:role+role:secret`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut parts = spec.splitn(3, ':');
        let (Some(name), Some(roles), Some(secret)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("token `{spec}` is not `name:role+role:secret`"));
        };
        let roles = roles
            .split('+')
            .map(|r| Role::parse(r).ok_or_else(|| format!("unknown role `{r}` in token `{name}`")))
            .collect::<Result<Vec<_>, _>>()?;
        if name.is_empty() || secret.is_empty() {
            return Err(format!("token `{name}` needs a name and a secret"));
        }
        let (name, secret) = (name.to_owned(), secret.to_owned());
        Ok(Self {
            name,
            secret,
            roles,
        })
    }
}

/// Who made a request.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub(crate) name: String,
    roles: Vec<Role>,
}

impl Caller {
    pub(crate) fn role_names(&self) -> Vec<&'static str> {
        self.roles.iter().map(|r| r.name()).collect()
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

/// The configured tokens; none configured means every request is `anonymous` with every role
/// (for local development: the server says so when it starts).
#[derive(Debug, Clone, Default)]
pub(crate) struct Tokens(pub(crate) Vec<ApiToken>);

impl Tokens {
    pub(crate) fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        if self.0.is_empty() {
            let roles = vec![
                Role::Read,
                Role::Write,
                Role::Approve,
                Role::Operate,
                Role::Settle,
            ];
            let name = "anonymous".to_owned();
            return Ok(Caller { name, roles });
        }
        let header = headers.get("authorization").and_then(|v| v.to_str().ok());
        let secret = header.and_then(|h| h.strip_prefix("Bearer "));
        let Some(secret) = secret else {
            return Err(ApiError::unauthorized("a bearer token is required"));
        };
        let token = self.0.iter().find(|t| constant_time_eq(&t.secret, secret));
        let token = token.ok_or_else(|| ApiError::unauthorized("unknown token"))?;
        let (name, roles) = (token.name.clone(), token.roles.clone());
        Ok(Caller { name, roles })
    }
}

/// Compares secrets without returning early on the first differing byte.
fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let differing = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    a.len() == b.len() && differing == 0
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
    }
}
