"""B5: the kafka target next to the outbox target, in the same run: backfill rows/s, streaming
rows/s and commit-to-consumer latency (p50/p99); then pg_tide alone against the broker (a
backlog of one-row transactions drained with nothing else running, with and without the
transaction topic) and the producer alone against the same broker (librdkafka, pg_tide's
producer settings, messages shaped like pg_tide's: the rows only without transactions, and the
same messages and Kafka transactions pg_tide writes), pg_tide's rates as a ratio of it.
Debezium's published engine figure (50–67k events/s) is cited, not run.

`run(suite, b)` is called by Suite.b5. The broker: with TIDE_BENCH_KAFKA_SCRIPT (scripts/kafka.sh;
run.sh exports it once scripts/setup.sh fetched the jars), an Apache Kafka broker (KRaft, one
node) of this module's own on loopback, started afresh (new storage, new port) for each kafka run,
so no run reads or writes topics an earlier one left. With TIDE_BENCH_KAFKA (host:port) instead,
that broker for every run."""

import re
import socket
import subprocess
import tempfile
import threading

from .common import *  # noqa: F401,F403

try:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
except ImportError:  # the venv predates B5: run.sh installs it
    Consumer = None

# librdkafka settings as pg_tide's producer sets them (src/sink/kafka.rs, properties()): the
# producer alone uses the same ones (with a transactional.id where it commits transactions as
# pg_tide's default, exactly-once, does).
TIDE_PRODUCER = {
    "enable.idempotence": True,
    "enable.gapless.guarantee": True,
    "acks": "all",
    "max.in.flight.requests.per.connection": 5,
    "partitioner": "murmur2",
    "queue.buffering.max.kbytes": 8 * 1024,
    "message.timeout.ms": 30000,
}
NO_BROKER = ("no Kafka broker: neither TIDE_BENCH_KAFKA_SCRIPT nor TIDE_BENCH_KAFKA is set (run.sh sets "
             "the first when scripts/setup.sh fetched Apache Kafka)")
SAMPLE_N = 500  # messages read back from a pg_tide topic to copy their size and key shape

DEBEZIUM = (
    "Debezium's published engine figure: 50–67k events/s (as cited by issue 16; a different "
    "machine and setup, not run here)"
)


def ts(text):
    """A timestamptz as the worker renders it (ISO, UTC: '2026-12-03 19:01:04.123456+00')."""
    t = text.replace(" ", "T")
    if t.endswith("+00"):
        t = t[:-3] + "+00:00"
    return dt.datetime.fromisoformat(t).timestamp()


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Collector:
    """A consumer thread: records (commit time, receive time) of each inserted ev row."""

    def __init__(self):
        self.got = []
        self.stop = threading.Event()
        self.error = None
        self.thread = None
        self.ready = False

    def start(self, fn):
        def loop():
            try:
                fn(self)
            except Exception as e:  # reported by the run
                self.error = errtext(e)

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def finish(self):
        self.stop.set()
        if self.thread:
            self.thread.join(30)
        if self.error:
            raise BenchError(f"consumer failed: {self.error}")


class Broker:
    """The broker of one kafka run: an external one (TIDE_BENCH_KAFKA), or a fresh Apache Kafka."""

    def __init__(self, src):
        self.src = src
        self.proc = None
        self.dir = None
        self.address = None

    def start(self):
        """Start a fresh broker (stopping any left from a run that failed) and point the
        bench_kafka server at it. Stops what it started when it fails."""
        self.stop()
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self):
        script = os.environ.get("TIDE_BENCH_KAFKA_SCRIPT")
        if not script:
            self.address = os.environ.get("TIDE_BENCH_KAFKA")
            if not self.address:
                raise BenchError(NO_BROKER)
        else:
            self.dir = tempfile.mkdtemp(prefix="pg_tide_bench_kafka.")
            ports = []
            for _ in range(2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    ports.append(s.getsockname()[1])
            r = subprocess.run(["bash", script, "start", self.dir, str(ports[0]), str(ports[1])],
                               capture_output=True, text=True, timeout=180)
            self.proc = True
            if r.returncode != 0:
                raise BenchError(f"the Kafka broker did not start on port {ports[0]}: {r.stderr[-500:]}")
            self.address = f"127.0.0.1:{ports[0]}"
        self.src.x("DROP SERVER IF EXISTS bench_kafka CASCADE")
        self.src.x(f"CREATE SERVER bench_kafka FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers '{self.address}')")
        return self.address

    def stop(self):
        if self.proc is not None and self.dir:
            subprocess.run(["bash", os.environ["TIDE_BENCH_KAFKA_SCRIPT"], "stop", self.dir],
                           capture_output=True, timeout=120)
            self.proc = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def sample_topic(brokers, topic, n=SAMPLE_N):
    """Up to `n` messages (key, value, headers) from the end of `topic`'s partitions: what
    pg_tide wrote, to replay messages of the same size and key shape (from the end)."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": "b5_sample", "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=30)
        parts = md.topics[topic].partitions
        tps = []
        for p in parts:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            tps.append(TopicPartition(topic, p, max(lo, hi - n // len(parts) - 1)))
        c.assign(tps)
        out, deadline = [], time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error() or m.value() is None:
                continue
            out.append((m.key(), m.value(), m.headers() or []))
        return out
    finally:
        c.close()


class Sample:
    """Reads messages of a pg_tide topic once, in a thread, early in the run (when `maybe(True)`
    is first called), while the topic is small (a broker that lags the producer still answers
    the sample's fetches quickly)."""

    def __init__(self, out, phase, brokers, topic):
        self.out, self.phase, self.brokers, self.topic = out, phase, brokers, topic
        self.th = None
        self.error = None

    def maybe(self, now):
        if now and self.th is None:
            self.th = threading.Thread(target=self.run, daemon=True)
            self.th.start()

    def run(self):
        try:
            self.out[self.phase] = sample_topic(self.brokers, self.topic)
            log(f"  read {len(self.out[self.phase])} of pg_tide's messages from {self.topic} for the ceiling")
        except Exception as e:  # the ceiling run reports that it has no sample
            self.error = errtext(e)
            log(f"  sampling {self.topic}: {self.error}", "warn")

    def join(self):
        if self.th:
            self.th.join(60)


def numbered_keys(sample, n):
    """The keys of `n` messages shaped like `sample`'s: the key's first number replaced by the
    message's number (1..n), so keys are distinct as rows' keys are. Built before the clock
    starts (a regular expression per message would bound the Python loop, not the broker)."""
    k = len(sample)
    out = []
    for i in range(1, n + 1):
        key = sample[i % k][0]
        out.append(None if key is None else re.sub(rb"\d+", str(i).encode(), key, count=1))
    return out


def create_topics(brokers, parts):
    """Create the topics of `parts` (name -> partitions) and wait until they show them."""
    admin = AdminClient({"bootstrap.servers": brokers})
    fs = admin.create_topics([NewTopic(t, num_partitions=n, replication_factor=1) for t, n in parts.items()])
    for f in fs.values():
        f.result(60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=10)
        if all(t in md.topics and len(md.topics[t].partitions) == n for t, n in parts.items()):
            return
        time.sleep(0.2)


def producer_ceiling(brokers, topic, partitions, sample, n, records=None, rows_per_txn=None):
    """librdkafka's producer alone (pg_tide's producer settings) writes `n` row messages shaped
    like `sample` (values and headers cycled, keys from `numbered_keys`) to a fresh topic of
    `partitions` partitions; timed from the first produce() until every message is
    acknowledged (flush() or the last commit_transaction() returns).

    `rows_per_txn` set: as pg_tide's exactly-once stream does, a transactional producer, one
    Kafka transaction per `rows_per_txn` rows (pg_tide's batch), each ending with a position
    record (`pg_tide.position`-like topic, one partition) before its commit. `records` set (a
    sample of pg_tide's transaction topic): each row is preceded by a BEGIN and followed by an
    END record of that shape (topic of one partition), as pg_tide writes a one-row source
    transaction. Returns (seconds, the process's CPU seconds meanwhile: the client's own work,
    Python and librdkafka's threads)."""
    txn_topic, pos_topic = f"{topic}.transaction", f"{topic}.position"
    parts = {topic: partitions}
    if records:
        parts[txn_topic] = 1
    if rows_per_txn:
        parts[pos_topic] = 1
    create_topics(brokers, parts)
    conf = {"bootstrap.servers": brokers, "client.id": "b5-ceiling", **TIDE_PRODUCER}
    if rows_per_txn:
        conf["transactional.id"] = f"b5-ceiling-{topic}"
    p = Producer(conf)
    failed = {"n": 0, "err": None}

    def on_delivery(err, _msg):
        if err is not None:
            failed["n"] += 1
            failed["err"] = str(err)

    def produce(t, value, key, headers):
        while True:
            try:
                p.produce(t, value=value, key=key, headers=headers, on_delivery=on_delivery)
                return
            except BufferError:  # the queue is full (queue.buffering.max.kbytes): wait as pg_tide does
                p.poll(0.001)

    keys = numbered_keys(sample, n)
    k, nr = len(sample), len(records or [])
    position = b'{"pipeline":"b5-ceiling","lsn":"0/16B3748"}'
    if rows_per_txn:
        p.init_transactions(60)
    c0, t0 = time.process_time(), time.monotonic()
    if rows_per_txn:
        p.begin_transaction()
    for i in range(1, n + 1):
        _, value, headers = sample[i % k]
        if nr:
            bk, bv, bh = records[(2 * i) % nr]
            produce(txn_topic, bv, bk, bh)
        produce(topic, value, keys[i - 1], headers)
        if nr:
            ek, ev, eh = records[(2 * i + 1) % nr]
            produce(txn_topic, ev, ek, eh)
        if rows_per_txn and i % rows_per_txn == 0:
            produce(pos_topic, position, b"b5-ceiling", None)
            p.commit_transaction(60)
            if i < n:
                p.begin_transaction()
        elif i % 1000 == 0:
            p.poll(0)
    if rows_per_txn and n % rows_per_txn:
        produce(pos_topic, position, b"b5-ceiling", None)
        p.commit_transaction(60)
    left = p.flush(300)
    secs, cpu = time.monotonic() - t0, time.process_time() - c0
    if left or failed["n"]:
        raise BenchError(f"{left} messages not acknowledged within 300 s, {failed['n']} failed ({failed['err']})")
    return secs, cpu


def first_timestamp(brokers, topic, offsets, floor):
    """The earliest CreateTime (s) of the backlog's row messages (`public.ev` rows with an id
    above `floor`) from `offsets` (partition -> offset) of `topic` on: when the producer was
    handed the first of them. (A read_committed consumer's watermark is the last stable offset,
    which can still be the probe's row while its transaction's markers are being written: rows
    at or below `floor` are skipped.)"""
    c = Consumer({"bootstrap.servers": brokers, "group.id": "b5_ts", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
        first, seen, deadline = None, set(), time.monotonic() + 30
        while len(seen) < len(offsets) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error() or m.value() is None or m.partition() in seen:
                continue
            after = json.loads(m.value()).get("after") or {}
            if int(after.get("id", 0)) <= floor:
                continue
            seen.add(m.partition())
            t = m.timestamp()[1] / 1000
            first = t if first is None else min(first, t)
        if first is None:
            raise BenchError(f"no row message of the backlog found in {topic}")
        return first
    finally:
        c.close()


def high_watermarks(brokers, topic):
    c = Consumer({"bootstrap.servers": brokers, "group.id": "b5_hw", "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=30)
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in md.topics[topic].partitions}
    finally:
        c.close()


def kafka_consumer(brokers, topic):
    def fn(col):
        c = Consumer({"bootstrap.servers": brokers, "group.id": "b5", "enable.auto.commit": False})
        md = c.list_topics(topic, timeout=10)
        parts = md.topics[topic].partitions
        # from each partition's current end: only what the workload writes
        tps = []
        for p in parts:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            tps.append(TopicPartition(topic, p, hi))
        c.assign(tps)
        col.ready = True
        while not col.stop.is_set():
            m = c.poll(0.05)
            if m is None or m.error() or m.value() is None:
                continue
            now = time.time()
            v = json.loads(m.value())
            if v.get("op") == "c":
                col.got.append((ts(v["after"]["committed_at"]), now))
        c.close()

    return fn


def outbox_consumer(node, pipeline):
    def fn(col):
        conn = node.connect("b5_outbox_consumer")
        conn.autocommit = True
        conn.execute("SELECT tide.create_consumer(%s, 'b5', 'latest')", (pipeline,))
        col.ready = True
        while not col.stop.is_set():
            rows = conn.execute(
                "SELECT id, op, row->>'committed_at' FROM tide.read_outbox(%s, 'b5', 5000)", (pipeline,)
            ).fetchall()
            now = time.time()
            if not rows:
                time.sleep(0.001)
                continue
            for _id, op, committed in rows:
                if op == "insert":
                    col.got.append((ts(committed), now))
            conn.execute("SELECT tide.commit_consumer(%s, 'b5', %s)", (pipeline, rows[-1][0]))
        conn.close()

    return fn


def ack_sampler(node, pipeline, stop, out):
    """Until `stop`: how long tide.wait_for_pipeline takes, again and again: the time until
    everything committed before the call is applied (for Kafka: acknowledged by the broker and
    recorded), an upper bound of the commit-to-acknowledged latency of the rows committed just
    before it (resolution: its 20 ms poll)."""
    conn = node.connect("b5_ack_sampler")
    conn.autocommit = True
    while not stop.is_set():
        t0 = time.monotonic()
        conn.execute("SELECT tide.wait_for_pipeline(%s, '60 seconds')", (pipeline,))
        out.append((time.monotonic() - t0) * 1000)
    conn.close()


def run(self, b):
    src, P = self.src, self.P
    b["reference"] = DEBEZIUM
    if not (os.environ.get("TIDE_BENCH_KAFKA_SCRIPT") or os.environ.get("TIDE_BENCH_KAFKA")):
        raise BenchError(NO_BROKER)
    if Consumer is None:
        raise BenchError("confluent_kafka is not importable from the venv (run.sh installs it)")
    broker = Broker(src)
    ensure_source_table(src, "t", P["b1_rows"])
    if not src.val("SELECT to_regclass('public.ev') IS NOT NULL"):
        src.x(self.EV_SRC)
    stamp = int(time.time())
    b["method"] = (
        "backfill: tide.add_table of public.t (default chunk 5000) into a fresh pipeline, timed until "
        "tide.wait_for_backfill is true (kafka: every message acknowledged by the broker, acks=all). Streaming: "
        "pgbench INSERTs into public.ev at a fixed rate and at full speed; a consumer (confluent-kafka for Kafka, "
        "tide.read_outbox + tide.commit_consumer in a loop for the outbox) stamps each row on receipt: latency = "
        "receipt - committed_at. Kafka topics: 3 partitions, Apache Kafka 4.4.0 (KRaft, one node, 512 MiB heap) on the same host, "
        "a fresh broker (new storage) for each kafka run."
    )
    opts = {
        "outbox": lambda n, extra: "{}",
        "kafka": lambda n, extra: json.dumps({"server": "bench_kafka", "topic_prefix": f"b5_{stamp}_{n}", "partitions": 3, **extra}),
    }

    def fresh(kind, n, extra=None):
        name = f"b5_{kind}"
        drop_pipeline(src, name)
        src.x("DELETE FROM tide.outbox WHERE pipeline = %s", (name,))
        src.x("SELECT tide.create_pipeline(%s, %s, %s)", (name, kind, opts[kind](n, extra or {})))
        return name

    samples = {}  # phase -> messages pg_tide wrote (for the ceiling)
    for kind in ("outbox", "kafka"):

        def backfill(kind=kind):
            if kind == "kafka":
                broker.start()
            try:
                name = fresh(kind, "bf")
            except BaseException:
                broker.stop()
                raise
            try:
                t0 = time.monotonic()
                src.x("SELECT tide.add_table(%s, 'public.t')", (name,))
                smp = None
                if kind == "kafka":
                    smp = Sample(samples, "backfill", broker.address, f"b5_{stamp}_bf.public.t")
                r = wait_backfill(src, name, "public.t", t0, P["b1_timeout"], sampler=(lambda _el, rows: smp.maybe(rows >= 3000)) if smp else None)
                secs = r["end_monotonic"] - t0
                if smp:
                    smp.join()
                return {"rows": r["rows_emitted"], "seconds": round(secs, 2), "rows_per_s": round(r["rows_emitted"] / secs, 1)}
            finally:
                try:
                    drop_pipeline(src, name)
                    src.x("DELETE FROM tide.outbox WHERE pipeline = %s", (name,))
                finally:
                    broker.stop()

        self.run(b, f"backfill {P['b1_rows']:,} rows → {kind}", backfill, kind=kind, phase="backfill")

    script = self.tmp / "ev_b5.sql"
    script.write_text(
        "\\set aid random(1, 100000)\n"
        "\\set delta random(-5000, 5000)\n"
        "INSERT INTO public.ev (aid, delta, note) VALUES (:aid, :delta, 'event ' || md5(:aid::text));\n"
    )
    os.chmod(script, 0o644)
    dur, warm = P["b2_duration"], P["b2_warmup"]
    for rate in (2000, None):
        for kind, consume in (("outbox", True), ("kafka", True), ("kafka", False)):

            def stream(kind=kind, rate=rate, consume=consume):
                brokers = broker.start() if kind == "kafka" else None
                try:
                    name = fresh(kind, f"s{rate or 'max'}{'' if consume else 'n'}")
                except BaseException:
                    broker.stop()
                    raise
                col = Collector()
                try:
                    src.x("SELECT tide.add_table(%s, 'public.ev', backfill => false)", (name,))
                    wait_capturing(src, name, "public.ev")
                    # a probe row makes the topic exist and the path live
                    src.x("INSERT INTO public.ev (aid, delta, note) VALUES (0, 0, 'probe')")
                    if not src.val("SELECT tide.wait_for_pipeline(%s, '60 seconds')", (name,)):
                        raise BenchError(f"the probe did not get through: {pipeline_health(src, name)}")
                    col.ready = False
                    if consume:
                        col.start(kafka_consumer(brokers, f"b5_{stamp}_s{rate or 'max'}.public.ev") if kind == "kafka" else outbox_consumer(src, name))
                    deadline = time.monotonic() + 30
                    while consume and not col.ready and time.monotonic() < deadline and not col.error:
                        time.sleep(0.05)
                    floor = src.val("SELECT coalesce(max(id), 0) FROM public.ev")
                    t_start = dt.datetime.now(dt.timezone.utc).timestamp()
                    args = ["-n", "-c", str(PGBENCH_CLIENTS), "-j", str(PGBENCH_THREADS), "-T", str(dur), "-f", str(script)]
                    if rate:
                        args += ["-R", str(rate)]
                    acks, ack_stop = [], threading.Event()
                    sampler = threading.Thread(target=ack_sampler, args=(src, name, ack_stop, acks), daemon=True)
                    sampler.start()
                    pg = pgbench_run(src, args, dur + 120)
                    ack_stop.set()
                    sampler.join(70)
                    n = src.val("SELECT count(*) FROM public.ev WHERE id > %s", (floor,))
                    t_drain = time.monotonic()
                    caught_up = src.val("SELECT tide.wait_for_pipeline(%s, '120 seconds')", (name,))
                    if not caught_up and not consume:
                        raise BenchError(f"the pipeline did not catch up within 120 s: {pipeline_health(src, name)}")
                    drain = time.monotonic() - t_drain if caught_up else None
                    if not consume:
                        return {
                            "rate": rate, "source_tps": pg.get("tps"), "rows": n, "consumer": False,
                            "applied_rows_per_s": round(n / (dur + drain), 1), "drain_s": round(drain, 2),
                        "ack_p50_ms": pct(acks[1:], 0.5), "ack_p99_ms": pct(acks[1:], 0.99), "ack_samples": len(acks),
                        }
                    # A consumer that falls behind gets 30 s to catch up (what it received is
                    # reported).
                    t_end = time.monotonic() + (30 if kind == "kafka" else P["b2_drain_timeout"])
                    while len(col.got) < n and time.monotonic() < t_end and not col.error:
                        time.sleep(0.05)
                    col.stop.set()
                    col.finish()
                    got = [g for g in col.got if g[0] >= t_start]
                    lat = [(r - c) * 1000 for c, r in got if c >= t_start + warm]
                    span = (max(r for _, r in got) - min(c for c, _ in got)) if got else 0
                    return {
                        "rate": rate,
                        "source_tps": pg.get("tps"),
                        "rows": n,
                        "received": len(got),
                        "rows_per_s": round(len(got) / span, 1) if span > 0 else None,
                        "p50_ms": pct(lat, 0.5),
                        "p99_ms": pct(lat, 0.99),
                        "max_ms": max(lat) if lat else None,
                        "ack_p50_ms": pct(acks[1:], 0.5),
                        "ack_p99_ms": pct(acks[1:], 0.99),
                        "ack_samples": len(acks),
                    }
                finally:
                    col.stop.set()
                    try:
                        drop_pipeline(src, name)
                        src.x("DELETE FROM tide.outbox WHERE pipeline = %s", (name,))
                    finally:
                        broker.stop()

            label = f"streaming {rate or 'full speed'} tx/s → {kind}{'' if consume else ', no consumer'}"
            self.run(b, label, stream, kind=kind, phase="streaming")

    # pg_tide alone against the broker, as the producer alone below: a backlog of one-row
    # transactions written while the pipeline is paused, then drained with nothing else running.
    backlog_rows = P.get("b5_backlog_rows", 200_000)
    batch_events = int(src.val("SELECT current_setting('tide.batch_events')"))
    rows_per_txn = -(-batch_events // 3)  # a one-row transaction decodes as BEGIN, row, COMMIT
    for tag, extra, what in (
        ("bl", {}, "exactly-once, transaction topic (defaults)"),
        ("blnt", {"transaction_topic": ""}, "exactly-once, no transaction topic"),
    ):

        def backlog(tag=tag, extra=extra):
            brokers = broker.start()
            try:
                name = fresh("kafka", tag, extra)
            except BaseException:
                broker.stop()
                raise
            try:
                prefix = f"b5_{stamp}_{tag}"
                src.x("SELECT tide.add_table(%s, 'public.ev', backfill => false)", (name,))
                wait_capturing(src, name, "public.ev")
                src.x("INSERT INTO public.ev (aid, delta, note) VALUES (0, 0, 'probe')")
                if not src.val("SELECT tide.wait_for_pipeline(%s, '60 seconds')", (name,)):
                    raise BenchError(f"the probe did not get through: {pipeline_health(src, name)}")
                offsets = high_watermarks(brokers, f"{prefix}.public.ev")
                src.x("SELECT tide.pause_pipeline(%s)", (name,))
                floor = src.val("SELECT coalesce(max(id), 0) FROM public.ev")
                per = backlog_rows // PGBENCH_CLIENTS
                pg = pgbench_run(src, ["-n", "-c", str(PGBENCH_CLIENTS), "-j", str(PGBENCH_THREADS), "-t", str(per), "-f", str(script)], 600)
                n = src.val("SELECT count(*) FROM public.ev WHERE id > %s", (floor,))
                src.x("CHECKPOINT")
                t_resume = time.time()
                src.x("SELECT tide.resume_pipeline(%s)", (name,))
                if not src.val("SELECT tide.wait_for_pipeline(%s, '600 seconds')", (name,)):
                    raise BenchError(f"the pipeline did not drain its backlog within 600 s: {pipeline_health(src, name)}")
                t_done = time.time()
                first = first_timestamp(brokers, f"{prefix}.public.ev", offsets, floor)
                secs = t_done - first
                samples[tag] = sample_topic(brokers, f"{prefix}.public.ev")
                if not extra:
                    samples["records"] = sample_topic(brokers, f"{prefix}.transaction")
                return {
                    "rows": n, "source_tps": pg.get("tps"), "seconds": round(secs, 2),
                    "worker_start_s": round(first - t_resume, 2),
                    "rows_per_s": round(n / secs, 1), "rows_per_txn": rows_per_txn,
                }
            finally:
                try:
                    drop_pipeline(src, name)
                finally:
                    broker.stop()

        self.run(b, f"backlog of {backlog_rows:,} one-row transactions → kafka, {what}", backlog, kind="kafka", phase=f"backlog_{tag}")

    # The broker's own produce ceiling, in the same run: librdkafka's producer alone writing
    # messages of the size, key shape and headers pg_tide wrote (read back from its topics), as
    # many as pg_tide wrote, to fresh topics (3 partitions) on a fresh broker, with pg_tide's
    # producer settings. pg_tide's rates are then reported as a ratio of it.
    by = {r["name"]: r for r in b["runs"]}
    by_phase = {r.get("phase"): r for r in b["runs"]}
    bf = by.get(f"backfill {P['b1_rows']:,} rows → kafka", {})
    bl, blnt = by_phase.get("backlog_bl", {}), by_phase.get("backlog_blnt", {})
    for phase, refs, n, src_tag, records, per_txn, what in (
        ("backfill", [bf], bf.get("rows") or P["b1_rows"], "backfill", None, None,
         "the backfill's row messages, idempotent producer, no transactions"),
        ("rows", [bl, blnt], bl.get("rows"), "bl", None, None,
         "the stream's row messages only, idempotent producer, no transactions"),
        ("same_notopic", [blnt], blnt.get("rows"), "blnt", None, rows_per_txn,
         "the stream's row messages, a position record and a Kafka transaction per batch (pg_tide with transaction_topic '')"),
        ("same", [bl], bl.get("rows"), "bl", "records", rows_per_txn,
         "per row its BEGIN, row and END messages, a position record and a Kafka transaction per batch (pg_tide's defaults)"),
    ):

        def ceiling(phase=phase, refs=refs, n=n, src_tag=src_tag, records=records, per_txn=per_txn, what=what):
            sample = samples.get(src_tag)
            recs = samples.get(records) if records else None
            if not sample or (records and not recs):
                raise BenchError(f"no messages sampled from pg_tide's {src_tag} run (it failed or was skipped), so no shape to copy")
            if not n:
                raise BenchError(f"pg_tide's {src_tag} run wrote no messages")
            brokers = broker.start()
            try:
                secs, cpu = producer_ceiling(brokers, f"b5_{stamp}_ceiling_{phase}", 3, sample, n, records=recs, rows_per_txn=per_txn)
            finally:
                broker.stop()
            rate = n / secs
            out = {
                "what": what,
                "rows": n,
                "seconds": round(secs, 2),
                "client_cpu_s": round(cpu, 2),
                "rows_per_s": round(rate, 1),
                "messages_per_row": 3 if recs else 1,
                "rows_per_txn": per_txn,
                "sample_messages": len(sample),
                "value_bytes_avg": round(statistics.mean(len(v) for _, v, _ in sample), 1),
                "key_bytes_avg": round(statistics.mean(len(k or b"") for k, _, _ in sample), 1),
                "key_example": (sample[0][0] or b"").decode(errors="replace"),
                "headers": [h for h, _ in sample[0][2]],
            }
            if recs:
                out["record_bytes_avg"] = round(statistics.mean(len(v or b"") for _, v, _ in recs), 1)
            ratios = []
            for ref in refs:
                if ref.get("ok") and ref.get("rows_per_s"):
                    ratios.append({"run": ref["name"], "tide_rows_per_s": ref["rows_per_s"], "ratio": round(ref["rows_per_s"] / rate, 3)})
            if ratios:
                out["tide_rows_per_s"] = ratios[0]["tide_rows_per_s"]
                out["tide_vs_ceiling"] = ratios[0]["ratio"]
                out["ratios"] = ratios
                b.setdefault("ceiling", {})[phase] = {"ceiling_rows_per_s": round(rate, 1), "ratios": ratios}
            log(
                f"  producer alone ({what}; {out['value_bytes_avg']:.0f} B values): {n:,} rows in {secs:.1f} s = {rate:,.0f} rows/s, "
                f"client CPU {cpu:.1f} s; pg_tide " + ", ".join(f"{fmt_ratio(x['ratio'])} ({x['run']})" for x in ratios)
            )
            return out

        self.run(b, f"producer alone, {phase}", ceiling, kind="kafka (librdkafka alone)", phase=f"ceiling_{phase}")


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}×"
