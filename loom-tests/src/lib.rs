//! The models are in `tests/`, compiled only under `--cfg turnstile_loom`;
//! what they share is here.

/// Asserts that `probe` was hit by a model's executions after `since` (a
/// `probe::sequence()` read before the model): the model reached `race`,
/// rather than passing without it.
#[cfg(turnstile_loom)]
pub fn reached(since: usize, probe: &turnstile_rl::probe::Probe, race: &str) {
    assert!(
        probe.last() > since,
        "no execution reached {race}: the model passed without its race"
    );
}
