//! The downstream files that the crash tests' activities write, one line per call or effect,
//! and that the tests read back whole.

use std::io::Write as _;
use std::path::Path;

use waymark::ActivityError;

/// The file's lines (empty if it does not exist yet).
pub fn read_lines(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines().map(str::to_owned).collect()
}

/// Appends `line` to `file` and syncs it; a failure is retriable, naming the file as `what`.
pub fn append_line(file: &Path, line: &str, what: &str) -> Result<(), ActivityError> {
    let write = || -> std::io::Result<()> {
        let mut opened = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)?;
        // One write call per line, so a kill leaves whole lines only.
        opened.write_all(format!("{line}\n").as_bytes())?;
        opened.sync_all()
    };
    write().map_err(|e| ActivityError::retriable(format!("{what} write failed: {e}")))
}
