//! A global allocator that counts the Rust heap's allocations and bytes, cheaply enough to stay
//! on while the benchmark times its figures.
//!
//! A counter every thread bumps with a locked instruction (what a shared counting allocator
//! does) costs each allocation and each free a read-modify-write of a shared cache line: about
//! a fifth of the replay figure's time was spent there. Here each thread counts in a block of
//! its own with plain loads and stores, and a reading sums the blocks of every thread that ever
//! allocated. Blocks are never freed, so the counts of a thread that exited stay in the sums;
//! each thread ever started keeps its 64 bytes, and a reading walks them all.
//!
//! The thread-local it reads must not allocate: it is const-initialised and has no destructor,
//! which on the targets with native thread-locals (Linux, macOS, Windows) it never does.
//!
//! The one module of the workspace allowed unsafe code: a global allocator cannot be written
//! without it. Only the benchmark binary installs it; the crates users depend on forbid unsafe
//! code.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// The system allocator, counted.
pub struct CountingAllocator;

/// What the Rust heap has done so far, summed over every thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapCounts {
    /// Allocations, reallocations included.
    pub allocations: usize,
    /// Bytes allocated (a reallocation counts its new size).
    pub bytes_allocated: usize,
    /// Bytes freed (a reallocation counts its old size).
    pub bytes_freed: usize,
}

impl HeapCounts {
    /// Bytes the heap holds now: what was allocated and not freed.
    pub fn live_bytes(&self) -> usize {
        self.bytes_allocated.saturating_sub(self.bytes_freed)
    }
}

/// The counts so far. Threads go on counting while they are summed: each block is read as it
/// stands.
pub fn heap_counts() -> HeapCounts {
    let mut sum = HeapCounts::default();
    let mut block = THREADS.load(Ordering::Acquire);
    // SAFETY: blocks are published whole (their `next` set before the release that publishes
    // them) and never freed.
    while let Some(counts) = unsafe { block.as_ref() } {
        sum.allocations += counts.allocations.load(Ordering::Relaxed);
        sum.bytes_allocated += counts.bytes_allocated.load(Ordering::Relaxed);
        sum.bytes_freed += counts.bytes_freed.load(Ordering::Relaxed);
        block = counts.next;
    }
    sum
}

/// One thread's counts: written by that thread alone, read by any. A cache line of its own,
/// so that no other thread's counting writes to it.
#[repr(align(64))]
struct ThreadCounts {
    allocations: AtomicUsize,
    bytes_allocated: AtomicUsize,
    bytes_freed: AtomicUsize,
    /// The block published before this one; fixed once this one is published.
    next: *mut ThreadCounts,
}

/// The last block published: the head of a list of every thread's block.
static THREADS: AtomicPtr<ThreadCounts> = AtomicPtr::new(ptr::null_mut());

thread_local! {
    // Const-initialised and without a destructor: reading it never allocates, as an
    // allocator's own state must not.
    static OWN: Cell<*const ThreadCounts> = const { Cell::new(ptr::null()) };
}

/// This thread's block, published at its first allocation; `None` if the system had no memory
/// for it (that thread then goes uncounted).
fn own_counts() -> Option<&'static ThreadCounts> {
    let block = OWN
        .try_with(|own| {
            if own.get().is_null() {
                own.set(publish_block());
            }
            own.get()
        })
        .ok()?;
    // SAFETY: a published block is never freed, and is only written through atomics.
    unsafe { block.as_ref() }
}

fn publish_block() -> *const ThreadCounts {
    // SAFETY: a non-zero-sized layout. All zeroes is a valid `ThreadCounts`: counts of zero and
    // a null `next`.
    let block =
        unsafe { System.alloc_zeroed(Layout::new::<ThreadCounts>()) }.cast::<ThreadCounts>();
    if block.is_null() {
        return block;
    }
    let mut head = THREADS.load(Ordering::Relaxed);
    loop {
        // SAFETY: the block is not published yet: this thread alone sees it.
        unsafe { (*block).next = head };
        match THREADS.compare_exchange_weak(head, block, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return block,
            Err(current) => head = current,
        }
    }
}

/// Adds `by` to a counter only this thread writes: a plain load and store, no locked
/// instruction.
fn bump(counter: &AtomicUsize, by: usize) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

fn count(allocated: usize, freed: usize) {
    if let Some(counts) = own_counts() {
        if allocated > 0 {
            bump(&counts.allocations, 1);
            bump(&counts.bytes_allocated, allocated);
        }
        bump(&counts.bytes_freed, freed);
    }
}

// SAFETY: every call goes to `System` unchanged; the counting beside it allocates nothing
// through this allocator (a thread's block comes from `System` directly).
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            count(layout.size(), 0);
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let block = unsafe { System.alloc_zeroed(layout) };
        if !block.is_null() {
            count(layout.size(), 0);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(block, layout) };
        count(0, layout.size());
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            count(new_size, layout.size());
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test, so that no other test of this binary counts meanwhile: the binary's own global
    /// allocator is the system's, and only these calls count.
    #[test]
    fn the_allocator_counts_every_call_of_every_thread() {
        let before = heap_counts();
        let layout = Layout::from_size_align(100, 8).unwrap();
        // SAFETY: a non-zero-sized layout; the block is reallocated and freed with the layout
        // it has, once.
        unsafe {
            let block = CountingAllocator.alloc(layout);
            assert!(!block.is_null());
            let grown = CountingAllocator.realloc(block, layout, 300);
            assert!(!grown.is_null());
            let grown_layout = Layout::from_size_align(300, 8).unwrap();
            CountingAllocator.dealloc(grown, grown_layout);
        }
        std::thread::spawn(|| count(40, 0)).join().unwrap();
        let after = heap_counts();
        let counted = HeapCounts {
            allocations: after.allocations - before.allocations,
            bytes_allocated: after.bytes_allocated - before.bytes_allocated,
            bytes_freed: after.bytes_freed - before.bytes_freed,
        };
        // The allocation, the reallocation, and the other thread's allocation (which exited).
        let expected = HeapCounts {
            allocations: 3,
            bytes_allocated: 100 + 300 + 40,
            bytes_freed: 100 + 300,
        };
        assert_eq!(counted, expected);
        assert_eq!(counted.live_bytes(), 40);
        let freed_more = HeapCounts {
            bytes_freed: 50,
            ..HeapCounts::default()
        };
        assert_eq!(freed_more.live_bytes(), 0, "never below zero");
    }
}
