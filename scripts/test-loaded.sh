#!/usr/bin/env bash
# Run chosen end-to-end suites several times in a row on a busy machine.
#
#   scripts/test-loaded.sh [-n LOAD] [-r RUNS] SUITE...
#       LOAD  CPU-bound and I/O-bound processes each (scripts/load.sh; default 3)
#       RUNS  runs of each suite (default 5)
#       SUITE a pg_test test target (pg_test/tests/SUITE.rs or SUITE/main.rs), e.g.
#             schema_events rewrite backfill table_target; SUITE:FILTER runs only its tests
#             whose name contains FILTER (backfill:convergence)
#
# Installs the current build into the e2e copy of PostgreSQL once (as scripts/test.sh does),
# starts the load, then runs `cargo test -p pg_test --test SUITE -- --test-threads=1` RUNS times
# per suite, in rounds (every suite once, then again). Prints one line per run and, last,
# "N passed, M failed" counting runs. Logs: ${TIDE_TEST_LOGS:-/tmp/pg_tide_test_logs}/loaded/.
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
load=3
runs=5
while getopts "n:r:" o; do
    case "$o" in
        n) load="$OPTARG" ;;
        r) runs="$OPTARG" ;;
        *) sed -n '2,14p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
(($# > 0)) || { sed -n '2,14p' "${BASH_SOURCE[0]}" >&2; exit 2; }
cd "$TIDE_REPO"
logdir="${TIDE_TEST_LOGS:-/tmp/pg_tide_test_logs}/loaded"
mkdir -p "$logdir"
TIDE_PG_BIN="$(bash scripts/private-pg.sh "$TIDE_REPO/target/pg$TIDE_PG-private")"
export TIDE_PG_BIN TIDE_PG_CONFIG="$TIDE_PG_BIN/pg_config"
tide_pg_libpath
if [[ "${TIDE_SKIP_INSTALL:-0}" != 1 ]]; then
    TIDE_SKIP_SETUP=1 bash scripts/install.sh
fi
# Build the suites before the load starts.
for s in "$@"; do cargo test -p pg_test --test "${s%%:*}" --no-run; done
bash scripts/load.sh start "$load"
trap 'bash "$TIDE_REPO/scripts/load.sh" stop' EXIT
passed=0
failed=0
for ((r = 1; r <= runs; r++)); do
    for s in "$@"; do
        bash scripts/cluster.sh prune >/dev/null 2>&1 || true
        log="$logdir/${s//:/-}.$r.log"
        start=$SECONDS
        filter=()
        [[ "$s" == *:* ]] && filter=("${s#*:}")
        if cargo test -p pg_test --test "${s%%:*}" -- --test-threads=1 "${filter[@]}" >"$log" 2>&1; then
            passed=$((passed + 1)); verdict=ok
        else
            failed=$((failed + 1)); verdict=FAILED
        fi
        printf '[loaded] run %d/%d %-14s %-6s %4ds  %s  (%s)\n' "$r" "$runs" "$s" "$verdict" \
            $((SECONDS - start)) "$(grep -E '^test result' "$log" | tail -1)" "$log"
    done
done
echo "$passed passed, $failed failed"
((failed == 0))
