//! The OpenAPI document is generated from the handlers (`sdk/src/http/openapi.rs`); these tests
//! keep it complete and keep the checked-in copy, `sdk/openapi.json`, the one served.
//! `WAYMARK_UPDATE_OPENAPI=1 cargo test -p waymark-tests --test openapi` rewrites the copy.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;
use waymark::http::{openapi_document, openapi_text};

fn checked_in_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sdk/openapi.json")
}

fn operations(document: &Value) -> Vec<(String, String, Value)> {
    let mut found = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            found.push((path.clone(), method.clone(), operation.clone()));
        }
    }
    found
}

#[test]
fn the_checked_in_document_is_the_generated_one() {
    let generated = openapi_text(&openapi_document());
    let path = checked_in_path();
    if std::env::var_os("WAYMARK_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "sdk/openapi.json is not the document the handlers generate; rewrite it with \
         WAYMARK_UPDATE_OPENAPI=1 cargo test -p waymark-tests --test openapi"
    );
}

/// Every `{name}` of a path is a path parameter of each of its operations, and no two paths
/// differ only in their parameters' names (which OpenAPI forbids).
#[test]
fn every_path_parameter_is_declared_and_templates_are_distinct() {
    let document = openapi_document();
    let mut shapes = BTreeSet::new();
    for path in document["paths"].as_object().unwrap().keys() {
        let shape: Vec<&str> = path
            .split('/')
            .map(|s| if s.starts_with('{') { "{}" } else { s })
            .collect();
        assert!(shapes.insert(shape.join("/")), "{path} repeats a template");
    }
    for (path, method, operation) in operations(&document) {
        let declared: BTreeSet<&str> = operation["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "path")
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        let templated: BTreeSet<&str> = path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .collect();
        assert_eq!(declared, templated, "{method} {path}");
    }
}

/// Each operation says what it answers: a success with a schema (not a bare object), and the
/// refusals every guarded route can give.
#[test]
fn every_operation_documents_its_answers() {
    let document = openapi_document();
    let schemas = document["components"]["schemas"].as_object().unwrap();
    for (path, method, operation) in operations(&document) {
        let responses = operation["responses"].as_object().unwrap();
        let success = responses.keys().find(|s| s.starts_with('2'));
        let success = success.unwrap_or_else(|| panic!("{method} {path}: no success"));
        let content = &responses[success]["content"];
        let media = content.as_object().and_then(|c| c.values().next());
        let schema = media.map(|m| &m["schema"]).unwrap_or(&Value::Null);
        let named = schema["$ref"]
            .as_str()
            .map(|r| r.rsplit('/').next().unwrap());
        if let Some(name) = named {
            let properties = &schemas[name]["properties"];
            let one_of = &schemas[name]["oneOf"];
            let not_an_object = schemas[name]["type"]
                .as_str()
                .is_some_and(|t| t != "object");
            assert!(
                properties.is_object() || one_of.is_array() || not_an_object,
                "{method} {path}: {name} is a bare object"
            );
        } else {
            assert!(
                schema.is_object(),
                "{method} {path}: no schema for {success}"
            );
        }
        for status in ["429", "503"] {
            assert!(responses.contains_key(status), "{method} {path}: {status}");
        }
        if method == "post" {
            for status in ["400", "413", "415"] {
                assert!(responses.contains_key(status), "{method} {path}: {status}");
            }
        }
    }
}

/// A route of the API can only be served documented: its router is built from
/// `#[utoipa::path]` handlers alone (`routes!`), never with axum's undocumented `.route(` or
/// `get(`. The one router merged in is the web UI's, whose pages are all under `/ui` (HTML
/// for people, not part of the JSON API).
#[test]
fn routes_are_only_registered_through_their_documentation() {
    let http = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sdk/src/http");
    for file in std::fs::read_dir(&http).unwrap() {
        let path = file.unwrap().path();
        if path.is_dir() {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replacen(".merge(ui::routes())", "", 1);
        for undocumented in [
            ".route(",
            ".route_service(",
            ".nest(",
            ".merge(",
            "routing::",
        ] {
            assert!(
                !text.contains(undocumented),
                "{} registers a route with `{undocumented}`, outside the document",
                path.display()
            );
        }
    }
    let ui = std::fs::read_to_string(http.join("ui/mod.rs")).unwrap();
    for route in ui.split(".route(\"").skip(1) {
        assert!(
            route.starts_with("/ui"),
            "a UI route outside /ui: {route:.40}"
        );
    }
    let document = openapi_document();
    let paths = document["paths"].as_object().unwrap();
    assert!(paths.keys().all(|path| !path.starts_with("/ui")));
    let routes = std::fs::read_to_string(http.join("mod.rs")).unwrap();
    let registered = routes.matches(".routes(routes!(").count();
    assert!(registered >= 18, "{registered} route groups");
}
