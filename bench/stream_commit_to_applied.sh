#!/usr/bin/env bash
# Commit-to-applied time of one large transaction, with and without streaming of in-progress
# transactions (tide.stream_in_progress), per target (outbox, local table).
#
#   export TIDE_PG_BIN=$(bash scripts/private-pg.sh target/pg15-private)
#   bash bench/stream_commit_to_applied.sh [ROWS (default 1000000)] [logical_decoding_work_mem (default 64MB)]
#
# One scratch cluster (bench_stream); for each target and mode a new pipeline (its worker reads
# the setting when it opens its decoder), then one INSERT of ROWS rows of about 220 bytes in one
# transaction. Prints how long the INSERT ran (until its commit returned) and how long after the
# commit tide.wait_for_pipeline returned (everything applied).
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS="${1:-1000000}"
LDWM="${2:-64MB}"
NAME=bench_stream
bash scripts/cluster.sh destroy "$NAME" >/dev/null 2>&1 || true
bash scripts/cluster.sh init "$NAME" --conf "logical_decoding_work_mem='$LDWM'" >/dev/null
bash scripts/cluster.sh start "$NAME" >/dev/null
trap 'bash scripts/cluster.sh destroy "$NAME" >/dev/null 2>&1 || true' EXIT
q() { bash scripts/cluster.sh psql "$NAME" -XAtq -v ON_ERROR_STOP=1 -c "$1"; }
now() { date +%s.%N; }
q "CREATE EXTENSION pg_tide"
sleep 2
q "CREATE TABLE big (id int PRIMARY KEY, a text, b text, c int, d timestamptz); CREATE SCHEMA tgt"
echo "rows=$ROWS logical_decoding_work_mem=$LDWM"
for target in outbox table; do
    for mode in off on; do
        q "ALTER SYSTEM SET tide.stream_in_progress = $mode" && q "SELECT pg_reload_conf()" >/dev/null
        sleep 1
        p="p_${target}_${mode}"
        if [[ $target == table ]]; then opts='{"schema": "tgt"}'; else opts='{}'; fi
        q "SELECT tide.create_pipeline('$p', '$target', '$opts')" >/dev/null
        q "SELECT tide.add_table('$p', 'big', backfill => false)" >/dev/null
        q "SELECT tide.wait_for_pipeline('$p', '1 minute')" >/dev/null
        t0=$(now)
        q "INSERT INTO big SELECT g, repeat(md5(g::text), 2), md5((g * 7)::text), g % 1000, now()
             FROM generate_series(1, $ROWS) g"
        t1=$(now)
        q "SELECT tide.wait_for_pipeline('$p', '30 minutes')" >/dev/null
        t2=$(now)
        streamed=$(q "SELECT stream_txns || ' streamed, ' || pg_size_pretty(stream_bytes) || '; ' || spill_txns || ' spilled, ' || pg_size_pretty(spill_bytes)
                        FROM pg_stat_replication_slots WHERE slot_name = 'tide_$p'")
        printf '%-7s streaming=%-3s insert %6.1f s   commit-to-applied %6.1f s   (slot: %s)\n' \
            "$target" "$mode" "$(echo "$t1 - $t0" | bc)" "$(echo "$t2 - $t1" | bc)" "$streamed"
        q "SELECT tide.drop_pipeline('$p')" >/dev/null
        q "TRUNCATE big; DROP TABLE IF EXISTS tgt.big; DELETE FROM tide.outbox" >/dev/null
    done
done
