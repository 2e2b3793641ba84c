#!/usr/bin/env bash
# The time of one tide.add_tables_in_schema of N empty tables to a remote (postgres) target,
# backfill off (issue 35, many small tables): what adding tables costs apart from their rows.
# The add_tables of one transaction share one remote connection (41-57 ms each when every table
# opened its own, benchmark B7).
#
#   TIDE_PG_BIN=... bash bench/remote-add-tables.sh [N=200]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200}
src=bench_addsrc_$$
tgt=bench_addtgt_$$
bash scripts/cluster.sh init "$src" >/dev/null
bash scripts/cluster.sh start "$src" >/dev/null
bash scripts/cluster.sh init "$tgt" --no-preload >/dev/null
bash scripts/cluster.sh start "$tgt" >/dev/null
trap 'bash scripts/cluster.sh destroy "$src" >/dev/null 2>&1; bash scripts/cluster.sh destroy "$tgt" >/dev/null 2>&1' EXIT
port="$(bash scripts/cluster.sh port "$tgt")"
psql() { bash scripts/cluster.sh psql "$src" -qAtX -v ON_ERROR_STOP=1 "$@"; }
psql -c "CREATE EXTENSION pg_tide; CREATE EXTENSION postgres_fdw;
         CREATE SERVER tgt FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '$port', dbname 'postgres');
         CREATE USER MAPPING FOR postgres SERVER tgt OPTIONS (user 'postgres');"
psql -c "SELECT tide.create_pipeline('p', 'postgres', '{\"server\": \"tgt\"}')" >/dev/null
psql -c "CREATE SCHEMA many;
         DO \$\$BEGIN FOR g IN 1..$N LOOP
             EXECUTE format('CREATE TABLE many.t%s (id int PRIMARY KEY, v text)', g);
         END LOOP; END\$\$"
start=$(date +%s.%N)
added=$(psql -c "SELECT tide.add_tables_in_schema('p', 'many', backfill => false)")
end=$(date +%s.%N)
printf "%s tables added to a remote target in %.2f s (one add_tables_in_schema)\n" "$added" "$(echo "$end - $start" | bc)"
