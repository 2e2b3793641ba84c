#!/usr/bin/env bash
# Benchmarks on several PostgreSQL versions in one run: bench/run.sh once per version, one after
# the other on the same machine, then a side-by-side table.
#
#   bench/versions.sh [--versions "15 18"] [bench/run.sh options]
#
# Default: --versions "15 18" (the oldest and the newest supported) and --only B1,B2. Each
# version's run gets its own scratch clusters of that version, the pg_tide build of this tree
# for it (scripts/install.sh, into the private copy scripts/private-pg.sh makes), and its own
# results directory: $BENCH_RESULTS/pgNN (default bench/results/versions-<date>/pgNN, each with
# the RESULTS.md, results.json and plots of bench/run.sh). $BENCH_RESULTS/RESULTS.md puts the
# figures side by side (bench/versions_table.py); the ratios against logical replication and
# COPY there are each version's own, measured in its own run, and are what to compare across
# versions on a shared machine (absolute figures move with the machine's other load).
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/common.sh
. "$BENCH_DIR/../scripts/common.sh"
log() { tide_log bench-versions "$@"; }

VERSIONS="15 18"
ARGS=()
while (($#)); do
    case "$1" in
        --versions) [[ $# -ge 2 ]] || tide_die bench-versions "--versions needs a list"; VERSIONS="$2"; shift ;;
        --versions=*) VERSIONS="${1#*=}" ;;
        *) ARGS+=("$1") ;;
    esac
    shift
done
if [[ " ${ARGS[*]-} " != *" --only"* ]]; then
    ARGS+=(--only B1,B2)
fi
OUT="${BENCH_RESULTS:-$BENCH_DIR/results/versions-$(date -u +%Y-%m-%d)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

log "scripts/setup.sh for PostgreSQL $VERSIONS"
TIDE_SETUP_PG="$VERSIONS" bash "$TIDE_REPO/scripts/setup.sh"
for v in $VERSIONS; do
    log "PostgreSQL $v: bench/run.sh --no-setup ${ARGS[*]} -> $OUT/pg$v"
    (
        export TIDE_PG="$v"
        unset TIDE_PG_BIN
        bin="$(bash "$TIDE_REPO/scripts/private-pg.sh" "$TIDE_REPO/target/pg$v-private")"
        export TIDE_PG_BIN="$bin"
        tide_pg_libpath
        TIDE_SKIP_SETUP=1 bash "$TIDE_REPO/scripts/install.sh"
        BENCH_RESULTS="$OUT/pg$v" bash "$BENCH_DIR/run.sh" --no-setup "${ARGS[@]}"
    ) || log "PostgreSQL $v: bench/run.sh failed (its results directory says why)"
done
python3 "$BENCH_DIR/versions_table.py" "$OUT" $VERSIONS >"$OUT/RESULTS.md"
log "side by side: $OUT/RESULTS.md"
