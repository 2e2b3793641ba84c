#!/usr/bin/env bash
# Scratch PostgreSQL clusters (of TIDE_PG_BIN: the version TIDE_PG, default 15) for tests, the demo and benchmarks.
#
#   scripts/cluster.sh init NAME [--no-preload] [--wal-level LEVEL] [--conf 'key=value']... [--initdb ARG]...
#   scripts/cluster.sh start NAME
#   scripts/cluster.sh stop NAME [fast|immediate|smart]     (default fast; a stopped cluster is fine)
#   scripts/cluster.sh restart NAME
#   scripts/cluster.sh basebackup NAME SOURCE [--standby]   NAME: a copy of running SOURCE (pg_basebackup), own port, not started;
#                                           --standby: a streaming standby of SOURCE (-R)
#   scripts/cluster.sh promote NAME         promote a standby (waits until it accepts writes)
#   scripts/cluster.sh status NAME          exit 0 running, 3 stopped, 4 no such cluster
#   scripts/cluster.sh psql NAME [psql args...]
#   scripts/cluster.sh port NAME            prints the TCP port
#   scripts/cluster.sh env NAME             prints: export PGHOST=... PGPORT=... PGUSER=postgres PGDATABASE=postgres
#   scripts/cluster.sh log NAME             prints the server log path
#   scripts/cluster.sh destroy NAME         stops (immediate) and removes
#   scripts/cluster.sh list
#   scripts/cluster.sh prune                destroys test clusters (t_*_PID_N) whose process PID is gone
#
# Layout: ${TIDE_CLUSTERS:-/tmp/pg_tide_clusters}/NAME/{data/,server.log,port}, owned by
# postgres; the unix socket lives in NAME/. Servers listen on 127.0.0.1 only, trust auth,
# user postgres. All pg_ctl/initdb/psql run as the postgres OS user.
# Environment: TIDE_CLUSTERS, TIDE_PG_BIN, TIDE_PORT_BASE (25432, below the kernel's ephemeral port range so a TIME-WAIT client socket cannot take it), TIDE_START_TIMEOUT (60 s).
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

BASE="${TIDE_CLUSTERS:-/tmp/pg_tide_clusters}"
PORT_BASE="${TIDE_PORT_BASE:-25432}"
PORT_SPAN=1000
START_TIMEOUT="${TIDE_START_TIMEOUT:-60}"
PG_CTL="$TIDE_PG_BIN/pg_ctl"

log() { tide_log cluster "$@"; }
die() { tide_die cluster "$@"; }

usage() {
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2
    exit 2
}

# --- helpers -----------------------------------------------------------------------
check_name() {
    [[ -n "${1:-}" ]] || usage
    [[ "$1" =~ ^[A-Za-z0-9_.-]+$ && "$1" != .* ]] || die "bad cluster name '$1' (use letters, digits, _ . -)"
}

set_paths() {
    NAME="$1"
    DIR="$BASE/$NAME"
    PGDATA_DIR="$DIR/data"
    LOGFILE="$DIR/server.log"
    PORTFILE="$DIR/port"
}

exists() {
    [[ -f "$PGDATA_DIR/PG_VERSION" ]] && return 0
    # PGDATA is 0700: a caller other than root/postgres cannot look inside.
    [[ -d "$DIR" && ! -x "$PGDATA_DIR" ]] && as_pg test -f "$PGDATA_DIR/PG_VERSION"
}
require_exists() { exists || die "no cluster '$NAME' (run: $0 init $NAME)"; }
port_of() { cat "$PORTFILE"; }

# pg_ctl and friends run as postgres from a directory postgres can enter.
pg() { (cd / && as_pg "$@"); }

running() { pg "$PG_CTL" -D "$PGDATA_DIR" status >/dev/null 2>&1; }

ensure_base() {
    if [[ ! -d "$BASE" ]]; then
        if ! pg mkdir -p "$BASE" 2>/dev/null; then
            as_root mkdir -p "$BASE"
            as_root chown "$TIDE_PG_USER:" "$BASE"
        fi
        pg chmod 0755 "$BASE"
    fi
    # lock file for port allocation, writable by whoever calls us
    if [[ ! -e "$BASE/.lock" ]]; then
        pg touch "$BASE/.lock"
        pg chmod 0666 "$BASE/.lock"
    fi
}

port_listening() {
    local p="$1"
    if command -v ss >/dev/null 2>&1; then
        ss -Hltn "sport = :$p" 2>/dev/null | grep -q . && return 0
    fi
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && return 0
    return 1
}

port_recorded() {
    local p="$1" f
    for f in "$BASE"/*/port; do
        [[ -f "$f" ]] || continue
        [[ "$(cat "$f" 2>/dev/null)" == "$p" ]] && return 0
    done
    return 1
}

pick_port() {
    local p
    for ((p = PORT_BASE; p < PORT_BASE + PORT_SPAN; p++)); do
        port_recorded "$p" && continue
        port_listening "$p" && continue
        echo "$p"
        return 0
    done
    die "no free port in $PORT_BASE..$((PORT_BASE + PORT_SPAN - 1))"
}

locale_flag() {
    if locale -a 2>/dev/null | grep -qiE '^c\.utf-?8$'; then
        echo "--locale=C.UTF-8"
    else
        echo "--locale=C"
    fi
}

print_log_tail() {
    local n="${1:-50}"
    echo "----- last $n lines of $LOGFILE -----" >&2
    tail -n "$n" "$LOGFILE" >&2 2>/dev/null || echo "(no server log)" >&2
    echo "----- end of $LOGFILE -----" >&2
}

# --- subcommands ---------------------------------------------------------------------
cmd_init() {
    local preload=1 wal_level=logical
    local -a confs=() initdb_args=()
    while (($#)); do
        case "$1" in
            --no-preload) preload=0 ;;
            --wal-level) [[ $# -ge 2 ]] || usage; wal_level="$2"; shift ;;
            --wal-level=*) wal_level="${1#*=}" ;;
            --conf) [[ $# -ge 2 ]] || usage; confs+=("$2"); shift ;;
            --conf=*) confs+=("${1#*=}") ;;
            --initdb) [[ $# -ge 2 ]] || usage; initdb_args+=("$2"); shift ;;
            *) die "init: unknown option '$1'" ;;
        esac
        shift
    done

    ensure_base
    if exists; then
        log "cluster '$NAME' already initialized (port $(port_of), $DIR): nothing to do"
        return 0
    fi
    local sock="$DIR/.s.PGSQL.$PORT_BASE.lock"
    ((${#sock} < 100)) || die "unix socket path '$sock' would be too long; use a shorter name or TIDE_CLUSTERS"

    # A half-made directory from an interrupted init: start over.
    if [[ -e "$DIR" ]]; then
        log "removing incomplete cluster directory $DIR"
        pg rm -rf "$DIR"
    fi

    local port
    port="$(reserve_port)"
    [[ -n "$port" ]] || die "could not reserve a port"

    local loc
    loc="$(locale_flag)"
    log "initdb '$NAME' in $PGDATA_DIR ($loc, port $port)"
    if ! pg "$TIDE_PG_BIN/initdb" -D "$PGDATA_DIR" -U postgres -A trust -E UTF8 "$loc" \
        --no-sync --no-instructions "${initdb_args[@]}" >"/tmp/pg_tide_initdb.$$.log" 2>&1; then
        cat "/tmp/pg_tide_initdb.$$.log" >&2
        rm -f "/tmp/pg_tide_initdb.$$.log"
        pg rm -rf "$DIR"
        die "initdb failed for '$NAME'"
    fi
    rm -f "/tmp/pg_tide_initdb.$$.log"

    local wal_senders=32
    [[ "$wal_level" == minimal ]] && wal_senders=0
    {
        echo ""
        echo "# ---- pg_tide scratch cluster '$NAME' (scripts/cluster.sh) ----"
        echo "port = $port"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$DIR'"
        echo "wal_level = $wal_level"
        if ((preload)); then
            echo "shared_preload_libraries = 'pg_tide'"
        fi
        echo "max_replication_slots = 32"
        echo "max_wal_senders = $wal_senders"
        echo "max_worker_processes = 40"
        echo "max_logical_replication_workers = 8"
        echo "fsync = off"
        echo "synchronous_commit = on"
        echo "log_line_prefix = '%m [%p] %b '"
        if ((${#confs[@]})); then
            echo "# --conf"
            printf '%s\n' "${confs[@]}"
        fi
    } | pg tee -a "$PGDATA_DIR/postgresql.conf" >/dev/null
    pg touch "$LOGFILE"
    pg chmod 0644 "$LOGFILE"
    log "initialized '$NAME': port $port, preload=$([[ $preload == 1 ]] && echo pg_tide || echo none), wal_level=$wal_level${confs[*]:+, conf: ${confs[*]}}"
}

# Reserve a port under the lock and make NAME's directory (parallel inits never pick the same).
reserve_port() {
    (
        exec 9>>"$BASE/.lock"
        flock 9
        p="$(pick_port)"
        pg mkdir -p "$DIR"
        pg chmod 0755 "$DIR"
        echo "$p" | pg tee "$PORTFILE" >/dev/null
        echo "$p"
    )
}

cmd_basebackup() {
    local src="${1:-}" standby=0
    [[ -n "$src" ]] || usage
    check_name "$src"
    [[ "${2:-}" == "--standby" ]] && standby=1
    local src_port
    src_port="$(cat "$BASE/$src/port")" || die "no cluster '$src'"
    ensure_base
    exists && die "cluster '$NAME' already exists"
    [[ -e "$DIR" ]] && pg rm -rf "$DIR"
    local port
    port="$(reserve_port)"
    [[ -n "$port" ]] || die "could not reserve a port"
    local -a flags=(-h 127.0.0.1 -p "$src_port" -U postgres -D "$PGDATA_DIR" -X stream -c fast --no-sync)
    ((standby)) && flags+=(-R)
    log "pg_basebackup of '$src' (port $src_port) into '$NAME' (port $port)$( ((standby)) && echo ', as a standby')"
    if ! pg "$TIDE_PG_BIN/pg_basebackup" "${flags[@]}"; then
        pg rm -rf "$DIR"
        die "pg_basebackup of '$src' failed"
    fi
    {
        echo ""
        echo "# ---- copy '$NAME' of '$src' (scripts/cluster.sh basebackup) ----"
        echo "port = $port"
        echo "unix_socket_directories = '$DIR'"
    } | pg tee -a "$PGDATA_DIR/postgresql.conf" >/dev/null
    pg touch "$LOGFILE"
    pg chmod 0644 "$LOGFILE"
}

cmd_promote() {
    require_exists
    log "promoting '$NAME'"
    pg "$PG_CTL" -D "$PGDATA_DIR" -w -t "$START_TIMEOUT" promote >/dev/null
}

cmd_start() {
    require_exists
    if running; then
        log "cluster '$NAME' already running on port $(port_of)"
        return 0
    fi
    # pg_ctl would create the log 0600; keep it readable for non-root callers.
    pg touch "$LOGFILE"
    pg chmod 0644 "$LOGFILE"
    log "starting '$NAME' on 127.0.0.1:$(port_of) (log: $LOGFILE)"
    if ! pg "$PG_CTL" -D "$PGDATA_DIR" -l "$LOGFILE" -w -t "$START_TIMEOUT" start >/dev/null; then
        echo "[cluster] ERROR: cluster '$NAME' failed to start" >&2
        print_log_tail 50
        exit 1
    fi
    log "cluster '$NAME' is up"
}

cmd_stop() {
    local mode="${1:-fast}"
    case "$mode" in fast | immediate | smart) ;; *) die "stop: mode must be fast, immediate or smart" ;; esac
    if ! exists; then
        log "no cluster '$NAME': nothing to stop"
        return 0
    fi
    if ! running; then
        log "cluster '$NAME' already stopped"
        return 0
    fi
    log "stopping '$NAME' ($mode)"
    pg "$PG_CTL" -D "$PGDATA_DIR" -m "$mode" -w -t "$START_TIMEOUT" stop >/dev/null
}

cmd_status() {
    if ! exists; then
        echo "$NAME: no such cluster ($DIR)"
        return 4
    fi
    if running; then
        local pid
        pid="$(head -n1 "$PGDATA_DIR/postmaster.pid" 2>/dev/null || pg head -n1 "$PGDATA_DIR/postmaster.pid")"
        echo "$NAME: running (pid $pid) on 127.0.0.1:$(port_of), dir $DIR"
        return 0
    fi
    echo "$NAME: stopped (port $(port_of)), dir $DIR"
    return 3
}

cmd_psql() {
    require_exists
    local port
    port="$(port_of)"
    local -a cmd=(env PGHOST=127.0.0.1 "PGPORT=$port" PGUSER=postgres PGDATABASE=postgres
        "$TIDE_PG_BIN/psql" -X "$@")
    # Stay in the caller's directory (relative -f paths) when postgres may enter it.
    if as_pg test -x "$PWD" 2>/dev/null; then
        as_pg "${cmd[@]}"
    else
        pg "${cmd[@]}"
    fi
}

cmd_destroy() {
    if [[ ! -e "$DIR" ]]; then
        log "no cluster '$NAME': nothing to destroy"
        return 0
    fi
    if exists && running; then
        log "stopping '$NAME' (immediate)"
        pg "$PG_CTL" -D "$PGDATA_DIR" -m immediate -w stop >/dev/null || true
    fi
    log "removing $DIR"
    pg rm -rf "$DIR" 2>/dev/null || as_root rm -rf "$DIR"
}

cmd_list() {
    local d n any=0
    for d in "$BASE"/*/; do
        [[ -d "$d" ]] || continue
        n="$(basename "$d")"
        set_paths "$n"
        any=1
        if ! exists; then
            printf '%-40s %-6s %s\n' "$n" "-" "incomplete"
        elif running; then
            printf '%-40s %-6s %s\n' "$n" "$(port_of)" "running"
        else
            printf '%-40s %-6s %s\n' "$n" "$(port_of)" "stopped"
        fi
    done
    ((any)) || log "no clusters under $BASE"
}

cmd_prune() {
    local d n pid
    for d in "$BASE"/*/; do
        [[ -d "$d" ]] || continue
        n="$(basename "$d")"
        [[ "$n" =~ ^t_.*_([0-9]+)_[0-9]+$ ]] || continue
        pid="${BASH_REMATCH[1]}"
        [[ -d "/proc/$pid" ]] && continue
        set_paths "$n"
        cmd_destroy
    done
}

# --- main ------------------------------------------------------------------------------
[[ $# -ge 1 ]] || usage
sub="$1"
shift
case "$sub" in
    list) cmd_list; exit 0 ;;
    prune) cmd_prune; exit 0 ;;
    -h | --help | help) usage ;;
esac
check_name "${1:-}"
set_paths "$1"
shift
case "$sub" in
    init) cmd_init "$@" ;;
    start) cmd_start ;;
    stop) cmd_stop "$@" ;;
    restart) cmd_stop fast; cmd_start ;;
    basebackup) cmd_basebackup "$@" ;;
    promote) cmd_promote ;;
    status) cmd_status ;;
    psql) cmd_psql "$@" ;;
    port) require_exists; port_of ;;
    env) require_exists; echo "export PGHOST=127.0.0.1 PGPORT=$(port_of) PGUSER=postgres PGDATABASE=postgres" ;;
    log) echo "$LOGFILE" ;;
    destroy) cmd_destroy ;;
    *) usage ;;
esac
