//! The web UI's sessions: a person logs in once with their token's secret; the browser then
//! holds only a random session id, in an `HttpOnly`, `SameSite=Strict` cookie that scripts
//! cannot read and other sites cannot send. Every form carries the session's CSRF token as
//! well, checked in constant time, so a request that did not come from a page this worker
//! served changes nothing even where `SameSite` is not honoured.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap};

use super::super::auth::Caller;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "waymark_session";
/// The cookie that carries the login form's CSRF token before there is a session.
pub(crate) const LOGIN_COOKIE: &str = "waymark_login";

/// How long a session lasts without use.
const IDLE: Duration = Duration::from_secs(8 * 3600);
/// The most sessions held at once; the least recently used goes first.
const MAX_SESSIONS: usize = 10_000;

/// A logged-in person: who their token says they are, and the token every form must carry.
#[derive(Clone)]
pub(crate) struct Session {
    pub(crate) caller: Caller,
    pub(crate) csrf: String,
    used: Instant,
}

/// The sessions this worker issued (in memory: a restart logs everyone out).
#[derive(Default)]
pub(crate) struct Sessions {
    open: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// A new session for `caller`; its id, for the cookie.
    pub(crate) fn open(&self, caller: Caller) -> String {
        let id = random_token();
        let session = Session {
            caller,
            csrf: random_token(),
            used: Instant::now(),
        };
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|_, s| s.used.elapsed() < IDLE);
        if open.len() >= MAX_SESSIONS {
            let oldest = open
                .iter()
                .min_by_key(|(_, s)| s.used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                open.remove(&oldest);
            }
        }
        open.insert(id.clone(), session);
        id
    }

    /// The session the request's cookie names, if it is open.
    pub(crate) fn find(&self, headers: &HeaderMap) -> Option<Session> {
        let id = cookie(headers, COOKIE)?;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let session = open.get_mut(&id)?;
        if session.used.elapsed() >= IDLE {
            open.remove(&id);
            return None;
        }
        session.used = Instant::now();
        Some(session.clone())
    }

    /// Ends the session the request's cookie names.
    pub(crate) fn close(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers, COOKIE) {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            open.remove(&id);
        }
    }
}

/// The value of cookie `name` in the request, if sent.
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    let cookies = headers.get_all(header::COOKIE);
    let pairs = cookies
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|line| line.split(';'));
    pairs
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
}

/// A `Set-Cookie` value: scripts cannot read it, other sites cannot send it, and over TLS it
/// never travels in clear.
pub(crate) fn set_cookie(name: &str, value: &str, secure: bool, max_age: Option<u64>) -> String {
    let mut cookie = format!("{name}={value}; Path=/ui; HttpOnly; SameSite=Strict");
    if secure {
        cookie.push_str("; Secure");
    }
    if let Some(seconds) = max_age {
        cookie.push_str(&format!("; Max-Age={seconds}"));
    }
    cookie
}

/// 32 random bytes, hex: a session id or a CSRF token.
pub(crate) fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `given` is `expected`, in time that does not depend on where they differ.
pub(crate) fn same_token(given: &str, expected: &str) -> bool {
    let (given, expected) = (given.as_bytes(), expected.as_bytes());
    if given.len() != expected.len() || expected.is_empty() {
        return false;
    }
    given
        .iter()
        .zip(expected)
        .fold(0u8, |differ, (a, b)| differ | (a ^ b))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn cookies_are_found_by_name_among_others() {
        let mut headers = HeaderMap::new();
        let line = "a=1; waymark_session=abc; waymark_sessionx=no";
        headers.insert(header::COOKIE, HeaderValue::from_static(line));
        assert_eq!(cookie(&headers, COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie(&headers, "missing"), None);
    }

    #[test]
    fn tokens_match_only_whole() {
        assert!(same_token("abcd", "abcd"));
        assert!(!same_token("abc", "abcd"));
        assert!(!same_token("abce", "abcd"));
        assert!(!same_token("", ""));
    }
}
