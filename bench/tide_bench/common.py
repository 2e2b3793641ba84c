"""Cluster and process helpers every benchmark uses: scales, logging, errors, shell, the
Node connection wrapper, tables, pipelines and native replication, pgbench, machine facts."""

import argparse
import datetime as dt
import decimal
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path


BENCH_DIR = Path(__file__).resolve().parent.parent
REPO = BENCH_DIR.parent
CLUSTER = str(REPO / "scripts" / "cluster.sh")
PG_BIN = os.environ.get("TIDE_PG_BIN", "/usr/lib/postgresql/15/bin")
RESULTS = Path(os.environ.get("BENCH_RESULTS", BENCH_DIR / "results"))
SRC_NAME, TGT_NAME = "bench_src", "bench_tgt"
FDW_SERVER = "tgt"
DEFAULT_CHUNK = 5000  # pg_tide's default chunk size (README: start_backfill)

# ---------------------------------------------------------------------------------------
# Scales
# ---------------------------------------------------------------------------------------
FULL = dict(
    b1_rows=1_000_000,
    b5_backlog_rows=1_000_000,
    b1_chunks=[DEFAULT_CHUNK, 1000, 20000],
    b1_timeout=420,  # per run
    b2_duration=30,
    b2_warmup=3,
    b2_rates=[500, 2000, None],  # None = full speed
    b2_backfill_rate=2000,  # the goal: p99 < 100 ms at 2000 tx/s, also during a backfill
    b2_drain_timeout=300,
    b3_scale=10,
    b3_duration=30,
    b3_backfill_timeout=600,
    b4_sizes=[1_000_000, 5_000_000],
    b4_timeout=900,
    b6_sizes=[1_000_000, 10_000_000],
    b6_kafka_max_rows=1_000_000,  # (chosen for tansu, ~10k messages/s; not re-measured on Apache Kafka)
    b6_timeout=1800,  # per run, from the commit
    b7_tables=200,
    b7_rows=5000,
    b7_timeout=900,  # per run
    b8_rows=1_000_000,
    b8_rate=2000,
    b8_secs=30,
    b8_timeout=900,
    budget=40 * 60,
)
QUICK = dict(
    b1_rows=100_000,
    b5_backlog_rows=200_000,
    b1_chunks=[DEFAULT_CHUNK, 1000, 20000],
    b1_timeout=120,
    b2_duration=6,
    b2_warmup=1,
    b2_rates=[500, 2000, None],
    b2_backfill_rate=2000,  # the goal: p99 < 100 ms at 2000 tx/s, also during a backfill
    b2_drain_timeout=90,
    b3_scale=1,
    b3_duration=6,
    b3_backfill_timeout=180,
    b4_sizes=[100_000, 300_000],
    b4_timeout=240,
    b6_sizes=[20_000, 100_000],
    b6_kafka_max_rows=100_000,
    b6_timeout=300,
    b7_tables=40,
    b7_rows=2000,
    b7_timeout=300,
    b8_rows=50_000,
    b8_rate=500,
    b8_secs=6,
    b8_timeout=300,
    budget=12 * 60,
)

PGBENCH_CLIENTS = 4
PGBENCH_THREADS = 2

# ---------------------------------------------------------------------------------------
# Logging, errors
# ---------------------------------------------------------------------------------------
T_START = time.monotonic()
_log_file = None


def set_log_file(f):
    """Also write every log line to `f` (bench/results/bench.log)."""
    global _log_file
    _log_file = f



def log(msg, level="info"):
    el = time.monotonic() - T_START
    prefix = f"[bench {int(el // 60):02d}:{int(el % 60):02d}]"
    if level == "error":
        prefix += " ERROR:"
    elif level == "warn":
        prefix += " WARNING:"
    line = f"{prefix} {msg}"
    print(line, flush=True)
    if _log_file:
        _log_file.write(line + "\n")
        _log_file.flush()


class BenchError(Exception):
    """A run failed; `partial` carries whatever was measured before the failure."""

    def __init__(self, msg, partial=None):
        super().__init__(msg)
        self.partial = partial or {}


class BudgetExceeded(Exception):
    pass


def errtext(e):
    """One line describing an exception, with SQLSTATE, detail and hint for database errors."""
    try:
        import psycopg

        if isinstance(e, psycopg.Error):
            d = e.diag
            if d is not None and d.message_primary:
                s = f"{d.sqlstate or ''} {d.message_primary}".strip()
                if d.message_detail:
                    s += f" (detail: {d.message_detail})"
                if d.message_hint:
                    s += f" (hint: {d.message_hint})"
                return s
    except ImportError:
        pass
    if isinstance(e, (BenchError, BudgetExceeded)):
        return str(e)
    return f"{type(e).__name__}: {e}"


def sh(args, timeout=300, env=None, check=True, input=None):
    """Run a command, return stdout; raise BenchError with stderr on failure."""
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, input=input)
    except subprocess.TimeoutExpired:
        raise BenchError(f"command timed out after {timeout} s: {' '.join(map(str, args))[:200]}")
    if check and p.returncode != 0:
        raise BenchError(
            f"command failed (exit {p.returncode}): {' '.join(map(str, args))[:200]}: {(p.stderr or p.stdout).strip()[-800:]}"
        )
    return p.stdout


# Child processes (pgbench, psql) to kill on exit.
CHILDREN = set()


def kill_children():
    for p in list(CHILDREN):
        if p.poll() is None:
            try:
                p.terminate()
                p.wait(5)
            except Exception:
                try:
                    p.kill()
                except Exception:
                    pass
        CHILDREN.discard(p)


def jsonable(o):
    if isinstance(o, (dt.datetime, dt.date)):
        return o.isoformat()
    if isinstance(o, dt.timedelta):
        return o.total_seconds()
    if isinstance(o, decimal.Decimal):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, set):
        return sorted(o)
    return str(o)


# ---------------------------------------------------------------------------------------
# Clusters
# ---------------------------------------------------------------------------------------
class Node:
    """One scratch cluster (scripts/cluster.sh), reached over TCP as postgres."""

    def __init__(self, name):
        import psycopg  # noqa: F401

        self.name = name
        self.port = int(sh([CLUSTER, "port", name], timeout=30).strip())
        self._conn = None

    def conninfo(self, app="pg_tide_bench"):
        return f"host=127.0.0.1 port={self.port} dbname=postgres user=postgres application_name={app}"

    def connect(self, app="pg_tide_bench"):
        import psycopg

        c = psycopg.connect(self.conninfo(app), autocommit=True, connect_timeout=10)
        c.execute("SET statement_timeout = '30min'")
        return c

    @property
    def conn(self):
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = self.connect()
        return self._conn

    def x(self, q, p=None):
        self.conn.execute(q, p)

    def one(self, q, p=None):
        return self.conn.execute(q, p).fetchone()

    def val(self, q, p=None):
        r = self.one(q, p)
        return r[0] if r else None

    def all(self, q, p=None):
        return self.conn.execute(q, p).fetchall()

    def env(self):
        e = dict(os.environ)
        e.update(PGHOST="127.0.0.1", PGPORT=str(self.port), PGUSER="postgres", PGDATABASE="postgres")
        return e

    def close(self):
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None


# ---------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------
ROWS_COLUMNS = """(
    id bigint PRIMARY KEY,
    customer text NOT NULL,
    amount numeric(12,2) NOT NULL,
    created_at timestamptz NOT NULL,
    qty integer NOT NULL,
    ref uuid NOT NULL,
    attrs jsonb NOT NULL,
    note text)"""

ROWS_FILL = """INSERT INTO {t}
SELECT g, 'customer-' || md5(g::text),
       ((g * 7919) %% 10000000) / 100.0,
       timestamptz '2024-01-01 00:00:00+00' + g * interval '7 seconds',
       (g %% 1000)::int,
       md5(g::text || 'ref')::uuid,
       jsonb_build_object('kind', (ARRAY['order','refund','invoice','credit'])[1 + g %% 4], 'seq', g,
                          'tag', substr(md5((g * 31)::text), 1, 10)),
       'note ' || substr(md5((g * 13)::text), 1, 24)
  FROM generate_series(%s::bigint, %s::bigint) g"""


def create_rows_table(node, qualified, with_index=True):
    """(Re)create an empty table of the benchmark row shape: the same primary key and the same
    extra index on every target, so every method maintains the same indexes."""
    node.x(f"DROP TABLE IF EXISTS {qualified}")
    node.x(f"CREATE TABLE {qualified} {ROWS_COLUMNS}")
    if with_index:
        node.x(f"CREATE INDEX ON {qualified} (created_at)")


def ensure_source_table(src, name, rows):
    """public.<name> with exactly `rows` rows of the benchmark shape, vacuumed and analyzed."""
    exists = src.val("SELECT to_regclass(%s) IS NOT NULL", (f"public.{name}",))
    if exists:
        n = src.val(f"SELECT count(*) FROM public.{name}")
        if n == rows:
            return
    log(f"creating source table public.{name} with {rows:,} rows (~215 bytes per row in the heap)")
    t0 = time.monotonic()
    src.x(f"DROP TABLE IF EXISTS public.{name}")
    src.x(f"CREATE TABLE public.{name} {ROWS_COLUMNS.replace('id bigint PRIMARY KEY', 'id bigint NOT NULL')}")
    # Copying the rows of public.t (ids shifted) is twice as fast as generating them again.
    base = None
    if name != "t" and src.val("SELECT to_regclass('public.t') IS NOT NULL"):
        base = src.val("SELECT count(*) FROM public.t WHERE id BETWEEN 1 AND (SELECT max(id) FROM public.t)")
        if not base or rows % base != 0 or src.val("SELECT max(id) FROM public.t") != base:
            base = None
    step = base or 1_000_000
    for lo in range(1, rows + 1, step):
        hi = min(rows, lo + step - 1)
        if base:
            src.x(
                f"INSERT INTO public.{name} SELECT id + %s, customer, amount, created_at, qty, ref, attrs, note FROM public.t",
                (lo - 1,),
            )
        else:
            src.x(ROWS_FILL.format(t=f"public.{name}"), (lo, hi))
        if rows > step:
            log(f"  public.{name}: {hi:,} / {rows:,} rows")
    src.x(f"ALTER TABLE public.{name} ADD PRIMARY KEY (id)")
    src.x(f"CREATE INDEX ON public.{name} (created_at)")
    # Hint bits and the visibility map set once, so no method pays for them.
    src.x(f"VACUUM (ANALYZE) public.{name}")
    src.x("CHECKPOINT")
    size = src.val("SELECT pg_relation_size(%s::regclass)", (f"public.{name}",))
    log(f"  public.{name}: {rows:,} rows, heap {size / 1e6:.0f} MB, built in {time.monotonic() - t0:.0f} s")


def heap_bytes(src, qualified):
    return int(src.val("SELECT pg_relation_size(%s::regclass)", (qualified,)))


# ---------------------------------------------------------------------------------------
# pg_tide helpers
# ---------------------------------------------------------------------------------------
class TideTarget:
    """Where a pg_tide pipeline writes: 'remote' (kind postgres, tables in bench_tgt through the
    postgres_fdw server) or 'local' (kind table, tables in a schema of bench_src)."""

    def __init__(self, kind, schema, src, tgt):
        self.kind = kind
        self.schema = schema
        self.node = tgt if kind == "remote" else src

    def q(self, table):
        return f"{self.schema}.{table}"

    def create(self, src, pipeline):
        if self.kind == "remote":
            opts = {"server": FDW_SERVER, "schema": self.schema}
            src.x("SELECT tide.create_pipeline(%s, 'postgres', %s::jsonb)", (pipeline, json.dumps(opts)))
        else:
            opts = {"schema": self.schema}
            src.x("SELECT tide.create_pipeline(%s, 'table', %s::jsonb)", (pipeline, json.dumps(opts)))

    def ensure_schema(self):
        self.node.x(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")

    def label(self):
        return "remote table (postgres_fdw server)" if self.kind == "remote" else "local table (same database)"


class SlotWatcher:
    """Samples, every 0.5 s on its own connection, how much WAL lies between a slot's
    restart_lsn and its confirmed position (WAL retained behind the stream, which a restarted
    worker decodes again), and the
    pg_tide pipeline's lag_bytes. Use as a context manager; read .max_reread and .max_lag."""

    def __init__(self, node, pipeline):
        self.node, self.pipeline = node, pipeline
        self.max_reread = None
        self.max_lag = None
        self._stop = threading.Event()
        self._th = None

    def _loop(self):
        try:
            conn = self.node.connect("pg_tide_bench_slotwatch")
        except Exception:
            return
        try:
            while not self._stop.is_set():
                try:
                    r = conn.execute(
                        """SELECT pg_wal_lsn_diff(s.confirmed_flush_lsn, s.restart_lsn)::float8,
                                  (SELECT lag_bytes::float8 FROM tide.pipelines WHERE name = %s)
                             FROM pg_replication_slots s WHERE s.slot_name = %s""",
                        (self.pipeline, "tide_" + self.pipeline),
                    ).fetchone()
                    if r:
                        if r[0] is not None:
                            self.max_reread = max(self.max_reread or 0, int(r[0]))
                        if r[1] is not None:
                            self.max_lag = max(self.max_lag or 0, int(r[1]))
                except Exception:
                    pass
                self._stop.wait(0.5)
        finally:
            conn.close()

    def __enter__(self):
        self._th = threading.Thread(target=self._loop, daemon=True)
        self._th.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._th.join(5)
        return False

    def record(self, r):
        r["max_slot_reread_bytes"] = self.max_reread
        r["max_lag_bytes"] = self.max_lag


def drop_pipeline(src, name):
    try:
        if src.val("SELECT EXISTS (SELECT 1 FROM tide.pipelines WHERE name = %s)", (name,)):
            src.x("SELECT tide.drop_pipeline(%s)", (name,))
    except Exception as e:
        log(f"could not drop pipeline {name}: {errtext(e)}", "warn")


def drop_all_pipelines(src):
    try:
        for (name,) in src.all("SELECT name FROM tide.pipelines"):
            drop_pipeline(src, name)
    except Exception as e:
        log(f"could not list pipelines: {errtext(e)}", "warn")


def pipeline_health(src, name):
    r = src.one(
        "SELECT state, worker_pid, lag_bytes, last_error, last_error_sqlstate, remedy FROM tide.pipelines WHERE name = %s",
        (name,),
    )
    if not r:
        return {"state": "missing"}
    return dict(zip(["state", "worker_pid", "lag_bytes", "last_error", "last_error_sqlstate", "remedy"], r))


def wait_capturing(src, pipeline, relation, timeout=60):
    """Wait until the worker has reached the add_table marker of `relation`."""
    deadline = time.monotonic() + timeout
    while True:
        st = src.val(
            "SELECT state FROM tide.tables WHERE pipeline = %s AND source = %s::regclass", (pipeline, relation)
        )
        if st == "capturing":
            return
        if time.monotonic() > deadline:
            h = pipeline_health(src, pipeline)
            raise BenchError(
                f"{relation} still '{st}' in pipeline {pipeline} after {timeout} s; pipeline {h.get('state')}: {h.get('last_error') or 'no error'}"
            )
        time.sleep(0.1)


def wait_backfill(src, pipeline, relation, t0, timeout, stall=120, poll=0.25, sampler=None):
    """Poll tide.backfills until the latest backfill of `relation` in `pipeline` is done, then
    confirm with tide.wait_for_backfill (done *and applied*). Returns a dict with the time
    series of rows_emitted (seconds since t0). Raises BenchError (with partial results) on
    failure, cancellation, a stall (no progress for `stall` s) or the timeout."""
    series = []
    deadline = t0 + timeout
    last_rows, last_change = -1, time.monotonic()
    row = None
    # WAL between the slot's restart_lsn and its confirmed position: retained behind the stream
    # (a restarted worker decodes it again; the running worker reads each record once).
    window = {"max": 0}

    def partial():
        return {
            "series": series,
            "rows_emitted": series[-1][1] if series else 0,
            "seconds": time.monotonic() - t0,
            "pipeline": pipeline_health(src, pipeline),
            "max_slot_reread_bytes": window["max"],
        }

    while True:
        row = src.one(
            """SELECT b.id, b.state, b.rows_read, b.rows_emitted, b.chunks_done, b.error, b.remedy,
                      b.started_at, b.finished_at, b.chunk_size,
                      (SELECT pg_wal_lsn_diff(s.confirmed_flush_lsn, s.restart_lsn)::float8
                         FROM pg_replication_slots s
                        WHERE s.slot_name = (SELECT p.slot_name FROM tide.pipeline p WHERE p.name = %s))
                 FROM tide.backfills b
                WHERE b.pipeline = %s AND b.source = %s::regclass
                ORDER BY b.id DESC LIMIT 1""",
            (pipeline, pipeline, relation),
        )
        now = time.monotonic()
        if row is not None and row[10] is not None:
            window["max"] = max(window["max"], int(row[10]))
        if row is None:
            state, rows = "none", 0
        else:
            state, rows = row[1], int(row[3] or 0)
        series.append((round(now - t0, 3), rows))
        if sampler:
            sampler(now - t0, rows)
        if rows != last_rows:
            last_rows, last_change = rows, now
        if state == "done":
            left = max(1.0, deadline - time.monotonic())
            try:
                ok = src.val(
                    "SELECT tide.wait_for_backfill(%s::regclass, %s, %s::interval)",
                    (relation, pipeline, f"{left:.0f} seconds"),
                )
            except Exception as e:
                raise BenchError(f"wait_for_backfill: {errtext(e)}", partial())
            if not ok:
                raise BenchError(f"backfill emitted but not applied within {timeout} s", partial())
            t_end = time.monotonic()
            series.append((round(t_end - t0, 3), rows))
            return {
                "backfill_id": row[0],
                "rows_read": int(row[2] or 0),
                "rows_emitted": rows,
                "chunks_done": int(row[4] or 0),
                "started_at": row[7],
                "finished_at": row[8],
                "chunk_size": row[9],
                "max_slot_reread_bytes": window["max"],
                "end_monotonic": t_end,
                "series": series,
            }
        if state in ("failed", "cancelled"):
            raise BenchError(f"backfill {state}: {row[5]} (remedy: {row[6]})", partial())
        if now - last_change > stall:
            h = pipeline_health(src, pipeline)
            raise BenchError(
                f"no progress for {stall} s (backfill {state}, {rows:,} rows emitted); pipeline {h.get('state')}: "
                f"{h.get('last_error_sqlstate') or ''} {h.get('last_error') or 'no error'}",
                partial(),
            )
        if now > deadline:
            h = pipeline_health(src, pipeline)
            raise BenchError(
                f"timed out after {timeout} s (backfill {state}, {rows:,} rows emitted); pipeline {h.get('state')}: "
                f"{h.get('last_error') or 'no error'}",
                partial(),
            )
        time.sleep(poll)


# ---------------------------------------------------------------------------------------
# Native logical replication helpers
# ---------------------------------------------------------------------------------------
def drop_subscription(src, tgt, sub):
    try:
        if not tgt.val("SELECT EXISTS (SELECT 1 FROM pg_subscription WHERE subname = %s)", (sub,)):
            return
        try:
            tgt.x(f"DROP SUBSCRIPTION {sub}")
        except Exception as e:
            log(f"DROP SUBSCRIPTION {sub} failed ({errtext(e)}); detaching it from its slot", "warn")
            tgt.x(f"ALTER SUBSCRIPTION {sub} DISABLE")
            tgt.x(f"ALTER SUBSCRIPTION {sub} SET (slot_name = NONE)")
            tgt.x(f"DROP SUBSCRIPTION {sub}")
    except Exception as e:
        log(f"could not drop subscription {sub}: {errtext(e)}", "warn")
    drop_leftover_slots(src, sub)


def drop_leftover_slots(src, sub=None):
    """Drop inactive non-pg_tide slots (a subscription's slot and its tablesync slots)."""
    try:
        deadline = time.monotonic() + 30
        while True:
            rows = src.all(
                "SELECT slot_name, active FROM pg_replication_slots WHERE slot_name NOT LIKE 'tide\\_%%'"
            )
            if not rows:
                return
            busy = False
            for name, active in rows:
                if active:
                    busy = True
                    continue
                try:
                    src.x("SELECT pg_drop_replication_slot(%s)", (name,))
                except Exception as e:
                    log(f"could not drop slot {name}: {errtext(e)}", "warn")
            if not busy or time.monotonic() > deadline:
                return
            time.sleep(0.5)
    except Exception as e:
        log(f"could not check leftover slots: {errtext(e)}", "warn")


def drop_all_native(src, tgt):
    try:
        for (sub,) in tgt.all("SELECT subname FROM pg_subscription"):
            drop_subscription(src, tgt, sub)
        for (pub,) in src.all("SELECT pubname FROM pg_publication"):
            src.x(f"DROP PUBLICATION IF EXISTS {pub}")
        drop_leftover_slots(src)
    except Exception as e:
        log(f"native cleanup: {errtext(e)}", "warn")


def wait_sub_ready(tgt, sub, tables, timeout, sampler=None, poll=0.2):
    """Wait until every table of `sub` is in state 'r' (ready) in pg_subscription_rel."""
    t0 = time.monotonic()
    while True:
        rows = tgt.all(
            """SELECT c.relname, r.srsubstate FROM pg_subscription_rel r
                 JOIN pg_subscription s ON s.oid = r.srsubid JOIN pg_class c ON c.oid = r.srrelid
                WHERE s.subname = %s""",
            (sub,),
        )
        states = {n: s for n, s in rows}
        if sampler:
            sampler(time.monotonic() - t0)
        if len(states) >= len(tables) and all(s == "r" for s in states.values()):
            return time.monotonic()
        if time.monotonic() - t0 > timeout:
            raise BenchError(f"subscription {sub} not ready after {timeout} s: {states}")
        time.sleep(poll)


def copy_progress(node, qualified):
    r = node.val(
        "SELECT sum(tuples_processed) FROM pg_stat_progress_copy WHERE relid = to_regclass(%s)", (qualified,)
    )
    return int(r or 0)


# ---------------------------------------------------------------------------------------
# pgbench
# ---------------------------------------------------------------------------------------
def pgbench_cmd(node, args):
    return [f"{PG_BIN}/pgbench", "-h", "127.0.0.1", "-p", str(node.port), "-U", "postgres", *args, "postgres"]


def parse_pgbench(out):
    res = {}
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out) or re.search(r"tps = ([\d.]+)", out)
    if m:
        res["tps"] = float(m.group(1))
    m = re.search(r"latency average = ([\d.]+) ms", out)
    if m:
        res["latency_avg_ms"] = float(m.group(1))
    m = re.search(r"latency stddev = ([\d.]+) ms", out)
    if m:
        res["latency_stddev_ms"] = float(m.group(1))
    m = re.search(r"number of transactions actually processed: (\d+)", out)
    if m:
        res["transactions"] = int(m.group(1))
    m = re.search(r"number of failed transactions: (\d+)", out)
    if m:
        res["failed"] = int(m.group(1))
    m = re.search(r"rate limit schedule lag: avg ([\d.]+) \(max ([\d.]+)\) ms", out)
    if m:
        res["schedule_lag_avg_ms"] = float(m.group(1))
        res["schedule_lag_max_ms"] = float(m.group(2))
    return res


def pgbench_start(node, args):
    cmd = pgbench_cmd(node, args)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=node.env())
    CHILDREN.add(p)
    p.cmdline = " ".join(cmd)
    return p


def while_pgbench_runs(p, fn):
    """Call fn(p) (if given) while pgbench `p` runs; should it fail, stop pgbench and re-raise."""
    if not fn:
        return
    try:
        fn(p)
    except BaseException:
        p.terminate()
        p.communicate()
        CHILDREN.discard(p)
        raise


def pgbench_finish(p, timeout):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        CHILDREN.discard(p)
        raise BenchError(f"pgbench did not finish within {timeout} s")
    CHILDREN.discard(p)
    res = parse_pgbench(out)
    if p.returncode != 0 or "tps" not in res:
        raise BenchError(f"pgbench failed (exit {p.returncode}): {(err or out).strip()[-600:]}")
    res["command"] = p.cmdline
    return res


def pgbench_run(node, args, timeout):
    return pgbench_finish(pgbench_start(node, args), timeout)


# ---------------------------------------------------------------------------------------
# Machine description
# ---------------------------------------------------------------------------------------
def elf_section_names(data):
    """Section names of an ELF64 little-endian file, or None if it is not one."""
    import struct

    try:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return None
        shoff = struct.unpack_from("<Q", data, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        str_off = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
        names = set()
        for i in range(shnum):
            name_off = struct.unpack_from("<I", data, shoff + i * shentsize)[0]
            end = data.index(b"\0", str_off + name_off)
            names.add(data[str_off + name_off : end].decode("ascii", "replace"))
        return names
    except Exception:
        return None


def machine_info(src):
    info = {}
    try:
        info["nproc"] = len(os.sched_getaffinity(0))
    except Exception:
        info["nproc"] = os.cpu_count()
    info["cpu_count_os"] = os.cpu_count()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
            info["cpu_model"] = m.group(1).strip() if m else None
    except Exception:
        info["cpu_model"] = None
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"^MemTotal:\s+(\d+) kB", f.read(), re.M)
            info["memory_bytes"] = int(m.group(1)) * 1024 if m else None
            info["memory_gib"] = round(info["memory_bytes"] / 2**30, 1) if m else None
    except Exception:
        info["memory_bytes"] = None
    info["kernel"] = platform.release()
    info["hostname"] = platform.node()
    try:
        info["loadavg_at_start"] = list(os.getloadavg())
    except Exception:
        pass
    sw = {}
    sw["postgresql"] = src.val("SELECT version()")
    sw["postgresql_version"] = src.val("SHOW server_version")
    try:
        sw["pg_tide"] = src.val("SELECT tide.version()")
    except Exception as e:
        sw["pg_tide"] = f"unknown ({errtext(e)})"
    try:
        libdir = sh([f"{PG_BIN}/pg_config", "--pkglibdir"]).strip()
        so = Path(libdir) / "pg_tide.so"
        st = so.stat()
        data = so.read_bytes()
        sections = elf_section_names(data)
        sw["pg_tide_so"] = {
            "path": str(so),
            "bytes": st.st_size,
            "mtime": dt.datetime.fromtimestamp(st.st_mtime, dt.timezone.utc).isoformat(),
            "sha256": hashlib.sha256(data).hexdigest()[:16],
            # cargo's dev profile emits DWARF (.debug_info); its release profile (debug = false) does not.
            "build_guess": "unknown" if sections is None else ("debug" if ".debug_info" in sections else "release"),
        }
    except Exception as e:
        sw["pg_tide_so"] = {"error": errtext(e)}
    try:
        sw["git_commit"] = sh(["git", "-C", str(REPO), "rev-parse", "HEAD"]).strip()
        dirty = sh(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"]).strip()
        sw["git_dirty"] = bool(dirty)
    except Exception as e:
        sw["git_commit"] = f"unknown ({errtext(e)})"
    sw["python"] = platform.python_version()
    try:
        import psycopg

        sw["psycopg"] = psycopg.__version__
    except Exception:
        pass
    try:
        import matplotlib

        sw["matplotlib"] = matplotlib.__version__
    except Exception:
        pass
    settings = {}
    for s in [
        "shared_buffers",
        "wal_level",
        "fsync",
        "synchronous_commit",
        "max_wal_size",
        "track_commit_timestamp",
        "tide.poll_interval",
        "tide.batch_events",
    ]:
        try:
            settings[s] = src.val("SELECT current_setting(%s)", (s,))
        except Exception:
            settings[s] = None
    return info, sw, settings


# ---------------------------------------------------------------------------------------
# The suite
# ---------------------------------------------------------------------------------------
