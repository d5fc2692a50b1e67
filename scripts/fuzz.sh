#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (FUZZ_SECONDS, default 20) on
# nightly, from a scratch copy of the committed corpus.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${FUZZ_SECONDS:-20}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in $(cargo +nightly fuzz list); do
    mkdir -p "$scratch/$target"
    [ -d "corpus/$target" ] && cp -r "corpus/$target/." "$scratch/$target/"
    echo "fuzz $target for ${seconds}s"
    log="$scratch/$target.log"
    flags=(-max_total_time="$seconds" -print_final_stats=1)
    if ! cargo +nightly fuzz run "$target" "$scratch/$target" -- "${flags[@]}" >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz target $target failed: see fuzz/artifacts/$target/" >&2
        exit 1
    fi
    grep -E 'stat::number_of_executed_units|stat::average_exec_per_sec' "$log"
done
