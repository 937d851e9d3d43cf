//! What the CLI prints: text for people, with the control characters of ids and payloads
//! escaped (a workflow id or a signal's payload cannot move the cursor, clear the screen or
//! forge a line), or JSON for programs.

use serde_json::Value;

/// How the command prints.
#[derive(Clone, Copy)]
pub(crate) struct Out {
    /// JSON instead of text.
    pub(crate) json: bool,
}

impl Out {
    /// Prints `text` (escaped) for people, or `json` for programs.
    pub(crate) fn either(self, text: impl FnOnce() -> String, json: impl FnOnce() -> Value) {
        match self.json {
            true => println!("{}", pretty(&json())),
            false => println!("{}", printable(&text())),
        }
    }

    /// Prints `value` as JSON, or as text by `text`.
    pub(crate) fn value(self, value: &Value, text: impl FnOnce(&Value) -> String) {
        self.either(|| text(value), || value.clone());
    }
}

pub(crate) fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// `text` with every control character but the line feed written as an escape (`\u{1b}`), so
/// that what a workflow id, a payload or a journal holds prints as what it is.
pub(crate) fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push('\n'),
            c if c.is_control() => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_are_escaped_and_lines_kept() {
        assert_eq!(printable("ok\n"), "ok\n");
        assert_eq!(printable("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(printable("x\ry\t"), "x\\u{d}y\\u{9}");
        assert_eq!(printable("héllo"), "héllo");
    }
}
