#!/usr/bin/env bash
# pg_tide benchmark suite: the one command.
#
#   bench/run.sh [--quick] [--only B1,B2,B3,B4,B5,B6,B7,B8] [--budget SECONDS] [--keep] [--no-setup]
#
#   --quick      small scale, to check the harness (about 3 minutes)
#   --only       run some benchmarks only (comma-separated): B1 backfill throughput, B2 streaming
#                latency, B3 source overhead, B4 worker bounds, B5 Kafka next to the outbox and the
#                broker's own produce ceiling, B6 one large transaction (1M and 10M rows) per
#                target next to logical replication, B7 many small tables (200 x 5,000 rows)
#                added at once next to logical replication's initial sync of one publication, B8
#                side by side with Debezium in Kafka Connect (scripts/debezium.sh: its jars
#                scripts/setup.sh fetched)
#   --budget     overall time budget in seconds (default 2400, quick 720): later runs are skipped
#   --keep       leave the clusters bench_src and bench_tgt running afterwards (to inspect them)
#   --no-setup   skip scripts/setup.sh (also BENCH_SKIP_SETUP=1)
#
# Does its own set-up: scripts/setup.sh (system packages), pg_tide itself only when it is not
# installed yet (scripts/install.sh), a Python venv in bench/.venv with psycopg 3 and
# matplotlib (and confluent-kafka for B5's consumer); B5 starts an Apache Kafka broker per kafka
# run (scripts/kafka.sh, whose jars scripts/setup.sh fetched). Then destroys and re-creates the
# scratch clusters bench_src and bench_tgt, runs bench/bench.py and destroys the clusters again
# on exit, whatever happens.
#
# Output: bench/results/results.json, bench/results/RESULTS.md, bench/results/*.png,
#         bench/results/bench.log (the progress lines); BENCH_RESULTS=DIR writes them to DIR
#         instead. TIDE_PG_BIN selects the PostgreSQL installation (scripts/private-pg.sh).
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/common.sh
. "$BENCH_DIR/../scripts/common.sh"

log() { tide_log bench "$@"; }
die() { tide_die bench "$@"; }

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2
    exit 2
}

KEEP=0
SETUP=1
[[ "${BENCH_SKIP_SETUP:-0}" == 1 ]] && SETUP=0
PYARGS=()
while (($#)); do
    case "$1" in
        --quick) PYARGS+=(--quick) ;;
        --only) [[ $# -ge 2 ]] || usage; PYARGS+=(--only "$2"); shift ;;
        --only=*) PYARGS+=(--only "${1#*=}") ;;
        --budget) [[ $# -ge 2 ]] || usage; PYARGS+=(--budget "$2"); shift ;;
        --budget=*) PYARGS+=(--budget "${1#*=}") ;;
        --keep) KEEP=1 ;;
        --no-setup) SETUP=0 ;;
        -h | --help) usage ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
    shift
done

CLUSTER="$TIDE_REPO/scripts/cluster.sh"
RESULTS_DIR="${BENCH_RESULTS:-$BENCH_DIR/results}"
CLUSTERS=(bench_src bench_tgt)
START=$SECONDS

# --- 1. the machine ----------------------------------------------------------------
pg_tide_installed() {
    [[ -x "$TIDE_PG_CONFIG" ]] || return 1
    [[ -f "$("$TIDE_PG_CONFIG" --pkglibdir)/pg_tide.so" && -f "$("$TIDE_PG_CONFIG" --sharedir)/extension/pg_tide.control" ]]
}

if ((SETUP)); then
    log "scripts/setup.sh"
    if ! TIDE_SETUP_KAFKA=1 bash "$TIDE_REPO/scripts/setup.sh"; then
        # setup.sh also checks the Rust toolchain; the benchmarks only need PostgreSQL and an
        # installed pg_tide.
        if pg_tide_installed && [[ -x "$TIDE_PG_BIN/pgbench" ]]; then
            log "WARNING: scripts/setup.sh failed, but PostgreSQL 15, pgbench and pg_tide are installed: going on"
        else
            die "scripts/setup.sh failed"
        fi
    fi
fi
if ! pg_tide_installed; then
    log "pg_tide is not installed in $TIDE_PG_BIN: scripts/install.sh (release build)"
    TIDE_SKIP_SETUP=1 bash "$TIDE_REPO/scripts/install.sh"
fi
[[ -x "$TIDE_PG_BIN/pgbench" ]] || die "$TIDE_PG_BIN/pgbench not found (TIDE_PG=$TIDE_PG scripts/setup.sh installs it)"
[[ -f "$("$TIDE_PG_CONFIG" --sharedir)/extension/postgres_fdw.control" ]] \
    || die "postgres_fdw is not installed (PostgreSQL contrib modules)"

# --- 2. Python environment -------------------------------------------------------------
VENV="$BENCH_DIR/.venv"
PY="$VENV/bin/python"
py_ok() { [[ -x "$PY" ]] && "$PY" -c 'import psycopg, matplotlib, confluent_kafka' >/dev/null 2>&1; }
if ! py_ok; then
    command -v python3 >/dev/null || die "python3 not found"
    if [[ ! -x "$PY" ]]; then
        log "creating $VENV"
        rm -rf "$VENV"
        if ! python3 -m venv "$VENV" 2>/dev/null; then
            # Debian's python3 ships venv/ensurepip separately.
            log "python3 -m venv failed: apt-get install python3-venv"
            as_root apt-get update -qq
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv
            rm -rf "$VENV"
            python3 -m venv "$VENV" || die "cannot create a Python venv in $VENV"
        fi
    fi
    log "pip install psycopg[binary] matplotlib confluent-kafka into $VENV"
    "$PY" -m pip install -q --disable-pip-version-check 'psycopg[binary]>=3.1,<4' 'matplotlib>=3.6' 'confluent-kafka>=2.3,<3' \
        || die "pip install failed (is PyPI reachable?)"
    py_ok || die "psycopg, matplotlib or confluent_kafka still not importable from $VENV"
fi
log "Python: $("$PY" -c 'import sys, psycopg, matplotlib; print(sys.version.split()[0], "psycopg", psycopg.__version__, "matplotlib", matplotlib.__version__)')"

# --- 3. clusters ---------------------------------------------------------------------------
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    mkdir -p "$RESULTS_DIR"
    for c in "${CLUSTERS[@]}"; do
        f="$("$CLUSTER" log "$c")"
        [[ -f "$f" ]] && cp "$f" "$RESULTS_DIR/$c.server.log" 2>/dev/null || true
    done
    if ((KEEP)); then
        log "--keep: clusters left running: ${CLUSTERS[*]} (scripts/cluster.sh destroy NAME)"
    else
        for c in "${CLUSTERS[@]}"; do
            "$CLUSTER" destroy "$c" >/dev/null 2>&1 || log "WARNING: could not destroy cluster $c"
        done
        log "clusters destroyed"
    fi
    log "finished in $((SECONDS - START)) s (exit $rc)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

CONF=(
    --conf "track_commit_timestamp = on"
    --conf "max_wal_size = 4GB"
    --conf "checkpoint_timeout = 30min"
)
# BENCH_CONF="tide.streaming_chunk_size = 1000; ...": more settings for both clusters.
IFS=';' read -r -a EXTRA_CONF <<< "${BENCH_CONF:-}"
for line in "${EXTRA_CONF[@]}"; do
    if [[ -n "${line// /}" ]]; then
        CONF+=(--conf "$(echo "$line" | sed 's/^ *//; s/ *$//')")
    fi
done
for c in "${CLUSTERS[@]}"; do
    "$CLUSTER" destroy "$c"
    "$CLUSTER" init "$c" "${CONF[@]}"
    "$CLUSTER" start "$c"
done

# --- 3b. a Kafka broker for B5 and B6 (Apache Kafka, KRaft, one node, loopback only) ----------
# b5.py starts a fresh broker (new storage, free port) for each kafka run with scripts/kafka.sh and
# stops it after. TIDE_BENCH_KAFKA=host:port set by the caller uses that broker instead.
if [[ -n "${TIDE_BENCH_KAFKA:-}" ]]; then
    log "B5 uses the Kafka broker at $TIDE_BENCH_KAFKA"
elif bash "$TIDE_REPO/scripts/kafka.sh" fetched; then
    export TIDE_BENCH_KAFKA_SCRIPT="$TIDE_REPO/scripts/kafka.sh"
    log "B5 starts an Apache Kafka broker (scripts/kafka.sh) for each kafka run"
else
    log "Apache Kafka is not fetched (TIDE_SETUP_KAFKA=1 scripts/setup.sh): B5 (kafka) will record that it could not run"
fi

# --- 4. the benchmarks ---------------------------------------------------------------------
log "bench/bench.py ${PYARGS[*]}"
set +e
"$PY" -u "$BENCH_DIR/bench.py" "${PYARGS[@]}"
rc=$?
set -e
if ((rc != 0)); then
    log "bench.py exited with $rc; logs: $("$CLUSTER" log bench_src) and $("$CLUSTER" log bench_tgt)"
    if ((!KEEP)); then
        for c in "${CLUSTERS[@]}"; do
            log "last lines of the $c server log:"
            tail -n 20 "$("$CLUSTER" log "$c")" >&2 || true
        done
    fi
fi
exit "$rc"
