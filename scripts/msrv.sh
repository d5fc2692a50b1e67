#!/usr/bin/env bash
# Checks that the minimum Rust version turnstile declares is true: that
# Cargo.toml's `rust-version`, and the README's "Minimum Rust version: X.Y",
# is the newest `rust-version` any crate of the locked dependency tree
# declares (default features, every target platform, dev-dependencies left
# out); that the README's feature table says "Needs Rust X.Y", with exactly
# that version, on the row of each feature whose tree needs a newer Rust,
# and on no other row; and that the README's "the tests and benchmarks need
# Rust X.Y" (every feature and the dev-dependencies) is right too.
#
#   scripts/msrv.sh     # a few seconds: dependency resolution only, no build
#
# It reads each crate's own Cargo.toml in cargo's registry sources (fetched
# first, from Cargo.lock). Crates that declare no rust-version are listed,
# not guessed at. The crate's own code is checked against the declared
# version by clippy (`incompatible_msrv`, on in `cargo clippy`).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
    echo "msrv.sh: FAILED: $*" >&2
    exit 1
}

package=$(sed -n '/^\[package\]/,/^\[/s/^name = "\(.*\)"$/\1/p' Cargo.toml)
[ -n "$package" ] || fail "no [package] name in Cargo.toml"
declared=$(sed -n 's/^rust-version = "\([0-9.]*\)"$/\1/p' Cargo.toml)
[ -n "$declared" ] || fail "no rust-version line in Cargo.toml"
features=$(sed -n '/^\[features\]/,/^\[/s/^\([a-z0-9_-]*\) = .*/\1/p' Cargo.toml | grep -vx default)
[ -n "$features" ] || fail "no features found in Cargo.toml's [features]"

cargo fetch --locked --quiet
registry="${CARGO_HOME:-$HOME/.cargo}/registry/src"

# 1.87 and 1.87.0 compare equal; sort -V orders the rest.
norm() { if [[ $1 =~ ^[0-9]+\.[0-9]+$ ]]; then echo "$1.0"; else echo "$1"; fi; }
newer() { [ "$(norm "$1")" != "$(norm "$2")" ] && [ "$(printf '%s\n%s\n' "$(norm "$1")" "$(norm "$2")" | sort -V | tail -n1)" = "$(norm "$1")" ]; }

declare -A rust_version # "name-version" -> its rust-version, or "" for none
undeclared=()

# Sets newest/newest_crate: the newest rust-version in the package's locked
# dependency tree for these `cargo tree` flags (edges, features), and the
# crates that declare it. Path crates (this workspace's) are not counted.
# loom is pruned: it is behind `cfg(turnstile_loom)` / `cfg(crossbeam_loom)`,
# set only by scripts/loom.sh, never by a user's build.
newest() {
    local tree crate manifest rv found=""
    tree=$(cargo tree --locked --quiet -p "$package" --target all --prune loom \
        --prefix none -f '{p}' "$@") || fail "cargo tree $* failed"
    while read -r crate; do
        if [ -z "${rust_version[$crate]+set}" ]; then
            manifest=$(compgen -G "$registry/*/$crate/Cargo.toml" | head -n1) ||
                fail "no registry source for $crate (under $registry)"
            rv=$(sed -n 's/^rust-version = "\([0-9.]*\)"$/\1/p' "$manifest")
            rust_version[$crate]=$rv
            [ -n "$rv" ] || undeclared+=("$crate")
        fi
        rv=${rust_version[$crate]}
        [ -z "$rv" ] || found+="$(norm "$rv") $rv $crate"$'\n'
    done < <(awk '$2 ~ /^v/ && $3 !~ /^\(\// { print $1 "-" substr($2, 2) }' <<<"$tree" | sort -u)
    # The newest version, as the crates write it, and every crate that
    # declares it (a tie names them all).
    read -r newest newest_crate < <(printf '%s' "${found:-0.0.0 0 (none)}" | sort -V -k1,1 | awk '
        { if ($1 != top) { top = $1; rv = $2; crates = $3 } else { crates = crates ", " $3 } }
        END { print rv, crates }')
}

newest -e no-dev
base=$newest base_crate=$newest_crate
printf '%-10s %-8s %s\n' "features" "needs" "set by"
printf '%-10s %-8s %s\n' "default" "$base" "$base_crate"
[ "$(norm "$declared")" = "$(norm "$base")" ] ||
    fail "Cargo.toml declares rust-version $declared, but with default features the locked tree needs $base ($base_crate): declare $base"
claimed=$(grep -oE 'Minimum Rust version: [0-9]+(\.[0-9]+)*' README.md | awk '{print $4}' || true)
[ "$(norm "${claimed:-0}")" = "$(norm "$declared")" ] ||
    fail "README.md says \"${claimed:+Minimum Rust version: $claimed}\", but Cargo.toml declares $declared: write \"Minimum Rust version: $declared\""

for feature in $features; do
    newest -e no-dev --features "$feature"
    needs=$newest crate=$newest_crate
    printf '%-10s %-8s %s\n' "$feature" "$needs" "$crate"
    row=$(grep -E "^\| \`$feature\` \|" README.md) || fail "README.md's feature table has no row for \`$feature\`"
    claimed=$(grep -oE 'Needs Rust [0-9]+(\.[0-9]+)*' <<<"$row" | awk '{print $3}' || true)
    if newer "$needs" "$declared"; then
        [ "$(norm "${claimed:-0}")" = "$(norm "$needs")" ] ||
            fail "feature $feature needs Rust $needs ($crate), but README.md's row for it says \"${claimed:+Needs Rust $claimed}\": write \"Needs Rust $needs\""
    elif [ -n "$claimed" ]; then
        fail "README.md says feature $feature needs Rust $claimed, but its tree needs only $needs, within the declared $declared: drop the note"
    fi
done

newest -e normal,build,dev --all-features
printf '%-10s %-8s %s\n' "(dev)" "$newest" "$newest_crate"
claimed=$(tr '\n' ' ' <README.md | grep -oE 'tests and benchmarks need Rust [0-9]+(\.[0-9]+)*' | awk '{print $6}' || true)
[ "$(norm "${claimed:-0}")" = "$(norm "$newest")" ] ||
    fail "the tests and benchmarks need Rust $newest ($newest_crate), but README.md says \"${claimed:+the tests and benchmarks need Rust $claimed}\": write \"the tests and benchmarks need Rust $newest\""

if [ "${#undeclared[@]}" -gt 0 ]; then
    echo "declare no rust-version (not counted): ${undeclared[*]}"
fi
echo "rust-version $declared is true"
