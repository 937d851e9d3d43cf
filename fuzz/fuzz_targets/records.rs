//! Every record decoder, and both export formats, on arbitrary bytes: an error, never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use waymark_runtime::artifacts::ArtifactRecord;
use waymark_runtime::export::Export;
use waymark_runtime::inbox::InboxMessage;
use waymark_runtime::journal::{decode_record, read_framed, Entry};
use waymark_runtime::operations::OperationRecord;
use waymark_runtime::store::WorkflowRecord;
use waymark_runtime::streams::StreamItem;

fuzz_target!(|bytes: &[u8]| {
    let _ = decode_record::<Entry>(bytes);
    let _ = decode_record::<WorkflowRecord>(bytes);
    let _ = decode_record::<OperationRecord>(bytes);
    let _ = decode_record::<InboxMessage>(bytes);
    let _ = decode_record::<ArtifactRecord>(bytes);
    let _ = decode_record::<StreamItem>(bytes);
    let _ = waymark_runtime::keys::parse_journal_key(bytes);
    let _ = waymark_runtime::keys::parse_inbox_key(bytes);
    if let Ok(export) = Export::read(bytes, None) {
        // An export read writes back to one that reads the same.
        let written = export.write(None).expect("no codec, nothing to refuse");
        let again = Export::read(&written, None).expect("a written export reads");
        assert_eq!(again.entries, export.entries);
        assert_eq!(again.operations, export.operations);
        assert_eq!(again.artifacts, export.artifacts);
    }
    if let Ok(entries) = read_framed(bytes) {
        // What decodes encodes back to what decodes the same.
        let again = read_framed(&waymark_runtime::journal::write_framed(&entries));
        assert_eq!(again.ok().as_ref(), Some(&entries));
    }
});
