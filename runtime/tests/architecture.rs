//! The map in ARCHITECTURE.md, checked: the modules of `runtime/src` import each other without
//! a circle. A circle means two modules can only change together; the fix is a trait on the
//! lower side (as `context::ActivityCatalog` and `executor::Host` are).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each top-level module of the crate with the top-level modules it names as `crate::…`,
/// test code left out.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = BTreeMap::new();
    for (module, source) in sources(&root, &root) {
        // A file's tests come last, in a `#[cfg(test)] mod`.
        let production = source
            .split("#[cfg(test)]\nmod ")
            .next()
            .unwrap_or_default();
        let named = graph.entry(module.clone()).or_insert_with(BTreeSet::new);
        for (at, _) in production.match_indices("crate::") {
            let rest = &production[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != module {
                named.insert(name);
            }
        }
    }
    graph
}

/// Every `.rs` file under `dir` with the top-level module it belongs to (`lib` for the root).
fn sources(root: &Path, dir: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read the source dir") {
        let path = entry.expect("a dir entry").path();
        if path.is_dir() {
            found.extend(sources(root, &path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).expect("under the root");
            let first = relative.components().next().expect("a file name");
            let first = first.as_os_str().to_string_lossy();
            let module = first.trim_end_matches(".rs").to_owned();
            let source = std::fs::read_to_string(&path).expect("read a source file");
            found.push((module, source));
        }
    }
    found
}

/// The first circle found, as the modules along it.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut found = path[start..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if !done.insert(node.to_owned()) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if graph.contains_key(next) {
                if let Some(found) = visit(next, graph, path, done) {
                    return Some(found);
                }
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        let mut path = Vec::new();
        // A node finished without a circle is skipped, but a circle through a finished node
        // would have been found when it was visited.
        if let Some(found) = visit(node, graph, &mut path, &mut done) {
            return Some(found);
        }
    }
    None
}

#[test]
fn the_runtime_modules_import_each_other_without_a_circle() {
    let graph = imports();
    assert!(graph.len() > 10, "the modules were found: {graph:?}");
    if let Some(found) = circle(&graph) {
        panic!(
            "the modules import each other in a circle: {}",
            found.join(" → ")
        );
    }
}

#[test]
fn a_circle_is_found() {
    let mut graph = BTreeMap::new();
    let edges = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")];
    for (from, to) in edges {
        let named: &mut BTreeSet<String> = graph.entry(from.to_owned()).or_default();
        named.insert(to.to_owned());
        graph.entry(to.to_owned()).or_default();
    }
    assert_eq!(
        circle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    graph.get_mut("c").unwrap().remove("a");
    assert_eq!(circle(&graph), None);
}
