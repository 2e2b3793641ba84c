#!/usr/bin/env bash
# Where a backfill's CPU goes: CPU seconds of each process (the pipeline worker, its reader, the
# target's backend for the remote table) during one 1M-row backfill of B1's table shape, to the
# outbox, a local table and a remote table (default chunk 5000), with the wall time.
#
#   bench/cpu_per_process.sh                 # KINDS="outbox local remote" CHUNK=5000
#   PERF=1 bench/cpu_per_process.sh          # also `perf record -g` of the worker for PERF_S (3) s,
#                                            # into $OUT/<kind>.data (perf report -i ...)
#
# Uses the installed pg_tide (scripts/install.sh) and two scratch clusters, prof_src and
# prof_tgt (scripts/cluster.sh), destroyed first and left running for inspection.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-/tmp/pg_tide_prof}"; mkdir -p "$OUT"
S=prof_src; T=prof_tgt
for c in $S $T; do bash scripts/cluster.sh destroy $c >/dev/null 2>&1 || true; done
bash scripts/cluster.sh init $S --conf 'max_wal_size=4GB' --conf 'checkpoint_timeout=30min' >/dev/null
bash scripts/cluster.sh init $T --no-preload --conf 'max_wal_size=4GB' --conf 'checkpoint_timeout=30min' >/dev/null
bash scripts/cluster.sh start $S >/dev/null; bash scripts/cluster.sh start $T >/dev/null
TP=$(bash scripts/cluster.sh port $T)
PS() { bash scripts/cluster.sh psql $S -qAtX -v ON_ERROR_STOP=1 "$@"; }
PT() { bash scripts/cluster.sh psql $T -qAtX -v ON_ERROR_STOP=1 "$@"; }
DDL="(id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2) NOT NULL, created_at timestamptz NOT NULL, qty integer NOT NULL, ref uuid NOT NULL, attrs jsonb NOT NULL, note text)"
PS -c "CREATE EXTENSION pg_tide" -c "CREATE EXTENSION postgres_fdw" -c "CREATE TABLE t $DDL" \
  -c "INSERT INTO t SELECT g, 'customer-' || md5(g::text), ((g * 7919) % 10000000) / 100.0, timestamptz '2024-01-01 00:00:00+00' + g * interval '7 seconds', (g % 1000)::int, md5(g::text || 'ref')::uuid, jsonb_build_object('kind', (ARRAY['order','refund','invoice','credit'])[1 + g % 4], 'seq', g, 'tag', substr(md5((g * 31)::text), 1, 10)), 'note ' || substr(md5((g * 13)::text), 1, 24) FROM generate_series(1::bigint, 1000000) g" \
  -c "VACUUM ANALYZE t" -c "SELECT count(*) FROM t" \
  -c "CREATE SERVER tgt FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '$TP', dbname 'postgres')" \
  -c "CREATE USER MAPPING FOR postgres SERVER tgt OPTIONS (user 'postgres')" -c "CREATE SCHEMA loc" >/dev/null
cpu() { # utime+stime seconds of a pid
  local p=${1:-}; [ -n "$p" ] && [ -r /proc/$p/stat ] && awk "{print (\$14+\$15)/100}" /proc/$p/stat || echo 0; }
for kind in ${KINDS:-outbox local remote}; do
  case $kind in
    outbox) PS -c "SELECT tide.create_pipeline('p_$kind', 'outbox')" >/dev/null ;;
    local) PS -c "CREATE TABLE loc.t $DDL" -c "CREATE INDEX ON loc.t (created_at)" -c "SELECT tide.create_pipeline('p_$kind', 'table', '{\"schema\": \"loc\"}')" >/dev/null ;;
    remote) PT -c "DROP TABLE IF EXISTS public.t" -c "CREATE TABLE public.t $DDL" -c "CREATE INDEX ON public.t (created_at)" >/dev/null
            PS -c "SELECT tide.create_pipeline('p_$kind', 'postgres', '{\"server\": \"tgt\", \"schema\": \"public\"}')" >/dev/null ;;
  esac
  PS -c "SELECT tide.add_table('p_$kind', 't', backfill => false)" >/dev/null
  sleep 2
  W=$(PS -c "SELECT worker_pid FROM tide.pipelines WHERE name = 'p_$kind'")
  TB=$(PT -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND application_name <> 'psql' LIMIT 1" || true)
  w0=$(cpu $W); t0=$(cpu "$TB"); s=$(date +%s.%N)
  PS -c "SELECT tide.start_backfill('t', 'p_$kind', chunk_size => ${CHUNK:-5000})" >/dev/null
  sleep 0.15
  R=""
  for _ in $(seq 1 100); do
    R=$(PS -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_tide reader' LIMIT 1")
    [ -n "$R" ] && break; sleep 0.02
  done
  r0=$(cpu $R)
  echo 0 > $OUT/reader_cpu
  [ -n "$R" ] && ( while [ -r /proc/$R/stat ]; do cpu $R > $OUT/reader_cpu; sleep 0.05; done ) &
  if [ -n "${PERF:-}" ]; then perf record -F 499 -g -o $OUT/$kind.data -p "$W" -- sleep ${PERF_S:-3} >/dev/null 2>&1 & fi
  PS -c "SELECT tide.wait_for_backfill('t', 'p_$kind', timeout => interval '600 s')" >/dev/null
  e=$(date +%s.%N); w1=$(cpu $W); r1=$(cat $OUT/reader_cpu); t1=$(cpu "$TB")
  wait || true
  echo "written_as: $(PS -c "SELECT string_agg(DISTINCT coalesce(written_as, '-'), ',') FROM tide.chunks")"
  echo "$kind: wall $(awk "BEGIN { print $e - $s }") s; cpu worker $(awk "BEGIN { print $w1 - $w0 }") s, reader $(awk "BEGIN { print $r1 - $r0 }") s (+ before $r0), target backend $(awk "BEGIN { print $t1 - $t0 }") s"
  PS -c "SELECT tide.drop_pipeline('p_$kind')" >/dev/null
done
