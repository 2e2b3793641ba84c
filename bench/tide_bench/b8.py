"""B8: side by side with Debezium, in one run, on the same source and the same broker: Debezium
3.6.1's PostgreSQL connector in a Kafka Connect 4.4.0 standalone worker (scripts/debezium.sh;
default settings, pgoutput, JsonConverter with schemas) against a pg_tide kafka pipeline
(value_format 'debezium-schema', the same converter format).

Measured for each: the initial snapshot (Debezium, snapshot.mode=initial) or backfill (pg_tide)
of a table of `b8_rows` rows, timed from the start (the Connect worker's JVM start included, and
without it: from its first message) until every row is in Kafka; then streaming: pgbench inserts
at a fixed rate for `b8_secs` seconds, a consumer stamps each row on receipt (latency = receipt -
committed_at, p50/p99), and the source's TPS at full speed while each captures. CPU seconds
(user + system, from /proc) and peak RSS (VmHWM) of the Connect JVM against pg_tide's processes
(the worker and its backfill readers: every backend whose type starts with 'pg_tide'; their RSS
counts the shared buffers they touched). The broker: a fresh Apache Kafka (scripts/kafka.sh) per
run, as B5's."""

import socket
import subprocess
import tempfile
import threading

from .common import *  # noqa: F401,F403
from .b5 import Broker, Collector, NO_BROKER, pct

try:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
except ImportError:
    Consumer = None

DEBEZIUM_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "debezium.sh")


def proc_cpu_rss(pids):
    """(CPU seconds, peak RSS bytes) summed over `pids` (those still alive)."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu, rss = 0.0, 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            cpu += (int(parts[11]) + int(parts[12])) / tick
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        rss += int(line.split()[1]) * 1024
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return cpu, rss


def tide_pids(src):
    return [r[0] for r in src.all("SELECT pid FROM pg_stat_activity WHERE backend_type LIKE 'pg_tide%'")]


def topic_count(brokers, topic):
    c = Consumer({"bootstrap.servers": brokers, "group.id": "b8_count", "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=10)
        if topic not in md.topics or md.topics[topic].error is not None:
            return 0
        n = 0
        for p in md.topics[topic].partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            n += hi - lo
        return n
    finally:
        c.close()


class Connect:
    """A Connect standalone worker with Debezium's PostgreSQL connector."""

    def __init__(self, brokers, port, prefix, snapshot_mode, table):
        self.dir = tempfile.mkdtemp(prefix="pg_tide_bench_connect.")
        worker = os.path.join(self.dir, "worker.in.properties")
        with open(worker, "w") as f:
            f.write(
                f"bootstrap.servers={brokers}\n"
                "key.converter=org.apache.kafka.connect.json.JsonConverter\n"
                "value.converter=org.apache.kafka.connect.json.JsonConverter\n"
                "key.converter.schemas.enable=true\nvalue.converter.schemas.enable=true\n"
                f"offset.storage.file.filename={self.dir}/offsets\noffset.flush.interval.ms=10000\n"
                "listeners=http://127.0.0.1:0\n"
            )
        conn = os.path.join(self.dir, "pg.properties")
        with open(conn, "w") as f:
            f.write(
                f"name=b8-{prefix}\nconnector.class=io.debezium.connector.postgresql.PostgresConnector\n"
                "tasks.max=1\ndatabase.hostname=127.0.0.1\n"
                f"database.port={port}\ndatabase.user=postgres\ndatabase.password=unused\n"
                f"database.dbname=postgres\ntopic.prefix={prefix}\nplugin.name=pgoutput\n"
                f"slot.name={prefix}\npublication.name={prefix}\npublication.autocreate.mode=filtered\n"
                f"table.include.list=public.{table}\nsnapshot.mode={snapshot_mode}\n"
            )
        self.t0 = time.monotonic()
        r = subprocess.run(["bash", DEBEZIUM_SCRIPT, "start", self.dir, worker, conn],
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise BenchError(f"scripts/debezium.sh start failed: {r.stderr[-500:]}")
        with open(os.path.join(self.dir, "connect.pid")) as f:
            self.pid = int(f.read().strip())

    def usage(self):
        return proc_cpu_rss([self.pid])

    def log_tail(self):
        try:
            with open(os.path.join(self.dir, "connect.log")) as f:
                return f.read()[-1500:]
        except OSError:
            return ""

    def stop(self):
        subprocess.run(["bash", DEBEZIUM_SCRIPT, "stop", self.dir], capture_output=True, timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


def drop_slot(src, name):
    src.x("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (name,))
    src.x(f"DROP PUBLICATION IF EXISTS {name}")


def wait_topic(brokers, topic, n, timeout, alive=None):
    """Seconds until `topic` holds `n` messages; (first message time, done time)."""
    first = None
    deadline = time.monotonic() + timeout
    while True:
        k = topic_count(brokers, topic)
        now = time.monotonic()
        if k and first is None:
            first = now
        if k >= n:
            return first, now
        if alive and not alive():
            raise BenchError(f"the Connect worker died with {k} of {n} messages in {topic}")
        if now > deadline:
            raise BenchError(f"{k} of {n} messages in {topic} after {timeout} s")
        time.sleep(0.5)


def latency_consumer(brokers, topic):
    def fn(col):
        c = Consumer({"bootstrap.servers": brokers, "group.id": "b8", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 1000})
        # Ready once the partition is assigned (rows written before would count their wait).
        c.subscribe([topic], on_assign=lambda _c, _ps: setattr(col, "ready", True))
        while not col.stop.is_set():
            m = c.poll(0.05)
            if m is None or m.error() or m.value() is None:
                continue
            now = time.time()
            p = json.loads(m.value()).get("payload") or {}
            if p.get("op") == "c":
                t = p["after"]["committed_at"].replace("Z", "+00:00")
                col.got.append((dt.datetime.fromisoformat(t).timestamp(), now))
        c.close()

    return fn


def streaming(self, src, brokers, topic, usage, label):
    """Fixed-rate inserts into public.ev with a consumer of `topic`; then the source's TPS at
    full speed. CPU and RSS from `usage()` around the fixed-rate part."""
    P = self.P
    # The topic exists before the consumer subscribes (one partition, as both would create it).
    admin = AdminClient({"bootstrap.servers": brokers})
    fs = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    for f in fs.values():
        try:
            f.result(60)
        except Exception as e:  # noqa: BLE001 - it may exist already
            log(f"  create topic {topic}: {e}")
    col = Collector()
    col.start(latency_consumer(brokers, topic))
    deadline = time.monotonic() + 60
    while not col.ready and time.monotonic() < deadline:
        time.sleep(0.1)
    script = self.tmp / "b8_ev.sql"
    script.write_text(
        "\\set aid random(1, 100000)\n"
        "INSERT INTO public.ev (aid, delta, note) VALUES (:aid, 1, 'event ' || md5(:aid::text));\n"
    )
    os.chmod(script, 0o644)
    script = str(script)
    cpu0, _ = usage()
    rate = P["b8_rate"]
    pg = pgbench_run(src, ["-n", "-c", str(PGBENCH_CLIENTS), "-j", str(PGBENCH_THREADS), "-R", str(rate), "-T", str(P["b8_secs"]), "-f", script],
                     P["b8_secs"] + 120)
    # Until the last row arrived (or 120 s).
    want = pg.get("transactions", 0)
    deadline = time.monotonic() + 120
    while len(col.got) < want and time.monotonic() < deadline:
        time.sleep(0.2)
    cpu1, rss = usage()
    col.finish()
    lat = [(r - c) * 1000 for c, r in col.got]
    full = pgbench_run(src, ["-n", "-c", str(PGBENCH_CLIENTS), "-j", str(PGBENCH_THREADS), "-T", str(P["b8_secs"]), "-f", script], P["b8_secs"] + 120)
    log(f"  {label}: {len(lat)}/{want} rows at {rate} tx/s, p50 {pct(lat, 0.5):.0f} ms, p99 {pct(lat, 0.99):.0f} ms; "
        f"source at full speed {full['tps']:.0f} tps")
    return {
        "rate_tps": rate, "rows_sent": want, "rows_received": len(lat),
        "latency_p50_ms": pct(lat, 0.5), "latency_p99_ms": pct(lat, 0.99),
        "cpu_s_per_million_rows": (cpu1 - cpu0) / max(want, 1) * 1e6, "peak_rss_mb": rss / 1e6,
        "source_full_speed_tps": full["tps"], "pgbench_fixed_rate": pg,
    }


def run(self, b):
    src, P = self.src, self.P
    if not os.environ.get("TIDE_BENCH_KAFKA_SCRIPT"):
        raise BenchError(NO_BROKER)
    if Consumer is None:
        raise BenchError("confluent_kafka is not importable from the venv (run.sh installs it)")
    r = subprocess.run(["bash", DEBEZIUM_SCRIPT, "dir"], capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchError("Kafka Connect and Debezium are not fetched (scripts/debezium.sh fetch)")
    rows = P["b8_rows"]
    ensure_source_table(src, "b8", rows)
    if not src.val("SELECT to_regclass('public.ev') IS NOT NULL"):
        src.x(self.EV_SRC)
    b["machine_note"] = "a shared, noisy machine (2 cores shared with other sessions' builds and tests)"
    b["loadavg_at_start"] = list(os.getloadavg())
    b["method"] = (
        f"public.b8 ({rows:,} rows of the benchmark shape). Debezium 3.6.1 PostgreSQL connector, Kafka Connect "
        "4.4.0 standalone (JsonConverter with schemas, default connector settings, heap -Xmx1g), snapshot.mode=initial "
        "for the snapshot, no_data for streaming; pg_tide: kafka pipeline, value_format debezium-schema, add_table "
        "(backfill) / streaming. Each on a fresh Apache Kafka 4.4.0 broker (one node, same host). Streaming: pgbench "
        f"INSERTs into public.ev at {P['b8_rate']} tx/s for {P['b8_secs']} s (4 clients), a confluent-kafka consumer "
        "stamps each row on receipt; then pgbench at full speed for as long (the source's TPS while capturing). "
        "rows/s: Debezium's from its first message (its JVM start and connector set-up left out), pg_tide's from "
        "tide.add_table. CPU: user + system seconds of the Connect JVM (JVM start included) / of the backends whose "
        "type starts with 'pg_tide' (the worker and its backfill readers); peak RSS: their VmHWM (pg_tide's counts the "
        "shared buffers they touched)."
    )
    out = {}
    broker = Broker(src)
    # --- Debezium: snapshot, then streaming (a second connector, no snapshot) ---------------------
    try:
        brokers = broker.start()
        drop_slot(src, "b8dbz")
        c = Connect(brokers, src.port, "b8dbz", "initial", "b8")
        try:
            first, done = wait_topic(brokers, "b8dbz.public.b8", rows, P["b8_timeout"],
                                     alive=lambda: os.path.exists(f"/proc/{c.pid}"))
            cpu, rss = c.usage()
            out["debezium_snapshot"] = {
                "seconds_from_start": done - c.t0, "seconds_from_first_message": done - first,
                "rows_per_s": rows / (done - first), "cpu_s_per_million_rows": cpu / rows * 1e6,
                "peak_rss_mb": rss / 1e6,
            }
            log(f"  Debezium snapshot: {rows:,} rows in {done - c.t0:.1f} s ({done - first:.1f} s from the first message), "
                f"CPU {cpu:.1f} s, peak RSS {rss / 1e6:.0f} MB")
        finally:
            c.stop()
            drop_slot(src, "b8dbz")
        c = Connect(brokers, src.port, "b8dbs", "no_data", "ev")
        try:
            # Streaming starts once the connector has its slot.
            deadline = time.monotonic() + 120
            while not src.val("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'b8dbs' AND active"):
                if time.monotonic() > deadline:
                    raise BenchError(f"Debezium's slot never became active: {c.log_tail()}")
                time.sleep(0.5)
            time.sleep(5)
            out["debezium_streaming"] = streaming(self, src, brokers, "b8dbs.public.ev", c.usage, "Debezium")
        finally:
            c.stop()
            drop_slot(src, "b8dbs")
    finally:
        broker.stop()
    # --- pg_tide: backfill, then streaming --------------------------------------------------------
    try:
        brokers = broker.start()
        drop_pipeline(src, "b8_tide")
        src.x("SELECT tide.create_pipeline('b8_tide', 'kafka', %s)",
              (json.dumps({"server": "bench_kafka", "value_format": "debezium-schema", "topic_prefix": "b8tide"}),))
        deadline = time.monotonic() + 60
        while src.val("SELECT state FROM tide.pipelines WHERE name = 'b8_tide'") != "streaming":
            if time.monotonic() > deadline:
                raise BenchError(f"pipeline b8_tide: {pipeline_health(src, 'b8_tide')}")
            time.sleep(0.2)
        pids = tide_pids(src)
        cpu0, _ = proc_cpu_rss(pids)
        t0 = time.monotonic()
        src.x("SELECT tide.add_table('b8_tide', 'public.b8')")
        first, done = wait_topic(brokers, "b8tide.public.b8", rows, P["b8_timeout"])
        pids = tide_pids(src)
        cpu1, rss = proc_cpu_rss(pids)
        out["pg_tide_backfill"] = {
            "seconds_from_start": done - t0, "seconds_from_first_message": done - first,
            "rows_per_s": rows / (done - t0), "cpu_s_per_million_rows": (cpu1 - cpu0) / rows * 1e6,
            "peak_rss_mb": rss / 1e6, "processes": len(pids),
        }
        log(f"  pg_tide backfill: {rows:,} rows in {done - t0:.1f} s, CPU {cpu1 - cpu0:.1f} s, peak RSS {rss / 1e6:.0f} MB")
        src.x("SELECT tide.add_table('b8_tide', 'public.ev', backfill => false)")
        time.sleep(3)
        out["pg_tide_streaming"] = streaming(self, src, brokers, "b8tide.public.ev",
                                             lambda: proc_cpu_rss(tide_pids(src)), "pg_tide")
    finally:
        drop_pipeline(src, "b8_tide")
        broker.stop()
    b["results"] = out
    b["loadavg_at_end"] = list(os.getloadavg())
    d, t = out["debezium_snapshot"], out["pg_tide_backfill"]
    b["ratios"] = {
        "backfill_rate_vs_debezium_snapshot": t["rows_per_s"] / d["rows_per_s"],
        "p99_vs_debezium": out["pg_tide_streaming"]["latency_p99_ms"] / out["debezium_streaming"]["latency_p99_ms"],
        "peak_rss_vs_debezium": t["peak_rss_mb"] / d["peak_rss_mb"],
    }
    return b
