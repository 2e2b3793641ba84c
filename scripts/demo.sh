#!/usr/bin/env bash
# A guided tour of pg_tide on a scratch cluster named `demo`.
#
#   scripts/demo.sh
#
# Builds and installs the extension (scripts/install.sh; TIDE_SKIP_INSTALL=1 skips it),
# creates or reuses the cluster `demo` (scripts/cluster.sh), and runs one section per
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
        section "Build and install pg_tide into the system PostgreSQL 15"
        bash "$TIDE_REPO/scripts/install.sh"
    fi

    section "A scratch cluster '$CLUSTER' with pg_tide preloaded and wal_level=logical"
    bash "$CLUSTER_SH" init "$CLUSTER"
    # A new build is only loaded by a fresh postmaster.
    if bash "$CLUSTER_SH" status "$CLUSTER" >/dev/null 2>&1; then
        bash "$CLUSTER_SH" restart "$CLUSTER"
    else
        bash "$CLUSTER_SH" start "$CLUSTER"
    fi
    bash "$CLUSTER_SH" status "$CLUSTER"

    section "The extension"
    sql "CREATE EXTENSION IF NOT EXISTS pg_tide;"
    sql "SELECT tide.version();"

    section "Configuration check"
    sql "SELECT tide.check();"

    section "The launcher background worker"
    wait_for "the launcher" "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'pg_tide launcher'" 30 || true
    sql "SELECT pid, backend_type, datname, backend_start FROM pg_stat_activity WHERE backend_type = 'pg_tide launcher';"
}

trap finish EXIT
main "$@"
