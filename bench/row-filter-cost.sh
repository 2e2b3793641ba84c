#!/usr/bin/env bash
# The cost of a row filter on streaming, measured in the output plugin alone (issue 36):
# decode the same WAL (N inserts and N updates of a 4-column table, one transaction each batch)
# with pg_logical_slot_peek_binary_changes and pg_tide's plugin, with no filter, with a filter
# every row passes (pure evaluation cost) and with one half the rows pass. Best of R runs each.
#
#   TIDE_PG_BIN=... bash bench/row-filter-cost.sh [N=200000] [R=5]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
R=${2:-5}
name=bench_rowfilter_$$
bash scripts/cluster.sh init "$name" --conf "output_plugin_libraries=pg_tide" >/dev/null
bash scripts/cluster.sh start "$name" >/dev/null
trap 'bash scripts/cluster.sh destroy "$name" >/dev/null 2>&1' EXIT
psql() { bash scripts/cluster.sh psql "$name" -qAtX -v ON_ERROR_STOP=1 "$@"; }
psql -c "CREATE EXTENSION pg_tide;
         CREATE TABLE o (id int PRIMARY KEY, region text NOT NULL, status text NOT NULL, note text);
         ALTER TABLE o REPLICA IDENTITY FULL;"
psql -c "SELECT 1 FROM pg_create_logical_replication_slot('bench', 'pg_tide')" >/dev/null
psql -c "INSERT INTO o SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, 'paid', 'note ' || g FROM generate_series(1, $N) g"
psql -c "UPDATE o SET note = note || '+'"
oid=$(psql -c "SELECT 'o'::regclass::oid")
run() { # label, extra options
    local best=""
    for _ in $(seq "$R"); do
        ms=$(psql -c "\\timing on" -c "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('bench', NULL, NULL, 'proto_version', '4', 'tables', '$oid' $2)" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p')
        if [[ -z "$best" ]] || awk "BEGIN{exit !($ms < $best)}"; then best=$ms; fi
    done
    msgs=$(psql -c "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('bench', NULL, NULL, 'proto_version', '4', 'tables', '$oid' $2)")
    printf '%-34s %10.1f ms  %8d messages\n' "$1" "$best" "$msgs"
}
echo "$N inserts + $N updates, best of $R decodes:"
run "no row filter" ""
run "row filter passing every row" ", 'row_filter.$oid', 'status <> ''draft''', 'row_filter_owner', '10'"
run "row filter passing half the rows" ", 'row_filter.$oid', 'region = ''eu'' AND status <> ''draft''', 'row_filter_owner', '10'"
psql -c "SELECT pg_drop_replication_slot('bench')" >/dev/null
