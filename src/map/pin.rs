//! Pinning the maps' tables on any thread without a locked instruction,
//! and freeing the tables they retire once no thread can hold them.
//!
//! A check pins, reads the map's root table, updates one cell and unpins.
//! crossbeam-epoch's pin is a `lock cmpxchg` (a full fence, so the
//! reclaimer sees the pin before the reader reads a pointer): about a fifth
//! of a check (issue 22's profile). This is the same protocol with that
//! fence moved to the side that runs once per retired table, the
//! reclaimer, as liburcu's default flavour does:
//!
//! - **Pin**: a thread stores an odd sequence number in its record, then a
//!   *light* barrier (a compiler fence) before it reads any table pointer.
//!   **Unpin**: it stores the next, even number (`Release`, so everything
//!   it read comes before).
//! - **Retire**: a table unreachable from its map's root is pushed on one
//!   stack. **Reclaim**: a thread takes the stack, runs a *heavy* barrier
//!   (`membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`: every running thread
//!   of the process executes a full fence), then notes every record holding
//!   an odd number. The batch is freed once each of those records has moved
//!   on from the number noted.
//!
//! Why that is enough: the table was unlinked before the heavy barrier. A
//! reader whose pin was not visible to the scan made that store after the
//! barrier's fence on its core, so its read of the root comes after it too
//! and finds the successor; a reader whose pin was visible is waited for.
//! A record's numbers only grow, so "moved on" cannot be confused with a
//! later pin. Where `membarrier` is missing (not Linux, a seccomp filter, an
//! old kernel), under Miri and under loom, both barriers are `SeqCst`
//! fences: the reader pays what crossbeam's pin pays, and the argument is
//! C++'s fence-to-fence rule. The loom models run that form; the two forms
//! differ only in who executes the reader's fence.
//!
//! A thread that sleeps holds an even number and holds nothing back, so
//! memory stays bounded whatever threads do; a pin lasts one operation
//! (a check, a batch, a multi-limit check, a housekeeping step), the only
//! user code inside one being a key's `Hash`, `Eq`, `Clone` and `Drop`.
//! Retired tables are freed by the retiring thread's next unpin, or by any
//! thread's unpin within [`RECLAIM_EVERY`] of its own.
//!
//! After a fork only the forking thread lives on in the child, with a copy
//! of every other thread's record as it stood: one pinned at the fork
//! would look pinned forever, and a `batches` lock held at the fork would
//! stay held, so the child would free nothing more. On Linux a
//! `pthread_atfork` child handler ([`fork`]) gives those records back and
//! reinitialises that lock, so a child reclaims as any process does; its
//! argument is in that module. On other platforms no handler is installed,
//! and a child forked while another thread was pinned or reclaiming keeps
//! every table it retires from then on (a child forked from a quiet
//! process, or one that calls `exec`, is not affected).
//!
//! The map still uses crossbeam-epoch's `Atomic` and `Shared` for its table
//! pointers; their guard parameter is crossbeam's unprotected guard, which
//! only [`Guard`] hands out, so a `Shared` cannot outlive the pin it was
//! loaded under.

mod fork;

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr;
use std::sync::TryLockError;

use crate::sync::{fence, AtomicU64, AtomicUsize, Ordering};

#[cfg(not(turnstile_loom))]
use std::sync::atomic::{AtomicBool, AtomicPtr};
#[cfg(not(turnstile_loom))]
use std::sync::Mutex;
#[cfg(not(turnstile_loom))]
use std::thread_local;

#[cfg(turnstile_loom)]
use loom::sync::atomic::{AtomicBool, AtomicPtr};
#[cfg(turnstile_loom)]
use loom::sync::Mutex;
#[cfg(turnstile_loom)]
use loom::thread_local;

/// Unpins between two looks at the retired stack by a thread that retired
/// nothing itself: bounds how long a retired table outlives its last reader
/// when the retiring thread goes quiet (a look is one relaxed load).
const RECLAIM_EVERY: u32 = 64;

/// Batches the list keeps room for however few wait. Above it, a reclaim
/// that leaves the list under a quarter full gives room back (down to
/// twice what is left): a stress's peak is not kept for good, and each
/// copy is paid for by the batches freed since the list last grew.
const BATCHES_KEPT: usize = 16;

/// One thread's announcement. Records are never freed: a thread's is taken
/// back by the next thread that registers.
///
/// Aligned as `crossbeam_utils::CachePadded` is on x86-64 and AArch64 (two
/// 64-byte lines, which the spatial prefetcher fetches together): its
/// owner writes `sequence` twice per check, and two threads' records on
/// one line made every check of each take the line from the other.
#[repr(align(128))]
struct Record {
    /// Odd while the owner is pinned, even otherwise; only ever grows.
    sequence: AtomicU64,
    /// Whether a thread owns this record.
    in_use: AtomicBool,
    /// The next record of the registry (fixed once the record is linked).
    next: *const Record,
    /// Nesting depth of the owner's pins (owner only).
    depth: Cell<u32>,
    /// Unpins left before the owner looks at the retired stack (owner only).
    countdown: Cell<u32>,
    /// Whether the owner's pins may use the light barrier (owner only,
    /// copied from [`expedited`] when the record is taken).
    light: Cell<bool>,
}

// SAFETY: `sequence`, `in_use` and `next` are shared (atomics, or fixed
// before the record is published); `depth`, `countdown` and `light` are
// touched only by the thread that owns the record (`in_use`, taken with
// `Acquire` and given back with `Release`), so no two threads access them
// at once.
unsafe impl Sync for Record {}
// SAFETY: as for `Sync`; the raw `next` points into the registry, which
// outlives every record.
unsafe impl Send for Record {}

/// A table (or anything else) waiting for its last reader.
struct Retired {
    ptr: *mut (),
    free: unsafe fn(*mut ()),
    next: *mut Retired,
}

/// Retired items taken off the stack, and the pins they wait for.
struct Batch {
    items: *mut Retired,
    readers: Vec<(&'static Record, u64)>,
}

// SAFETY: a batch owns its items (unreachable by anyone else since they
// were taken off the stack), whose contents are `Send` (see `retire`).
unsafe impl Send for Batch {}

/// Everything shared: one per process (one per execution under loom).
struct Domain {
    /// Every record ever registered, newest first.
    records: AtomicPtr<Record>,
    /// Retired items not yet taken by a reclaimer.
    retired: AtomicPtr<Retired>,
    /// Items retired and not yet freed: what a thread's look checks.
    pending: AtomicUsize,
    /// Batches waiting for readers; `try_lock`ed, so reclaiming never
    /// waits for another reclaimer. In a cell only so that a forked child
    /// can reinitialise a lock that a vanished thread held (see [`fork`]);
    /// read it through [`Domain::batches`].
    batches: UnsafeCell<Mutex<Vec<Batch>>>,
}

// SAFETY: every field but `batches` is an atomic; `batches` is only ever
// read as a shared `&Mutex` (`Domain::batches`), and written only by the
// fork child handler, when no other thread exists (see [`fork`]).
unsafe impl Sync for Domain {}

impl Domain {
    #[cfg(not(turnstile_loom))]
    const fn new() -> Self {
        Domain {
            records: AtomicPtr::new(ptr::null_mut()),
            retired: AtomicPtr::new(ptr::null_mut()),
            pending: AtomicUsize::new(0),
            batches: UnsafeCell::new(Mutex::new(Vec::new())),
        }
    }

    #[cfg(turnstile_loom)]
    fn new() -> Self {
        Domain {
            records: AtomicPtr::new(ptr::null_mut()),
            retired: AtomicPtr::new(ptr::null_mut()),
            pending: AtomicUsize::new(0),
            batches: UnsafeCell::new(Mutex::new(Vec::new())),
        }
    }

    /// The batches' lock.
    fn batches(&self) -> &Mutex<Vec<Batch>> {
        // SAFETY: only the fork child handler writes the cell, and only
        // when no reference to the lock is held (see [`fork`]).
        unsafe { &*self.batches.get() }
    }

    /// A record for the calling thread: a free one if any, else a new one.
    fn register(&'static self) -> &'static Record {
        fork::install();
        let mut record = self.records.load(Ordering::Acquire);
        while !record.is_null() {
            // SAFETY: records are never freed while the domain lives.
            let r = unsafe { &*record };
            // Relaxed: a cheap look before the CAS, which decides.
            if !r.in_use.load(Ordering::Relaxed)
                && r.in_use
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                r.light.set(expedited());
                return r;
            }
            record = r.next.cast_mut();
        }
        let record = Box::into_raw(Box::new(Record {
            sequence: AtomicU64::new(0),
            in_use: AtomicBool::new(true),
            next: ptr::null(),
            depth: Cell::new(0),
            countdown: Cell::new(RECLAIM_EVERY),
            light: Cell::new(expedited()),
        }));
        let mut head = self.records.load(Ordering::Relaxed);
        loop {
            // SAFETY: not yet published: this thread owns it.
            unsafe { (*record).next = head };
            // Release: publishes the record's fields to every scan.
            match self.records.compare_exchange_weak(
                head,
                record,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(actual) => head = actual,
            }
        }
        // SAFETY: published, and never freed while the domain lives.
        unsafe { &*record }
    }

    /// Frees every batch whose readers have all moved on, after taking the
    /// retired stack as a new batch. Returns at once if another thread is
    /// reclaiming.
    fn reclaim(&'static self) {
        let mut batches = match self.batches().try_lock() {
            Ok(batches) => batches,
            // A key's `Drop` panicked while a reclaimer freed its table: the
            // list is still whole (the batch being freed was removed from it
            // first, and `free` pushed what it had left back on the stack),
            // so go on.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let _held = fork::HoldingBatches::note();
        // Relaxed: a look; the swap below is what synchronizes.
        if !self.retired.load(Ordering::Relaxed).is_null() {
            // Acquire: the items' unlinking happens before the barrier.
            let items = self.retired.swap(ptr::null_mut(), Ordering::Acquire);
            if heavy_barrier() {
                batches.push(Batch {
                    items,
                    readers: self.pinned_readers(),
                });
            } else {
                // Without the barrier no pin can be trusted: keep the items
                // retired (leaked, if the barrier never works again).
                self.push_retired(items);
            }
        }
        let mut index = 0;
        while index < batches.len() {
            // Acquire: a number that moved on was stored (`Release`) after
            // its reader's last access to the batch's items.
            batches[index]
                .readers
                .retain(|(record, seen)| record.sequence.load(Ordering::Acquire) == *seen);
            if batches[index].readers.is_empty() {
                let batch = batches.swap_remove(index);
                self.free(batch.items);
            } else {
                probe!(RECLAIM_WAITED_FOR_READER);
                index += 1;
            }
        }
        let (waiting, room) = (batches.len(), batches.capacity());
        if room > BATCHES_KEPT && waiting < room / 4 {
            batches.shrink_to(BATCHES_KEPT.max(2 * waiting));
        }
    }

    /// Every record pinned now, with its number.
    fn pinned_readers(&self) -> Vec<(&'static Record, u64)> {
        let mut readers = Vec::new();
        let mut record = self.records.load(Ordering::Acquire);
        while !record.is_null() {
            // SAFETY: records are never freed while the domain lives.
            let r: &'static Record = unsafe { &*record };
            let sequence = r.sequence.load(Ordering::Acquire);
            if sequence % 2 == 1 {
                readers.push((r, sequence));
            }
            record = r.next.cast_mut();
        }
        readers
    }

    /// Puts `ptr` on the retired stack, to be freed by `free`.
    fn retire(&self, ptr: *mut (), free: unsafe fn(*mut ())) {
        let item = Box::into_raw(Box::new(Retired {
            ptr,
            free,
            next: ptr::null_mut(),
        }));
        // Relaxed: a hint for the looks (see `Domain::pending`); the push
        // below publishes the item.
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.push_retired(item);
    }

    /// Pushes a chain of retired items (ending in null) on the stack.
    fn push_retired(&self, first: *mut Retired) {
        if first.is_null() {
            return;
        }
        let mut last = first;
        // SAFETY: the chain is owned by the caller until pushed.
        unsafe {
            while !(*last).next.is_null() {
                last = (*last).next;
            }
        }
        let mut head = self.retired.load(Ordering::Relaxed);
        loop {
            // SAFETY: as above.
            unsafe { (*last).next = head };
            // Release: the item's unlinking (sequenced before the push) is
            // seen by the reclaimer that takes it.
            match self.retired.compare_exchange_weak(
                head,
                first,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => head = actual,
            }
        }
    }

    /// Frees a chain of items no reader can hold. If a key's `Drop`
    /// panics, the rest of the chain goes back on the stack (to be freed by
    /// a later look) and the panic goes on.
    fn free(&self, item: *mut Retired) {
        /// The chain not yet freed: pushed back if a `free` unwinds.
        struct Rest<'d> {
            domain: &'d Domain,
            item: *mut Retired,
        }
        impl Drop for Rest<'_> {
            fn drop(&mut self) {
                self.domain.push_retired(self.item);
            }
        }
        let mut rest = Rest { domain: self, item };
        while !rest.item.is_null() {
            // SAFETY: the chain was taken off the stack by this reclaimer
            // and every reader that could hold an item has unpinned.
            let retired = unsafe { Box::from_raw(rest.item) };
            rest.item = retired.next;
            // Relaxed: `pending` guards no data; it only tells a look
            // whether reclaiming is worth a try.
            self.pending.fetch_sub(1, Ordering::Relaxed);
            probe!(RECLAIM_FREED);
            // SAFETY: `free` is the function `retire` paired with `ptr`.
            unsafe { (retired.free)(retired.ptr) };
        }
    }
}

#[cfg(not(turnstile_loom))]
fn domain() -> &'static Domain {
    static DOMAIN: Domain = Domain::new();
    &DOMAIN
}

/// One domain per loom execution. Its records outlive it (leaked, as what a
/// model leaves retired is): loom drops a thread's thread-locals after its
/// `join` returns, so a record may be given back after the model's statics
/// are gone.
#[cfg(turnstile_loom)]
fn domain() -> &'static Domain {
    loom::lazy_static! {
        static ref DOMAIN: Domain = Domain::new();
    }
    &DOMAIN
}

/// This thread's record, given back when the thread exits.
struct Local(&'static Record);

impl Local {
    fn new() -> Self {
        let record = domain().register();
        fork::note_local(record);
        Local(record)
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        fork::forget_local();
        release(self.0);
    }
}

thread_local! {
    static LOCAL: Local = Local::new();
}

/// Gives a record back (its owner holds no pin).
fn release(record: &'static Record) {
    // Release: the next owner's use of the owner-only fields comes after.
    record.in_use.store(false, Ordering::Release);
}

/// A pin of the current thread: tables loaded under it stay allocated
/// until it is dropped. Not `Send`: it is one thread's announcement.
pub(crate) struct Guard {
    record: &'static Record,
    /// Whether the record is the one a thread whose thread-local is gone
    /// pins with: given back when its outermost pin ends.
    own_record: bool,
    _not_send: PhantomData<*mut ()>,
}

/// Pins the current thread.
#[inline]
pub(crate) fn pin() -> Guard {
    match LOCAL.try_with(|local| local.0) {
        Ok(record) => enter(record, false),
        // The thread-local is gone while the thread exits (a key dropped by
        // another thread-local's destructor): a record for the pins until
        // the outermost one ends.
        Err(_) => enter(fork::exiting_record(), true),
    }
}

#[inline]
fn enter(record: &'static Record, own_record: bool) -> Guard {
    let depth = record.depth.get();
    record.depth.set(depth + 1);
    if depth == 0 {
        // Only this thread stores to its record: the load sees its last
        // store. Release: a reclaimer that reads this number also sees
        // everything this thread did in its earlier pins.
        let sequence = record.sequence.load(Ordering::Relaxed) + 1;
        record.sequence.store(sequence, Ordering::Release);
        light_barrier(record.light.get());
    }
    Guard {
        record,
        own_record,
        _not_send: PhantomData,
    }
}

impl Deref for Guard {
    type Target = crossbeam_epoch::Guard;

    /// The guard crossbeam's `Atomic` and `Shared` take, for as long as
    /// this pin lives.
    #[inline]
    fn deref(&self) -> &crossbeam_epoch::Guard {
        // SAFETY: the unprotected guard defers nothing (its `defer` runs at
        // once, and the map never defers through it: tables are retired
        // with `Guard::retire`), and the pointers loaded through it stay
        // allocated while this pin lives, by the protocol above.
        unsafe { crossbeam_epoch::unprotected() }
    }
}

/// Retires `table`: it is freed (`Owned::from_raw`, then dropped) once
/// every thread pinned now has unpinned, at the latest on this thread's
/// next unpin that finds no such thread.
///
/// # Safety
/// The caller is pinned; `table` is unreachable for any pin that starts
/// from now on, came from `Owned`, is retired once, and may be dropped on
/// any thread.
pub(crate) unsafe fn retire<T>(table: *mut T) {
    unsafe fn free<T>(ptr: *mut ()) {
        // SAFETY: `retire`'s contract.
        drop(unsafe { crossbeam_epoch::Owned::from_raw(ptr.cast::<T>()) });
    }
    domain().retire(table.cast(), free::<T>);
    // Look at the stack on this thread's next unpin (if its record is
    // gone, another thread's look finds it).
    let _ = LOCAL.try_with(|local| local.0.countdown.set(0));
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        let record = self.record;
        let depth = record.depth.get() - 1;
        record.depth.set(depth);
        if depth != 0 {
            return;
        }
        // Release: every read of this pin comes before a reclaimer's free.
        let sequence = record.sequence.load(Ordering::Relaxed) + 1;
        record.sequence.store(sequence, Ordering::Release);
        let countdown = record.countdown.get();
        if countdown != 0 {
            record.countdown.set(countdown - 1);
        } else if !std::thread::panicking() {
            // Not while unwinding: a key's `Drop` that panicked too would
            // abort the process. The next unpin looks instead.
            record.countdown.set(RECLAIM_EVERY);
            reclaim_if_pending();
        }
        if self.own_record {
            fork::forget_exiting_record();
            release(record);
        }
    }
}

/// Forks this process is a child of (0 off Linux, and under Miri and
/// loom, where no child handler is installed): see `fork`.
#[cfg_attr(turnstile_loom, allow(dead_code))]
#[inline]
pub(crate) fn forks() -> u64 {
    fork::forks()
}

/// Whether the thread that forked this process was pinned when it forked
/// (inside an operation on some map: a key's `Hash` or `Drop`, or a clock,
/// that forks): then a map's state may hold that thread's own work in
/// progress, which it finishes itself, and no map repairs what vanished
/// threads left (`map::raw::after_fork`). False when no fork was counted.
#[cfg_attr(turnstile_loom, allow(dead_code))]
pub(crate) fn pinned_at_fork() -> bool {
    fork::pinned_at_fork()
}

/// Frees what retired tables no reader holds, if there are any.
#[cold]
pub(crate) fn reclaim_if_pending() {
    let domain = domain();
    // Relaxed: a stale zero only delays reclaiming to a later look.
    if domain.pending.load(Ordering::Relaxed) != 0 {
        domain.reclaim();
    }
}

/// The reader's half: orders the pin's store before the reads after it.
#[inline(always)]
fn light_barrier(light: bool) {
    if light {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The reclaimer's half: a full fence on every running thread (or its own,
/// when the readers fence themselves). False if the barrier failed, so no
/// pin can be trusted.
fn heavy_barrier() -> bool {
    if expedited() {
        membarrier::private_expedited()
    } else {
        fence(Ordering::SeqCst);
        true
    }
}

/// Whether readers may use the light barrier: `membarrier`'s private
/// expedited command registered for this process. Decided once, by the
/// first record's registration, and read by readers and reclaimers alike.
fn expedited() -> bool {
    #[cfg(all(target_os = "linux", not(miri), not(turnstile_loom)))]
    {
        use std::sync::atomic::AtomicU8;
        const UNDECIDED: u8 = 0;
        const NO: u8 = 1;
        const YES: u8 = 2;
        // Not a `OnceLock`: a child forked while another thread was
        // deciding would wait for a thread that is gone. Threads that
        // decide together each ask the kernel (registering twice is
        // harmless); the first answer stored stands for all.
        static EXPEDITED: AtomicU8 = AtomicU8::new(UNDECIDED);
        // Acquire: a YES read comes after the registration that decided it.
        let decided = EXPEDITED.load(Ordering::Acquire);
        if decided != UNDECIDED {
            return decided == YES;
        }
        let answer = if membarrier::register() { YES } else { NO };
        // AcqRel: publishes this answer, or reads the one that won.
        match EXPEDITED.compare_exchange(UNDECIDED, answer, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => answer == YES,
            Err(first) => first == YES,
        }
    }
    #[cfg(not(all(target_os = "linux", not(miri), not(turnstile_loom))))]
    false
}

#[cfg(all(target_os = "linux", not(miri), not(turnstile_loom)))]
mod membarrier {
    // From linux/membarrier.h.
    const CMD_QUERY: libc::c_long = 0;
    const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    fn membarrier(cmd: libc::c_long) -> libc::c_long {
        // SAFETY: membarrier takes two integers and touches no memory of
        // ours; an unknown command is an error return, not UB.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_long,
                0 as libc::c_long,
            )
        }
    }

    /// Registers the process for the private expedited command; false if
    /// the kernel lacks it or a filter refuses it.
    pub(super) fn register() -> bool {
        let supported = membarrier(CMD_QUERY);
        supported >= 0
            && supported & CMD_PRIVATE_EXPEDITED != 0
            && membarrier(CMD_REGISTER_PRIVATE_EXPEDITED) == 0
    }

    /// A full fence on every running thread of the process.
    pub(super) fn private_expedited() -> bool {
        membarrier(CMD_PRIVATE_EXPEDITED) == 0
    }
}

#[cfg(not(all(target_os = "linux", not(miri), not(turnstile_loom))))]
mod membarrier {
    /// Never called: `expedited()` is false without membarrier.
    pub(super) fn private_expedited() -> bool {
        false
    }
}

/// Small enough for Miri (the README's test command runs `map::` under it).
#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;

    /// Retires a boxed number on `domain`.
    fn retire_one(domain: &Domain) {
        unsafe fn free(ptr: *mut ()) {
            // SAFETY: `ptr` came from `Box::into_raw` below, freed once.
            drop(unsafe { Box::from_raw(ptr.cast::<u64>()) });
        }
        domain.retire(Box::into_raw(Box::new(7u64)).cast(), free);
    }

    fn batches_room(domain: &Domain) -> usize {
        domain.batches().lock().unwrap().capacity()
    }

    /// A burst of reclaims while a reader stays pinned leaves one batch
    /// each; once the reader moves on and they are freed, the list gives
    /// its room back.
    #[test]
    fn batches_give_back_their_room_after_a_burst() {
        const BURST: usize = 200;
        /// A domain of the test's own, which other tests' pins and retires
        /// do not reach; a static, as the real one, so LeakSanitizer sees
        /// its records and list reachable.
        static DOMAIN: Domain = Domain::new();
        let domain = &DOMAIN;
        let reader = domain.register();
        // Pinned, as `enter` would store it (this domain's record only).
        reader.sequence.store(1, Ordering::Release);
        for _ in 0..BURST {
            retire_one(domain);
            domain.reclaim();
        }
        assert_eq!(domain.batches().lock().unwrap().len(), BURST);
        let peak = batches_room(domain);
        reader.sequence.store(2, Ordering::Release);
        domain.reclaim();
        assert_eq!(domain.pending.load(Ordering::Relaxed), 0);
        let after = batches_room(domain);
        assert!(
            after <= BATCHES_KEPT,
            "the batches kept room for {after} after the burst (peak {peak})"
        );
    }
}
