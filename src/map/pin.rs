//! Pinning a map's own epoch collector from any thread, cheaply.
//!
//! Each map owns its `Collector` (so one map's garbage never waits on
//! another's readers, and loom models stay independent). Pinning one needs a
//! `LocalHandle` registered for the current thread; registering allocates,
//! so each thread keeps its handles in a small cache. A handle keeps its
//! collector alive, and with it every bit of garbage the map left behind,
//! so the cache must let go of a dropped map's handle: the dropping thread
//! removes its own, and every other thread removes its own at its next pin
//! of any map (a dropped map bumps a global generation that pins compare).
//!
//! Pinning and dropping a handle may run epoch collection, which drops keys
//! of any map, and a key's `Drop` may pin another map on this same thread:
//! the cache is never borrowed mutably while either runs.

#[cfg(turnstile_loom)]
use crossbeam_epoch::{Collector, Guard};

/// A map's liveness, watched by the handles cached for it.
#[derive(Debug)]
pub(crate) struct Alive(#[cfg(not(turnstile_loom))] std::sync::Arc<()>);

#[cfg(not(turnstile_loom))]
mod cache {
    use std::cell::{Cell, RefCell};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Weak};

    use crossbeam_epoch::{Collector, Guard, LocalHandle};

    use super::Alive;

    /// Handles a thread keeps; a thread that uses more maps than this
    /// re-registers (an allocation) on a miss, which stays correct.
    const CACHED_HANDLES: usize = 8;

    /// Bumped by every dropped map: a thread whose cache saw an older value
    /// looks for handles of dead maps to let go of.
    static DROPPED_MAPS: AtomicUsize = AtomicUsize::new(0);

    struct Entry {
        map: Weak<()>,
        handle: LocalHandle,
    }

    thread_local! {
        static HANDLES: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
        static SEEN_DROPS: Cell<usize> = const { Cell::new(0) };
    }

    impl Alive {
        pub(crate) fn new() -> Self {
            Alive(Arc::new(()))
        }
    }

    #[inline]
    pub(crate) fn pin(collector: &Collector, alive: &Alive) -> Guard {
        // Acquire: pairs with `forget`'s Release, so a dead map's `Arc` is
        // seen dead here.
        let drops = DROPPED_MAPS.load(Ordering::Acquire);
        let seen = SEEN_DROPS.try_with(Cell::get).unwrap_or(drops);
        // Recorded only once the cache could be cleaned (not inside a nested
        // pin, which finds it borrowed): a later pin tries again.
        if seen != drops && release(|entry| entry.map.strong_count() == 0) {
            let _ = SEEN_DROPS.try_with(|seen| seen.set(drops));
        }
        // A shared borrow while pinning: a nested pin from a key's `Drop`
        // (run by collection inside `handle.pin()`) borrows it again, which
        // is fine for shared borrows.
        let cached = HANDLES.try_with(|handles| {
            let handles = handles.try_borrow().ok()?;
            let entry = handles.iter().find(|e| e.handle.collector() == collector)?;
            Some(entry.handle.pin())
        });
        if let Ok(Some(guard)) = cached {
            return guard;
        }
        let handle = collector.register();
        let guard = handle.pin();
        let entry = Entry {
            map: Arc::downgrade(&alive.0),
            handle,
        };
        // Keep the new handle if the cache is free to change now (not
        // during thread teardown, not inside a nested pin); the one it
        // pushes out is dropped after the borrow ends.
        let evicted = HANDLES.try_with(|handles| {
            let mut handles = handles.try_borrow_mut().ok()?;
            let evicted = (handles.len() == CACHED_HANDLES).then(|| handles.remove(0));
            handles.push(entry);
            evicted
        });
        drop(evicted);
        guard
    }

    /// Lets go of this thread's handle on a map being dropped, and has other
    /// threads let go of theirs.
    pub(crate) fn forget(collector: &Collector) {
        // Release: the map's `Alive` was dropped before this.
        DROPPED_MAPS.fetch_add(1, Ordering::Release);
        release(|entry| entry.handle.collector() == collector);
    }

    /// Removes the entries `dead` picks, dropping them after the borrow.
    /// Returns false if the cache could not be borrowed (a nested pin, or
    /// thread teardown).
    fn release(dead: impl Fn(&Entry) -> bool) -> bool {
        let released = HANDLES.try_with(|handles| {
            let mut handles = handles.try_borrow_mut().ok()?;
            let (gone, kept): (Vec<Entry>, Vec<Entry>) = handles.drain(..).partition(|e| dead(e));
            *handles = kept;
            Some(gone)
        });
        match released {
            Ok(Some(gone)) => {
                drop(gone);
                true
            }
            _ => false,
        }
    }
}

#[cfg(not(turnstile_loom))]
pub(crate) use cache::pin;

#[cfg(not(turnstile_loom))]
pub(crate) use cache::forget;

/// Under loom, a cache per modelled thread (loom's own thread-locals, new
/// in every execution): registering a handle at every pin would put a list
/// insertion's worth of atomics into every check the models explore.
#[cfg(turnstile_loom)]
pub(crate) fn pin(collector: &Collector, _alive: &Alive) -> Guard {
    use crossbeam_epoch::LocalHandle;
    use std::cell::RefCell;

    loom::thread_local! {
        static HANDLES: RefCell<Vec<LocalHandle>> = RefCell::new(Vec::new());
    }
    HANDLES.with(|handles| {
        if let Some(handle) = handles.borrow().iter().find(|h| h.collector() == collector) {
            return handle.pin();
        }
        let handle = collector.register();
        let guard = handle.pin();
        handles.borrow_mut().push(handle);
        guard
    })
}

#[cfg(turnstile_loom)]
pub(crate) fn forget(_collector: &Collector) {}

#[cfg(turnstile_loom)]
impl Alive {
    pub(crate) fn new() -> Self {
        Alive()
    }
}
