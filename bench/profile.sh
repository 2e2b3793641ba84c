#!/usr/bin/env bash
# Where a backfill's CPU goes: a B1-shaped table (bench/tide_bench/common.py's row shape) backfilled
# into TARGET on a scratch cluster, with `perf record` on the pipeline's worker and its reader for
# the whole backfill. Writes OUT_DIR/{flat,callers}-TARGET.txt: the flat profile per process, and
# (with --call-graph) each function's share including what it calls.
#
#   bench/profile.sh [outbox|table] [ROWS, default 1000000] [OUT_DIR, default bench/results/profile-<date>]
#   PROFILE_CALL_GRAPH=1 bench/profile.sh outbox           # also DWARF call graphs (about 100 MB of data)
#
# Needs perf (linux-perf) and root; the extension installed into TIDE_PG_BIN (scripts/install.sh).
# A profile is a distribution, not a speed: run it on a loaded host if you must, but quote the
# shares, not the wall time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TARGET=${1:-outbox}
ROWS=${2:-1000000}
OUT=${3:-bench/results/profile-$(date -u +%F)}
export TIDE_CLUSTERS=${TIDE_CLUSTERS:-/tmp/tide_profile} TIDE_PORT_BASE=${TIDE_PORT_BASE:-25632}
C=scripts/cluster.sh
NAME=profile
mkdir -p "$OUT"
command -v perf >/dev/null || { echo "perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
bash $C destroy $NAME >/dev/null 2>&1 || true
bash $C init $NAME --conf "track_commit_timestamp = on" --conf "max_wal_size = 4GB" \
    --conf "checkpoint_timeout = 30min" --conf "fsync = off" >/dev/null
bash $C start $NAME >/dev/null
trap 'bash $C destroy $NAME >/dev/null 2>&1 || true' EXIT
P() { bash $C psql $NAME -XAtq -v ON_ERROR_STOP=1 "$@"; }
P -c "CREATE EXTENSION pg_tide; CREATE SCHEMA replica;"
P -c "CREATE TABLE public.rows (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2) NOT NULL,
      created_at timestamptz NOT NULL, qty integer NOT NULL, ref uuid NOT NULL, attrs jsonb NOT NULL, note text)"
P -c "INSERT INTO public.rows SELECT g, 'customer-' || md5(g::text), ((g * 7919) % 10000000) / 100.0,
      timestamptz '2024-01-01 00:00:00+00' + g * interval '7 seconds', (g % 1000)::int, md5(g::text || 'ref')::uuid,
      jsonb_build_object('kind', (ARRAY['order','refund','invoice','credit'])[1 + g % 4], 'seq', g,
                         'tag', substr(md5((g * 31)::text), 1, 10)),
      'note ' || substr(md5((g * 13)::text), 1, 24)
      FROM generate_series(1::bigint, $ROWS::bigint) g"
P -c "VACUUM ANALYZE public.rows"
case $TARGET in
outbox) P -c "SELECT tide.create_pipeline('p')" >/dev/null ;;
table) P -c "SELECT tide.create_pipeline('p', 'table', '{\"schema\": \"replica\"}')" >/dev/null ;;
*) echo "TARGET: outbox or table" >&2; exit 2 ;;
esac
P -c "SELECT tide.add_table('p', 'public.rows', backfill => false)" >/dev/null
P -c "SELECT tide.wait_for_pipeline('p')" >/dev/null
P -c "SELECT tide.start_backfill('public.rows', 'p')" >/dev/null
# The reader starts with the backfill: wait for it (at most 10 s; without one the worker reads alone).
for _ in $(seq 1 100); do
    n=$(P -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide reader'")
    ((n > 0)) && break
    sleep 0.1
done
pids=$(P -c "SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE backend_type IN ('pg_tide worker', 'pg_tide reader')")
P -c "SELECT pid, backend_type FROM pg_stat_activity WHERE backend_type IN ('pg_tide worker', 'pg_tide reader')" | tee "$OUT/processes-$TARGET.txt"
data=$(mktemp /tmp/profile.XXXXXX.data)
if [[ -n "${PROFILE_CALL_GRAPH:-}" ]]; then
    perf record -F 199 --call-graph dwarf,16384 -o "$data" -p "$pids" >/dev/null 2>&1 &
else
    perf record -F 499 -o "$data" -p "$pids" >/dev/null 2>&1 &
fi
perf_pid=$!
t0=$(date +%s.%N)
P -c "SELECT tide.wait_for_backfill('public.rows', 'p', '1 hour')" >/dev/null
t1=$(date +%s.%N)
kill -INT $perf_pid
wait $perf_pid || true
set +o pipefail # head closes the pipe of perf report early
{
    echo "# bench/profile.sh $TARGET $ROWS: $(date -u '+%F %T') UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# backfill wall $(echo "$t1 - $t0" | bc) s (on a shared host: not a speed figure)"
    perf report -i "$data" --no-children --sort pid --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -5
    for pid in ${pids//,/ }; do
        echo "=== pid $pid: flat profile (self time)"
        perf report -i "$data" --no-children --pid "$pid" --sort dso,symbol --stdio -g none 2>/dev/null |
            grep -v '^#' | grep -v '^$' | head -40 | cut -c1-130
        if [[ -n "${PROFILE_CALL_GRAPH:-}" ]]; then
            echo "=== pid $pid: with callees (children)"
            perf report -i "$data" --children --pid "$pid" --sort symbol --stdio -g none 2>/dev/null |
                grep -v '^#' | grep -v '^$' | grep -v '0x0000\|0xffff\|cee_scape' | head -45 | cut -c1-130
        fi
    done
} > "$OUT/$([[ -n "${PROFILE_CALL_GRAPH:-}" ]] && echo callers || echo flat)-$TARGET.txt"
rm -f "$data"
echo "written: $OUT"
