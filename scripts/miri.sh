#!/usr/bin/env bash
# Runs the unsafe-adjacent unit tests under Miri (nightly).
# - The cell and GCRA tests use no raw pointers of crossbeam's: strict provenance.
# - The map's tests go through crossbeam-epoch, which casts integers to
#   pointers (its tagged pointers) and trips Stacked Borrows itself, so they
#   run with Tree Borrows and without leak checks, as crossbeam's own CI does.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup component add --toolchain nightly miri rust-src >/dev/null
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/miri"
# The lean build (Cargo.toml): none of the HTTP, gRPC or bench dev-dependencies.
export RUSTFLAGS="--cfg turnstile_lean_tests ${RUSTFLAGS:-}"
cargo +nightly miri setup >/dev/null
MIRIFLAGS="-Zmiri-strict-provenance" \
    cargo +nightly miri test --lib -- cell:: gcra:: live::
MIRIFLAGS="-Zmiri-tree-borrows -Zmiri-ignore-leaks" \
    cargo +nightly miri test --lib -- map::
