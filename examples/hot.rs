//! Profiling loop (not committed).
use turnstile_rl::{KeyedLimiter, Quota};
fn main() {
    let deny = std::env::args().nth(2).is_some();
    let q = if deny {
        Quota::per_hour(1).unwrap()
    } else {
        Quota::per_second(1_000_000_000).unwrap()
    };
    let l = KeyedLimiter::<u64>::new(q);
    let keys: Vec<u64> = (0..1000u64)
        .map(|k| k.wrapping_mul(0x9E3779B97F4A7C15))
        .collect();
    let n: usize = std::env::args()
        .nth(1)
        .map_or(200_000_000, |s| s.parse().unwrap());
    for k in &keys {
        l.check(k);
    }
    let t = std::time::Instant::now();
    let mut ok = 0u64;
    for i in 0..n {
        ok += l.check(&keys[i % 1000]).is_allowed() as u64;
    }
    println!(
        "{:.2} ns/check ({ok})",
        t.elapsed().as_nanos() as f64 / n as f64
    );
}
