#!/usr/bin/env bash
# The e2e stage's runner: pg_test's unit and doc tests, then its suites (pg_test/tests/NAME.rs
# and NAME/main.rs) in TIDE_E2E_LANES lanes (default 2) side by side, each lane one suite after
# another with `cargo test -p pg_test --test NAME -- --test-threads=1`; then the suites that
# must run alone.
#
# Why lanes: most of a suite's time is spent waiting (for a worker, a backfill, a restart), so
# two suites side by side take little more than the longer of the two, and the whole stage about
# half the time of one lane. Every suite runs its own scratch clusters on ports reserved under
# scripts/cluster.sh's lock, and every test is written to pass on a busy machine (the bar), so
# lanes change nothing a test may rely on. ALONE lists suites that must run by themselves after
# the lanes: none now (`kafka` did while its broker was tansu, whose sqlite storage slowed down
# badly when the CPUs were shared; on Apache Kafka it passed in a lane beside `security`, 310 s
# against 234 s alone, 2026-12-07).
#
# Each lane's output goes to a file and is printed whole when the lanes are done (so the stage's
# log keeps every suite's output in one piece, with its `test result:` lines, which
# scripts/test.sh counts); progress lines ("[e2e] lane 1: capture ok in 76 s") come as suites
# end. TIDE_E2E_LANES=1 runs every suite in one lane, in name order, as `cargo test` would.
# TIDE_E2E_SUITES="a b ..." runs only those suites (scripts/test.sh's version matrix runs a
# subset on the versions in the middle); a name that is no suite is an error.
# Exit status: 0 when every suite passed.
set -uo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
LANES="${TIDE_E2E_LANES:-2}"
[[ "$LANES" =~ ^[1-9][0-9]*$ ]] || { echo "TIDE_E2E_LANES must be a positive integer, not '$LANES'" >&2; exit 2; }
ALONE=()

# Seconds each suite took in a warm sequential run (2026-12-05); a suite not listed counts 30.
declare -A WEIGHT=(
    [table_target]=226 [security]=131 [capture]=76 [backfill]=72 [slot_lost]=62
    [rewrite]=52 [consumers]=44 [verify]=36 [regress]=34 [partitions]=26 [upgrade]=25
    [schema_events]=23 [large_tx]=23 [operations]=22 [controls]=20 [streaming]=19 [shape]=16
    [foundation]=15 [multidb]=11 [harness]=10 [progress]=8 [fencing]=110 [failover]=60
    [pg_upgrade]=240 [pg_upgrade_slots]=200 [dump_restore]=54
    # kafka: 239 s with its debezium and jdbc_sink tests (a Kafka Connect JVM each; 2026-12-07)
    [kafka]=240
)

suites=()
for f in pg_test/tests/*.rs pg_test/tests/*/main.rs; do
    [[ -e "$f" ]] || continue
    if [[ "$f" == */main.rs ]]; then n="$(basename "$(dirname "$f")")"; else n="$(basename "$f" .rs)"; fi
    suites+=("$n")
done

# Suites that exist for some versions only (their file's head says why); elsewhere they are not
# run, and the stage says so (it never counts them as passed).
declare -A FROM_VERSION=([pg_upgrade]=16 [pg_upgrade_slots]=18)
major="$("${TIDE_PG_BIN:-/usr/lib/postgresql/15/bin}/pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')"
# Suites that fail today for a reason written down, not run (and said so; never counted as
# passed). Run one by hand with `cargo test -p pg_test --test NAME`.
declare -A NOT_RUN=()
kept=()
for s in "${suites[@]}"; do
    if [[ -n "${NOT_RUN[$s]:-}" ]]; then
        echo "[e2e] $s: not run: ${NOT_RUN[$s]}"
        continue
    fi
    if [[ -n "${FROM_VERSION[$s]:-}" ]] && ((major < FROM_VERSION[$s])); then
        echo "[e2e] $s: not a suite for PostgreSQL $major (from ${FROM_VERSION[$s]} on): not run"
        continue
    fi
    kept+=("$s")
done
suites=("${kept[@]}")
# The upgrade suite upgrades from the newest earlier release that supports this version.
if [[ -z "$(TIDE_PG="$major" bash "$REPO/scripts/release.sh" --previous)" ]]; then
    echo "[e2e] upgrade: no earlier release supports PostgreSQL $major (sql/releases.txt): nothing to upgrade from, not run"
    kept=()
    for s in "${suites[@]}"; do [[ "$s" == upgrade ]] || kept+=("$s"); done
    suites=("${kept[@]}")
fi

if [[ -n "${TIDE_E2E_SUITES:-}" ]]; then
    chosen=()
    for n in $TIDE_E2E_SUITES; do
        found=0
        for s in "${suites[@]}"; do [[ "$s" == "$n" ]] && found=1; done
        ((found)) || { echo "TIDE_E2E_SUITES names '$n', which is no suite of pg_test/tests" >&2; exit 2; }
        chosen+=("$n")
    done
    suites=("${chosen[@]}")
    echo "[e2e] TIDE_E2E_SUITES: only ${suites[*]}"
fi

echo "+ cargo test -p pg_test --no-run"
cargo test -p pg_test --no-run || exit 1
# The harness's own unit tests and doc tests (no server), before the suites.
status=0
echo "+ cargo test -p pg_test --lib"
cargo test -p pg_test --lib || status=1
echo "+ cargo test -p pg_test --doc"
cargo test -p pg_test --doc || status=1

is_alone() { local a; for a in "${ALONE[@]}"; do [[ "$1" == "$a" ]] && return 0; done; return 1; }

# Longest first, each to the lane with the least work so far.
mapfile -t sorted < <(for s in "${suites[@]}"; do is_alone "$s" || echo "${WEIGHT[$s]:-30} $s"; done | sort -k1,1nr -k2 | awk '{print $2}')
declare -a load lane_suites
for ((i = 0; i < LANES; i++)); do load[i]=0; lane_suites[i]=""; done
for s in "${sorted[@]}"; do
    best=0
    for ((i = 1; i < LANES; i++)); do ((load[i] < load[best])) && best=$i; done
    load[best]=$((load[best] + ${WEIGHT[$s]:-30}))
    lane_suites[best]+="$s "
done

run_suite() { # run_suite LABEL NAME LOG: appends the suite's output to LOG; returns its status
    local label="$1" s="$2" log="$3" start=$SECONDS rc
    echo "+ cargo test -p pg_test --test $s -- --test-threads=1" >>"$log"
    cargo test -p pg_test --test "$s" -- --test-threads=1 >>"$log" 2>&1
    rc=$?
    echo "[e2e] $label: $s $( ((rc == 0)) && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - start)) s"
    return "$rc"
}

tmp="$(mktemp -d /tmp/pg_tide_e2e_lanes.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
pids=()
for ((i = 0; i < LANES; i++)); do
    echo "[e2e] lane $((i + 1)): ${lane_suites[i]}"
    (
        rc=0
        for s in ${lane_suites[i]}; do
            run_suite "lane $((i + 1))" "$s" "$tmp/lane$i.log" || rc=1
        done
        exit "$rc"
    ) &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
for ((i = 0; i < LANES; i++)); do
    echo
    echo "===== e2e lane $((i + 1)): ${lane_suites[i]}"
    cat "$tmp/lane$i.log"
done
for s in "${ALONE[@]}"; do
    for t in "${suites[@]}"; do
        [[ "$t" == "$s" ]] || continue
        echo
        echo "===== e2e alone: $s"
        run_suite alone "$s" "$tmp/alone-$s.log" || status=1
        cat "$tmp/alone-$s.log"
    done
done
exit "$status"
