#!/usr/bin/env bash
# Apache Kafka (KRaft, one node) as the test broker of the kafka suites and of bench B5.
#
#   scripts/kafka.sh fetch               the broker's jars, once, with Maven (idempotent)
#   scripts/kafka.sh fetched             exit status 0 when the jars are in the cache (no fetch)
#   scripts/kafka.sh classpath           prints the broker's classpath (fetches first if needed)
#   scripts/kafka.sh start DIR PORT [CPORT]  a broker on 127.0.0.1:PORT (controller on CPORT,
#                                        default PORT+1), its storage, config and log in DIR,
#                                        in the background; returns once it takes connections
#   scripts/kafka.sh run DIR PORT [CPORT]    the same in the foreground (exec: the caller's child
#                                        is the JVM itself; pg_test's harness uses this)
#   scripts/kafka.sh stop DIR            stops the broker started in DIR (SIGTERM, then SIGKILL
#                                        after 20 s)
#
# The broker: org.apache.kafka:kafka_2.13 KAFKA_VERSION from Maven Central, resolved once by a
# generated pom and `mvn dependency:copy-dependencies` into TIDE_KAFKA_HOME (default
# /var/cache/pg_tide/kafka-KAFKA_VERSION; the jars in libs/, a .tide-ok marker when complete),
# run by the JVM at TIDE_JAVA (default: java on PATH; Java 17 or later). One node is broker and
# controller; every internal topic (offsets, transaction state) has replication factor 1 and one
# partition, so a transactional producer's first init_transactions does not wait for 50
# partitions. The first start formats DIR/data (kafka.tools.StorageTool, --standalone);
# later starts on the same DIR reuse its storage and its ports (a restart keeps the topics).
# Memory: TIDE_KAFKA_HEAP (default 512m). The broker's log: DIR/broker.log.
set -euo pipefail
KAFKA_VERSION=4.4.0
SCALA_VERSION=2.13
# The logging back end the broker's own distribution ships (Kafka logs through SLF4J 2).
LOG4J_VERSION=2.25.5
SLF4J_VERSION=2.0.17

KAFKA_HOME="${TIDE_KAFKA_HOME:-/var/cache/pg_tide/kafka-$KAFKA_VERSION}"
JAVA="${TIDE_JAVA:-java}"
log() { printf '[kafka] %s\n' "$*" >&2; }
die() {
    printf '[kafka] ERROR: %s\n' "$*" >&2
    exit 1
}

fetched() { [[ -f "$KAFKA_HOME/.tide-ok" && -f "$KAFKA_HOME/libs/kafka_$SCALA_VERSION-$KAFKA_VERSION.jar" ]]; }

fetch() {
    if fetched; then
        log "Apache Kafka $KAFKA_VERSION: ok ($KAFKA_HOME/libs)"
        return 0
    fi
    command -v mvn >/dev/null || die "mvn not found (scripts/setup.sh installs Debian's maven)"
    local tmp start=$SECONDS
    tmp="$(mktemp -d)"
    cat >"$tmp/pom.xml" <<EOF
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>pg_tide</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_$SCALA_VERSION</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>$SLF4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
  </dependencies>
</project>
EOF
    log "Apache Kafka $KAFKA_VERSION: mvn dependency:copy-dependencies into $KAFKA_HOME/libs (once)"
    if ! (cd "$tmp" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp/libs" >"$tmp/mvn.log" 2>&1); then
        tail -n 30 "$tmp/mvn.log" >&2
        rm -rf "$tmp"
        die "mvn could not resolve org.apache.kafka:kafka_$SCALA_VERSION:$KAFKA_VERSION (is Maven Central reachable?)"
    fi
    [[ -f "$tmp/libs/kafka_$SCALA_VERSION-$KAFKA_VERSION.jar" ]] || die "mvn resolved no kafka_$SCALA_VERSION-$KAFKA_VERSION.jar"
    mkdir -p "$(dirname "$KAFKA_HOME")"
    rm -rf "$KAFKA_HOME"
    mkdir -p "$KAFKA_HOME"
    mv "$tmp/libs" "$KAFKA_HOME/libs"
    cp "$tmp/pom.xml" "$KAFKA_HOME/pom.xml"
    chmod -R go+rX "$KAFKA_HOME"
    touch "$KAFKA_HOME/.tide-ok"
    rm -rf "$tmp"
    log "Apache Kafka $KAFKA_VERSION: $(find "$KAFKA_HOME/libs" -name '*.jar' | wc -l) jars in $((SECONDS - start)) s"
}

classpath() {
    fetched || fetch
    local cp="" j
    for j in "$KAFKA_HOME"/libs/*.jar; do cp="${cp:+$cp:}$j"; done
    printf '%s\n' "$cp"
}

# configure DIR PORT CPORT: server.properties and log4j2.yaml in DIR (kept when they exist:
# a restart reuses the ports the storage was formatted with).
configure() {
    local dir="$1" port="$2" cport="$3"
    mkdir -p "$dir"
    if [[ ! -f "$dir/server.properties" ]]; then
        [[ "$port" =~ ^[0-9]+$ && "$cport" =~ ^[0-9]+$ ]] || die "ports must be numbers: '$port' '$cport'"
        cat >"$dir/server.properties" <<EOF
# pg_tide's test broker (scripts/kafka.sh): one node, broker and controller, loopback only.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
delete.topic.enable=true
EOF
    fi
    if [[ ! -f "$dir/log4j2.yaml" ]]; then
        cat >"$dir/log4j2.yaml" <<EOF
Configuration:
  Appenders:
    File:
      name: file
      fileName: "$dir/broker.log"
      append: true
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: file
    Logger:
      - name: kafka
        level: WARN
      - name: org.apache.kafka
        level: WARN
      - name: kafka.server.KafkaServer
        level: INFO
      - name: kafka.server.KafkaRaftServer
        level: INFO
      - name: state.change.logger
        level: WARN
EOF
    fi
}

# The JVM's command line without its main class: classpath, heap, logging.
jvm_args() {
    local dir="$1"
    printf '%s\n' -cp "$(classpath)" "-Xms${TIDE_KAFKA_HEAP:-512m}" "-Xmx${TIDE_KAFKA_HEAP:-512m}" \
        -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1 -Xshare:auto \
        -Djava.awt.headless=true "-Dlog4j2.configurationFile=$dir/log4j2.yaml" \
        "-Dkafka.logs.dir=$dir"
}

format_storage() {
    local dir="$1"
    [[ -f "$dir/data/meta.properties" ]] && return 0
    local -a args
    mapfile -t args < <(jvm_args "$dir")
    "$JAVA" "${args[@]}" kafka.tools.StorageTool format --standalone \
        --cluster-id "$("$JAVA" "${args[@]}" kafka.tools.StorageTool random-uuid)" \
        --config "$dir/server.properties" >>"$dir/broker.log" 2>&1 ||
        die "formatting $dir/data failed (see $dir/broker.log)"
}

# ports DIR [PORT] [CPORT]: the ports of DIR's config (or the ones given, for a new DIR).
ports_of() {
    local dir="$1"
    sed -nE 's|^listeners=PLAINTEXT://127.0.0.1:([0-9]+),CONTROLLER://127.0.0.1:([0-9]+)$|\1 \2|p' "$dir/server.properties"
}

prepare() { # prepare DIR PORT [CPORT]
    local dir="$1" port="${2:-}" cport="${3:-}"
    [[ -n "$dir" ]] || die "no broker directory given"
    if [[ ! -f "$dir/server.properties" ]]; then
        [[ -n "$port" ]] || die "no port given for a new broker in $dir"
        cport="${cport:-$((port + 1))}"
    fi
    configure "$dir" "$port" "$cport"
    fetched || fetch
    format_storage "$dir"
}

run() { # run DIR PORT [CPORT]: exec the broker
    local dir
    prepare "$@"
    dir="$(cd "$1" && pwd)"
    local -a args
    mapfile -t args < <(jvm_args "$dir")
    exec "$JAVA" "${args[@]}" kafka.Kafka "$dir/server.properties" >>"$dir/broker.log" 2>&1 </dev/null
}

start() { # start DIR PORT [CPORT]
    local dir="$1"
    prepare "$@"
    dir="$(cd "$dir" && pwd)"
    if [[ -f "$dir/kafka.pid" ]] && kill -0 "$(cat "$dir/kafka.pid")" 2>/dev/null; then
        log "a broker runs already in $dir (pid $(cat "$dir/kafka.pid"))"
        return 0
    fi
    local port
    read -r port _ < <(ports_of "$dir")
    nohup bash "${BASH_SOURCE[0]}" run "$dir" >/dev/null 2>&1 &
    echo $! >"$dir/kafka.pid"
    local deadline=$((SECONDS + 120))
    while ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        if ! kill -0 "$(cat "$dir/kafka.pid")" 2>/dev/null; then
            tail -n 30 "$dir/broker.log" >&2 || true
            die "the broker exited before it listened on 127.0.0.1:$port"
        fi
        ((SECONDS < deadline)) || die "the broker did not listen on 127.0.0.1:$port within 120 s (see $dir/broker.log)"
        sleep 0.2
    done
    log "Apache Kafka $KAFKA_VERSION on 127.0.0.1:$port (pid $(cat "$dir/kafka.pid"), $dir)"
}

stop() { # stop DIR
    local dir="$1" pid
    [[ -f "$dir/kafka.pid" ]] || return 0
    pid="$(cat "$dir/kafka.pid")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        local deadline=$((SECONDS + 20))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/kafka.pid"
}

case "${1:-}" in
    fetch) fetch ;;
    fetched) fetched ;;
    classpath) classpath ;;
    start) shift; [[ $# -ge 1 ]] || die "usage: kafka.sh start DIR PORT [CPORT]"; start "$@" ;;
    run) shift; [[ $# -ge 1 ]] || die "usage: kafka.sh run DIR PORT [CPORT]"; run "$@" ;;
    stop) shift; [[ $# -eq 1 ]] || die "usage: kafka.sh stop DIR"; stop "$1" ;;
    *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
esac
