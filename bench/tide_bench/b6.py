"""B6: one large source transaction (one INSERT of 1M and 10M rows of the benchmark shape, in a
single transaction, into a captured table), per target: the pipeline worker's peak private
memory (RssAnon) above its idle level and the time from the INSERT's commit until it is applied;
side by side with PostgreSQL's own logical replication of the same transaction with
`streaming = off` and `streaming = on` (peak RssAnon of the walsender and of the apply worker).

`run(suite, b)` is called by Suite.b6. Every run starts from an empty source table (created for
the run, dropped after it, so the disk holds one run's data at a time) and a fresh pipeline or
subscription. Before a run of the larger size, the disk that the same method took at the smaller
size, scaled, must fit in what is free with a margin; otherwise the run is recorded as skipped
(the machine's disk is shared)."""

from .common import *  # noqa: F401,F403
from . import b5

SAMPLE_S = 0.05  # /proc sampling period
IDLE_S = 1.0  # idle baseline before the INSERT
AFTER_S = 1.0  # sampled after the transaction is applied
DISK_MARGIN = 3 * 2**30  # free disk left to other users of the machine


def read_status(pid):
    """RssAnon, VmRSS, VmHWM of a process in bytes, or None when it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("RssAnon", "VmRSS", "VmHWM"):
                    out[k] = int(v.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return out


class Sampler:
    """A thread that reads /proc/<pid>/status of some processes every SAMPLE_S seconds, and the
    free disk every 0.5 s, until stopped. `pids` maps a role ('worker', 'walsender',
    'apply') to a pid."""

    def __init__(self, pids, t0):
        self.pids = dict(pids)
        self.t0 = t0
        self.samples = {role: [] for role in self.pids}  # role -> [(t, RssAnon, VmRSS)]
        self.gone = set()
        self.min_free = None
        self.stop = threading.Event()
        self.th = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        next_disk = 0.0
        while not self.stop.is_set():
            t = time.monotonic() - self.t0
            for role, pid in self.pids.items():
                s = read_status(pid)
                if s is None:
                    self.gone.add(role)
                    continue
                self.samples[role].append((round(t, 3), s.get("RssAnon"), s.get("VmRSS")))
            if t >= next_disk:
                st = os.statvfs(str(BENCH_DIR))
                free = st.f_bavail * st.f_frsize
                self.min_free = free if self.min_free is None else min(self.min_free, free)
                next_disk = t + 0.5
            self.stop.wait(SAMPLE_S)

    def start(self):
        self.th.start()

    def finish(self):
        self.stop.set()
        self.th.join(5)

    def summary(self, role, t_insert):
        """idle (median RssAnon before the INSERT), peak, peak above idle, for one process."""
        s = [x for x in self.samples.get(role, []) if x[1] is not None]
        if not s:
            return {"error": "no sample"}
        idle = [x[1] for x in s if x[0] < t_insert] or [s[0][1]]
        idle_v = int(statistics.median(idle))
        peak = max(x[1] for x in s)
        return {
            "pid": self.pids[role],
            "idle_rss_anon_bytes": idle_v,
            "peak_rss_anon_bytes": peak,
            "peak_above_idle_bytes": peak - idle_v,
            "peak_vmrss_bytes": max(x[2] or 0 for x in s),
            "samples_n": len(s),
            "exited": role in self.gone,
        }


def free_disk():
    st = os.statvfs(str(BENCH_DIR))
    return st.f_bavail * st.f_frsize


def fill_sql(table):
    return ROWS_FILL.format(t=table)


def run(self, b):
    src, tgt, P = self.src, self.tgt, self.P
    sizes = P["b6_sizes"]
    # BENCH_B6_SIZES=5000000 / BENCH_B6_METHODS=outbox,native_off: a partial rerun
    if os.environ.get("BENCH_B6_SIZES"):
        sizes = [int(x) for x in os.environ["BENCH_B6_SIZES"].split(",") if x.strip()]
    only_methods = [x.strip() for x in os.environ.get("BENCH_B6_METHODS", "").split(",") if x.strip()]
    kafka_max = P["b6_kafka_max_rows"]
    b["sizes"] = sizes
    b["method"] = (
        "per run: an empty source table public.b6 (the benchmark row shape, primary key only), captured by a fresh "
        "pipeline (tide.add_table, backfill => false) or published to a fresh subscription (copy_data = false); "
        f"then one INSERT ... SELECT of N rows from generate_series (one transaction). /proc/<pid>/status every "
        f"{SAMPLE_S * 1000:.0f} ms from {IDLE_S:.0f} s before the INSERT until {AFTER_S:.0f} s after the transaction "
        "is applied: peak RssAnon minus its median before the INSERT. commit→applied: from the INSERT's return "
        "(its commit) until tide.wait_for_pipeline, called right then, returns true (pg_tide: everything committed "
        "before the call applied; resolution 20 ms); for table targets and native replication also until the "
        "target shows the transaction's last row (polled every 50 ms on its primary key; a reader sees the whole "
        "transaction or none of it), then every row counted."
    )
    b["kafka_note"] = (
        f"Kafka (Apache Kafka 4.4.0, one node, a fresh broker per run) only up to {kafka_max:,} rows "
        "(b6_kafka_max_rows in bench/tide_bench/common.py)."
    )
    b["settings"] = {
        "tide.decoding_work_mem": src.val("SELECT current_setting('tide.decoding_work_mem', true)"),
        "logical_decoding_work_mem (source)": src.val("SHOW logical_decoding_work_mem"),
        "work_mem (target)": tgt.val("SHOW work_mem"),
    }
    b["loadavg_at_start"] = list(os.getloadavg())
    log(f"  settings {b['settings']}; load average {b['loadavg_at_start']}")
    broker = b5.Broker(src)
    disk_per_row = {}  # method -> bytes of disk per row, measured at a smaller size

    methods = [
        ("outbox", "pg_tide → outbox"),
        ("local", "pg_tide → local table"),
        ("remote", "pg_tide → remote table"),
        ("kafka", "pg_tide → Kafka"),
        ("native_off", "logical replication, streaming = off"),
        ("native_on", "logical replication, streaming = on"),
    ]

    def prepare_source():
        drop_all_native(src, tgt)
        src.x("DROP TABLE IF EXISTS public.b6")
        src.x(f"CREATE TABLE public.b6 {ROWS_COLUMNS}")

    def settle():
        src.x("CHECKPOINT")
        tgt.x("CHECKPOINT")

    def one(method, n):
        r = b["runs"][-1]
        need = disk_per_row.get(method)
        free0 = free_disk()
        r["free_disk_before_bytes"] = free0
        if need is not None and need * n + DISK_MARGIN > free0:
            r["skipped"] = True
            raise BenchError(
                f"at the smaller size this method took {need * n / 2**30:.1f} GiB of disk scaled to {n:,} rows, "
                f"and only {free0 / 2**30:.1f} GiB are free (the machine's disk is shared; {DISK_MARGIN / 2**30:.0f} GiB kept free)"
            )
        prepare_source()
        name = f"b6_{method}"
        sub = f"bench_b6_{method}"
        tgt_table = None  # (node, qualified) where the rows land, for visibility and count
        pids = {}
        try:
            if method in ("native_off", "native_on"):
                tgt.x("DROP TABLE IF EXISTS public.b6")
                tgt.x(f"CREATE TABLE public.b6 {ROWS_COLUMNS}")
                tgt_table = (tgt, "public.b6")
                src.x("CREATE PUBLICATION bench_b6_pub FOR TABLE public.b6")
                streaming = "on" if method == "native_on" else "off"
                tgt.x(
                    f"CREATE SUBSCRIPTION {sub} CONNECTION '{src.conninfo(sub)}' PUBLICATION bench_b6_pub "
                    f"WITH (copy_data = false, streaming = {streaming})"
                )
                deadline = time.monotonic() + 60
                while True:
                    ws = src.val(
                        "SELECT pid FROM pg_stat_replication WHERE application_name = %s AND state = 'streaming'", (sub,)
                    )
                    ap = tgt.val("SELECT pid FROM pg_stat_subscription WHERE subname = %s AND relid IS NULL", (sub,))
                    if ws and ap:
                        pids = {"walsender": ws, "apply": ap}
                        break
                    if time.monotonic() > deadline:
                        raise BenchError(f"subscription {sub} did not start streaming within 60 s")
                    time.sleep(0.1)
            else:
                if method == "kafka":
                    broker.start()
                    opts = json.dumps({"server": "bench_kafka", "topic_prefix": f"b6_{int(time.time())}_{n}", "partitions": 3})
                    r["topic"] = json.loads(opts)["topic_prefix"] + ".public.b6"
                    drop_pipeline(src, name)
                    src.x("SELECT tide.create_pipeline(%s, 'kafka', %s::jsonb)", (name, opts))
                elif method == "outbox":
                    drop_pipeline(src, name)
                    src.x("SELECT tide.create_pipeline(%s, 'outbox', '{}')", (name,))
                else:
                    target = TideTarget(method, "public" if method == "remote" else "replica", src, tgt)
                    drop_pipeline(src, name)
                    target.ensure_schema()
                    target.node.x(f"DROP TABLE IF EXISTS {target.q('b6')}")
                    target.node.x(f"CREATE TABLE {target.q('b6')} {ROWS_COLUMNS}")
                    tgt_table = (target.node, target.q("b6"))
                    target.create(src, name)
                src.x("SELECT tide.add_table(%s, 'public.b6', backfill => false)", (name,))
                wait_capturing(src, name, "public.b6")
                # the worker is idle once everything before is applied
                if not src.val("SELECT tide.wait_for_pipeline(%s, '60 seconds')", (name,)):
                    raise BenchError(f"pipeline {name} did not catch up before the run: {pipeline_health(src, name)}")
                pid = src.val("SELECT worker_pid FROM tide.pipelines WHERE name = %s", (name,))
                if not pid:
                    raise BenchError(f"pipeline {name} has no worker: {pipeline_health(src, name)}")
                pids = {"worker": pid}
            settle()
            r["loadavg_before"] = list(os.getloadavg())
            t0 = time.monotonic()
            smp = Sampler(pids, t0)
            smp.start()
            time.sleep(IDLE_S)
            t_ins = time.monotonic() - t0
            src.x(fill_sql("public.b6"), (1, n))  # autocommit: one transaction, committed on return
            t_commit = time.monotonic()
            r["insert_s"] = round(t_commit - t0 - t_ins, 3)
            applied = {}

            def waiter():
                c = src.connect("b6_wait")
                try:
                    ok = c.execute(
                        "SELECT tide.wait_for_pipeline(%s, %s::interval)", (name, f"{P['b6_timeout']} seconds")
                    ).fetchone()[0]
                    applied["t"] = time.monotonic() if ok else None
                except Exception as e:
                    applied["error"] = errtext(e)
                finally:
                    c.close()

            wt = None
            if "worker" in pids:
                wt = threading.Thread(target=waiter, daemon=True)
                wt.start()
            visible = None
            if tgt_table:
                node, q = tgt_table
                c = node.connect("b6_visible")
                try:
                    deadline = t_commit + P["b6_timeout"]
                    while time.monotonic() < deadline:
                        if c.execute(f"SELECT EXISTS (SELECT 1 FROM {q} WHERE id = %s)", (n,)).fetchone()[0]:
                            visible = time.monotonic()
                            break
                        if "error" in applied:
                            break
                        time.sleep(0.05)
                finally:
                    c.close()
            if wt:
                wt.join(P["b6_timeout"] + 30)
                if applied.get("error"):
                    raise BenchError(f"wait_for_pipeline: {applied['error']}; {pipeline_health(src, name)}")
                if not applied.get("t"):
                    raise BenchError(f"not applied within {P['b6_timeout']} s after the commit: {pipeline_health(src, name)}")
                r["commit_to_applied_s"] = round(applied["t"] - t_commit, 3)
            if tgt_table:
                if visible is None:
                    raise BenchError(f"the last row was not at the target {P['b6_timeout']} s after the commit")
                r["commit_to_visible_s"] = round(visible - t_commit, 3)
                if "worker" not in pids:
                    r["commit_to_applied_s"] = r["commit_to_visible_s"]
            time.sleep(AFTER_S)
            smp.finish()
            r["loadavg_after"] = list(os.getloadavg())
            for role in pids:
                r[role] = smp.summary(role, t_ins)
                if role == "worker" and src.val("SELECT worker_pid FROM tide.pipelines WHERE name = %s", (name,)) != pids[role]:
                    r[role]["restarted"] = True
            r["series"] = {role: [(t, a) for t, a, _ in s] for role, s in smp.samples.items()}
            r["insert_start_t"] = round(t_ins, 3)
            r["commit_t"] = round(t_commit - t0, 3)
            r["disk_peak_bytes"] = free0 - smp.min_free if smp.min_free is not None else None
            if r["disk_peak_bytes"]:
                disk_per_row[method] = r["disk_peak_bytes"] / n
            # every row arrived
            if tgt_table:
                node, q = tgt_table
                got = node.val(f"SELECT count(*) FROM {q}")
            elif method == "outbox":
                got = src.val("SELECT count(*) FROM tide.outbox WHERE pipeline = %s AND op = 'insert'", (name,))
            else:
                got = kafka_count(broker.address, r["topic"])
            r["rows_at_target"] = got
            if got != n:
                raise BenchError(f"the target holds {got:,} rows, expected {n:,}")
            mem = ", ".join(
                f"{role} +{r[role]['peak_above_idle_bytes'] / 2**20:.1f} MiB (idle {r[role]['idle_rss_anon_bytes'] / 2**20:.1f})"
                for role in pids
            )
            log(
                f"  {method} {n:,} rows: INSERT {r['insert_s']:.1f} s, commit→applied {r['commit_to_applied_s']:.2f} s; "
                f"RssAnon {mem}; disk {(r['disk_peak_bytes'] or 0) / 2**30:.2f} GiB; load {r['loadavg_after'][0]:.1f}"
            )
        finally:
            if method.startswith("native"):
                drop_subscription(src, tgt, sub)
                src.x("DROP PUBLICATION IF EXISTS bench_b6_pub")
            else:
                drop_pipeline(src, name)
                if method == "outbox":
                    try:
                        src.x("TRUNCATE tide.outbox")
                    except Exception as e:
                        log(f"TRUNCATE tide.outbox: {errtext(e)}; deleting", "warn")
                        src.x("DELETE FROM tide.outbox WHERE pipeline = %s", (name,))
                if method == "kafka":
                    broker.stop()
            if tgt_table:
                try:
                    tgt_table[0].x(f"DROP TABLE IF EXISTS {tgt_table[1]}")
                except Exception as e:
                    log(f"could not drop {tgt_table[1]}: {errtext(e)}", "warn")
            src.x("DROP TABLE IF EXISTS public.b6")
            settle()

    for n in sizes:
        for method, label in methods:
            if only_methods and method not in only_methods:
                continue
            if method == "kafka" and n > kafka_max:
                b["runs"].append(
                    {"name": f"{method}_{n}", "method": method, "label": label, "rows": n, "ok": False, "skipped": True,
                     "error": f"not run: {b['kafka_note']}"}
                )
                continue
            if method == "kafka" and not (os.environ.get("TIDE_BENCH_KAFKA_SCRIPT") or os.environ.get("TIDE_BENCH_KAFKA")):
                b["runs"].append(
                    {"name": f"{method}_{n}", "method": method, "label": label, "rows": n, "ok": False,
                     "error": b5.NO_BROKER}
                )
                continue
            self.run(b, f"{method}_{n}", lambda m=method, k=n: one(m, k), method=method, label=label, rows=n)
    b["loadavg_at_end"] = list(os.getloadavg())
    # same-run ratios: pg_tide's commit→applied and memory against native streaming = off / on
    summ = {}
    byname = {r["name"]: r for r in b["runs"] if r.get("ok")}
    for n in sizes:
        for nat in ("native_off", "native_on"):
            base = byname.get(f"{nat}_{n}")
            if not base:
                continue
            for method, _ in methods[:4]:
                r = byname.get(f"{method}_{n}")
                if r and base.get("commit_to_applied_s"):
                    summ[f"{method}_{n}_time_vs_{nat}"] = round(r["commit_to_applied_s"] / base["commit_to_applied_s"], 2)
    b["summary"] = summ


def kafka_count(brokers, topic):
    """Data messages in `topic`, read (read_committed) from each partition's start to its end:
    its offsets alone would also count the commit markers of pg_tide's Kafka transactions (one
    per partition a transaction wrote to)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": brokers, "group.id": "b6", "enable.auto.commit": False,
                  "enable.partition.eof": True, "isolation.level": "read_committed"})
    try:
        md = c.list_topics(topic, timeout=30)
        tps, done = [], set()
        for p in md.topics[topic].partitions:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            tps.append(TopicPartition(topic, p, lo))
            if hi <= lo:
                done.add(p)
        c.assign(tps)
        total, deadline = 0, time.monotonic() + 600
        while len(done) < len(tps):
            if time.monotonic() > deadline:
                raise BenchError(f"could not read {topic} to its end within 600 s ({total:,} messages read)")
            for m in c.consume(10000, 1.0):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        done.add(m.partition())
                    continue
                total += 1
        return total
    finally:
        c.close()
