//! The store's own write-ahead log: what makes a synced write durable, in place of RocksDB's.
//!
//! RocksDB appends to its log, and an `fdatasync` that must also make the file's new size
//! durable cost this machine's ext4 about half as much again as one that overwrites bytes
//! inside a file already that long (BENCHMARKS.md, "What a synced write pays for growing its
//! file"); RocksDB has no option to write its log otherwise. So every write is first a record
//! here, in one of two segments whose length is allocated when they are made, and only this
//! log is synced. RocksDB still writes its own log, unsynced: after a process crash it holds
//! every write (the page cache outlives the process), and a read-only view reads it as before.
//! After the machine itself stops, RocksDB recovers a prefix of its writes; the records here
//! past that prefix are applied again before the store serves anything.
//!
//! Each record carries the RocksDB sequence number its batch is written at, so that recovery
//! knows which records RocksDB already holds. A segment is written from its start again only
//! once RocksDB's log is synced past every record in it: when the active segment fills, the
//! other one takes the writes, and a thread syncs RocksDB's log, which frees the full one for
//! the next switch.
//!
//! A segment is a header of [`HEADER_BYTES`] (magic, format version, generation, checksum),
//! then records from [`RECORDS_START`]: the payload's length, a CRC-32 over the segment's
//! generation, the sequence number, the length and the payload, the sequence number, then the
//! payload (RocksDB's write batch as it is). A new generation makes every record written
//! under an older one fail its checksum, so a segment is emptied by one header write. Reading
//! stops at the first record that fails: a write torn by a crash was never acknowledged, nor
//! was any after it.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::store::StoreError;

/// The bytes of each segment: records are written until the next would not fit.
pub(super) const SEGMENT_BYTES: u64 = 16 << 20;

/// What a segment's header takes: one sector, so that a header write is not torn.
const HEADER_BYTES: usize = 512;

/// Where a segment's records begin: its first page is the header's alone.
const RECORDS_START: u64 = 4096;

/// A record's bytes before its payload: length, checksum, sequence number.
const RECORD_HEADER: usize = 16;

/// The record buffer kept between writes: one made for a larger batch is let go.
const SCRATCH_KEPT: usize = 64 << 10;

const MAGIC: &[u8; 8] = b"WAYMKLOG";
const FORMAT: u32 = 1;

/// A record read back from a segment.
pub(super) struct Record {
    /// The RocksDB sequence number of the batch's first write.
    pub(super) first_sequence: u64,
    /// RocksDB's write batch, as it was written.
    pub(super) batch: Vec<u8>,
}

/// What makes RocksDB's log durable past every write made so far.
pub(super) type SyncRocks = Arc<dyn Fn() -> Result<(), StoreError> + Send + Sync>;

/// The log of one open store: two segments, one taking writes.
pub(super) struct StoreLog {
    dir: PathBuf,
    segments: [Segment; 2],
    active: usize,
    /// Where the active segment's next record goes.
    offset: u64,
    segment_bytes: u64,
    /// The highest generation given to a segment.
    generation: u64,
    sync_rocks: SyncRocks,
    /// The sync of RocksDB's log that frees the segment written before the active one.
    freeing: Option<JoinHandle<Result<(), StoreError>>>,
    /// A record's bytes are made here, then written in one call.
    scratch: Vec<u8>,
    /// Set when a write failed part-way: what is on disk is no longer known, and the store
    /// takes no more writes until it is opened again (which reads the log back).
    failed: bool,
}

struct Segment {
    path: PathBuf,
    file: File,
    generation: u64,
    /// The file's length, where reading its records ends: a build that writes longer or
    /// shorter segments still reads a segment whole.
    length: u64,
}

impl StoreLog {
    /// Reads the log in `dir` back, handing `apply` every record on it, oldest first. Writes
    /// nothing: a store refused next is left as it was. Writes go to the log once
    /// [`Recovered::begin`] says RocksDB holds what `apply` wrote.
    pub(super) fn open(
        dir: &Path,
        segment_bytes: u64,
        mut apply: impl FnMut(Record) -> Result<Applied, StoreError>,
    ) -> Result<Recovered, StoreError> {
        let found = [
            Segment::existing(&segment_path(dir, 0))?,
            Segment::existing(&segment_path(dir, 1))?,
        ];
        let older_first = older_first(&found);
        let mut applied = Applied::Held;
        for segment in older_first
            .iter()
            .filter_map(|&index| found[index].as_ref())
        {
            let read = segment.read_records(&mut apply)?;
            applied = applied.max(read);
        }
        Ok(Recovered {
            dir: dir.to_owned(),
            segment_bytes,
            applied,
            found,
        })
    }

    /// Writes the record of `batch`, whose first write RocksDB numbers `first_sequence`,
    /// synced to disk when `sync`. When the active segment is full, the other one takes it.
    pub(super) fn append(
        &mut self,
        first_sequence: u64,
        batch: &[u8],
        sync: bool,
    ) -> Result<Appended, StoreError> {
        if self.failed {
            return Err(failed_before());
        }
        let length = (RECORD_HEADER + batch.len()) as u64;
        if RECORDS_START + length > self.segment_bytes {
            return Ok(Appended::TooLarge);
        }
        if self.offset + length > self.segment_bytes {
            self.switch()?;
        }
        let segment = &self.segments[self.active];
        encode_record(&mut self.scratch, segment.generation, first_sequence, batch);
        let written = write_at(&segment.file, &self.scratch, self.offset).and_then(|()| {
            if sync {
                segment.file.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(error) = written {
            self.failed = true;
            return Err(io_error(&segment.path, "writing", error));
        }
        if self.scratch.capacity() > SCRATCH_KEPT {
            self.scratch = Vec::new();
        }
        let at = self.offset;
        self.offset += length;
        Ok(Appended::At(at))
    }

    /// Makes every record written so far durable, for a synced write with nothing to write:
    /// one that only asks that the writes before it be durable.
    pub(super) fn sync(&mut self) -> Result<(), StoreError> {
        if self.failed {
            return Err(failed_before());
        }
        self.segments[self.active].sync()
    }

    /// Takes back the record written at `at`, which RocksDB then failed to apply: it must
    /// not be applied at the next open either. The log takes no more writes.
    pub(super) fn retract(&mut self, at: u64) {
        self.failed = true;
        let segment = &self.segments[self.active];
        let zeroed = write_at(&segment.file, &[0; RECORD_HEADER], at);
        if let Err(error) = zeroed.and_then(|()| segment.file.sync_data()) {
            tracing::error!(%error, "a record RocksDB did not apply could not be taken back");
        }
    }

    /// Moves the writes to the other segment, once RocksDB's log holds every record on it
    /// (the sync started when the writes last left it), and starts the sync that frees the
    /// segment left.
    fn switch(&mut self) -> Result<(), StoreError> {
        // A synced write makes every write before it durable. Those of the segment left may
        // be unsynced, and RocksDB's log is not synced yet either: a sync of the next segment
        // alone would not cover them.
        let left = self.sync();
        if let Err(error) = left.and_then(|()| self.wait_for_freeing()) {
            self.failed = true;
            return Err(error);
        }
        let sync_rocks = Arc::clone(&self.sync_rocks);
        let spawned = std::thread::Builder::new()
            .name("waymark-log-sync".into())
            .spawn(move || sync_rocks());
        let spawned = spawned.map_err(|e| StoreError::Backend(format!("spawning: {e}")));
        self.freeing = Some(spawned.inspect_err(|_| self.failed = true)?);
        self.active = 1 - self.active;
        self.empty_active()
    }

    fn wait_for_freeing(&mut self) -> Result<(), StoreError> {
        let Some(freeing) = self.freeing.take() else {
            return Ok(());
        };
        let panicked = || Err(StoreError::Backend("syncing RocksDB's log panicked".into()));
        freeing.join().unwrap_or_else(|_| panicked())
    }

    /// Makes both segments anew, their blocks too: what `rekey` replaced must not stay on
    /// disk in a record. RocksDB must hold every record on them.
    pub(super) fn remake(&mut self) -> Result<(), StoreError> {
        if self.failed {
            return Err(failed_before());
        }
        // Until both are made anew, what the segments hold is not known.
        self.failed = true;
        self.wait_for_freeing()?;
        (self.sync_rocks)()?;
        for number in 0..2 {
            let path = &self.segments[number].path;
            std::fs::remove_file(path).map_err(|e| io_error(path, "removing", e))?;
            self.segments[number] = Segment::make(&self.dir, number as u8, self.segment_bytes)?;
        }
        self.active = 0;
        self.failed = false;
        self.empty_active()
    }

    /// A write that panicked part-way (the lock it held was poisoned) leaves the log in a
    /// state that is not known: it takes no more writes.
    pub(super) fn poisoned(&mut self) {
        self.failed = true;
    }

    /// Empties both segments, RocksDB holding every record durably (its memtables were just
    /// flushed): the next open has no record to read back. The active one is emptied first,
    /// so that it holds the older generation and the next open writes into it again: the
    /// blocks it wrote are no longer `fallocate`'s unwritten ones, whose first write costs a
    /// sync as much as an append does.
    pub(super) fn empty_both(&mut self) -> Result<(), StoreError> {
        self.wait_for_freeing()?;
        self.empty_active()?;
        self.active = 1 - self.active;
        self.empty_active()?;
        self.active = 1 - self.active;
        self.segments.iter().try_for_each(Segment::sync)
    }

    /// Gives the active segment a new generation, which empties it, and writes from its
    /// start. The header is not synced here: the next sync of the segment makes it durable
    /// with the records written after it (one sync of the file covers both). Until then the
    /// disk may hold the old header, under which the new records do not read back (none was
    /// acknowledged) and the old ones are all held by RocksDB already (a segment is emptied
    /// only then), or the new one, under which the old records do not read back.
    fn empty_active(&mut self) -> Result<(), StoreError> {
        self.generation += 1;
        let segment = &mut self.segments[self.active];
        segment.generation = self.generation;
        let written = segment.write_header();
        if written.is_err() {
            self.failed = true;
        }
        self.offset = RECORDS_START;
        written
    }
}

/// What the store's tests look at.
#[cfg(test)]
impl StoreLog {
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    pub(super) fn offset(&self) -> u64 {
        self.offset
    }

    pub(super) fn room(&self) -> u64 {
        self.segment_bytes - self.offset
    }

    pub(super) fn active(&self) -> usize {
        self.active
    }

    pub(super) fn synced_rocks(&mut self) -> Result<(), StoreError> {
        self.wait_for_freeing()
    }

    pub(super) fn set_sync_rocks(&mut self, sync_rocks: SyncRocks) {
        self.sync_rocks = sync_rocks;
    }
}

/// Waits for a sync of RocksDB's log still running: the store is closing.
impl Drop for StoreLog {
    fn drop(&mut self) {
        if let Err(error) = self.wait_for_freeing() {
            tracing::error!(%error, "syncing RocksDB's log failed as the store closed");
        }
    }
}

/// A log read back at open, which takes no writes yet.
pub(super) struct Recovered {
    dir: PathBuf,
    segment_bytes: u64,
    /// Whether RocksDB was given writes again, which its log does not hold durably yet.
    pub(super) applied: Applied,
    /// The segments that read (a missing one, or one whose header does not, is none).
    found: [Option<Segment>; 2],
}

impl Recovered {
    /// Starts taking writes, into the segment of older records, emptied (making a segment
    /// that is missing). RocksDB must hold every record durably: the other segment's records
    /// are kept until the writes first switch to it, after `sync_rocks` (which makes
    /// RocksDB's log durable) ran on a thread.
    pub(super) fn begin(self, sync_rocks: SyncRocks) -> Result<StoreLog, StoreError> {
        let active = older_first(&self.found)[0];
        let generation = self.found.iter().flatten().map(|s| s.generation).max();
        let [first, second] = self.found;
        let made = |found: Option<Segment>, number| match found {
            Some(segment) => Ok(segment),
            None => Segment::make(&self.dir, number, self.segment_bytes),
        };
        let mut log = StoreLog {
            segments: [made(first, 0)?, made(second, 1)?],
            dir: self.dir,
            active,
            offset: RECORDS_START,
            segment_bytes: self.segment_bytes,
            generation: generation.unwrap_or(0),
            sync_rocks,
            freeing: None,
            scratch: Vec::new(),
            failed: false,
        };
        log.empty_active()?;
        Ok(log)
    }
}

/// The segments' numbers, the one of older records first (a missing one before both).
fn older_first(found: &[Option<Segment>; 2]) -> [usize; 2] {
    let generation = |index: usize| found[index].as_ref().map(|segment| segment.generation);
    match generation(0) <= generation(1) {
        true => [0, 1],
        false => [1, 0],
    }
}

fn segment_path(dir: &Path, number: u8) -> PathBuf {
    dir.join(format!("WAYMARK-LOG-{number}"))
}

/// What a record read back at open asked of RocksDB, the later the stronger.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Applied {
    /// RocksDB held its writes already.
    Held,
    /// Its writes were written again.
    Written,
}

/// Where [`StoreLog::append`] left a batch.
pub(super) enum Appended {
    /// Its record starts at this offset of the active segment.
    At(u64),
    /// It is larger than a segment: RocksDB must write it synced, to its own log.
    TooLarge,
}

impl Segment {
    /// Makes segment `number` in `dir` anew, its length allocated. One whose header does not
    /// read is replaced: a header is only torn while it is being emptied, which happens once
    /// RocksDB holds its records.
    fn make(dir: &Path, number: u8, segment_bytes: u64) -> Result<Segment, StoreError> {
        let path = segment_path(dir, number);
        let _ = std::fs::remove_file(&path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io_error(&path, "making", e))?;
        allocate(&file, segment_bytes).map_err(|e| io_error(&path, "allocating", e))?;
        let segment = Segment {
            path,
            file,
            generation: 0,
            length: segment_bytes,
        };
        segment.write_header()?;
        // The allocation and the length with the header: the file's metadata too.
        let synced = segment.file.sync_all();
        synced.map_err(|e| io_error(&segment.path, "syncing", e))?;
        sync_dir(dir)?;
        Ok(segment)
    }

    fn existing(path: &Path) -> Result<Option<Segment>, StoreError> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(path, "opening", e)),
        };
        let mut header = [0u8; HEADER_BYTES];
        let read = read_at(&file, &mut header, 0).map_err(|e| io_error(path, "reading", e))?;
        let decoded = decode_header(&header).map_err(|format| newer_format(path, format))?;
        let Some(generation) = decoded else {
            // A segment made but not yet given its header (its blocks read as zeros) is made
            // again; any other is refused, since its records, if any, cannot be read.
            if header[..read].iter().all(|&byte| byte == 0) {
                return Ok(None);
            }
            return Err(StoreError::Backend(format!(
                "the header of the store's log {} does not read: its records cannot be checked",
                path.display()
            )));
        };
        let length = file
            .metadata()
            .map_err(|e| io_error(path, "reading", e))?
            .len();
        Ok(Some(Segment {
            path: path.to_owned(),
            file,
            generation,
            length,
        }))
    }

    fn sync(&self) -> Result<(), StoreError> {
        let synced = self.file.sync_data();
        synced.map_err(|e| io_error(&self.path, "syncing", e))
    }

    fn write_header(&self) -> Result<(), StoreError> {
        let header = encode_header(self.generation);
        let written = write_at(&self.file, &header, 0);
        written.map_err(|e| io_error(&self.path, "writing the header of", e))
    }

    /// Hands `apply` each record of this segment's generation, up to the first that does not
    /// read back whole.
    fn read_records(
        &self,
        apply: &mut impl FnMut(Record) -> Result<Applied, StoreError>,
    ) -> Result<Applied, StoreError> {
        let mut reader = Chunks::new(&self.file, self.length);
        // The next record's writes start at or past this sequence number.
        let (mut next_sequence, mut applied) = (1, Applied::Held);
        loop {
            let head = reader
                .read(RECORD_HEADER)
                .map_err(|e| io_error(&self.path, "reading", e))?;
            let Some(head) = head.map(<[u8]>::to_vec) else {
                return Ok(applied);
            };
            let length = u32::from_le_bytes(head[0..4].try_into().unwrap_or_default()) as usize;
            let checksum = u32::from_le_bytes(head[4..8].try_into().unwrap_or_default());
            let first_sequence = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
            if length == 0 || first_sequence < next_sequence {
                return Ok(applied);
            }
            let Some(batch) = reader
                .read(length)
                .map_err(|e| io_error(&self.path, "reading", e))?
            else {
                return Ok(applied);
            };
            if record_checksum(self.generation, first_sequence, batch) != checksum {
                return Ok(applied);
            }
            let count = batch_count(batch).unwrap_or(0);
            let Some(next) = first_sequence.checked_add(count).filter(|_| count > 0) else {
                return Ok(applied);
            };
            next_sequence = next;
            let batch = batch.to_vec();
            let record = Record {
                first_sequence,
                batch,
            };
            applied = applied.max(apply(record)?);
        }
    }
}

/// A segment read from [`RECORDS_START`] in reads that grow: an emptied segment, what an open
/// after a clean close finds, costs one small read.
struct Chunks<'a> {
    file: &'a File,
    end: u64,
    /// The next read's length.
    chunk: usize,
    buffer: Vec<u8>,
    /// The file offset of `buffer`'s first byte.
    buffer_at: u64,
    /// The next byte to hand out, within `buffer`.
    next: usize,
}

impl<'a> Chunks<'a> {
    const FIRST_CHUNK: usize = 4 << 10;
    const LARGEST_CHUNK: usize = 1 << 20;

    fn new(file: &'a File, end: u64) -> Self {
        Chunks {
            file,
            end,
            chunk: Self::FIRST_CHUNK,
            buffer: Vec::new(),
            buffer_at: RECORDS_START,
            next: 0,
        }
    }

    /// The next `length` bytes, or none when the segment ends first.
    fn read(&mut self, length: usize) -> std::io::Result<Option<&[u8]>> {
        if self.buffer.len() - self.next < length {
            let from = self.buffer_at + self.next as u64;
            if self.end.saturating_sub(from) < length as u64 {
                return Ok(None);
            }
            let wanted = length.max(self.chunk).min((self.end - from) as usize);
            self.chunk = (self.chunk * 2).min(Self::LARGEST_CHUNK);
            self.buffer.resize(wanted, 0);
            let read = read_at(self.file, &mut self.buffer, from)?;
            self.buffer.truncate(read);
            self.buffer_at = from;
            self.next = 0;
            if read < length {
                return Ok(None);
            }
        }
        let bytes = &self.buffer[self.next..self.next + length];
        self.next += length;
        Ok(Some(bytes))
    }
}

/// How many writes a RocksDB write batch holds, each taking one sequence number: its header
/// is a sequence number (8 bytes), then this count (4, little-endian).
pub(super) fn batch_count(batch: &[u8]) -> Option<u64> {
    let count = batch.get(8..12)?;
    Some(u32::from_le_bytes([count[0], count[1], count[2], count[3]]).into())
}

fn encode_header(generation: u64) -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[0..8].copy_from_slice(MAGIC);
    header[8..12].copy_from_slice(&FORMAT.to_le_bytes());
    header[12..20].copy_from_slice(&generation.to_le_bytes());
    let checksum = crc32fast::hash(&header[..20]);
    header[20..24].copy_from_slice(&checksum.to_le_bytes());
    header
}

/// The generation a header names, if it reads; the format it names, if not this build's.
fn decode_header(header: &[u8; HEADER_BYTES]) -> Result<Option<u64>, u32> {
    let word = |at: usize| {
        u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    if &header[0..8] != MAGIC || crc32fast::hash(&header[..20]) != word(20) {
        return Ok(None);
    }
    match word(8) {
        FORMAT => Ok(Some(u64::from(word(12)) | u64::from(word(16)) << 32)),
        other => Err(other),
    }
}

fn encode_record(into: &mut Vec<u8>, generation: u64, first_sequence: u64, batch: &[u8]) {
    into.clear();
    into.extend_from_slice(&(batch.len() as u32).to_le_bytes());
    let checksum = record_checksum(generation, first_sequence, batch);
    into.extend_from_slice(&checksum.to_le_bytes());
    into.extend_from_slice(&first_sequence.to_le_bytes());
    into.extend_from_slice(batch);
}

fn record_checksum(generation: u64, first_sequence: u64, batch: &[u8]) -> u32 {
    let mut checksum = crc32fast::Hasher::new();
    checksum.update(&generation.to_le_bytes());
    checksum.update(&first_sequence.to_le_bytes());
    checksum.update(&(batch.len() as u32).to_le_bytes());
    checksum.update(batch);
    checksum.finalize()
}

/// Gives `file` its length with its blocks allocated, so that a record written into it
/// changes no size: the sync that follows then writes the record's block alone. Not synced:
/// [`Segment::make`] syncs the file once its header is written.
fn allocate(file: &File, bytes: u64) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let allocated = rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, bytes);
        match allocated {
            Ok(()) => return Ok(()),
            // A file system without `fallocate` (tmpfs before Linux 3.5, some network ones):
            // the length alone is set.
            Err(rustix::io::Errno::OPNOTSUPP) => {}
            Err(error) => return Err(error.into()),
        }
    }
    file.set_len(bytes)
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    let synced = File::open(dir).and_then(|dir| dir.sync_all());
    synced.map_err(|e| io_error(dir, "syncing", e))
}

#[cfg(unix)]
fn write_at(file: &File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::write_all_at(file, bytes, offset)
}

#[cfg(windows)]
fn write_at(file: &File, mut bytes: &[u8], mut offset: u64) -> std::io::Result<()> {
    while !bytes.is_empty() {
        let written = std::os::windows::fs::FileExt::seek_write(file, bytes, offset)?;
        bytes = &bytes[written..];
        offset += written as u64;
    }
    Ok(())
}

#[cfg(unix)]
fn read_at(file: &File, into: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut read = 0;
    while read < into.len() {
        match std::os::unix::fs::FileExt::read_at(file, &mut into[read..], offset + read as u64) {
            Ok(0) => break,
            Ok(more) => read += more,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(read)
}

#[cfg(windows)]
fn read_at(file: &File, into: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut read = 0;
    while read < into.len() {
        match std::os::windows::fs::FileExt::seek_read(
            file,
            &mut into[read..],
            offset + read as u64,
        ) {
            Ok(0) => break,
            Ok(more) => read += more,
            Err(e) => return Err(e),
        }
    }
    Ok(read)
}

fn io_error(path: &Path, doing: &str, error: std::io::Error) -> StoreError {
    StoreError::Backend(format!(
        "{doing} the store's log {}: {error}",
        path.display()
    ))
}

/// A segment written by a newer build is refused, not made anew over records this build
/// cannot read.
fn newer_format(path: &Path, format: u32) -> StoreError {
    StoreError::Backend(format!(
        "the store's log {} is in format {format}, which this build does not read (it reads {FORMAT})",
        path.display()
    ))
}

fn failed_before() -> StoreError {
    StoreError::Backend(
        "an earlier write to the store's log failed: the store takes no more writes until it \
         is opened again"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(dir: &Path) -> Vec<(u64, Vec<u8>)> {
        let mut read = Vec::new();
        let recovered = StoreLog::open(dir, 64 << 10, |record| {
            read.push((record.first_sequence, record.batch));
            Ok(Applied::Held)
        });
        drop(recovered.unwrap());
        read
    }

    fn records_of(log: &StoreLog) -> usize {
        let mut count = 0;
        for segment in &log.segments {
            let counted = segment.read_records(&mut |_| {
                count += 1;
                Ok(Applied::Held)
            });
            counted.unwrap();
        }
        count
    }

    fn begun(dir: &Path) -> StoreLog {
        let recovered = StoreLog::open(dir, 64 << 10, |_| Ok(Applied::Held)).unwrap();
        recovered.begin(Arc::new(|| Ok(()))).unwrap()
    }

    #[test]
    fn records_read_back_in_order_up_to_the_first_torn_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = begun(dir.path());
        let mut ends = Vec::new();
        for sequence in 1..=3u64 {
            log.append(sequence * 10, &batch_of(sequence * 10), true)
                .ok()
                .unwrap();
            ends.push(log.offset);
        }
        let (active, path) = (log.active, log.segments[log.active].path.clone());
        drop(log);
        let read = records(dir.path());
        assert_eq!(read.iter().map(|r| r.0).collect::<Vec<_>>(), [10, 20, 30]);
        assert_eq!(read[1].1, batch_of(20));
        // The last record's final byte never reached the disk.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        write_at(&file, &[0], ends[2] - 1).unwrap();
        assert_eq!(records(dir.path()).len(), 2, "segment {active}");
    }

    #[test]
    fn an_emptied_segment_reads_none_of_its_earlier_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = begun(dir.path());
        log.append(1, &batch_of(1), true).ok().unwrap();
        drop(log);
        assert_eq!(records(dir.path()).len(), 1);
        // Each open empties the segment of older records, then writes into it: the second
        // empties the one that held the record, and one written after it is read alone.
        drop(begun(dir.path()));
        assert_eq!(
            records(dir.path()).len(),
            1,
            "the other segment was emptied"
        );
        let mut log = begun(dir.path());
        assert_eq!(records_of(&log), 0);
        log.append(5, &batch_of(5), true).ok().unwrap();
        drop(log);
        assert_eq!(
            records(dir.path()).iter().map(|r| r.0).collect::<Vec<_>>(),
            [5]
        );
    }

    #[test]
    fn a_batch_larger_than_a_segment_is_left_to_rocksdb() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = begun(dir.path());
        let appended = log.append(1, &vec![0; 64 << 10], true).ok().unwrap();
        assert!(matches!(appended, Appended::TooLarge));
        assert_eq!(log.offset, RECORDS_START);
    }

    #[test]
    fn a_segment_of_a_newer_format_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        drop(begun(dir.path()));
        let mut header = encode_header(7);
        header[8..12].copy_from_slice(&(FORMAT + 1).to_le_bytes());
        let checksum = crc32fast::hash(&header[..20]);
        header[20..24].copy_from_slice(&checksum.to_le_bytes());
        let path = segment_path(dir.path(), 1);
        write_at(
            &OpenOptions::new().write(true).open(&path).unwrap(),
            &header,
            0,
        )
        .unwrap();
        let refused = StoreLog::open(dir.path(), 64 << 10, |_| Ok(Applied::Held))
            .err()
            .unwrap();
        assert!(refused.to_string().contains("is in format 2"), "{refused}");
        let mut kept = [0u8; HEADER_BYTES];
        read_at(&File::open(&path).unwrap(), &mut kept, 0).unwrap();
        assert_eq!(kept, header);
    }

    /// The writes go back to a segment only once the sync of RocksDB's log started when they
    /// left it has ended: until then, the write that would switch waits.
    #[test]
    fn a_segment_is_written_again_only_once_rocksdbs_log_is_synced_past_it() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let recovered = StoreLog::open(dir.path(), 8 << 10, |_| Ok(Applied::Held)).unwrap();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let released = std::sync::Mutex::new(released);
        let sync_rocks: SyncRocks = Arc::new(move || {
            let _ = released.lock().unwrap().recv();
            Ok(())
        });
        let mut log = recovered.begin(sync_rocks).unwrap();
        // Dropped before the log, whose drop waits for the syncs it holds back.
        let release = release;
        let first = log.generation;
        let mut sequence = 1;
        // Into the second segment: its sync of RocksDB's log is held.
        while log.generation == first {
            log.append(sequence, &batch_of(sequence), true)
                .ok()
                .unwrap();
            sequence += 1;
        }
        let switched = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let second = log.generation;
                while log.generation == second {
                    log.append(sequence, &batch_of(sequence), true)
                        .ok()
                        .unwrap();
                    sequence += 1;
                }
                switched.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(300));
            assert!(
                !switched.load(Ordering::SeqCst),
                "switched before RocksDB's log was synced"
            );
            release.send(()).unwrap();
            release.send(()).unwrap();
        });
        assert!(switched.load(Ordering::SeqCst));
    }

    /// A RocksDB write batch of one write, numbered `sequence`: 12 bytes of header, then a
    /// few of payload.
    fn batch_of(sequence: u64) -> Vec<u8> {
        let mut batch = sequence.to_le_bytes().to_vec();
        batch.extend_from_slice(&1u32.to_le_bytes());
        batch.extend_from_slice(&[7; 300]);
        batch
    }

    #[test]
    fn a_segment_whose_header_does_not_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(begun(dir.path()));
        let path = segment_path(dir.path(), 0);
        write_at(
            &OpenOptions::new().write(true).open(&path).unwrap(),
            &[0xff],
            13,
        )
        .unwrap();
        let refused = StoreLog::open(dir.path(), 64 << 10, |_| Ok(Applied::Held))
            .err()
            .unwrap();
        assert!(refused.to_string().contains("does not read"), "{refused}");
        // A segment made but not given its header yet is made again.
        write_at(
            &OpenOptions::new().write(true).open(&path).unwrap(),
            &[0; HEADER_BYTES],
            0,
        )
        .unwrap();
        drop(begun(dir.path()));
    }
}
