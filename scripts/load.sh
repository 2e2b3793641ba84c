#!/usr/bin/env bash
# Keep the machine busy while tests run, as a developer's laptop or a shared CI host is.
#
#   scripts/load.sh start N    starts N CPU-bound and N I/O-bound processes (in the background,
#                              their process group recorded in $TIDE_LOAD_DIR/pids); prints nothing
#   scripts/load.sh stop       stops them (also a no-op when none runs)
#
# CPU-bound: a shell loop computing checksums of /dev/urandom blocks, forever. I/O-bound: writes
# 64 MiB files with fsync in $TIDE_LOAD_DIR, over and over (the files are removed at stop).
# scripts/test.sh runs `start "$TIDE_TEST_LOAD"` before its stages when TIDE_TEST_LOAD is set,
# and `stop` when it exits (whatever the outcome).
set -euo pipefail
TIDE_LOAD_DIR="${TIDE_LOAD_DIR:-/tmp/pg_tide_load}"

start() {
    local n="$1" i
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "load.sh: N must be a number, not '$n'" >&2; exit 2; }
    stop
    mkdir -p "$TIDE_LOAD_DIR"
    : >"$TIDE_LOAD_DIR/pids"
    for ((i = 0; i < n; i++)); do
        setsid bash -c 'while :; do head -c 8388608 /dev/urandom | sha256sum >/dev/null; done' \
            </dev/null >/dev/null 2>&1 &
        echo "$!" >>"$TIDE_LOAD_DIR/pids"
        setsid bash -c "while :; do dd if=/dev/zero of='$TIDE_LOAD_DIR/io.$i' bs=1M count=64 conv=fsync status=none; rm -f '$TIDE_LOAD_DIR/io.$i'; done" \
            </dev/null >/dev/null 2>&1 &
        echo "$!" >>"$TIDE_LOAD_DIR/pids"
    done
    echo "[load] started $n CPU-bound and $n I/O-bound processes" >&2
}

stop() {
    local pid
    if [[ -f "$TIDE_LOAD_DIR/pids" ]]; then
        while read -r pid; do
            [[ -n "$pid" ]] || continue
            # Each runs in its own session: kill the whole group (the loop and its children).
            kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        done <"$TIDE_LOAD_DIR/pids"
        rm -f "$TIDE_LOAD_DIR/pids"
        echo "[load] stopped" >&2
    fi
    rm -f "$TIDE_LOAD_DIR"/io.* 2>/dev/null || true
}

case "${1:-}" in
    start) start "${2:?usage: load.sh start N}" ;;
    stop) stop ;;
    *) echo "usage: load.sh start N | stop" >&2; exit 2 ;;
esac
