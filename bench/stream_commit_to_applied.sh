#!/usr/bin/env bash
# Commit-to-applied time of one large transaction, with and without streaming of in-progress
# transactions (tide.stream_in_progress), per target (outbox, local table, remote table).
#
#   export TIDE_PG_BIN=$(bash scripts/private-pg.sh target/pg15-private)
#   [TARGETS="outbox table remote"] [MODES="off on spool"] [PAUSE=seconds] \
#     bash bench/stream_commit_to_applied.sh [ROWS (default 1000000)] [logical_decoding_work_mem (default 64MB)]
#
# PAUSE (default 0): the transaction waits that long after its INSERT before it commits (a
# transaction that runs longer than its writes, as most large ones do: the worker can catch up
# before the commit).
#
# One scratch cluster (bench_stream), and one for the remote target (bench_stream_tgt); for each
# target and mode a new pipeline (its worker reads the settings when it opens its decoder), then
# one INSERT of ROWS rows of about 220 bytes in one transaction. Prints how long the INSERT ran
# (until its commit returned) and how long after the commit tide.wait_for_pipeline returned
# (everything applied). Modes: streaming off, on; for the remote target also "spool" (streaming
# on, tide.remote_stream_connections = 0: applied at the commit from the worker's file, as
# before the remote target wrote streamed transactions while they run).
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS="${1:-1000000}"
LDWM="${2:-64MB}"
TARGETS="${TARGETS:-outbox table remote}"
NAME=bench_stream
TGT=bench_stream_tgt
for n in "$NAME" "$TGT"; do bash scripts/cluster.sh destroy "$n" >/dev/null 2>&1 || true; done
bash scripts/cluster.sh init "$NAME" --conf "logical_decoding_work_mem='$LDWM'" >/dev/null
bash scripts/cluster.sh start "$NAME" >/dev/null
trap 'for n in "$NAME" "$TGT"; do bash scripts/cluster.sh destroy "$n" >/dev/null 2>&1 || true; done' EXIT
q() { bash scripts/cluster.sh psql "$NAME" -XAtq -v ON_ERROR_STOP=1 -c "$1"; }
qt() { bash scripts/cluster.sh psql "$TGT" -XAtq -v ON_ERROR_STOP=1 -c "$1"; }
now() { date +%s.%N; }
q "CREATE EXTENSION pg_tide"
sleep 2
q "CREATE TABLE big (id int PRIMARY KEY, a text, b text, c int, d timestamptz); CREATE SCHEMA tgt"
if [[ " $TARGETS " == *" remote "* ]]; then
    bash scripts/cluster.sh init "$TGT" --no-preload >/dev/null
    bash scripts/cluster.sh start "$TGT" >/dev/null
    q "CREATE EXTENSION postgres_fdw;
       CREATE SERVER tgt FOREIGN DATA WRAPPER postgres_fdw
         OPTIONS (host '127.0.0.1', port '$(bash scripts/cluster.sh port "$TGT")', dbname 'postgres');
       CREATE USER MAPPING FOR postgres SERVER tgt OPTIONS (user 'postgres')"
fi
echo "rows=$ROWS logical_decoding_work_mem=$LDWM pause before commit=${PAUSE:-0} s"
for target in $TARGETS; do
    modes="off on"
    [[ $target == remote ]] && modes="off spool on"
    [[ -n "${MODES:-}" ]] && modes="$MODES"
    for mode in $modes; do
        [[ $target != remote && $mode == spool ]] && continue
        streaming=on; conns=2
        [[ $mode == off ]] && streaming=off
        [[ $mode == spool ]] && conns=0
        q "ALTER SYSTEM SET tide.stream_in_progress = $streaming" >/dev/null
        q "ALTER SYSTEM SET tide.remote_stream_connections = $conns" >/dev/null
        q "SELECT pg_reload_conf()" >/dev/null
        sleep 1
        p="p_${target}_${mode}"
        case $target in
            table) kind=table; opts='{"schema": "tgt"}' ;;
            remote) kind=postgres; opts='{"server": "tgt"}' ;;
            *) kind=outbox; opts='{}' ;;
        esac
        q "SELECT tide.create_pipeline('$p', '$kind', '$opts')" >/dev/null
        q "SELECT tide.add_table('$p', 'big', backfill => false)" >/dev/null
        q "SELECT tide.wait_for_pipeline('$p', '1 minute')" >/dev/null
        t0=$(now)
        q "BEGIN; INSERT INTO big SELECT g, repeat(md5(g::text), 2), md5((g * 7)::text), g % 1000, now()
             FROM generate_series(1, $ROWS) g; SELECT pg_sleep(${PAUSE:-0}); COMMIT" >/dev/null
        t1=$(now)
        q "SELECT tide.wait_for_pipeline('$p', '30 minutes')" >/dev/null
        t2=$(now)
        streamed=$(q "SELECT stream_txns || ' streamed, ' || pg_size_pretty(stream_bytes) || '; ' || spill_txns || ' spilled, ' || pg_size_pretty(spill_bytes)
                        FROM pg_stat_replication_slots WHERE slot_name = (SELECT slot_name FROM tide.pipeline WHERE name = '$p')")
        printf '%-7s streaming=%-5s insert(+pause) %6.1f s   commit-to-applied %6.1f s   (slot: %s)\n' \
            "$target" "$mode" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$streamed"
        q "SELECT tide.drop_pipeline('$p')" >/dev/null
        q "TRUNCATE big; DROP TABLE IF EXISTS tgt.big; DELETE FROM tide.outbox" >/dev/null
        [[ $target == remote ]] && qt "DROP TABLE IF EXISTS public.big" >/dev/null
    done
done
