#!/usr/bin/env bash
# Every check turnstile has, in the order a reviewer would want them to fail:
# formatting, lints, unit/integration/doc tests, loom models, Miri,
# sanitizers, fuzzing.
# Installs what a fresh machine lacks: toolchain components (rustfmt,
# clippy, miri, rust-src) and cargo-fuzz; no system packages are needed yet.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }
started=$SECONDS

step "toolchain components"
rustup component add rustfmt clippy >/dev/null

step "cargo fmt --check"
cargo fmt --all -- --check
(cd fuzz && cargo fmt -- --check)

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo doc (broken links are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

step "cargo test (unit, integration, doc tests; optimized, with debug assertions)"
cargo test --workspace

step "loom models"
scripts/loom.sh

step "Miri"
scripts/miri.sh

step "AddressSanitizer + LeakSanitizer over the map"
scripts/sanitize.sh

step "fuzz targets, 20 s each"
scripts/fuzz.sh

step "all green in $((SECONDS - started)) s"
