#!/usr/bin/env bash
# Watch pg_tide's installed files for in-place rewrites (scripts/test.sh runs it around every
# stage).
#
#   scripts/installed-files.sh snapshot DIR...       one line per pg_tide* file under each DIR:
#                                                    inode size mtime sha256 path
#   scripts/installed-files.sh compare BEFORE AFTER  exit 1, naming each file that was rewritten in
#                                                    place (same inode, other contents or times)
#   scripts/installed-files.sh selftest              shows that compare catches an in-place write
#                                                    and lets an install by rename through
#
# Why: a server that preloads pg_tide maps pg_tide.so; writing that file in place (cp over it)
# changes the pages under the running server, which then dies with SIGBUS. Installing by rename
# (write a new file, mv it over the old name) gives the file a new inode and leaves the mapped
# one alone. So an in-place rewrite shows as the same inode with other contents.
set -euo pipefail

snapshot() {
    local d f
    for d in "$@"; do
        [[ -d "$d" ]] || continue
        while IFS= read -r -d '' f; do
            # (paths with blanks are not supported: installation paths have none)
            printf '%s %s %s\n' "$(stat -c '%i %s %Y' "$f")" "$(sha256sum "$f" | cut -d' ' -f1)" "$f"
        done < <(find "$d" -maxdepth 1 -type f -name 'pg_tide*' -print0)
    done | sort -k5
}

compare() {
    awk '
        NR == FNR { ino[$5] = $1; rest[$5] = $2 " " $3 " " $4; next }
        ($5 in ino) && ino[$5] == $1 && rest[$5] != ($2 " " $3 " " $4) {
            print "rewritten in place (inode " $1 " kept, contents changed): " $5; bad = 1
        }
        END { exit bad }
    ' "$1" "$2"
}

selftest() {
    local t
    t="$(mktemp -d)"
    trap 'rm -rf "$t"' RETURN
    printf 'old library\n' >"$t/pg_tide.so"
    snapshot "$t" >"$t/before"
    sleep 1.1
    # Install by rename: passes.
    printf 'new library\n' >"$t/pg_tide.so.new"
    mv -f "$t/pg_tide.so.new" "$t/pg_tide.so"
    snapshot "$t" >"$t/after"
    if ! compare "$t/before" "$t/after" >/dev/null; then
        echo "selftest FAILED: an install by rename was reported as in place" >&2
        return 1
    fi
    # In-place write (what cp and cargo-pgrx's install do to an existing file): caught.
    cp "$t/after" "$t/before"
    printf 'newer library!\n' >"$t/pg_tide.so"
    snapshot "$t" >"$t/after"
    if compare "$t/before" "$t/after" >/dev/null; then
        echo "selftest FAILED: an in-place write was not caught" >&2
        return 1
    fi
    echo "selftest ok: in-place write caught, install by rename let through"
}

case "${1:-}" in
    snapshot) shift; snapshot "$@" ;;
    compare) [[ $# -eq 3 ]] || { echo "usage: $0 compare BEFORE AFTER" >&2; exit 2; }; compare "$2" "$3" ;;
    selftest) selftest ;;
    *) echo "usage: $0 snapshot DIR... | compare BEFORE AFTER | selftest" >&2; exit 2 ;;
esac
