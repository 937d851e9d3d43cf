//! The Waymark engine: journal model, store, the sans-I/O replay cursor, the deterministic
//! executor and the worker. Applications depend on the `waymark` crate, which re-exports what
//! they need from here; this crate's surface is for that crate, the CLI and tools.
#![forbid(unsafe_code)]
#![warn(clippy::large_futures)]

pub mod approvals;
pub mod artifacts;
mod attempt_cell;
mod canonical;
pub mod clock;
pub mod codec;
pub mod compensations;
pub mod context;
pub mod entropy;
pub mod error;
mod executor;
pub mod export;
pub mod faults;
pub mod inbox;
pub mod journal;
pub mod keys;
pub mod lineage;
pub mod llm;
pub mod machines;
pub mod namespace;
pub mod operations;
pub mod options;
pub mod redact;
pub mod registry;
pub mod render;
pub mod replay;
pub mod replayer;
mod run;
pub mod store;
pub mod streams;
mod sync;
pub mod telemetry;
pub mod worker;
