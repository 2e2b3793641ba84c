#!/usr/bin/env bash
# pg_tide's test command.
#
#   scripts/test.sh                 all stages
#   scripts/test.sh core|pgrx|e2e   only the named stage(s)
#
# Stages (each runs even if an earlier one failed):
#   core  cargo test -p tide-core                        (server-independent logic)
#   pgrx  cargo pgrx test pg15 --runas postgres ...      (#[pg_test]s in a pgrx-managed server,
#         and the remote sink's tests against a scratch cluster: TIDE_REMOTE_TEST_CONNINFO)
#   e2e   scripts/install.sh, then cargo test -p pg_test -- --test-threads=1
#         (end-to-end suites against scratch clusters of the system PostgreSQL 15;
#         TIDE_SKIP_INSTALL=1 skips the install when the current build is installed)
# scripts/setup.sh runs first. The pgrx and e2e stages install pg_tide into a private copy of
# PostgreSQL (scripts/private-pg.sh, under target/pg15-private; pgrx gets its own PGRX_HOME in
# target/pgrx-home), never into the system's: a server that maps the installed pg_tide.so (the
# demo's, say) is never disturbed. TIDE_PG_BIN set by the caller overrides the private copy.
# Each stage's output is also kept in
# ${TIDE_TEST_LOGS:-/tmp/pg_tide_test_logs}/STAGE.log.
# The last line is "N passed, M failed" (totals; a stage that failed to build or
# crashed counts as at least 1 failed); the exit status is non-zero on any failure.
set -euo pipefail
TIDE_PG_BIN_FROM_CALLER="${TIDE_PG_BIN:-}"
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

LOGDIR="${TIDE_TEST_LOGS:-/tmp/pg_tide_test_logs}"
PGRX_PGDATA="${TIDE_PGRX_PGDATA:-/tmp/pg_tide_pgrx_test}"
ALL_STAGES=(core pgrx e2e)

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2
    exit 2
}

stages=()
for a in "$@"; do
    case "$a" in
        core | pgrx | e2e) stages+=("$a") ;;
        -h | --help) usage ;;
        *) echo "unknown stage '$a'" >&2; usage ;;
    esac
done
((${#stages[@]})) || stages=("${ALL_STAGES[@]}")

mkdir -p "$LOGDIR"
cd "$TIDE_REPO"
export CARGO_TERM_COLOR=never

declare -A PASSED FAILED RESULT NOTE SECS
order=()

banner() {
    printf '\n======================================================================\n'
    printf '== %s\n' "$*"
    printf '======================================================================\n'
}

# run_stage NAME FUNCTION: runs FUNCTION, tees its output to LOGDIR/NAME.log and
# sums the `test result:` lines.
run_stage() {
    local name="$1" fn="$2" logf="$LOGDIR/$1.log" rc start p=0 f=0 line
    order+=("$name")
    banner "stage $name"
    start=$SECONDS
    set +e
    (set -e; "$fn") 2>&1 | tee "$logf"
    rc=${PIPESTATUS[0]}
    set -e
    SECS[$name]=$((SECONDS - start))
    while IFS= read -r line; do
        if [[ "$line" =~ ([0-9]+)\ passed\;\ ([0-9]+)\ failed ]]; then
            p=$((p + BASH_REMATCH[1]))
            f=$((f + BASH_REMATCH[2]))
        fi
    done < <(sed -e 's/\x1b\[[0-9;]*[A-Za-z]//g' "$logf" | grep -E '^test result: ' || true)
    NOTE[$name]=""
    if ((rc != 0 && f == 0)); then
        f=1
        NOTE[$name]="(exit $rc without a failing test: build failure or crash, see log)"
    fi
    PASSED[$name]=$p
    FAILED[$name]=$f
    if ((rc == 0 && f == 0)); then RESULT[$name]=ok; else RESULT[$name]=FAILED; fi
}

# --- stages ---------------------------------------------------------------------
stage_setup() {
    bash "$TIDE_REPO/scripts/setup.sh"
}

stage_core() {
    echo "+ cargo test -p tide-core --no-fail-fast"
    cargo test -p tide-core --no-fail-fast
}

# A pgrx test server that died with its runner leaves PGRX_PGDATA/15-PID behind.
clean_stale_pgrx_data() {
    local d pid
    for d in "$PGRX_PGDATA"/15-*; do
        [[ -d "$d" ]] || continue
        pid="${d##*-}"
        [[ -d "/proc/$pid" ]] && continue
        echo "+ removing stale pgrx test cluster $d"
        (cd / && as_pg "$TIDE_PG_BIN/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1) || true
        as_pg rm -rf "$d" 2>/dev/null || as_root rm -rf "$d"
    done
}

stage_pgrx() {
    local -a runas=()
    if [[ "$(id -un)" != "$TIDE_PG_USER" ]]; then
        runas=(--runas "$TIDE_PG_USER")
        # pgrx creates PGDATA (a subdirectory per run) and the unix socket here as postgres.
        if [[ ! -d "$PGRX_PGDATA" ]]; then
            as_pg mkdir -p "$PGRX_PGDATA" 2>/dev/null || as_root install -d -o "$TIDE_PG_USER" "$PGRX_PGDATA"
        elif ! as_pg test -w "$PGRX_PGDATA"; then
            as_root chown "$TIDE_PG_USER" "$PGRX_PGDATA"
        fi
        clean_stale_pgrx_data
    else
        mkdir -p "$PGRX_PGDATA"
    fi
    # The remote sink's integration tests (src/sink/remote.rs) talk to a server of their own:
    # a scratch cluster, destroyed afterwards.
    local remote="pgrx_remote_$$" port rc=0
    bash "$TIDE_REPO/scripts/cluster.sh" init "$remote" --no-preload --wal-level replica
    bash "$TIDE_REPO/scripts/cluster.sh" start "$remote"
    port="$(bash "$TIDE_REPO/scripts/cluster.sh" port "$remote")"
    export TIDE_REMOTE_TEST_CONNINFO="host=127.0.0.1 port=$port user=postgres dbname=postgres sslmode=disable"
    echo "+ TIDE_REMOTE_TEST_CONNINFO='$TIDE_REMOTE_TEST_CONNINFO' cargo pgrx test pg15 ${runas[*]} --pgdata $PGRX_PGDATA"
    cargo pgrx test pg15 "${runas[@]}" --pgdata "$PGRX_PGDATA" || rc=$?
    bash "$TIDE_REPO/scripts/cluster.sh" destroy "$remote" >/dev/null 2>&1 || true
    return "$rc"
}

stage_e2e() {
    # The pgrx stage installs a debug test build into the private PostgreSQL;
    # the e2e suites need the release build.
    if [[ "${TIDE_SKIP_INSTALL:-0}" == 1 ]]; then
        echo "+ TIDE_SKIP_INSTALL=1: using the pg_tide already installed in $TIDE_PG_BIN/.."
    else
        echo "+ scripts/install.sh"
        TIDE_SKIP_SETUP=1 bash "$TIDE_REPO/scripts/install.sh"
    fi
    bash "$TIDE_REPO/scripts/cluster.sh" prune
    echo "+ cargo test -p pg_test --no-fail-fast -- --test-threads=1"
    cargo test -p pg_test --no-fail-fast -- --test-threads=1
}

# Point cargo-pgrx, install.sh, cluster.sh and the pg_test suites at a private PostgreSQL copy.
use_private_pg() {
    if [[ -z "${TIDE_PG_BIN_FROM_CALLER:-}" ]]; then
        TIDE_PG_BIN="$(bash "$TIDE_REPO/scripts/private-pg.sh" "$TIDE_REPO/target/pg15-private")"
    fi
    TIDE_PG_CONFIG="$TIDE_PG_BIN/pg_config"
    export TIDE_PG_BIN
    export PGRX_HOME="$TIDE_REPO/target/pgrx-home"
    mkdir -p "$PGRX_HOME"
    printf '[configs]\npg15 = "%s"\n' "$TIDE_PG_CONFIG" >"$PGRX_HOME/config.toml"
    echo "+ private PostgreSQL: TIDE_PG_BIN=$TIDE_PG_BIN PGRX_HOME=$PGRX_HOME"
}

# --- main -------------------------------------------------------------------------
run_stage setup stage_setup
use_private_pg
for s in "${stages[@]}"; do
    run_stage "$s" "stage_$s"
done

total_p=0
total_f=0
banner "pg_tide test summary"
for s in "${order[@]}"; do
    if [[ "$s" == setup ]]; then
        # setup runs no tests; it only counts when it fails
        PASSED[$s]=0
        [[ "${RESULT[$s]}" == ok ]] && FAILED[$s]=0
    fi
    printf '  %-6s %-7s %4d passed, %4d failed  %4ds  %s %s\n' "$s" "${RESULT[$s]}" \
        "${PASSED[$s]}" "${FAILED[$s]}" "${SECS[$s]}" "$LOGDIR/$s.log" "${NOTE[$s]}"
    total_p=$((total_p + PASSED[$s]))
    total_f=$((total_f + FAILED[$s]))
done
printf '  stages run: %s\n' "${order[*]}"
echo "$total_p passed, $total_f failed"
((total_f == 0))
