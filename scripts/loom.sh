#!/usr/bin/env bash
# Model-checks turnstile's lock-free protocols with loom (loom-tests/).
# Both cfgs are needed: without crossbeam_loom, crossbeam-epoch is not
# modelled and an epoch test passes without exploring anything.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="--cfg turnstile_loom --cfg crossbeam_loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
# Its own target dir: the RUSTFLAGS change would otherwise rebuild everything.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom"
exec cargo test --release -p turnstile-loom-tests --tests -- --test-threads=1 "$@"
