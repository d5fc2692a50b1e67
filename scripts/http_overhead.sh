#!/usr/bin/env bash
# The rate-limit layer's overhead: the example gateway under wrk, without
# the layer (`--no-limit`), with one limit on the route, and with two limits
# (one layer over a KeyedMultiLimiter), on loopback, bounded in time.
#
#   scripts/http_overhead.sh            # 2 rounds x 5 s x 6 runs: about 70 s
#   SECONDS_PER_RUN=10 ROUNDS=3 CONNECTIONS="1 64" scripts/http_overhead.sh
#
# One connection shows the latency a request pays for the layer; many
# connections show throughput (and latency with queueing).
#
# The quota is far above what wrk can send, so every request is allowed:
# what is measured is the full path of an admitted request (key from the
# header, the check, the headers written), the costly case. Needs wrk
# (apt-get install -y wrk).
set -euo pipefail
cd "$(dirname "$0")/.."

port=${PORT:-18087}
secs=${SECONDS_PER_RUN:-5}
rounds=${ROUNDS:-2}
conns=${CONNECTIONS:-1 32}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install -y wrk)" >&2; exit 1; }

cargo build --release --quiet --example gateway --features tower
bin="${CARGO_TARGET_DIR:-target}/release/examples/gateway"
work=$(mktemp -d)
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
cat >"$work/bench.toml" <<TOML
listen = "127.0.0.1:$port"
[[route]]
path = "/api"
quota = "1000000000/min"
key = "header:x-api-key"
[[route]]
path = "/two"
quota = ["1000000000/min", "1000000000/h"]
key = "header:x-api-key"
TOML

run() { # $1: label, $2: connections, $3: path, $4...: gateway flags
    local label=$1 c=$2 path=$3
    shift 3
    RUST_LOG=warn "$bin" "$work/bench.toml" "$@" &
    pid=$!
    for _ in $(seq 50); do
        curl -s -o /dev/null "http://127.0.0.1:$port/metrics" && break
        sleep 0.1
    done
    printf '\n== %s, %s connection(s)\n' "$label" "$c"
    wrk -t1 -c"$c" -d"${secs}s" --latency -H 'x-api-key: bench' \
        "http://127.0.0.1:$port$path" | grep -E 'Requests/sec|^ +(50|99)%|Non-2xx'
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
}

for round in $(seq "$rounds"); do
    for c in $conns; do
        run "round $round: without the layer" "$c" /api --no-limit
        run "round $round: with one limit" "$c" /api
        run "round $round: with two limits (one layer)" "$c" /two
    done
done
