# shellcheck shell=bash
# shellcheck disable=SC2034  # variables used by the scripts that source this
# Shared helpers for pg_tide's scripts. Source it; do not run it.
#
#   TIDE_REPO     repository root (derived from this file's location)
#   TIDE_PG_BIN   PostgreSQL 15 binaries (default /usr/lib/postgresql/15/bin)
#   TIDE_PG_CONFIG  $TIDE_PG_BIN/pg_config

TIDE_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TIDE_PG_BIN="${TIDE_PG_BIN:-/usr/lib/postgresql/15/bin}"
TIDE_PG_CONFIG="$TIDE_PG_BIN/pg_config"
TIDE_PG_USER=postgres

# rustup installs cargo into ~/.cargo/bin; a non-login shell may not have it on PATH.
if ! command -v cargo >/dev/null 2>&1 && [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
    # shellcheck disable=SC1091
    . "${CARGO_HOME:-$HOME/.cargo}/env"
fi

# log TAG message...   -> "[TAG] message" on stderr (stdout stays clean for values)
tide_log() {
    local tag="$1"
    shift
    printf '[%s] %s\n' "$tag" "$*" >&2
}

tide_die() {
    local tag="$1"
    shift
    printf '[%s] ERROR: %s\n' "$tag" "$*" >&2
    exit 1
}

tide_is_root() { [[ ${EUID:-$(id -u)} -eq 0 ]]; }

# Run a command as root: directly when we are root, else through sudo.
as_root() {
    if tide_is_root; then
        "$@"
    else
        sudo -- "$@"
    fi
}

# Run a command as the postgres OS user: directly when we are postgres,
# via runuser when we are root, else via sudo.
as_pg() {
    if [[ "$(id -un)" == "$TIDE_PG_USER" ]]; then
        "$@"
    elif tide_is_root; then
        runuser -u "$TIDE_PG_USER" -- "$@"
    else
        sudo -u "$TIDE_PG_USER" -- "$@"
    fi
}
