#!/usr/bin/env bash
# The cost of column masks on streaming, measured in the output plugin alone (issue 36): decode
# the same WAL (N inserts and N updates of a 4-column REPLICA IDENTITY FULL table) with
# pg_logical_slot_peek_binary_changes and pg_tide's plugin, without masks and with each kind of
# mask on the `note` column (and all three non-key columns hashed). Best of R runs each.
#
#   TIDE_PG_BIN=... bash bench/mask-cost.sh [N=200000] [R=5]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
R=${2:-5}
name=bench_masks_$$
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
salt=$(printf '%064d' 7)
run() { # label, extra options
    local best=""
    for _ in $(seq "$R"); do
        ms=$(psql -c "\\timing on" -c "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('bench', NULL, NULL, 'proto_version', '4', 'tables', '$oid' $2)" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p')
        if [[ -z "$best" ]] || awk "BEGIN{exit !($ms < $best)}"; then best=$ms; fi
    done
    printf '%-34s %10.1f ms\n' "$1" "$best"
}
m() { echo ", 'masks.$oid', '$1', 'mask_salt', '$salt'"; }
echo "$N inserts + $N updates, best of $R decodes:"
run "no masks" ""
run "note hashed" "$(m '{"4": "hash"}')"
run "note truncated to 3" "$(m '{"4": {"truncate": 3}}')"
run "note constant" "$(m '{"4": {"constant": "x"}}')"
run "note null" "$(m '{"4": "null"}')"
run "3 columns hashed" "$(m '{"2": "hash", "3": "hash", "4": "hash"}')"
psql -c "SELECT pg_drop_replication_slot('bench')" >/dev/null
