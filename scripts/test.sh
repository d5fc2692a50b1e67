#!/usr/bin/env bash
# Every check turnstile has, in the order a reviewer would want them to fail:
# formatting, lints, unit/integration/doc tests, loom models, Miri, fuzzing.
# Installs what a fresh machine lacks: toolchain components (rustfmt,
# clippy, miri, rust-src), cargo-fuzz, and redis-server (apt-get) for the
# Redis tests, which start their own servers on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }
started=$SECONDS

step "toolchain components"
rustup component add rustfmt clippy >/dev/null

step "redis-server (for the redis feature's tests)"
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq redis-server >/dev/null
fi
redis-server --version

step "cargo fmt --check"
cargo fmt --all -- --check
(cd fuzz && cargo fmt -- --check)

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo doc (broken links are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet

step "cargo test (unit, integration, doc tests; optimized, with debug assertions)"
cargo test --workspace --all-features

step "loom models"
scripts/loom.sh

step "Miri"
scripts/miri.sh

step "fuzz targets, 20 s each"
scripts/fuzz.sh

step "all green in $((SECONDS - started)) s"
