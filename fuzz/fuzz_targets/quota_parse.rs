//! Any text is a quota or a typed error, never a panic; and every quota's
//! canonical text parses back to the same quota.
#![no_main]

use libfuzzer_sys::fuzz_target;
use turnstile_rl::Quota;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(quota) = text.parse::<Quota>() {
        let shown = quota.to_string();
        let again: Quota = shown.parse().expect("canonical text must parse");
        assert_eq!(again, quota, "{text:?} -> {shown:?}");
        assert!(quota.burst_size() >= 1 && turnstile_rl::__private::interval_nanos(&quota) >= 1);
    }
});
