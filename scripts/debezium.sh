#!/usr/bin/env bash
# Kafka Connect 4.4.0 and Debezium, fetched once with Maven, for the kafka suite's Debezium tests
# (pg_test/tests/kafka/debezium.rs: Debezium's PostgreSQL connector as the oracle of pg_tide's
# envelope, Debezium's JDBC sink reading pg_tide's topics) and bench B8.
#
#   scripts/debezium.sh fetch            fetch into the cache (once; later runs only check it)
#   scripts/debezium.sh dir              print the cache directory (fails if it is not complete)
#   scripts/debezium.sh start DIR WORKER.properties CONNECTOR.properties...
#                                        run a Connect standalone worker in the background
#                                        (ConnectStandalone), its pid in DIR/connect.pid, its log in
#                                        DIR/connect.log; the worker's plugin.path is the cache's
#                                        plugins/ unless WORKER.properties names one
#   scripts/debezium.sh stop DIR         stop the worker started in DIR (SIGTERM, then SIGKILL)
#
# The cache (TIDE_DEBEZIUM_HOME, default /var/cache/pg_tide/debezium-3.6.1 as root, else
# ~/.cache/pg_tide/debezium-3.6.1):
#   runtime/                              connect-runtime, connect-json, connect-transforms 4.4.0
#                                         and their dependencies, slf4j-simple (the worker's classpath)
#   plugins/debezium-connector-postgres/  io.debezium:debezium-connector-postgres 3.6.1.Final
#   plugins/debezium-connector-jdbc/      io.debezium:debezium-connector-jdbc 3.6.0.Final: Maven
#                                         Central serves no 3.6.1.Final of it (see
#                                         scripts/debezium/jdbc.pom.xml), with PostgreSQL's driver
# The Connect API jars are left out of the plugin directories (the worker's own are used, as in
# Debezium's distribution archives). The broker is not here: scripts/setup.sh's.
# Needs java (17+) and mvn; Maven's own repository is ~/.m2 (MAVEN_REPO_LOCAL overrides it).
set -euo pipefail
# shellcheck source=scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

log() { tide_log debezium "$@"; }
die() { tide_die debezium "$@"; }

DEBEZIUM_VERSION=3.6.1.Final
if [[ -z "${TIDE_DEBEZIUM_HOME:-}" ]]; then
    if tide_is_root; then
        TIDE_DEBEZIUM_HOME=/var/cache/pg_tide/debezium-3.6.1
    else
        TIDE_DEBEZIUM_HOME="$HOME/.cache/pg_tide/debezium-3.6.1"
    fi
fi
POMS="$TIDE_REPO/scripts/debezium"
# Which pom fills which directory of the cache.
declare -A PARTS=([runtime]=runtime [postgres]=plugins/debezium-connector-postgres [jdbc]=plugins/debezium-connector-jdbc)
# Jars the worker provides: never in a plugin directory. Not kafka-clients: Debezium 3.6 is built
# against Kafka 4.3, whose org.apache.kafka.common.utils.Sanitizer (its metrics' names) Kafka 4.4
# moved to ...utils.internals; a plugin's class loader asks the worker's first and falls back to
# the plugin's own kafka-clients 4.3.0 only for what 4.4.0 lacks.
# Nor Jackson's core: the worker's own (2.21.7, with its Blackbird module registered as a
# service) must be the only one, else the JDBC sink's Hibernate finds that module through the
# worker and fails on it ("BlackbirdModule not a subtype").
PROVIDED=connect-api,connect-runtime,connect-json,connect-transforms,slf4j-api,jackson-core,jackson-databind,jackson-annotations
# The JDBC sink's drivers for other databases (some tens of MB) are not needed here.
OTHER_DRIVERS=ojdbc11,mssql-jdbc,mysql-connector-j,mariadb-java-client

# What a complete cache was fetched from: the poms and the exclusions (a change fetches again).
stamp() { cat "$POMS"/*.pom.xml; echo "$PROVIDED $OTHER_DRIVERS"; }
complete() {
    [[ -f "$TIDE_DEBEZIUM_HOME/.tide-ok" ]] && cmp -s "$TIDE_DEBEZIUM_HOME/.tide-ok" <(stamp)
}

fetch() {
    if complete; then
        log "Kafka Connect 4.4.0 and Debezium $DEBEZIUM_VERSION: ok ($TIDE_DEBEZIUM_HOME)"
        return 0
    fi
    command -v java >/dev/null || die "java not found (Java 17 or later runs Kafka Connect)"
    command -v mvn >/dev/null || die "mvn not found (Maven fetches Kafka Connect and Debezium)"
    local tmp start part args
    start=$(date +%s)
    tmp="$(mktemp -d)"
    log "mvn: Kafka Connect 4.4.0 and Debezium $DEBEZIUM_VERSION into $TIDE_DEBEZIUM_HOME (once)"
    for part in "${!PARTS[@]}"; do
        args=(-B -q -f "$POMS/$part.pom.xml" dependency:copy-dependencies -DincludeScope=runtime
            "-DoutputDirectory=$tmp/${PARTS[$part]}")
        [[ -n "${MAVEN_REPO_LOCAL:-}" ]] && args+=("-Dmaven.repo.local=$MAVEN_REPO_LOCAL")
        [[ "$part" != runtime ]] && args+=("-DexcludeArtifactIds=$PROVIDED,$OTHER_DRIVERS")
        mvn "${args[@]}" >"$tmp/mvn-$part.log" 2>&1 || {
            cat "$tmp/mvn-$part.log" >&2
            die "mvn could not fetch $POMS/$part.pom.xml (log above)"
        }
    done
    [[ -n "$(find "$tmp/plugins/debezium-connector-postgres" -name 'debezium-connector-postgres-*.jar')" &&
        -n "$(find "$tmp/plugins/debezium-connector-jdbc" -name 'debezium-connector-jdbc-*.jar')" &&
        -n "$(find "$tmp/runtime" -name 'connect-runtime-*.jar')" ]] || die "mvn fetched no connector or runtime jar into $tmp"
    rm -f "$tmp"/mvn-*.log
    stamp >"$tmp/.tide-ok"
    chmod -R go+rX "$tmp"
    mkdir -p "$(dirname "$TIDE_DEBEZIUM_HOME")"
    rm -rf "$TIDE_DEBEZIUM_HOME"
    mv "$tmp" "$TIDE_DEBEZIUM_HOME"
    chmod 0755 "$TIDE_DEBEZIUM_HOME"
    log "fetched in $(($(date +%s) - start)) s ($(du -sh "$TIDE_DEBEZIUM_HOME" | cut -f1))"
}

start_worker() {
    local dir="$1" worker="$2"
    shift 2
    complete || die "not fetched: run scripts/debezium.sh fetch (scripts/setup.sh does, with TIDE_SETUP_KAFKA=1)"
    mkdir -p "$dir"
    [[ -f "$worker" ]] || die "no worker properties file $worker"
    local props="$dir/worker.properties"
    cp "$worker" "$props"
    grep -q '^plugin.path=' "$props" || echo "plugin.path=$TIDE_DEBEZIUM_HOME/plugins" >>"$props"
    local c
    for c in "$@"; do [[ -f "$c" ]] || die "no connector properties file $c"; done
    # setsid: its own process group, which stop signals whole.
    setsid java ${TIDE_CONNECT_HEAP:--Xms256m -Xmx1g} \
        -Dorg.slf4j.simpleLogger.defaultLogLevel="${TIDE_CONNECT_LOG_LEVEL:-warn}" \
        -Dorg.slf4j.simpleLogger.showDateTime=true \
        -cp "$TIDE_DEBEZIUM_HOME/runtime/*" org.apache.kafka.connect.cli.ConnectStandalone \
        "$props" "$@" </dev/null >"$dir/connect.log" 2>&1 &
    echo $! >"$dir/connect.pid"
    log "Connect standalone worker: pid $(cat "$dir/connect.pid"), log $dir/connect.log"
}

stop_worker() {
    local dir="$1" pid i
    [[ -f "$dir/connect.pid" ]] || return 0
    pid="$(cat "$dir/connect.pid")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$dir/connect.pid"
}

case "${1:-}" in
    fetch) fetch ;;
    dir)
        complete || die "not fetched: run scripts/debezium.sh fetch"
        echo "$TIDE_DEBEZIUM_HOME"
        ;;
    start)
        (($# >= 3)) || die "usage: scripts/debezium.sh start DIR WORKER.properties CONNECTOR.properties..."
        shift
        start_worker "$@"
        ;;
    stop)
        (($# == 2)) || die "usage: scripts/debezium.sh stop DIR"
        stop_worker "$2"
        ;;
    *)
        awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2
        exit 2
        ;;
esac
