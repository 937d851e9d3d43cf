//! Example workflows, shared by the example binaries and their tests.

pub mod bench;
pub mod bench_postgres;
pub mod crashloop;
pub mod desk;
pub mod fleet;
pub mod heap_count;
pub mod lines;
pub mod rebook;
pub mod shipment;
pub mod steps;
