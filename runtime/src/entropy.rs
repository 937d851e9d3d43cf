//! Where recorded random values come from: the operating system by default, or a seed, so that
//! a simulation or a test gets the same values every time it runs.
//!
//! Only a first execution draws: replay reads the journal. A seeded source derives each value
//! from the seed, the workflow id, the command's seq and the draw's index, so it does not
//! depend on which workflow drew first.

use sha2::{Digest as _, Sha256};

use crate::journal::Seq;

/// A source of random values for `ctx.random` and `ctx.uuid`.
pub trait Entropy: Send + Sync + 'static {
    /// A random value for draw `index` of command `seq` of `workflow_id`.
    fn draw(&self, workflow_id: &str, seq: Seq, index: u32) -> u64;
}

/// The operating system's randomness: what a worker uses unless told otherwise.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsEntropy;

impl Entropy for OsEntropy {
    fn draw(&self, _workflow_id: &str, _seq: Seq, _index: u32) -> u64 {
        rand::random()
    }
}

/// Values derived from a seed: the same seed, workflow id and seq give the same value.
#[derive(Debug, Clone, Copy)]
pub struct SeededEntropy {
    seed: u64,
}

impl SeededEntropy {
    /// A source derived from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }
}

impl Entropy for SeededEntropy {
    fn draw(&self, workflow_id: &str, seq: Seq, index: u32) -> u64 {
        let mut hasher = Sha256::new();
        hasher.update(self.seed.to_be_bytes());
        hasher.update((workflow_id.len() as u64).to_be_bytes());
        hasher.update(workflow_id.as_bytes());
        hasher.update(seq.to_be_bytes());
        hasher.update(index.to_be_bytes());
        let digest = hasher.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_be_bytes(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_draw_depends_on_seed_workflow_seq_and_index_only() {
        let source = SeededEntropy::new(7);
        let value = source.draw("wf", 3, 0);
        assert_eq!(SeededEntropy::new(7).draw("wf", 3, 0), value);
        assert_ne!(SeededEntropy::new(8).draw("wf", 3, 0), value);
        assert_ne!(source.draw("wg", 3, 0), value);
        assert_ne!(source.draw("wf", 4, 0), value);
        assert_ne!(source.draw("wf", 3, 1), value);
    }
}
