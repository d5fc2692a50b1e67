#!/usr/bin/env bash
# Runs the map's tests and its multi-threaded stress test under
# AddressSanitizer with LeakSanitizer on (nightly): a use after free, a double
# free, an overflow or a leaked table or key in the map fails them.
# `--target` keeps the sanitizer flags off build scripts and proc macros.
set -euo pipefail
cd "$(dirname "$0")/.."
target="$(rustc -vV | sed -n 's/^host: //p')"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/asan"
# The lean build (Cargo.toml): none of the HTTP, gRPC or bench dev-dependencies.
export RUSTFLAGS="-Zsanitizer=address --cfg turnstile_lean_tests"
export RUSTDOCFLAGS="-Zsanitizer=address"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
cargo +nightly test --target "$target" --lib -- map:: keyed::
# The map's stress test, alone of the map's binary (tests/map/). A filter
# that matches nothing passes, so the name is checked first.
stress=stress::checks_evictions_and_migrations_race_without_losing_memory_safety
cargo +nightly test --target "$target" --test map -- --exact "$stress" --list |
    grep -x "$stress: test" >/dev/null ||
    { echo "sanitize.sh: no test $stress in tests/map/" >&2; exit 1; }
cargo +nightly test --target "$target" --test map -- --exact "$stress"
