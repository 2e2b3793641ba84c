"""B5: the kafka target next to the outbox target, in the same run: backfill rows/s, streaming
rows/s and commit-to-consumer latency (p50/p99); then the broker's own produce ceiling
(librdkafka's producer alone, pg_tide's producer settings, messages shaped like pg_tide's) and
pg_tide's Kafka rates as a ratio of it. Debezium's published engine figure (50–67k events/s) is
cited, not run.

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
# ceiling's producer uses the same ones, without transactions (pg_tide's default, exactly-once,
# also commits a Kafka transaction per batch: the ratio includes that cost).
TIDE_PRODUCER = {
    "enable.idempotence": True,
    "enable.gapless.guarantee": True,
    "acks": "all",
    "max.in.flight.requests.per.connection": 5,
    "partitioner": "murmur2_random",
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


def producer_ceiling(brokers, topic, partitions, sample, n):
    """librdkafka's producer alone (pg_tide's producer settings) writes `n` messages shaped like
    `sample` (the values and headers cycled, the key's first number replaced by the message's
    number, so keys are distinct as rows' keys are) to a fresh topic of `partitions` partitions;
    timed from the first produce() until flush() returns (every message acknowledged)."""
    admin = AdminClient({"bootstrap.servers": brokers})
    fs = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for f in fs.values():
        f.result(60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=10)
        if topic in md.topics and len(md.topics[topic].partitions) == partitions:
            break
        time.sleep(0.2)
    p = Producer({"bootstrap.servers": brokers, "client.id": "b5-ceiling", **TIDE_PRODUCER})
    failed = {"n": 0, "err": None}

    def on_delivery(err, _msg):
        if err is not None:
            failed["n"] += 1
            failed["err"] = str(err)

    k = len(sample)
    t0 = time.monotonic()
    for i in range(1, n + 1):
        key, value, headers = sample[i % k]
        if key is not None:
            key = re.sub(rb"\d+", str(i).encode(), key, count=1)
        while True:
            try:
                p.produce(topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:  # the queue is full (queue.buffering.max.kbytes): wait as pg_tide does
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(300)
    secs = time.monotonic() - t0
    if left or failed["n"]:
        raise BenchError(f"{left} messages not acknowledged within 300 s, {failed['n']} failed ({failed['err']})")
    return secs


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
        "outbox": lambda n: "{}",
        "kafka": lambda n: json.dumps({"server": "bench_kafka", "topic_prefix": f"b5_{stamp}_{n}", "partitions": 3}),
    }

    def fresh(kind, n):
        name = f"b5_{kind}"
        drop_pipeline(src, name)
        src.x("DELETE FROM tide.outbox WHERE pipeline = %s", (name,))
        src.x("SELECT tide.create_pipeline(%s, %s, %s)", (name, kind, opts[kind](n)))
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
                    smp = None
                    if kind == "kafka" and not consume and rate is None:
                        # the stream's messages, for the ceiling: read early, while the topic is small
                        smp = Sample(samples, "stream", brokers, f"b5_{stamp}_s{rate or 'max'}n.public.ev")
                        threading.Timer(3.0, smp.maybe, args=(True,)).start()
                    pg = pgbench_run(src, args, dur + 120)
                    ack_stop.set()
                    sampler.join(70)
                    n = src.val("SELECT count(*) FROM public.ev WHERE id > %s", (floor,))
                    t_drain = time.monotonic()
                    caught_up = src.val("SELECT tide.wait_for_pipeline(%s, '120 seconds')", (name,))
                    if not caught_up and not consume:
                        raise BenchError(f"the pipeline did not catch up within 120 s: {pipeline_health(src, name)}")
                    drain = time.monotonic() - t_drain if caught_up else None
                    if smp:
                        smp.join()
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

    # The broker's own produce ceiling, in the same run: librdkafka's producer alone writing
    # messages of the size and key shape pg_tide wrote (read back from its topics), as many as
    # pg_tide wrote, to a fresh topic (3 partitions) on a fresh broker, with pg_tide's producer
    # settings. pg_tide's rates are then reported as a ratio of it.
    by = {r["name"]: r for r in b["runs"]}
    bf = by.get(f"backfill {P['b1_rows']:,} rows → kafka", {})
    st = by.get("streaming full speed tx/s → kafka, no consumer", {})
    for phase, ref, n in (
        ("backfill", bf, bf.get("rows") or P["b1_rows"]),
        ("stream", st, st.get("rows")),
    ):

        def ceiling(phase=phase, ref=ref, n=n):
            sample = samples.get(phase)
            if not sample:
                raise BenchError(f"no messages sampled from pg_tide's {phase} run (it failed or was skipped), so no shape to copy")
            if not n:
                raise BenchError(f"pg_tide's {phase} run wrote no messages")
            brokers = broker.start()
            try:
                secs = producer_ceiling(brokers, f"b5_{stamp}_ceiling_{phase}", 3, sample, n)
            finally:
                broker.stop()
            rate = n / secs
            out = {
                "rows": n,
                "seconds": round(secs, 2),
                "rows_per_s": round(rate, 1),
                "sample_messages": len(sample),
                "value_bytes_avg": round(statistics.mean(len(v) for _, v, _ in sample), 1),
                "key_bytes_avg": round(statistics.mean(len(k or b"") for k, _, _ in sample), 1),
                "key_example": (sample[0][0] or b"").decode(errors="replace"),
                "headers": [h for h, _ in sample[0][2]],
            }
            tide_rate = ref.get("rows_per_s") if phase == "backfill" else ref.get("applied_rows_per_s")
            if ref.get("ok") and tide_rate:
                out["tide_rows_per_s"] = tide_rate
                out["tide_vs_ceiling"] = round(tide_rate / rate, 3)
                b.setdefault("ceiling", {})[phase] = {"ceiling_msgs_per_s": round(rate, 1), "tide_rows_per_s": tide_rate, "ratio": out["tide_vs_ceiling"]}
            log(
                f"  producer ceiling ({phase} messages, {out['value_bytes_avg']:.0f} B values, key like {out['key_example']!r}): "
                f"{n:,} messages in {secs:.1f} s = {rate:,.0f} msgs/s; pg_tide {fmt_ratio(out.get('tide_vs_ceiling'))} of it"
            )
            return out

        self.run(b, f"producer ceiling, {phase} messages", ceiling, kind="kafka (librdkafka alone)", phase=f"ceiling_{phase}")


def fmt_ratio(x):
    return "–" if x is None else f"{x:.2f}×"
