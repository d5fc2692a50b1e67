//! After a fork: the `pthread_atfork` child handler that lets a forked
//! child reclaim as any process does (Linux), and the thread-locals it
//! reads to know the forking thread's own state.
//!
//! `fork` copies the whole address space but only the calling thread. In
//! the child every other thread's record is left as it stood: in use,
//! perhaps pinned (odd), and never to move on, so every batch the child
//! makes would wait for it; and if one of those threads held the batches'
//! lock, it stays held and no reclaim runs again. The handler, which the
//! child's only thread runs inside `fork` before it returns:
//!
//! 1. **Gives back every record in use but the forking thread's own** (its
//!    thread-local's, and the one its pins take while it exits): an odd
//!    number moves on to the next even one, the owner-only fields are set
//!    as a new owner expects them (`depth` 0, or a new owner's first pin
//!    would not store its odd number), and `in_use` is cleared. A batch
//!    that noted the record now sees it moved on; a thread the child
//!    starts may take the record.
//! 2. **Reinitialises the batches' lock if another thread held it**: it
//!    writes a new, unlocked, empty `Mutex` over the old one instead of
//!    unlocking it, since the vanished holder may have been halfway
//!    through changing the list. The old list is leaked with its batches
//!    and the chain the holder had in hand: what was retired before the
//!    fork, once, never anything the child retires.
//! 3. **Counts `pending` again** from what the child can still free (the
//!    retired stack and the batches), since items held by vanished threads
//!    will never be freed; unless the forking thread holds the lock itself
//!    (a key's `Drop` that forks while this thread reclaims): then the
//!    chain it is freeing is in its own hands, still counted, and both the
//!    lock and the count are left to it.
//!
//! Why each step is safe here:
//! - Only one thread exists, so nothing races the handler: its loads and
//!   stores, those to the owner-only `Cell`s of vanished owners included,
//!   are not data races. Each atomic in the copy holds a value its last
//!   writer stored whole, and a lock found free was released (`Release`)
//!   after its holder's last change to the list.
//! - A vanished thread never runs again, so nothing it held (a pin, a
//!   reference to the lock, a half-freed chain) is ever used: a batch that
//!   waited for its record may be freed, and the lock may be replaced
//!   while no live reference to it exists (the forking thread's own, if
//!   it holds one, is the case step 2 skips).
//! - The forking thread's own state is left alone: its records may be
//!   pinned right now (a key's `Hash` that forks), and its pins end later
//!   in the child as they would have in the parent. It finds them through
//!   `const` thread-locals without destructors, which are never torn down
//!   and need no lazy registration.
//! - It allocates nothing and waits for nothing: atomic and cell accesses,
//!   one `try_lock`, and a `const` `Mutex::new` (no heap, no syscall).
//! - membarrier's registration belongs to the address space, which the
//!   child copies: the child's heavy barrier works as the parent's did
//!   (checked on Linux 6.18: `MEMBARRIER_CMD_PRIVATE_EXPEDITED` returns 0
//!   in a child of a registered process).
//! - Nothing the child's pins or reclaims need waits on a one-time
//!   initialisation another thread may have been running at the fork:
//!   whether the barrier is expedited and whether the handler is installed
//!   are atomics, not `OnceLock`s (a child would wait in one for a thread
//!   that is gone).
//!
//! The handler is installed by the first registration of a record (before
//! then there is nothing to fix). Under Miri and loom, and off Linux, none
//! is installed and the functions here do nothing, except that an exiting
//! thread's pins take a record each, as a pin always did.

#[cfg(all(target_os = "linux", not(miri), not(turnstile_loom)))]
pub(super) use handled::*;
#[cfg(not(all(target_os = "linux", not(miri), not(turnstile_loom))))]
pub(super) use unhandled::*;

#[cfg(all(target_os = "linux", not(miri), not(turnstile_loom)))]
mod handled {
    use std::cell::Cell;
    use std::ptr;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Mutex, TryLockError};

    use super::super::{domain, Domain, Record, Retired, RECLAIM_EVERY};
    use crate::sync::Ordering;

    std::thread_local! {
        /// The record this thread's thread-local holds (null before its
        /// first pin and after it is given back at exit).
        static LOCAL_RECORD: Cell<*const Record> = const { Cell::new(ptr::null()) };
        /// The record this thread pins with once its thread-local is gone
        /// (null when it holds none).
        static EXITING_RECORD: Cell<*const Record> = const { Cell::new(ptr::null()) };
        /// Whether this thread holds the batches' lock.
        static HOLDS_BATCHES: Cell<bool> = const { Cell::new(false) };
    }

    /// Installs the child handler, once per process. Not through a
    /// `Once`: a child forked while another thread ran it would wait for a
    /// thread that is gone. A thread that registers while the first one is
    /// still installing goes on without waiting (a fork in that moment, at
    /// the process's first pins, finds no handler yet).
    pub(in super::super) fn install() {
        static INSTALLED: AtomicBool = AtomicBool::new(false);
        // Relaxed: nothing is published with the flag; it only elects the
        // one thread that installs.
        if INSTALLED.load(Ordering::Relaxed) || INSTALLED.swap(true, Ordering::Relaxed) {
            return;
        }
        // SAFETY: registers a plain `extern "C" fn()` that lives as long
        // as the program (this crate is never unloaded while running).
        let failed = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        // Only ENOMEM can fail it: then a forked child keeps what it
        // retires, as off Linux.
        let _ = failed;
    }

    /// Notes the record this thread's thread-local took.
    pub(in super::super) fn note_local(record: &'static Record) {
        LOCAL_RECORD.with(|cell| cell.set(record));
    }

    /// This thread's thread-local is giving its record back.
    pub(in super::super) fn forget_local() {
        LOCAL_RECORD.with(|cell| cell.set(ptr::null()));
    }

    /// The record for a pin of this thread once its thread-local is gone:
    /// the one its outer pins use, or a new one.
    pub(in super::super) fn exiting_record() -> &'static Record {
        EXITING_RECORD.with(|cell| {
            // SAFETY: records are never freed while the domain (a static)
            // lives.
            if let Some(record) = unsafe { cell.get().as_ref() } {
                return record;
            }
            let record = domain().register();
            cell.set(record);
            record
        })
    }

    /// The exiting record's outermost pin ended: it is given back.
    pub(in super::super) fn forget_exiting_record() {
        EXITING_RECORD.with(|cell| cell.set(ptr::null()));
    }

    /// Marks, while it lives, that this thread holds the batches' lock.
    pub(in super::super) struct HoldingBatches(());

    impl HoldingBatches {
        /// Called right after the lock is taken.
        pub(in super::super) fn note() -> Self {
            HOLDS_BATCHES.with(|cell| cell.set(true));
            HoldingBatches(())
        }
    }

    impl Drop for HoldingBatches {
        fn drop(&mut self) {
            HOLDS_BATCHES.with(|cell| cell.set(false));
        }
    }

    /// Forks this process is a child of, counted by the child handler:
    /// what a map compares with its own note to tell that its stripes of
    /// inserts in flight hold marks of vanished threads
    /// (`map::inflight`).
    static FORKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    /// See [`FORKS`].
    #[inline]
    pub(in super::super) fn forks() -> u64 {
        // Relaxed: the child handler wrote it before the child's code ran
        // again, on the one thread that then existed.
        FORKS.load(Ordering::Relaxed)
    }

    /// Whether the forking thread was pinned at the last fork: see
    /// `pin::pinned_at_fork`.
    static PINNED_AT_FORK: AtomicBool = AtomicBool::new(false);

    /// See [`PINNED_AT_FORK`].
    pub(in super::super) fn pinned_at_fork() -> bool {
        // Relaxed: as `forks`.
        PINNED_AT_FORK.load(Ordering::Relaxed)
    }

    /// The child handler (see the module docs).
    extern "C" fn in_child() {
        FORKS.fetch_add(1, Ordering::Relaxed);
        let own = [LOCAL_RECORD.with(Cell::get), EXITING_RECORD.with(Cell::get)];
        // SAFETY: `own` are this thread's records (or null), which the
        // domain never frees; their `depth` is this thread's to read.
        let pinned = own
            .iter()
            .any(|&record| unsafe { record.as_ref() }.is_some_and(|r| r.depth.get() > 0));
        PINNED_AT_FORK.store(pinned, Ordering::Relaxed);
        let holds_batches = HOLDS_BATCHES.with(Cell::get);
        // SAFETY: called by `fork` in the child, whose only thread is this
        // one; `own` and `holds_batches` are this thread's state.
        unsafe { domain().after_fork(own, holds_batches) };
    }

    impl Domain {
        /// Steps 1 to 3 of the module docs.
        ///
        /// # Safety
        /// Only the calling thread exists (a forked child), `own` holds
        /// every record it holds, and `holds_batches` says whether it holds
        /// the batches' lock.
        unsafe fn after_fork(&self, own: [*const Record; 2], holds_batches: bool) {
            let mut record = self.records.load(Ordering::Acquire);
            while !record.is_null() {
                // SAFETY: records are never freed while the domain lives.
                let r = unsafe { &*record };
                if !own.contains(&record.cast_const()) && r.in_use.load(Ordering::Acquire) {
                    // The owner vanished in the fork, and no other thread
                    // runs: its owner-only cells are ours to reset.
                    let sequence = r.sequence.load(Ordering::Relaxed);
                    if sequence % 2 == 1 {
                        r.sequence.store(sequence + 1, Ordering::Release);
                    }
                    r.depth.set(0);
                    r.countdown.set(RECLAIM_EVERY);
                    r.in_use.store(false, Ordering::Release);
                }
                record = r.next.cast_mut();
            }
            if holds_batches {
                return;
            }
            let held_by_vanished =
                matches!(self.batches().try_lock(), Err(TryLockError::WouldBlock));
            if held_by_vanished {
                // SAFETY: no reference to the lock is live: its holder
                // vanished and this thread holds none (`holds_batches` is
                // false, and the `try_lock` result is gone). The old list
                // is leaked, not dropped (`write` does not drop).
                unsafe { ptr::write(self.batches.get(), Mutex::new(Vec::new())) };
            }
            let batches = match self.batches().try_lock() {
                Ok(batches) => batches,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                // Unreachable: free or just made so, and no other thread.
                Err(TryLockError::WouldBlock) => return,
            };
            let reclaimable = chain_len(self.retired.load(Ordering::Acquire))
                + batches
                    .iter()
                    .map(|batch| chain_len(batch.items))
                    .sum::<usize>();
            // Relaxed: `pending` guards no data (see `Domain::pending`).
            self.pending.store(reclaimable, Ordering::Relaxed);
        }
    }

    /// Items in a chain of retired items (ending in null).
    fn chain_len(mut item: *mut Retired) -> usize {
        let mut len = 0;
        while !item.is_null() {
            len += 1;
            // SAFETY: the chain is on the stack or in a batch, unreachable
            // for any other thread (there is none), and its items are freed
            // only by a reclaimer holding the lock.
            item = unsafe { (*item).next };
        }
        len
    }
}

#[cfg(not(all(target_os = "linux", not(miri), not(turnstile_loom))))]
mod unhandled {
    use super::super::{domain, Record};

    /// No child handler here (see the module docs).
    pub(in super::super) fn install() {}

    /// No fork is ever counted without a child handler.
    #[cfg_attr(turnstile_loom, allow(dead_code))]
    #[inline]
    pub(in super::super) fn forks() -> u64 {
        0
    }

    /// No fork, so no thread pinned at one.
    #[cfg_attr(turnstile_loom, allow(dead_code))]
    pub(in super::super) fn pinned_at_fork() -> bool {
        false
    }

    pub(in super::super) fn note_local(_: &'static Record) {}

    pub(in super::super) fn forget_local() {}

    /// A record for this pin alone.
    pub(in super::super) fn exiting_record() -> &'static Record {
        domain().register()
    }

    pub(in super::super) fn forget_exiting_record() {}

    /// Nothing to mark without a child handler.
    pub(in super::super) struct HoldingBatches(());

    impl HoldingBatches {
        pub(in super::super) fn note() -> Self {
            HoldingBatches(())
        }
    }
}
