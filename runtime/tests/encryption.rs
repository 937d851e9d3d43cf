//! Encryption at rest on RocksDB: nothing written is in clear in the data dir, keys rotate
//! (old values open under the key they name, new ones are sealed under the current key, and
//! rekeying lets an old key go), and a value that does not open is an error naming its row.

use std::path::Path;
use std::sync::Arc;

use waymark_runtime::codec::{Codec, Keyring};
use waymark_runtime::journal::{Digest, Entry, Payload, WorkflowStarted};
use waymark_runtime::store::{RocksStore, Store, StoreError, Table, Transition, WorkflowRecord};

const KEY_A: &str = "a:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const KEY_B: &str = "b:ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/// A string no store writes unless a workflow's input holds it.
const CANARY: &str = "canary-7f3a9c1e-not-in-clear";

fn keys(spec: &str) -> Option<Arc<dyn Codec>> {
    Some(Arc::new(Keyring::parse(spec).unwrap()))
}

fn started(secret: &str) -> Entry {
    Entry::WorkflowStarted(WorkflowStarted {
        workflow_name: "wf".into(),
        input: Payload::encode(&serde_json::json!({ "note": secret })).unwrap(),
        request_id: Some(format!("request {secret}")),
        started_at_ms: 0,
    })
}

fn start(id: &str, secret: &str) -> Transition {
    let record = WorkflowRecord::new("wf", None, Digest::of(b"null"));
    Transition::append(id, &record, vec![started(secret)])
}

/// Every file under `dir` that holds `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if std::fs::read(&path)
            .unwrap()
            .windows(needle.len())
            .any(|w| w == needle)
        {
            found.push(path.display().to_string());
        }
    }
    found
}

async fn write_one(dir: &Path, codec: Option<Arc<dyn Codec>>, id: &str, secret: &str) {
    let store = RocksStore::open_with_codec(dir, codec).unwrap();
    store.commit(start(id, secret)).await.unwrap();
}

#[tokio::test]
async fn nothing_written_is_in_clear_in_the_data_dir() {
    let plain = tempfile::tempdir().unwrap();
    write_one(plain.path(), None, "wf", CANARY).await;
    // The scan sees what a store writes in clear, so its finding nothing below means something.
    assert!(!files_holding(plain.path(), CANARY.as_bytes()).is_empty());

    let sealed = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open_with_codec(sealed.path(), keys(KEY_A)).unwrap();
        store.commit(start("wf", CANARY)).await.unwrap();
        // Open, the log holds every write as written; closed, the table files hold them
        // compressed, where a leak is harder to find: both are searched.
        assert_eq!(
            files_holding(sealed.path(), CANARY.as_bytes()),
            Vec::<String>::new()
        );
    }
    assert_eq!(
        files_holding(sealed.path(), CANARY.as_bytes()),
        Vec::<String>::new()
    );
    let store = RocksStore::open_read_only_with_codec(sealed.path(), keys(KEY_A)).unwrap();
    assert_eq!(store.journal("wf").unwrap(), vec![started(CANARY)]);
}

#[tokio::test]
async fn after_rotation_old_values_open_new_ones_use_the_new_key_and_rekey_retires_the_old() {
    let dir = tempfile::tempdir().unwrap();
    write_one(dir.path(), None, "plain", "p").await;
    write_one(dir.path(), keys(KEY_A), "old", "o").await;
    let rotated = keys(&format!("{KEY_B},{KEY_A}"));
    write_one(dir.path(), rotated.clone(), "new", "n").await;
    {
        let store = RocksStore::open_read_only_with_codec(dir.path(), rotated.clone()).unwrap();
        for (id, secret) in [("plain", "p"), ("old", "o"), ("new", "n")] {
            assert_eq!(store.journal(id).unwrap(), vec![started(secret)], "{id}");
        }
    }
    {
        let only_b = RocksStore::open_read_only_with_codec(dir.path(), keys(KEY_B)).unwrap();
        assert_eq!(only_b.journal("new").unwrap(), vec![started("n")]);
        let error = only_b.journal("old").unwrap_err().to_string();
        assert!(error.contains("key `a`"), "{error}");
    }
    let store = RocksStore::open_with_codec(dir.path(), rotated).unwrap();
    let done = store.rekey().unwrap();
    assert!(done.rewritten > 0 && done.kept > 0, "{done:?}");
    drop(store);
    // What was plain before is in no file once rekeyed: the values were rewritten, compacted.
    assert_eq!(
        files_holding(dir.path(), b"request p"),
        Vec::<String>::new()
    );
    let only_b = RocksStore::open_read_only_with_codec(dir.path(), keys(KEY_B)).unwrap();
    for (id, secret) in [("plain", "p"), ("old", "o"), ("new", "n")] {
        assert_eq!(only_b.journal(id).unwrap(), vec![started(secret)], "{id}");
    }
}

#[tokio::test]
async fn a_sealed_store_does_not_open_without_keys_so_nothing_is_written_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    write_one(dir.path(), keys(KEY_A), "wf", "s").await;
    let refused = RocksStore::open(dir.path()).err().unwrap();
    assert!(matches!(refused, StoreError::KeysRequired), "{refused}");
    assert!(
        refused.to_string().contains("WAYMARK_ENCRYPTION_KEYS"),
        "{refused}"
    );
    let refused = RocksStore::open_read_only(dir.path()).err().unwrap();
    assert!(matches!(refused, StoreError::KeysRequired), "{refused}");
    // Opened with keys it reads; with the wrong ones, a value says which key it needs.
    let wrong = RocksStore::open_read_only_with_codec(dir.path(), keys(KEY_B)).unwrap();
    let error = wrong.journal("wf").unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::Codec {
                table: Table::Journal,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("key `a`"), "{error}");
}

#[tokio::test]
async fn an_altered_sealed_value_is_an_error_naming_its_row_and_others_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open_with_codec(dir.path(), keys(KEY_A)).unwrap();
    store.commit(start("good", "g")).await.unwrap();
    store.commit(start("bad", "b")).await.unwrap();
    let key = waymark_runtime::keys::journal_key("bad", 0);
    let inner = store.engine().inner();
    let mut stored = waymark_runtime::store::Reads::get(inner, Table::Journal, &key)
        .unwrap()
        .unwrap();
    let last = stored.len() - 1;
    stored[last] ^= 1;
    let altered = waymark_runtime::store::Write::Put(Table::Journal, key, stored);
    waymark_runtime::store::Engine::write(inner, vec![altered], true).unwrap();
    let error = store.journal("bad").unwrap_err().to_string();
    assert!(
        error.contains("`journal`") && error.contains("bad") && error.contains("does not verify"),
        "{error}"
    );
    assert_eq!(store.journal("good").unwrap(), vec![started("g")]);
}
