//! Large tables ask the kernel for transparent huge pages.
//!
//! A lookup in a table of a million keys lands on a random page, so with
//! 4 KiB pages nearly every one also misses the TLB (a 28 MiB table is
//! 7,000 pages; a core's second-level TLB holds one or two thousand) and
//! waits for a page walk beside its cache miss. Backed by 2 MiB pages the
//! same table is 14 entries, and a new table is mapped in 14 faults
//! instead of 7,000. Figures are in `BENCHMARKS.md` ("Huge pages for large
//! tables").
//!
//! Linux's default on many distributions (`transparent_hugepage/enabled`
//! set to `madvise`) backs only the memory a program advises, which is
//! what this does, before the table's first touch. The allocator may hand
//! back memory it had already mapped in small pages, though (a freed
//! table's, say), which advice no longer changes; such a table is
//! collapsed into huge pages there and then (`MADV_COLLAPSE`, Linux 6.1),
//! as a first touch of fresh advised memory would have mapped it.
//!
//! The system's settings still rule. Under `enabled` = `never` nothing is
//! asked. The price of huge pages is compaction: where `defrag` is
//! `always`, `madvise` or `defer+madvise`, a fault in advised memory with
//! no free huge page at hand compacts memory there and then, on the thread
//! that touches it (an insert's migration step), and the collapse does the
//! same; under `defer` or `never`, no table is collapsed (the kernel's
//! background thread may still do it). After a `fork`, the first write to
//! a huge page that parent and child share copies 2 MiB, not 4 KiB.
//! Everything here is best effort: a kernel that refuses leaves the table
//! in small pages, working the same.

/// A huge page's size on x86-64 and on AArch64 with 4 KiB base pages.
const HUGE_PAGE: usize = 2 << 20;

/// What [`advise`] asked of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(all(target_os = "linux", not(miri))), allow(dead_code))]
pub(super) enum Advice {
    /// Nothing: no whole huge page in the range, or the system's setting
    /// is `never`, or not Linux.
    None,
    /// Advised before its first touch: faults map huge pages.
    Advised,
    /// Advised, and already mapped, so collapsed into huge pages (`true`
    /// when the kernel did it).
    Collapsed(bool),
}

/// Asks the kernel to back the whole 2 MiB pages inside
/// `[start, start + len)` with huge pages: advice for memory not yet
/// touched, a collapse for memory already mapped (see the module docs).
#[cfg(all(target_os = "linux", not(miri)))]
pub(super) fn advise(start: *mut u8, len: usize) -> Advice {
    // Inward to whole huge pages: a part of one can never be a huge page,
    // and the advice then covers only memory this allocation owns.
    let first = (start as usize).next_multiple_of(HUGE_PAGE);
    let end = (start as usize).saturating_add(len) / HUGE_PAGE * HUGE_PAGE;
    let settings = settings::read();
    if end <= first || !settings.enabled {
        return Advice::None;
    }
    let range = first as *mut libc::c_void;
    // SAFETY: `madvise` with MADV_HUGEPAGE changes how pages are backed,
    // never their contents or whether they are mapped; the range lies
    // inside the caller's live allocation and is page aligned.
    unsafe { libc::madvise(range, end - first, libc::MADV_HUGEPAGE) };
    if !settings.collapse || !mapped(range) {
        return Advice::Advised;
    }
    // SAFETY: as above: a collapse copies the pages' contents into huge
    // pages and leaves the range mapped; it is a no-op on failure.
    let collapsed = unsafe { libc::madvise(range, end - first, MADV_COLLAPSE) } == 0;
    Advice::Collapsed(collapsed)
}

#[cfg(not(all(target_os = "linux", not(miri))))]
pub(super) fn advise(_start: *mut u8, _len: usize) -> Advice {
    Advice::None
}

/// Linux 6.1's `MADV_COLLAPSE` (the `libc` crate names it for glibc
/// targets only).
#[cfg(all(target_os = "linux", not(miri)))]
const MADV_COLLAPSE: libc::c_int = 25;

/// Whether the page at `page` (page aligned) is mapped already: memory the
/// allocator reused rather than fresh from the kernel.
#[cfg(all(target_os = "linux", not(miri)))]
fn mapped(page: *mut libc::c_void) -> bool {
    let mut resident = 0u8;
    // SAFETY: `mincore` reads the page tables for one page of the caller's
    // allocation and writes one byte, to `resident`.
    let ok = unsafe { libc::mincore(page, 1, &mut resident) } == 0;
    ok && resident & 1 == 1
}

/// The system's transparent huge page settings, read once.
#[cfg(all(target_os = "linux", not(miri)))]
mod settings {
    use std::sync::atomic::{AtomicU8, Ordering};

    #[derive(Clone, Copy)]
    pub(super) struct Settings {
        /// Huge pages may be asked for (`enabled` is not `never`).
        pub(super) enabled: bool,
        /// Advised memory may be compacted for on the spot (`defrag` is
        /// `always`, `madvise` or `defer+madvise`), so a collapse asks
        /// nothing the system's faults would not.
        pub(super) collapse: bool,
    }

    const UNREAD: u8 = u8::MAX;
    static SETTINGS: AtomicU8 = AtomicU8::new(UNREAD);

    pub(super) fn read() -> Settings {
        // Relaxed: every thread computes the same value from the same files.
        let mut bits = SETTINGS.load(Ordering::Relaxed);
        if bits == UNREAD {
            let chosen = |file: &str| {
                std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{file}"))
                    .ok()
                    .and_then(|text| {
                        let (_, rest) = text.split_once('[')?;
                        Some(rest.split_once(']')?.0.to_owned())
                    })
            };
            let enabled = chosen("enabled").is_some_and(|c| c == "always" || c == "madvise");
            let collapse = enabled
                && chosen("defrag")
                    .is_some_and(|c| c == "always" || c == "madvise" || c == "defer+madvise");
            bits = u8::from(enabled) | u8::from(collapse) << 1;
            SETTINGS.store(bits, Ordering::Relaxed);
        }
        Settings {
            enabled: bits & 1 == 1,
            collapse: bits & 2 == 2,
        }
    }
}

#[cfg(all(test, target_os = "linux", not(miri)))]
mod tests {
    use super::*;

    /// An allocation for the tests, freed on drop.
    struct Pages {
        start: *mut u8,
        layout: std::alloc::Layout,
    }

    impl Pages {
        fn new(len: usize) -> Pages {
            let layout = std::alloc::Layout::from_size_align(len, 4096).expect("a layout");
            // SAFETY: the layout is not zero-sized; freed in `drop`.
            let start = unsafe { std::alloc::alloc_zeroed(layout) };
            assert!(!start.is_null());
            Pages { start, layout }
        }

        /// The `smaps` entry of the mapping that holds the third huge page
        /// of this allocation (always inside the advised range).
        fn smaps(&self) -> Option<String> {
            let inside = self.start as usize + 2 * HUGE_PAGE;
            let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
            let mut entry: Option<String> = None;
            for line in smaps.lines() {
                let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
                let bounds = range.and_then(|(from, to)| {
                    Some((
                        usize::from_str_radix(from, 16).ok()?,
                        usize::from_str_radix(to, 16).ok()?,
                    ))
                });
                if let Some((from, to)) = bounds {
                    if entry.is_some() {
                        break;
                    }
                    if (from..to).contains(&inside) {
                        entry = Some(String::new());
                    }
                } else if let Some(entry) = entry.as_mut() {
                    entry.push_str(line);
                    entry.push('\n');
                }
            }
            entry
        }
    }

    impl Drop for Pages {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout.
            unsafe { std::alloc::dealloc(self.start, self.layout) };
        }
    }

    fn flag(entry: &str, flag: &str) -> bool {
        entry
            .lines()
            .find_map(|l| l.strip_prefix("VmFlags:"))
            .is_some_and(|flags| flags.split_whitespace().any(|f| f == flag))
    }

    fn huge_kib(entry: &str) -> u64 {
        entry
            .lines()
            .find_map(|l| l.strip_prefix("AnonHugePages:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Fresh memory is advised (the mapping's `VmFlags` gain `hg`), where
    /// the system's setting lets a program ask.
    #[test]
    fn a_large_allocation_is_advised() {
        let pages = Pages::new(8 * HUGE_PAGE);
        let advice = advise(pages.start, 8 * HUGE_PAGE);
        if !settings::read().enabled {
            assert_eq!(advice, Advice::None, "asked under `never`");
            return;
        }
        assert_ne!(advice, Advice::None);
        let entry = pages.smaps().expect("the allocation's mapping");
        assert!(flag(&entry, "hg"), "not advised for huge pages: {entry}");
    }

    /// Memory already mapped in small pages is collapsed into huge ones
    /// where the settings allow a collapse and the kernel has one.
    #[test]
    fn memory_already_mapped_is_collapsed() {
        let pages = Pages::new(8 * HUGE_PAGE);
        // SAFETY: writes inside the allocation, mapping every page small.
        unsafe { std::ptr::write_bytes(pages.start, 0, 8 * HUGE_PAGE) };
        let advice = advise(pages.start, 8 * HUGE_PAGE);
        let settings = settings::read();
        if !settings.collapse {
            assert_ne!(
                advice,
                Advice::Collapsed(true),
                "collapsed against `defrag`"
            );
            return;
        }
        assert!(
            matches!(advice, Advice::Collapsed(_)),
            "mapped memory was not collapsed: {advice:?}"
        );
        let entry = pages.smaps().expect("the allocation's mapping");
        if advice == Advice::Collapsed(true) {
            assert!(huge_kib(&entry) > 0, "collapsed, yet no huge page: {entry}");
        }
    }
}
