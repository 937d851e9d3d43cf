//! The export format: a workflow as `waymark export` writes it and `waymark import` reads it,
//! with what its journal needs to mean the same in another store.
//!
//! A journal alone is not enough to move a workflow: an effect it committed is answered from
//! the operation log (without its row, the imported workflow would call the downstream again),
//! and an approval or a retrieval names artifacts by hash. An export therefore holds the
//! journal, the workflow's operation log rows and the artifacts its journal committed.
//!
//! Layout: [`MAGIC`] and the format's version byte, then frames, each a big-endian `u32`
//! length and that many bytes: a kind byte, a seal byte (0 plain, 1 sealed), then the record,
//! sealed or not. A sealed frame is sealed under a context naming the export (a random id the
//! header holds), its kind and its place, so a frame moved within an export or taken from
//! another does not open. The first frame is the header, which counts the frames of each kind
//! that follow, in order: entries, operations, artifacts. A file cut short at a frame's edge is
//! therefore refused, not read as a shorter workflow. Records keep their own format byte
//! ([`crate::journal::encode_record`]), so an export is read by later builds as the store's
//! rows are.
//!
//! Files without [`MAGIC`] are the older export, framed journal records only
//! ([`crate::journal::write_framed`]): they are read as a journal with no rows or artifacts.
//!
//! An import checks what it is given before writing any of it ([`Export::into_import`]): the
//! rows must be the exported workflow's own, and each artifact must be one its journal
//! committed, with the content its hash names.

use serde::{Deserialize, Serialize};

use crate::artifacts::{artifact_hash, ArtifactRecord};
use crate::codec::{Codec, CodecError};
use crate::journal::{
    decode_exact, decode_record, encode_record, read_framed_with, DecodeError, Digest, Entry,
    Record,
};
use crate::lineage::{rebase, rebase_entry};
use crate::operations::{key_prefix, OperationEvent, OperationRecord, OperationStatus};
use crate::store::{committed_artifacts, Store, StoreError, Transition};

/// The first bytes of an export; the format's version byte follows.
pub const MAGIC: &[u8; 8] = b"WAYMARKX";
/// The version of the format this build writes and reads.
pub const VERSION: u8 = 3;

const HEADER: u8 = b'h';
const ENTRY: u8 = b'e';
const OPERATION: u8 = b'o';
const ARTIFACT: u8 = b'a';

const PLAIN: u8 = 0;
const SEALED: u8 = 1;

/// A workflow as exported.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// The workflow's stored id where it was exported; `None` for an older export.
    pub source_id: Option<String>,
    /// Its journal.
    pub entries: Vec<Entry>,
    /// Its operation log rows, by the idempotency key they had there.
    pub operations: Vec<(String, OperationRecord)>,
    /// The artifacts its journal committed.
    pub artifacts: Vec<(Digest, ArtifactRecord)>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    /// Binds every sealed frame to this export.
    export_id: [u8; 16],
    source_id: String,
    entries: u64,
    operations: u64,
    artifacts: u64,
}

impl Record for Header {}

/// A row and its key; the row keeps its own format byte.
#[derive(Serialize, Deserialize)]
struct Row {
    key: Vec<u8>,
    record: Vec<u8>,
}

/// Why an export cannot be imported; nothing of it was written.
#[derive(Debug, thiserror::Error)]
pub enum ImportRefusal {
    /// A row that is not the exported workflow's own.
    #[error("the export holds operation `{key}`, which is not a row of `{source_id}`")]
    ForeignRow {
        /// Its key.
        key: String,
        /// The exported workflow.
        source_id: String,
    },
    /// An artifact the journal did not commit, or whose content is not what its hash names.
    #[error("the export's artifact {hash} {problem}")]
    BadArtifact {
        /// Its hash.
        hash: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// Under another id, an effect whose outcome is not settled: the downstream knows its
    /// old key, and the copy would ask under a new one.
    #[error(
        "operation `{key}` is {status}: import the workflow under its own id, or settle it first"
    )]
    Unsettled {
        /// Its key.
        key: String,
        /// Where it stands.
        status: String,
    },
    /// The store refused the workflow (the id exists, the request id is taken).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Export {
    /// Reads `workflow_id` from `store`: its journal, the rows of its operation log (those of
    /// the workflow it was kept from, for a kept run `ID#run-N`: its keys name them), and the
    /// artifacts its journal committed that the store still holds.
    pub fn collect(store: &dyn Store, workflow_id: &str) -> Result<Self, StoreError> {
        let owner = rows_owner(workflow_id);
        let entries = store.journal(workflow_id)?;
        let mut operations = Vec::new();
        for (key, record) in store.operations(&key_prefix(owner))? {
            let record = record?;
            if record.workflow_id == owner {
                operations.push((key, record));
            }
        }
        let (namespace, _) = crate::namespace::split(workflow_id);
        let mut artifacts = Vec::new();
        for hash in committed_artifacts(&entries) {
            if let Some(record) = store.artifact(namespace, &hash)? {
                artifacts.push((hash, record));
            }
        }
        Ok(Self {
            source_id: Some(workflow_id.to_owned()),
            entries,
            operations,
            artifacts,
        })
    }

    /// The export's bytes; every record sealed by `codec` when one is given.
    pub fn write(&self, codec: Option<&dyn Codec>) -> Result<Vec<u8>, CodecError> {
        // The id binds sealed frames to their export; a plain export needs none, and the same
        // workflow then exports to the same bytes.
        let export_id = match codec {
            Some(_) => rand::random(),
            None => [0; 16],
        };
        let header = Header {
            export_id,
            source_id: self.source_id.clone().unwrap_or_default(),
            entries: self.entries.len() as u64,
            operations: self.operations.len() as u64,
            artifacts: self.artifacts.len() as u64,
        };
        let mut out = MAGIC.to_vec();
        out.push(VERSION);
        let mut writer = Writer {
            out,
            codec,
            export_id: header.export_id,
            index: 0,
        };
        writer.frame(HEADER, &encode_record(&header))?;
        for entry in &self.entries {
            writer.frame(ENTRY, &encode_record(entry))?;
        }
        for (key, record) in &self.operations {
            writer.frame(OPERATION, &row(key.as_bytes(), encode_record(record)))?;
        }
        for (hash, record) in &self.artifacts {
            writer.frame(ARTIFACT, &row(&hash.0, encode_record(record)))?;
        }
        Ok(writer.out)
    }

    /// Reads an export, or an older one (framed journal records); sealed records are opened
    /// with `codec`. The error names the frame (the header is frame 0).
    pub fn read(bytes: &[u8], codec: Option<&dyn Codec>) -> Result<Self, (usize, DecodeError)> {
        let Some(versioned) = bytes.strip_prefix(MAGIC.as_slice()) else {
            return Ok(Self {
                source_id: None,
                entries: read_framed_with(bytes, codec)?,
                operations: Vec::new(),
                artifacts: Vec::new(),
            });
        };
        match versioned.split_first() {
            Some((&VERSION, frames)) => Reader::new(frames, codec).export(),
            Some((&newer, _)) if newer > VERSION => Err((
                0,
                DecodeError::NewerFormat {
                    found: newer,
                    supported: VERSION,
                },
            )),
            _ => Err((
                0,
                DecodeError::UnknownVersion(versioned.first().copied().unwrap_or(0)),
            )),
        }
    }

    /// The change that writes this export into a store as workflow `workflow_id` (in its
    /// namespace): the journal; each operation row under its key rebased to `workflow_id`
    /// (the key its code derives there, so a committed effect is answered, not called again),
    /// with an event saying where it came from; and the artifacts (written only where absent:
    /// artifacts never change).
    ///
    /// Refused, writing nothing, for a row of another workflow, an artifact the journal did
    /// not commit or whose content is not what its hash names, and, under another id than the
    /// exported one, an effect whose outcome is not settled; and like [`Transition::import`].
    pub fn into_import(self, workflow_id: &str, now_ms: u64) -> Result<Transition, ImportRefusal> {
        let source = self.source_id.clone().unwrap_or_default();
        let owner = rows_owner(&source).to_owned();
        // An older export names no source: its journal is taken as it is.
        let moved = self.source_id.is_some() && owner != rows_owner(workflow_id);
        check_rows(&self.operations, &source, &owner, moved)?;
        let committed = committed_artifacts(&self.entries);
        check_artifacts(&self.artifacts, &committed)?;
        let entries = match moved {
            true => rebase_journal(self.entries, &owner, workflow_id),
            false => self.entries,
        };
        let mut transition = Transition::import(workflow_id, entries, now_ms)?;
        let shown_source = crate::namespace::display(&source);
        for (key, mut record) in self.operations {
            let row = rebase(&key, &owner, workflow_id).unwrap_or_else(|| key.clone());
            record.history.push(OperationEvent {
                at_ms: now_ms,
                seq: record.seq,
                attempt: record.attempt,
                status: record.status.name().to_owned(),
                by: Some(format!("{IMPORTED_BY}{shown_source}")),
                note: format!("imported from `{}`", crate::namespace::display(&key)),
            });
            record.workflow_id = workflow_id.to_owned();
            transition.operations.push((row, record));
        }
        transition.artifacts = self.artifacts;
        for (_, artifact) in &mut transition.artifacts {
            artifact.workflow_id = workflow_id.to_owned();
        }
        Ok(transition)
    }
}

/// The workflow whose operation log rows `workflow_id`'s keys name.
fn rows_owner(workflow_id: &str) -> &str {
    crate::executor::kept_run_owner(workflow_id).unwrap_or(workflow_id)
}

/// Every row must be the exported workflow's own: keyed under its prefix and recorded as its.
/// Moved to another id, every effect must be settled.
fn check_rows(
    operations: &[(String, OperationRecord)],
    source: &str,
    owner: &str,
    moved: bool,
) -> Result<(), ImportRefusal> {
    for (key, record) in operations {
        if record.workflow_id != owner || !key.starts_with(&key_prefix(owner)) {
            return Err(ImportRefusal::ForeignRow {
                key: crate::namespace::display(key),
                source_id: crate::namespace::display(source),
            });
        }
        let settled = !matches!(
            record.status,
            OperationStatus::Prepared
                | OperationStatus::UnknownOutcome { .. }
                | OperationStatus::AwaitingOperator { .. }
        );
        if moved && !settled {
            return Err(ImportRefusal::Unsettled {
                key: crate::namespace::display(key),
                status: record.status.name().to_owned(),
            });
        }
    }
    Ok(())
}

/// Every artifact must be one the journal committed, with the content its hash names.
fn check_artifacts(
    artifacts: &[(Digest, ArtifactRecord)],
    committed: &[Digest],
) -> Result<(), ImportRefusal> {
    for (hash, record) in artifacts {
        let problem = if !committed.contains(hash) {
            "is not one the journal committed"
        } else if artifact_hash(&record.content) != *hash {
            "holds content of another hash"
        } else {
            continue;
        };
        return Err(ImportRefusal::BadArtifact {
            hash: hash.hex(),
            problem,
        });
    }
    Ok(())
}

/// The journal with each effect's recorded key rebased from `owner` to `workflow_id`, as its
/// code derives them there.
fn rebase_journal(entries: Vec<Entry>, owner: &str, workflow_id: &str) -> Vec<Entry> {
    let rebased = entries.into_iter();
    rebased
        .map(|entry| rebase_entry(entry, owner, workflow_id))
        .collect()
}

/// How an imported operation's last history event names where it came from: this, then the
/// exported workflow's id.
pub const IMPORTED_BY: &str = "imported:";

fn row(key: &[u8], record: Vec<u8>) -> Vec<u8> {
    let row = Row {
        key: key.to_vec(),
        record,
    };
    postcard::to_stdvec(&row).unwrap_or_default()
}

/// Where a frame's record is sealed: the export, the frame's kind and its place. The header,
/// which holds the export's id, is sealed under its kind alone.
fn context(export_id: Option<&[u8; 16]>, kind: u8, index: usize) -> Vec<u8> {
    let mut context = b"export3#".to_vec();
    if let Some(id) = export_id {
        context.extend_from_slice(id);
    }
    context.push(kind);
    context.extend_from_slice(&(index as u64).to_be_bytes());
    context
}

struct Writer<'a> {
    out: Vec<u8>,
    codec: Option<&'a dyn Codec>,
    export_id: [u8; 16],
    index: usize,
}

impl Writer<'_> {
    fn frame(&mut self, kind: u8, record: &[u8]) -> Result<(), CodecError> {
        let mut frame = vec![kind];
        match self.codec {
            Some(codec) => {
                let export = (kind != HEADER).then_some(&self.export_id);
                frame.push(SEALED);
                frame.extend(codec.encode(&context(export, kind, self.index), record)?);
            }
            None => {
                frame.push(PLAIN);
                frame.extend_from_slice(record);
            }
        }
        // A frame is one record of at most the payload limit and its key: far below 4 GiB.
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        self.out.extend_from_slice(&len.to_be_bytes());
        self.out.extend_from_slice(&frame);
        self.index += 1;
        Ok(())
    }
}

struct Reader<'a> {
    rest: &'a [u8],
    codec: Option<&'a dyn Codec>,
    index: usize,
    /// Whether the export is sealed, as its header is: then every frame is.
    sealed: Option<bool>,
    export_id: Option<[u8; 16]>,
}

impl<'a> Reader<'a> {
    fn new(rest: &'a [u8], codec: Option<&'a dyn Codec>) -> Self {
        Self {
            rest,
            codec,
            index: 0,
            sealed: None,
            export_id: None,
        }
    }

    fn export(mut self) -> Result<Export, (usize, DecodeError)> {
        let header: Header = self.record(HEADER)?;
        self.export_id = Some(header.export_id);
        let mut export = Export {
            source_id: Some(header.source_id),
            entries: Vec::new(),
            operations: Vec::new(),
            artifacts: Vec::new(),
        };
        for _ in 0..header.entries {
            export.entries.push(self.record(ENTRY)?);
        }
        for _ in 0..header.operations {
            let (key, record) = self.row(OPERATION)?;
            let key = String::from_utf8(key).map_err(|_| self.malformed("a key is not text"))?;
            export.operations.push((key, record));
        }
        for _ in 0..header.artifacts {
            let (hash, record) = self.row(ARTIFACT)?;
            let hash = <[u8; 32]>::try_from(hash).map_err(|_| self.malformed("a bad hash"))?;
            export.artifacts.push((Digest(hash), record));
        }
        if !self.rest.is_empty() {
            return Err(self.malformed("bytes after the frames the header counts"));
        }
        Ok(export)
    }

    fn malformed(&self, what: &str) -> (usize, DecodeError) {
        (self.index, DecodeError::Malformed(what.to_owned()))
    }

    /// The next frame's record, which must be of `kind`.
    fn record<T: Record>(&mut self, kind: u8) -> Result<T, (usize, DecodeError)> {
        let bytes = self.frame(kind)?;
        let decoded = decode_record(&bytes).map_err(|e| (self.index, e));
        self.index += 1;
        decoded
    }

    fn row<T: Record>(&mut self, kind: u8) -> Result<(Vec<u8>, T), (usize, DecodeError)> {
        let bytes = self.frame(kind)?;
        let row: Row = decode_exact(&bytes).map_err(|e| (self.index, e))?;
        let record = decode_record(&row.record).map_err(|e| (self.index, e))?;
        self.index += 1;
        Ok((row.key, record))
    }

    /// The next frame's record bytes, opened if sealed.
    fn frame(&mut self, kind: u8) -> Result<Vec<u8>, (usize, DecodeError)> {
        let Some((len, rest)) = self.rest.split_first_chunk::<4>() else {
            return Err(self.malformed("the export ends before the frames its header counts"));
        };
        let len = u32::from_be_bytes(*len) as usize;
        let frame = rest
            .get(..len)
            .ok_or_else(|| self.malformed("truncated frame"))?;
        self.rest = &rest[len..];
        let Some((&found, frame)) = frame.split_first() else {
            return Err(self.malformed("an empty frame"));
        };
        if found != kind {
            let (found, kind) = (found as char, kind as char);
            let message = format!("a frame of kind `{found}` where `{kind}` belongs");
            return Err((self.index, DecodeError::Malformed(message)));
        }
        let sealed = match frame.first() {
            Some(&PLAIN) => false,
            Some(&SEALED) => true,
            _ => return Err(self.malformed("a frame neither plain nor sealed")),
        };
        // A plain frame among sealed ones was not written by the export.
        if *self.sealed.get_or_insert(sealed) != sealed {
            return Err(self.malformed("sealed and plain frames mixed in one export"));
        }
        if !sealed {
            return Ok(frame[1..].to_vec());
        }
        let no_keys = (self.index, DecodeError::Sealed(CodecError::NoKeys));
        let codec = self.codec.ok_or(no_keys)?;
        let context = context(self.export_id.as_ref(), kind, self.index);
        let opened = codec.decode(&context, &frame[1..]);
        opened.map_err(|e| (self.index, DecodeError::Sealed(e)))
    }
}
