#!/usr/bin/env bash
# Build pg_tide (release) and install it into the system PostgreSQL 15.
#
#   scripts/install.sh
#
# Runs scripts/setup.sh first unless TIDE_SKIP_SETUP=1. Uses `--sudo` when not root.
# Restart running clusters that preload pg_tide to pick up a new build.
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

log() { tide_log install "$@"; }

if [[ "${TIDE_SKIP_SETUP:-0}" != 1 ]]; then
    bash "$TIDE_REPO/scripts/setup.sh"
fi

cd "$TIDE_REPO"
args=(pgrx install --release --pg-config "$TIDE_PG_CONFIG")
tide_is_root || args+=(--sudo)
log "cargo ${args[*]}"
cargo "${args[@]}"

pkglibdir="$("$TIDE_PG_CONFIG" --pkglibdir)"
sharedir="$("$TIDE_PG_CONFIG" --sharedir)"
[[ -f "$pkglibdir/pg_tide.so" ]] || tide_die install "$pkglibdir/pg_tide.so missing after install"
[[ -f "$sharedir/extension/pg_tide.control" ]] || tide_die install "$sharedir/extension/pg_tide.control missing after install"
log "installed: $pkglibdir/pg_tide.so ($(stat -c %y "$pkglibdir/pg_tide.so" | cut -d. -f1))"
files=("$sharedir"/extension/pg_tide*)
log "installed: ${files[*]}"
