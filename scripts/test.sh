#!/usr/bin/env bash
# Every check turnstile has, in the order a reviewer would want them to fail:
# formatting, the minimum Rust version, lints, unit/integration/doc tests,
# loom models, Miri, sanitizers, fuzzing.
# Installs what a fresh machine lacks: toolchain components (rustfmt,
# clippy, miri, rust-src), cargo-fuzz, and redis-server (apt-get) for the
# Redis tests, which start their own servers on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's wall time, printed as a table at the end (BENCHMARKS.md's
# table of where the test command's time goes comes from it).
started=$SECONDS
step_name="" step_started=$SECONDS
timings=""
step() {
    [ -z "$step_name" ] || timings+="$(printf '%6d s  %s' $((SECONDS - step_started)) "$step_name")"$'\n'
    step_name="$*" step_started=$SECONDS
    [ -z "$step_name" ] || printf '\n== %s\n' "$step_name"
}

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

step "the declared minimum Rust version is the locked tree's (scripts/msrv.sh)"
scripts/msrv.sh

# What crates.io would receive: the package builds on its own, and cargo
# has nothing to warn about (a target left out of it, a profile override
# that matches nothing there). --allow-dirty: the check is of the files,
# so it also runs mid-change. Not --quiet: that hides the warnings too.
step "cargo package (the published crate builds, without a warning)"
package_log=$(cargo package --allow-dirty -p turnstile-rl 2>&1) || { printf '%s\n' "$package_log"; exit 1; }
if grep -i "warning" <<<"$package_log"; then
    echo "cargo package warned (above); see the comments at Cargo.toml's include list" >&2
    exit 1
fi

# Default features and every feature: code behind a feature gate must not
# break the build without it, and the tower/tokio code is linted too.
step "cargo clippy (all targets, default and all features, warnings are errors)"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo doc (all features; broken links are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features --quiet

# --all-features runs the HTTP tests too (tests/http_*.rs: a real axum
# server and reqwest client, and a real tonic server and client, on
# 127.0.0.1, nothing to install), including those of the `axum` feature
# (the default key read from axum's ConnectInfo).
step "cargo test (unit, integration, doc tests, all features; optimized, with debug assertions)"
cargo test --workspace --all-features

step "loom models"
scripts/loom.sh

step "Miri"
scripts/miri.sh

step "AddressSanitizer + LeakSanitizer over the map"
scripts/sanitize.sh

step "fuzz targets, 20 s each"
scripts/fuzz.sh

step ""
printf '\n== time per step\n%s' "$timings"
printf '\n== all green in %d s\n' $((SECONDS - started))
