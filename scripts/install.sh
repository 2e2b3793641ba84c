#!/usr/bin/env bash
# Build pg_tide (release) and install it into the PostgreSQL of TIDE_PG (default 15: the system's;
# 16-18: the tree scripts/setup.sh unpacks), or the one of TIDE_PG_BIN.
#
#   scripts/install.sh
#
# Runs scripts/setup.sh first unless TIDE_SKIP_SETUP=1; TIDE_DEBUG_BUILD=1 installs a debug build.
# Files are put in place by rename (with sudo when not root), so running servers are not disturbed.
# Restart running clusters that preload pg_tide to pick up a new build.
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

log() { tide_log install "$@"; }

if [[ "${TIDE_SKIP_SETUP:-0}" != 1 ]]; then
    bash "$TIDE_REPO/scripts/setup.sh"
fi

cd "$TIDE_REPO"
# Package, then put each file in place by rename: a running server that has the old library
# mapped keeps its copy (overwriting the file in place would crash it).
# An output directory of this run's own: two installs at once (of two versions) must not take
# each other's files.
out="$TIDE_REPO/target/pg_tide-package-pg$TIDE_PG-$$"
rm -rf "$out"
trap 'rm -rf "$out"' EXIT
args=(pgrx package --pg-config "$TIDE_PG_CONFIG" --out-dir "$out")
[[ "${TIDE_DEBUG_BUILD:-0}" == 1 ]] && args+=(--debug)
log "cargo ${args[*]}"
cargo "${args[@]}"
bash "$TIDE_REPO/scripts/install-tree.sh" "$TIDE_PG_BIN" "$out"

pkglibdir="$("$TIDE_PG_CONFIG" --pkglibdir)"
sharedir="$("$TIDE_PG_CONFIG" --sharedir)"
[[ -f "$pkglibdir/pg_tide.so" ]] || tide_die install "$pkglibdir/pg_tide.so missing after install"
[[ -f "$sharedir/extension/pg_tide.control" ]] || tide_die install "$sharedir/extension/pg_tide.control missing after install"
log "installed: $pkglibdir/pg_tide.so ($(stat -c %y "$pkglibdir/pg_tide.so" | cut -d. -f1))"
files=("$sharedir"/extension/pg_tide*)
log "installed: ${files[*]}"
