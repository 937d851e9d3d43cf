//! The README's worker for a crate of one's own is `examples/src/bin/own_worker.rs`, which the
//! workspace builds and lints: the two must not drift apart.

#[test]
fn the_readme_shows_the_own_worker_as_it_is() {
    let readme = include_str!("../../README.md");
    let source = include_str!("../src/bin/own_worker.rs");
    let marker = "<!-- examples/src/bin/own_worker.rs -->\n```rust\n";
    let start = readme.find(marker).expect("the README marks the block") + marker.len();
    let block = &readme[start..];
    let block = &block[..block.find("```\n").expect("the block ends")];
    // The file's module comment is for the repository only.
    let code: String = source
        .lines()
        .skip_while(|line| line.starts_with("//!") || line.is_empty())
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(block, code, "update the README's block from the file");
}
