#!/usr/bin/env bash
# Install pg_tide's files from one or more directories into a PostgreSQL 15 installation.
#
#   scripts/install-tree.sh PG_BIN DIR...
#
# Every regular file named pg_tide* under each DIR (a `cargo pgrx package` output tree, a release
# tree from scripts/release.sh, or another installation's lib and extension directories) goes to
# the installation of PG_BIN: `pg_tide.so` into its pkglibdir, `pg_tide.control` and
# `pg_tide--*.sql` into its sharedir/extension. Each file is put in place by rename (written next
# to its destination, then moved over it), never rewritten in place: a running server that maps
# the old library keeps its copy (an in-place write would crash it with SIGBUS). Files of other
# versions already there stay. Uses sudo for a destination the caller cannot write.
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

(($# >= 2)) || tide_die install-tree "usage: $0 PG_BIN DIR..."
pg_config="$1/pg_config"
shift
[[ -x "$pg_config" ]] || tide_die install-tree "$pg_config not found"
pkglibdir="$("$pg_config" --pkglibdir)"
extdir="$("$pg_config" --sharedir)/extension"

put() { # put SRC DEST MODE
    local src="$1" dest="$2" mode="$3" dir
    dir="$(dirname "$dest")"
    if [[ -w "$dir" ]]; then
        install -m "$mode" "$src" "$dest.tide-new" && mv -f "$dest.tide-new" "$dest"
    else
        as_root install -m "$mode" "$src" "$dest.tide-new" && as_root mv -f "$dest.tide-new" "$dest"
    fi
}

n=0
for d in "$@"; do
    [[ -d "$d" ]] || tide_die install-tree "$d is not a directory"
    while IFS= read -r -d '' f; do
        name="${f##*/}"
        case "$name" in
            pg_tide.so) put "$f" "$pkglibdir/$name" 0755 ;;
            pg_tide.control | pg_tide--*.sql) put "$f" "$extdir/$name" 0644 ;;
            *) continue ;;
        esac
        n=$((n + 1))
    done < <(find "$d" -type f -name 'pg_tide*' -print0)
done
((n > 0)) || tide_die install-tree "no pg_tide files found in $*"
tide_log install-tree "installed $n files into $pkglibdir and $extdir"
