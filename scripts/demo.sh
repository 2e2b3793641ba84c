#!/usr/bin/env bash
# A guided tour of pg_tide on a scratch cluster named `demo`.
#
#   [TIDE_PG=NN] scripts/demo.sh      NN: 15 (default), 16, 17 or 18
#
# Builds and installs the extension (scripts/install.sh; TIDE_SKIP_INSTALL=1 skips it),
# creates the cluster `demo` afresh (scripts/cluster.sh), and runs one section per
# capability. The cluster is left running; the end of the output says how to stop it.
#
# To add a capability: add a block at the end of main() with
#   section "What it shows"
#   sql "SELECT ...;"
# (sql echoes the statement and runs it through psql on the demo cluster).
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CLUSTER=demo
CLUSTER_SH="$TIDE_REPO/scripts/cluster.sh"
SHOWN=()
if [[ -t 1 ]]; then BOLD=$'\033[1m' CYAN=$'\033[36m' RESET=$'\033[0m'; else BOLD="" CYAN="" RESET=""; fi

# section "title": a banner; remembered for the closing summary.
section() {
    SHOWN+=("$1")
    printf '\n%s=== %s ===%s\n' "$BOLD" "$1" "$RESET"
}

# sql "statement(s)" [psql args...]: echo, then run on the demo cluster; stops the demo on error.
sql() {
    local stmt="$1"
    shift
    printf '%sdemo=#%s %s\n' "$CYAN" "$RESET" "$stmt"
    bash "$CLUSTER_SH" psql "$CLUSTER" -v ON_ERROR_STOP=1 -P pager=off "$@" -c "$stmt"
}

# wait_for "description" "query returning true" [seconds]
wait_for() {
    local what="$1" query="$2" secs="${3:-30}" i
    for ((i = 0; i < secs * 5; i++)); do
        if [[ "$(bash "$CLUSTER_SH" psql "$CLUSTER" -tAq -c "$query" 2>/dev/null)" == t ]]; then
            return 0
        fi
        sleep 0.2
    done
    echo "(gave up waiting ${secs}s for $what)"
    return 1
}

finish() {
    local rc=$?
    printf '\n%s=== summary ===%s\n' "$BOLD" "$RESET"
    if ((${#SHOWN[@]})); then
        echo "Shown:"
        printf '  - %s\n' "${SHOWN[@]}"
    fi
    ((rc == 0)) || echo "The demo stopped early (exit $rc); server log: $(bash "$CLUSTER_SH" log "$CLUSTER")"
    echo
    if bash "$CLUSTER_SH" status "$CLUSTER" >/dev/null 2>&1; then
        echo "The cluster '$CLUSTER' is left running so you can explore:"
    else
        echo "The cluster '$CLUSTER' is not running. To use or remove it:"
        echo "  scripts/cluster.sh start $CLUSTER"
    fi
    echo "  scripts/cluster.sh psql $CLUSTER          # psql on it"
    echo "  eval \"\$(scripts/cluster.sh env $CLUSTER)\"  # PGHOST/PGPORT/... for other tools"
    echo "  scripts/cluster.sh stop $CLUSTER          # stop it (keeps the data)"
    echo "  scripts/cluster.sh destroy $CLUSTER       # stop it and remove it"
    exit "$rc"
}

main() {
    if [[ "${TIDE_SKIP_INSTALL:-0}" != 1 ]]; then
        section "Build and install pg_tide into PostgreSQL $TIDE_PG ($TIDE_PG_BIN/..)"
        bash "$TIDE_REPO/scripts/install.sh"
    fi

    section "A scratch cluster '$CLUSTER' with pg_tide preloaded and wal_level=logical"
    # A fresh cluster every time: a new build needs a fresh postmaster, and an extension created
    # by an earlier build would keep that build's SQL definitions.
    bash "$CLUSTER_SH" destroy "$CLUSTER" >/dev/null 2>&1 || true
    bash "$CLUSTER_SH" init "$CLUSTER"
    bash "$CLUSTER_SH" start "$CLUSTER"
    bash "$CLUSTER_SH" status "$CLUSTER"

    section "The extension"
    sql "CREATE EXTENSION IF NOT EXISTS pg_tide;"
    sql "SELECT tide.version();"

    section "Configuration check"
    sql "SELECT tide.check();"

    section "The launcher background worker"
    wait_for "the launcher" "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'pg_tide launcher'" 30 || true
    sql "SELECT pid, backend_type, datname, backend_start FROM pg_stat_activity WHERE backend_type = 'pg_tide launcher';"

    section "Live capture: a pipeline streams committed changes into tide.outbox"
    sql "SELECT tide.drop_pipeline(name) FROM tide.pipeline;" -q
    sql "DROP TABLE IF EXISTS public.accounts, public.orders, public.orders_copy; TRUNCATE tide.outbox;" -q
    sql "CREATE TABLE public.accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2) NOT NULL);"
    sql "SELECT tide.create_pipeline('demo');"
    sql "SELECT tide.add_table('demo', 'public.accounts', backfill => false);"
    sql "INSERT INTO public.accounts VALUES (1, 'ada', 100.00), (2, 'bob', 50.00);
BEGIN; UPDATE public.accounts SET balance = balance - 30 WHERE id = 1; UPDATE public.accounts SET balance = balance + 30 WHERE id = 2; COMMIT;
DELETE FROM public.accounts WHERE id = 2;"
    sql "SELECT tide.wait_for_pipeline('demo');"
    sql "SELECT id, commit_lsn, position, relation, op, key, \"row\" FROM tide.outbox ORDER BY id;"
    sql "SELECT name, state, worker_pid, lag_bytes, events_applied, transactions_applied, last_error FROM tide.pipelines;"

    section "Backfill: 1,000,000 existing rows, chunk by chunk, while writers keep writing"
    sql "CREATE TABLE public.orders (id int PRIMARY KEY, customer int NOT NULL, total numeric(12,2) NOT NULL,
        status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
INSERT INTO public.orders SELECT g, g % 5000, (g % 997) * 1.25, 'new', now() FROM generate_series(1, 1000000) g;"
    local script
    script="$(mktemp /tmp/pg_tide_demo_XXXX.sql)"
    cat >"$script" <<'SQL'
\set id random(1, 1100000)
BEGIN;
UPDATE public.orders SET status = 'paid', total = total + 1 WHERE id = :id;
DELETE FROM public.orders WHERE id = :id + 7;
INSERT INTO public.orders VALUES (:id + 13, 1, 9.99, 'new', now()) ON CONFLICT (id) DO UPDATE SET status = 'shipped';
COMMIT;
SQL
    chmod 644 "$script"
    local port
    port="$(bash "$CLUSTER_SH" port "$CLUSTER")"
    echo "(starting 2 pgbench writers on public.orders for 25 s)"
    as_pg "$TIDE_PG_BIN/pgbench" -h 127.0.0.1 -p "$port" -U postgres -n -c 2 -T 25 -f "$script" postgres >/tmp/pg_tide_demo_pgbench.log 2>&1 &
    local bench=$!
    sql "SELECT tide.add_table('demo', 'public.orders');   -- queues the backfill"
    for _ in 1 2 3 4; do
        sleep 3
        sql "SELECT relation, state, chunks_done, rows_read, rows_dropped, rows_emitted, round(fraction_done::numeric, 3) AS done, round(rows_per_second_now) AS rows_per_s, estimated_time_left FROM tide.backfills WHERE relation = 'public.orders';"
    done
    wait "$bench" || true
    tail -n 4 /tmp/pg_tide_demo_pgbench.log
    rm -f "$script"
    sql "SELECT tide.wait_for_backfill('public.orders', timeout => '10 minutes');"
    sql "SELECT tide.wait_for_pipeline('demo');"
    sql "SELECT * FROM tide.readiness;"
    sql "SELECT id, state, chunks_done, rows_read, rows_dropped, rows_emitted, finished_at - started_at AS took FROM tide.backfills WHERE relation = 'public.orders';"
    sql "SELECT chunk, key_from, key_to, low_lsn, high_lsn, rows_read, rows_dropped, duration FROM tide.chunks WHERE relation = 'public.orders' ORDER BY chunk DESC LIMIT 5;"

    section "Zero differences: replay the outbox onto an empty copy and compare with the source"
    # The last event of each key, in outbox order, is the key's state at the target.
    sql "CREATE TABLE public.orders_copy (LIKE public.orders INCLUDING ALL);
INSERT INTO public.orders_copy
SELECT (jsonb_populate_record(NULL::public.orders, e.\"row\")).*
  FROM (SELECT DISTINCT ON (key) op, \"row\" FROM tide.outbox
         WHERE relation = 'public.orders' ORDER BY key, id DESC) e
 WHERE e.op <> 'delete';"
    sql "SELECT (SELECT count(*) FROM public.orders) AS source_rows, (SELECT count(*) FROM public.orders_copy) AS copy_rows,
       (SELECT count(*) FROM (TABLE public.orders EXCEPT TABLE public.orders_copy) a) AS missing_or_stale_in_copy,
       (SELECT count(*) FROM (TABLE public.orders_copy EXCEPT TABLE public.orders) b) AS extra_or_resurrected_in_copy;"

    section "A table target: a live copy of public.orders in schema replica, then verify it"
    sql "SELECT tide.create_pipeline('copy', 'table', '{\"schema\": \"replica\"}');"
    sql "SELECT tide.add_table('copy', 'public.orders');   -- creates replica.orders, backfills it"
    sql "SELECT tide.wait_for_backfill('public.orders', 'copy', '10 minutes');"
    sql "UPDATE public.orders SET status = 'refunded' WHERE id % 1000 = 0;"
    sql "SELECT tide.wait_for_pipeline('copy');"
    sql "SELECT range, kind, source_rows, target_rows FROM tide.verify('public.orders', 'copy', ranges => 20);"
    sql "UPDATE replica.orders SET total = 0 WHERE id = 4242;   -- damage the copy behind pg_tide's back"
    sql "SELECT range, key_from, key_to, missing, extra, changed, kind FROM tide.verify('public.orders', 'copy', ranges => 20);"
    sql "SELECT ranges_differing, backfill_id, action FROM tide.repair('public.orders', 'copy');"
    sql "SELECT tide.wait_for_backfill('public.orders', 'copy', '10 minutes');"
    sql "SELECT range, kind FROM tide.verify('public.orders', 'copy', ranges => 20);"
}

trap finish EXIT
main "$@"
