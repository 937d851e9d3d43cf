//! Token specs, encryption key specs and namespaced ids built from arbitrary text: an error
//! that never quotes a secret, never a panic. Each entry's secret is a canary the harness
//! appends, so whatever the fuzzer puts before it (names, roles, namespaces, separators), an
//! error that shows the canary shows a secret.

#![no_main]

use libfuzzer_sys::fuzz_target;
use waymark::codec::Keyring;
use waymark::http::ApiToken;
use waymark_runtime::namespace;

const CANARY: &str = "CanarySecretValue0001";
const CANARY_KEY: &str = "c0ffee0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d";

/// One spec per line of `text`, each `line:secret`.
fn specs(text: &str, secret: &str) -> String {
    let lines = text.lines().take(8);
    let specs = lines.map(|line| format!("{}:{secret}", line.replace(',', "\n")));
    specs.collect::<Vec<_>>().join("\n")
}

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    if text.contains(CANARY) || text.contains(CANARY_KEY) {
        return;
    }
    let _ = ApiToken::parse_list(text);
    let _ = Keyring::parse(text);
    if let Err(error) = ApiToken::parse_list(&specs(text, CANARY)) {
        assert!(!error.contains(CANARY), "{error:?} shows the secret");
    }
    for secret in [CANARY, CANARY_KEY] {
        if let Err(error) = Keyring::parse(&specs(text, secret)) {
            let shown = error.to_string();
            assert!(!shown.contains(secret), "{shown:?} shows the secret");
        }
    }
    let (ns, id) = text.split_once('\n').unwrap_or(("default", text));
    if let Ok(stored) = namespace::qualify(ns, "id", id) {
        assert_eq!(namespace::split(&stored), (ns, id));
    }
});
