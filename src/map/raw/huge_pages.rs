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
//! what this does. The system's setting still rules: under `never` the
//! advice does nothing, under `always` the table got huge pages anyway.
//! The advice is best effort: if the kernel refuses it, the table keeps
//! small pages and works the same.
//!
//! The price: where `transparent_hugepage/defrag` is `madvise` (the usual
//! default) or `always`, a first touch of an advised table with no free
//! huge page at hand compacts memory there and then, on the thread that
//! touches it (an insert's migration step). A server that would rather
//! not pay that sets `defrag` to `defer`, or `enabled` to `never`.

/// A huge page's size on x86-64 and on AArch64 with 4 KiB base pages.
const HUGE_PAGE: usize = 2 << 20;

/// Advises the kernel to back the whole 2 MiB pages inside
/// `[start, start + len)` with huge pages. Call it before the memory is
/// first touched, so that the first faults map huge pages.
#[cfg(all(target_os = "linux", not(miri)))]
pub(super) fn advise(start: *mut u8, len: usize) {
    // Inward to whole huge pages: a part of one can never be a huge page,
    // and the advice then covers only memory this allocation owns.
    let first = (start as usize).next_multiple_of(HUGE_PAGE);
    let end = (start as usize).saturating_add(len) / HUGE_PAGE * HUGE_PAGE;
    if end <= first {
        return;
    }
    // SAFETY: `madvise` with MADV_HUGEPAGE changes how pages are backed,
    // never their contents or whether they are mapped; the range lies
    // inside the caller's live allocation and is page aligned.
    unsafe {
        libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
    }
}

#[cfg(not(all(target_os = "linux", not(miri))))]
pub(super) fn advise(_start: *mut u8, _len: usize) {}

#[cfg(all(test, target_os = "linux", not(miri)))]
mod tests {
    use super::*;

    /// The advice reaches the kernel: the mapping's `VmFlags` gain `hg`
    /// (on a kernel built with transparent huge pages at all).
    #[test]
    fn a_large_allocation_is_advised() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            eprintln!("this kernel has no transparent huge pages: nothing to advise");
            return;
        }
        let len = 8 * HUGE_PAGE;
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("a layout");
        // SAFETY: the layout is not zero-sized; freed below with it.
        let start = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!start.is_null());
        advise(start, len);
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let advised = smaps_flags_at(&smaps, start as usize + 2 * HUGE_PAGE);
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(start, layout) };
        assert!(
            advised
                .as_deref()
                .is_some_and(|flags| flags.split_whitespace().any(|f| f == "hg")),
            "the table's mapping is not advised for huge pages: {advised:?}"
        );
    }

    /// The `VmFlags` line of the mapping that holds `address`.
    fn smaps_flags_at(smaps: &str, address: usize) -> Option<String> {
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((from, to)) = range.split_once('-') {
                    if let (Ok(from), Ok(to)) = (
                        usize::from_str_radix(from, 16),
                        usize::from_str_radix(to, 16),
                    ) {
                        inside = (from..to).contains(&address);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return Some(flags.to_owned());
                }
            }
        }
        None
    }
}
