#!/usr/bin/env python3
"""pg_tide benchmark suite. Run it through bench/run.sh, which sets up the machine, the
Python environment and the two scratch clusters (bench_src, bench_tgt) this script expects.

    bench.py [--quick] [--only B1,B2,B3,B4] [--budget SECONDS]
    bench.py --report-only        (re-render RESULTS.md and the plots from results.json)

Benchmarks (see bench/README.md):
  B1  backfill throughput: pg_tide (remote and local table targets, three chunk sizes) vs
      PostgreSQL logical replication initial sync vs a COPY pipe
  B2  streaming: apply throughput and commit-to-target latency, pg_tide vs logical
      replication, at fixed rates and at full speed, and pg_tide while a backfill runs
  B3  source overhead: pgbench TPC-B TPS with nothing / native replication / pg_tide
  B4  bounds: pg_tide worker RSS and oldest snapshot during backfills of two table sizes

Every run fails soft: its error is recorded in results.json and RESULTS.md and the suite
goes on. Results are written after every benchmark, so an interrupted run keeps what it had.
"""

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

BENCH_DIR = Path(__file__).resolve().parent
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
    budget=40 * 60,
)
QUICK = dict(
    b1_rows=100_000,
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
    budget=12 * 60,
)

PGBENCH_CLIENTS = 4
PGBENCH_THREADS = 2

# ---------------------------------------------------------------------------------------
# Logging, errors
# ---------------------------------------------------------------------------------------
T_START = time.monotonic()
_log_file = None


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
_children = set()


def kill_children():
    for p in list(_children):
        if p.poll() is None:
            try:
                p.terminate()
                p.wait(5)
            except Exception:
                try:
                    p.kill()
                except Exception:
                    pass
        _children.discard(p)


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
                         FROM pg_replication_slots s WHERE s.slot_name = 'tide_' || %s)
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
    _children.add(p)
    p.cmdline = " ".join(cmd)
    return p


def pgbench_finish(p, timeout):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        _children.discard(p)
        raise BenchError(f"pgbench did not finish within {timeout} s")
    _children.discard(p)
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
class Suite:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.P = dict(QUICK if args.quick else FULL)
        if args.budget:
            self.P["budget"] = args.budget
        self.src = Node(SRC_NAME)
        self.tgt = Node(TGT_NAME)
        self.tmp = Path(tempfile.mkdtemp(prefix="pg_tide_bench_"))
        os.chmod(self.tmp, 0o755)
        self.results = {
            "schema_version": 1,
            "mode": "quick" if self.quick else "full",
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
            "started_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "params": {k: v for k, v in self.P.items()},
            "benchmarks": {},
        }
        self.deadline = T_START + self.P["budget"]
        self.remote_ok = None  # learnt in B1

    # -- bookkeeping -------------------------------------------------------------------
    def check_budget(self, what):
        if time.monotonic() > self.deadline:
            raise BudgetExceeded(f"skipped {what}: the time budget of {self.P['budget']} s is used up")

    def save(self):
        RESULTS.mkdir(parents=True, exist_ok=True)
        self.results["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat()
        self.results["duration_s"] = round(time.monotonic() - T_START, 1)
        tmp = RESULTS / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=jsonable))
        tmp.replace(RESULTS / "results.json")

    def bench(self, key, title, fn):
        b = {"title": title, "ok": False, "error": None, "runs": []}
        self.results["benchmarks"][key] = b
        log(f"=== {key}: {title} ===")
        t0 = time.monotonic()
        try:
            self.check_budget(key)
            fn(b)
            b["ok"] = all(r.get("ok") for r in b["runs"]) if b["runs"] else b["error"] is None
        except (Exception, BudgetExceeded) as e:
            b["error"] = errtext(e)
            log(f"{key} failed: {b['error']}", "error")
            if not isinstance(e, (BenchError, BudgetExceeded)):
                b["traceback"] = traceback.format_exc()
                log(traceback.format_exc().rstrip(), "error")
        b["seconds"] = round(time.monotonic() - t0, 1)
        n_ok = sum(1 for r in b["runs"] if r.get("ok"))
        log(f"=== {key} finished in {b['seconds']:.0f} s: {n_ok}/{len(b['runs'])} runs ok ===")
        self.save()

    def run(self, b, name, fn, **meta):
        """One run of a benchmark: fails soft, records its error and partial results."""
        r = {"name": name, "ok": False, "error": None, **meta}
        b["runs"].append(r)
        t0 = time.monotonic()
        try:
            self.check_budget(name)
            out = fn()
            if out:
                r.update(out)
            r["ok"] = True
        except KeyboardInterrupt:
            r["error"] = "interrupted"
            raise
        except (Exception, BudgetExceeded) as e:
            r["error"] = errtext(e)
            if isinstance(e, BenchError) and e.partial:
                r["partial"] = e.partial
            if not isinstance(e, (BenchError, BudgetExceeded)):
                r["traceback"] = traceback.format_exc()
            log(f"{name}: FAILED: {r['error']}", "error")
        r["wall_seconds"] = round(time.monotonic() - t0, 2)
        return r

    # -- setup -------------------------------------------------------------------------
    def setup(self):
        src, tgt = self.src, self.tgt
        log(f"source {SRC_NAME} on 127.0.0.1:{src.port}, target {TGT_NAME} on 127.0.0.1:{tgt.port}")
        src.x("CREATE EXTENSION IF NOT EXISTS pg_tide")
        src.x("CREATE EXTENSION IF NOT EXISTS postgres_fdw")
        src.x(f"DROP SERVER IF EXISTS {FDW_SERVER} CASCADE")
        src.x(
            f"CREATE SERVER {FDW_SERVER} FOREIGN DATA WRAPPER postgres_fdw "
            f"OPTIONS (host '127.0.0.1', port '{tgt.port}', dbname 'postgres')"
        )
        src.x(f"CREATE USER MAPPING FOR postgres SERVER {FDW_SERVER} OPTIONS (user 'postgres')")
        log(f"pg_tide: {src.val('SELECT tide.check()')}")
        machine, software, settings = machine_info(src)
        self.results["machine"] = machine
        self.results["software"] = software
        self.results["settings"] = settings
        so = software.get("pg_tide_so", {})
        log(
            f"machine: {machine.get('nproc')} CPUs ({machine.get('cpu_model')}), {machine.get('memory_gib')} GiB; "
            f"PostgreSQL {software.get('postgresql_version')}; pg_tide {software.get('pg_tide')} "
            f"({so.get('build_guess', '?')} build, {so.get('bytes', 0) / 1e6:.0f} MB); commit {str(software.get('git_commit'))[:12]}"
        )
        if so.get("build_guess") == "debug":
            log("the installed pg_tide.so is a DEBUG build: its figures are not representative", "warn")
        self.save()

    def cleanup(self):
        log("cleaning up pipelines, subscriptions and publications")
        kill_children()
        for fn in (lambda: drop_all_pipelines(self.src), lambda: drop_all_native(self.src, self.tgt)):
            try:
                fn()
            except Exception as e:
                log(f"cleanup: {errtext(e)}", "warn")
        self.src.close()
        self.tgt.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # =================================================================================
    # B1 backfill throughput
    # =================================================================================
    def b1(self, b):
        src, tgt, P = self.src, self.tgt, self.P
        n = P["b1_rows"]
        ensure_source_table(src, "t", n)
        heap = heap_bytes(src, "public.t")
        total = heap_bytes(src, "public.t") + int(src.val("SELECT pg_indexes_size('public.t'::regclass)"))
        b["rows"] = n
        b["heap_bytes"] = heap
        b["heap_plus_index_bytes"] = total
        b["bytes_per_row"] = round(heap / n, 1)
        src.val("SELECT count(*) FROM public.t")  # warm the cache once for every method

        def rate(r, rows, secs):
            r["rows"] = rows
            r["seconds"] = round(secs, 3)
            r["rows_per_s"] = round(rows / secs, 1) if secs > 0 else None
            r["mb_per_s"] = round(heap / 1e6 / secs, 2) if secs > 0 else None
            log(
                f"  {r['label']}: {rows:,} rows in {secs:.2f} s = {r['rows_per_s']:,.0f} rows/s, {r['mb_per_s']:.1f} MB/s"
            )

        def verify(node, qualified):
            got = node.val(f"SELECT count(*) FROM {qualified}")
            if got != n:
                raise BenchError(f"target {qualified} has {got:,} rows, expected {n:,}")

        def settle():
            src.x("CHECKPOINT")
            tgt.x("CHECKPOINT")

        # (d) COPY pipe -----------------------------------------------------------------
        def copy_pipe():
            r = b["runs"][-1]
            create_rows_table(tgt, "public.t")
            settle()
            psql = f"{PG_BIN}/psql"
            cmd = (
                f"set -o pipefail; {psql} -X -q -h 127.0.0.1 -p {src.port} -U postgres -d postgres "
                f"-c 'COPY public.t TO STDOUT' | {psql} -X -q -h 127.0.0.1 -p {tgt.port} -U postgres -d postgres "
                f"-v ON_ERROR_STOP=1 -c 'COPY public.t FROM STDIN'"
            )
            series = []
            t0 = time.monotonic()
            p = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            _children.add(p)
            while p.poll() is None:
                try:
                    prev = series[-1][1] if series else 0
                    series.append((round(time.monotonic() - t0, 3), max(prev, copy_progress(tgt, "public.t"))))
                except Exception:
                    pass
                if time.monotonic() - t0 > P["b1_timeout"]:
                    p.kill()
                    raise BenchError(f"COPY pipe did not finish within {P['b1_timeout']} s")
                time.sleep(0.1)
            secs = time.monotonic() - t0
            _, err = p.communicate()
            _children.discard(p)
            if p.returncode != 0:
                raise BenchError(f"COPY pipe failed (exit {p.returncode}): {err.strip()[-500:]}")
            series.append((round(secs, 3), n))
            verify(tgt, "public.t")
            rate(r, n, secs)
            r["series"] = series
            tgt.x("DROP TABLE IF EXISTS public.t")

        self.run(b, "copy_pipe", copy_pipe, method="copy", label="COPY pipe (psql | psql)", target="bench_tgt")

        # (c) native logical replication initial sync -------------------------------------
        def native():
            r = b["runs"][-1]
            drop_all_native(src, tgt)
            create_rows_table(tgt, "public.t")
            src.x("CREATE PUBLICATION bench_b1_pub FOR TABLE public.t")
            settle()
            series = []
            t0 = time.monotonic()
            try:
                tgt.x(
                    "CREATE SUBSCRIPTION bench_b1_sub CONNECTION '"
                    + src.conninfo("bench_b1_sub")
                    + "' PUBLICATION bench_b1_pub WITH (copy_data = true)"
                )

                def sample(el):
                    # pg_stat_progress_copy shows the tablesync worker's COPY while it runs; then the row is gone
                    prev = series[-1][1] if series else 0
                    series.append((round(el, 3), max(prev, copy_progress(tgt, "public.t"))))

                t_end = wait_sub_ready(tgt, "bench_b1_sub", ["t"], P["b1_timeout"], sampler=sample)
                secs = t_end - t0
                series.append((round(secs, 3), n))
                verify(tgt, "public.t")
                rate(r, n, secs)
                r["series"] = series
            finally:
                drop_subscription(src, tgt, "bench_b1_sub")
                src.x("DROP PUBLICATION IF EXISTS bench_b1_pub")
                tgt.x("DROP TABLE IF EXISTS public.t")

        self.run(
            b,
            "native_initial_sync",
            native,
            method="native",
            label="logical replication initial sync",
            target="bench_tgt",
        )

        # (a)/(b) pg_tide ---------------------------------------------------------------------
        def tide(kind, chunk):
            r = b["runs"][-1]
            target = TideTarget(kind, "public" if kind == "remote" else "replica", src, tgt)
            name = f"b1_{kind}_{chunk}"
            drop_pipeline(src, name)
            target.ensure_schema()
            create_rows_table(target.node, target.q("t"))
            settle()
            t0 = time.monotonic()
            try:
                target.create(src, name)
                if chunk == DEFAULT_CHUNK:
                    src.x("SELECT tide.add_table(%s, 'public.t', backfill => true)", (name,))
                else:
                    src.x("SELECT tide.add_table(%s, 'public.t', backfill => false)", (name,))
                    src.x("SELECT tide.start_backfill('public.t', %s, chunk_size => %s::int)", (name, chunk))
                res = wait_backfill(src, name, "public.t", t0, P["b1_timeout"])
                secs = res["end_monotonic"] - t0
                verify(target.node, target.q("t"))
                rate(r, n, secs)
                r["series"] = res["series"]
                r["chunks_done"] = res["chunks_done"]
                r["max_slot_reread_bytes"] = res["max_slot_reread_bytes"]
                if res["started_at"] and res["finished_at"]:
                    r["backfill_seconds"] = round((res["finished_at"] - res["started_at"]).total_seconds(), 3)
                ch = src.one(
                    """SELECT avg(extract(epoch FROM duration))::float8, max(extract(epoch FROM duration))::float8,
                              (extract(epoch FROM max(emitted_at) - min(read_at)) / nullif(count(*) - 1, 0))::float8
                         FROM tide.chunks WHERE backfill_id = %s""",
                    (res["backfill_id"],),
                )
                if ch:
                    r["chunk_read_to_emit_avg_s"] = ch[0]
                    r["chunk_read_to_emit_max_s"] = ch[1]
                    r["chunk_interval_avg_s"] = ch[2]
            finally:
                drop_pipeline(src, name)
                try:
                    target.node.x(f"DROP TABLE IF EXISTS {target.q('t')}")
                except Exception as e:
                    log(f"could not drop {target.q('t')}: {errtext(e)}", "warn")

        for kind in ("local", "remote"):
            for chunk in P["b1_chunks"]:
                label = f"pg_tide → {kind} table, chunk {chunk}" + (" (default)" if chunk == DEFAULT_CHUNK else "")
                r = self.run(
                    b,
                    f"tide_{kind}_chunk{chunk}",
                    lambda k=kind, c=chunk: tide(k, c),
                    method=f"tide_{kind}",
                    label=label,
                    target="bench_tgt" if kind == "remote" else "bench_src (schema replica)",
                    chunk_size=chunk,
                )
                if kind == "remote" and chunk == P["b1_chunks"][0]:
                    self.remote_ok = r["ok"]
                    if not r["ok"]:
                        # Same cause for the other chunk sizes: record it once, do not wait again.
                        for c in P["b1_chunks"][1:]:
                            b["runs"].append(
                                {
                                    "name": f"tide_remote_chunk{c}",
                                    "ok": False,
                                    "error": f"skipped: the remote target failed at chunk {chunk} ({r['error']})",
                                    "method": "tide_remote",
                                    "label": f"pg_tide → remote table, chunk {c}",
                                    "chunk_size": c,
                                }
                            )
                        break

        # ratios
        by = {r["name"]: r for r in b["runs"]}
        native_rate = by.get("native_initial_sync", {}).get("rows_per_s") if by.get("native_initial_sync", {}).get("ok") else None
        copy_rate = by.get("copy_pipe", {}).get("rows_per_s") if by.get("copy_pipe", {}).get("ok") else None
        for r in b["runs"]:
            if r.get("ok") and r["method"].startswith("tide"):
                r["ratio_vs_native"] = round(r["rows_per_s"] / native_rate, 3) if native_rate else None
                r["ratio_vs_copy"] = round(r["rows_per_s"] / copy_rate, 3) if copy_rate else None

    # =================================================================================
    # B2 streaming
    # =================================================================================
    EV_SRC = """CREATE TABLE public.ev (
        id bigserial PRIMARY KEY,
        committed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        aid integer NOT NULL,
        delta integer NOT NULL,
        note text)"""
    EV_TGT = """CREATE TABLE {q} (
        id bigint PRIMARY KEY,
        committed_at timestamptz NOT NULL,
        aid integer NOT NULL,
        delta integer NOT NULL,
        note text,
        applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"""

    def b2(self, b):
        src, tgt, P = self.src, self.tgt, self.P
        if not src.val("SELECT to_regclass('public.ev') IS NOT NULL"):
            src.x(self.EV_SRC)
        script = self.tmp / "ev.sql"
        script.write_text(
            "\\set aid random(1, 100000)\n"
            "\\set delta random(-5000, 5000)\n"
            "INSERT INTO public.ev (aid, delta, note) VALUES (:aid, :delta, 'event ' || md5(:aid::text));\n"
        )
        os.chmod(script, 0o644)
        dur, warm = P["b2_duration"], P["b2_warmup"]
        has_t = src.val("SELECT to_regclass('public.t') IS NOT NULL")
        if not has_t:
            ensure_source_table(src, "t", P["b1_rows"])
        b["workload"] = (
            f"pgbench -n -c {PGBENCH_CLIENTS} -j {PGBENCH_THREADS} -T {dur} [-R rate] -f ev.sql: one INSERT of a "
            f"~100-byte row per transaction; committed_at = clock_timestamp() at the INSERT"
        )
        b["latency_definition"] = (
            "latency of a row = the moment it became visible at the target minus its committed_at. pg_tide: "
            "pg_xact_commit_timestamp(xmin) of the target row (track_commit_timestamp = on). Logical replication: the "
            "target-only column applied_at DEFAULT clock_timestamp(), because its apply worker stamps the origin's "
            "commit time on the replicated transaction (so the target's commit timestamp equals the source's); it "
            "commits right after applying each source transaction. Columns 'applied' give applied_at for every method. "
            f"Rows committed in the first {warm} s are excluded (warm-up)."
        )

        def probe(target_node, q):
            """Insert one row and wait until the target has it: the path is live."""
            pid = src.val("INSERT INTO public.ev (aid, delta, note) VALUES (0, 0, 'probe') RETURNING id")
            deadline = time.monotonic() + 120
            while not target_node.val(f"SELECT EXISTS (SELECT 1 FROM {q} WHERE id = %s)", (pid,)):
                if time.monotonic() > deadline:
                    raise BenchError("the probe row did not reach the target within 120 s")
                time.sleep(0.05)
            return pid

        VISIBLE = {
            # pg_tide's targets keep their own commit timestamps
            "commit_ts": "coalesce(pg_xact_commit_timestamp(xmin), applied_at)",
            # logical replication records the origin's commit time: use the apply-time column
            "applied_at": "applied_at",
        }

        def latency(target_node, q, floor_id, lo, hi, basis):
            r = target_node.one(
                f"""WITH l AS (
                      SELECT (extract(epoch FROM ({VISIBLE[basis]} - committed_at)) * 1000)::float8 AS vis,
                             (extract(epoch FROM (applied_at - committed_at)) * 1000)::float8 AS app
                        FROM {q} WHERE id > %(floor)s AND committed_at >= %(lo)s AND committed_at < %(hi)s)
                    SELECT count(*),
                           percentile_cont(ARRAY[0.5, 0.9, 0.99, 0.999]) WITHIN GROUP (ORDER BY vis), max(vis), avg(vis),
                           percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY app), max(app)
                      FROM l""",
                {"floor": floor_id, "lo": lo, "hi": hi},
            )
            out = {"rows": r[0], "basis": basis}
            if basis == "applied_at" and r[0]:
                # Sanity check of the basis: the target's commit timestamp is the origin's commit
                # time here, so applied_at - it is the source-commit-to-apply delay (>= 0).
                c = target_node.one(
                    f"""SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d), min(d) FROM (
                          SELECT (extract(epoch FROM (applied_at - pg_xact_commit_timestamp(xmin))) * 1000)::float8 AS d
                            FROM {q} WHERE id > %(floor)s AND committed_at >= %(lo)s AND committed_at < %(hi)s) x""",
                    {"floor": floor_id, "lo": lo, "hi": hi},
                )
                if c:
                    out["origin_commit_to_apply_p50_ms"], out["origin_commit_to_apply_min_ms"] = c
            if r[0]:
                out.update(
                    p50_ms=r[1][0], p90_ms=r[1][1], p99_ms=r[1][2], p999_ms=r[1][3], max_ms=r[2], avg_ms=r[3],
                    applied_p50_ms=r[4][0], applied_p99_ms=r[4][1], applied_max_ms=r[5],
                )
            return out

        def per_second(target_node, q, floor_id, t_start, basis):
            rows = target_node.all(
                f"""WITH l AS (SELECT committed_at,
                          (extract(epoch FROM ({VISIBLE[basis]} - committed_at)) * 1000)::float8 AS lat
                     FROM {q} WHERE id > %(floor)s)
                    SELECT floor(extract(epoch FROM (committed_at - %(t0)s)))::int AS s, count(*),
                           percentile_cont(0.5) WITHIN GROUP (ORDER BY lat), percentile_cont(0.99) WITHIN GROUP (ORDER BY lat), max(lat)
                      FROM l GROUP BY 1 ORDER BY 1""",
                {"floor": floor_id, "t0": t_start},
            )
            return [list(r) for r in rows]

        def throughput(target_node, q, floor_id, basis):
            """Rows over the span from the first source commit to the last row visible at the target."""
            r = target_node.one(
                f"""SELECT count(*), min(committed_at), max({VISIBLE[basis]}), max(committed_at)
                      FROM {q} WHERE id > %s""",
                (floor_id,),
            )
            if not r or not r[0]:
                return {}
            span = (r[2] - r[1]).total_seconds()
            src_span = (r[3] - r[1]).total_seconds()
            return {
                "target_rows": r[0],
                "apply_rows_per_s": round(r[0] / span, 1) if span > 0 else None,
                "source_rows_per_s": round(r[0] / src_span, 1) if src_span > 0 else None,
            }

        def drain(target_node, q, floor_id, timeout):
            n_src = src.val("SELECT count(*) FROM public.ev WHERE id > %s", (floor_id,))
            t0 = time.monotonic()
            while True:
                got = target_node.val(f"SELECT count(*) FROM {q} WHERE id > %s", (floor_id,))
                if got >= n_src:
                    return n_src, time.monotonic() - t0
                if time.monotonic() - t0 > timeout:
                    raise BenchError(f"target has {got:,} of {n_src:,} rows {timeout} s after the workload ended")
                time.sleep(0.2)

        def workload(rate, on_running=None):
            args = ["-n", "-c", str(PGBENCH_CLIENTS), "-j", str(PGBENCH_THREADS), "-T", str(dur), "-f", str(script)]
            if rate:
                args += ["-R", str(rate)]
            t_start = src.val("SELECT clock_timestamp()")
            p = pgbench_start(src, args)
            if on_running:
                try:
                    on_running(p)
                except BaseException:
                    p.terminate()
                    p.communicate()
                    _children.discard(p)
                    raise
            res = pgbench_finish(p, dur + 120)
            t_end = src.val("SELECT clock_timestamp()")
            return res, t_start, t_end

        def measure(r, target_node, q, floor_id, pg, t_start, t_end, drain_s, n_src, basis, extra_windows=None):
            r["pgbench"] = pg
            r["source_tps"] = pg.get("tps")
            r["rows"] = n_src
            r["drain_seconds"] = round(drain_s, 2)
            lo = t_start + dt.timedelta(seconds=warm)
            r["latency"] = latency(target_node, q, floor_id, lo, t_end, basis)
            r.update(throughput(target_node, q, floor_id, basis))
            r["per_second"] = per_second(target_node, q, floor_id, t_start, basis)
            for wname, (wlo, whi) in (extra_windows or {}).items():
                r[f"latency_{wname}"] = latency(target_node, q, floor_id, wlo, whi, basis)
            L = r["latency"]
            if L.get("rows"):
                log(
                    f"  {r['label']}: source {r['source_tps']:,.0f} tx/s, applied {r.get('apply_rows_per_s') or 0:,.0f} rows/s; "
                    f"latency p50 {L['p50_ms']:.1f} ms, p99 {L['p99_ms']:.1f} ms, max {L['max_ms']:.1f} ms; drain {drain_s:.1f} s"
                )

        # pg_tide ------------------------------------------------------------------------------
        def tide(kind, rate, with_backfill=False):
            r = b["runs"][-1]
            target = TideTarget(kind, "public" if kind == "remote" else "replica", src, tgt)
            name = f"b2_{kind}_{rate or 'max'}" + ("_bf" if with_backfill else "")
            drop_pipeline(src, name)
            target.ensure_schema()
            q = target.q("ev")
            target.node.x(f"DROP TABLE IF EXISTS {q}")
            target.node.x(self.EV_TGT.format(q=q))
            if with_backfill:
                create_rows_table(target.node, target.q("t"))
            try:
                target.create(src, name)
                src.x("SELECT tide.add_table(%s, 'public.ev', backfill => false)", (name,))
                if with_backfill:
                    src.x("SELECT tide.add_table(%s, 'public.t', backfill => false)", (name,))
                wait_capturing(src, name, "public.ev")
                floor_id = probe(target.node, q)
                bf = {}

                def start_bf(p):
                    # the backfill starts once the workload has warmed up, and is followed while it runs
                    time.sleep(warm)
                    bf["t0"] = src.val("SELECT clock_timestamp()")
                    src.x("SELECT tide.start_backfill('public.t', %s)", (name,))
                    while p.poll() is None:
                        st = src.one(
                            "SELECT state, rows_emitted, finished_at, error, remedy FROM tide.backfills WHERE pipeline = %s AND source = 'public.t'::regclass ORDER BY id DESC LIMIT 1",
                            (name,),
                        )
                        if st and st[0] == "done":
                            bf["t1"] = st[2]
                            break
                        if st and st[0] in ("failed", "cancelled"):
                            raise BenchError(f"backfill {st[0]} during the workload: {st[3]} (remedy: {st[4]})")
                        time.sleep(0.25)

                with SlotWatcher(src, name) as sw:
                    pg, t_start, t_end = workload(rate, start_bf if with_backfill else None)
                    n_src, drain_s = drain(target.node, q, floor_id, P["b2_drain_timeout"])
                sw.record(r)
                windows = {}
                if with_backfill:
                    if "t0" not in bf:
                        raise BenchError("the backfill was not started during the workload")
                    st = src.one(
                        """SELECT state, rows_emitted, chunks_done, started_at, finished_at, chunk_size
                             FROM tide.backfills WHERE pipeline = %s AND source = 'public.t'::regclass ORDER BY id DESC LIMIT 1""",
                        (name,),
                    )
                    if st:
                        r["backfill_state_after_drain"] = st[0]
                        r["backfill_rows_emitted_after_drain"] = st[1]
                        r["backfill_chunk_size"] = st[5]
                        if st[3]:
                            end = st[4] or src.val("SELECT clock_timestamp()")
                            secs = (end - st[3]).total_seconds()
                            r["backfill_rows_per_s"] = round(st[1] / secs, 1) if secs > 0 else None
                    hi = min(bf.get("t1") or t_end, t_end)
                    windows["during_backfill"] = (bf["t0"], hi)
                    r["backfill_window_s"] = round((hi - bf["t0"]).total_seconds(), 2)
                    r["backfill_started_offset_s"] = round((bf["t0"] - t_start).total_seconds(), 2)
                    r["backfill_finished_during_workload"] = "t1" in bf
                measure(r, target.node, q, floor_id, pg, t_start, t_end, drain_s, n_src, "commit_ts", windows)
                if with_backfill and r.get("latency_during_backfill", {}).get("rows"):
                    L = r["latency_during_backfill"]
                    log(
                        f"    while the backfill ran ({r['backfill_window_s']:.1f} s): p50 {L['p50_ms']:.1f} ms, "
                        f"p99 {L['p99_ms']:.1f} ms, max {L['max_ms']:.1f} ms; the backfill ran at "
                        f"{r.get('backfill_rows_per_s') or 0:,.0f} rows/s"
                    )
            finally:
                drop_pipeline(src, name)
                if with_backfill:
                    try:
                        target.node.x(f"DROP TABLE IF EXISTS {target.q('t')}")
                    except Exception as e:
                        log(f"could not drop {target.q('t')}: {errtext(e)}", "warn")

        # native -------------------------------------------------------------------------------
        def native(rate):
            r = b["runs"][-1]
            drop_all_native(src, tgt)
            q = "public.ev"
            tgt.x(f"DROP TABLE IF EXISTS {q}")
            tgt.x(self.EV_TGT.format(q=q))
            src.x("CREATE PUBLICATION bench_b2_pub FOR TABLE public.ev")
            try:
                tgt.x(
                    "CREATE SUBSCRIPTION bench_b2_sub CONNECTION '"
                    + src.conninfo("bench_b2_sub")
                    + "' PUBLICATION bench_b2_pub WITH (copy_data = false)"
                )
                wait_sub_ready(tgt, "bench_b2_sub", ["ev"], 60)
                floor_id = probe(tgt, q)
                pg, t_start, t_end = workload(rate)
                n_src, drain_s = drain(tgt, q, floor_id, P["b2_drain_timeout"])
                measure(r, tgt, q, floor_id, pg, t_start, t_end, drain_s, n_src, "applied_at")
            finally:
                drop_subscription(src, tgt, "bench_b2_sub")
                src.x("DROP PUBLICATION IF EXISTS bench_b2_pub")

        def rl(rate):
            return f"{rate} tx/s" if rate else "full speed"

        for rate in P["b2_rates"]:
            self.run(
                b,
                f"tide_remote_{rate or 'max'}",
                lambda rt=rate: tide("remote", rt),
                method="tide_remote",
                label=f"pg_tide → remote, {rl(rate)}",
                rate=rate,
            )
            self.run(
                b,
                f"native_{rate or 'max'}",
                lambda rt=rate: native(rt),
                method="native",
                label=f"logical replication, {rl(rate)}",
                rate=rate,
            )
        rate = P["b2_backfill_rate"]
        self.run(
            b,
            f"tide_remote_{rate}_backfill",
            lambda: tide("remote", rate, True),
            method="tide_remote",
            label=f"pg_tide → remote, {rl(rate)}, while backfilling t",
            rate=rate,
            with_backfill=True,
        )
        # Reference points with the local table target (also covers a remote target that fails).
        self.run(
            b,
            "tide_local_2000",
            lambda: tide("local", 2000),
            method="tide_local",
            label=f"pg_tide → local, {rl(2000)}",
            rate=2000,
        )
        self.run(
            b,
            f"tide_local_{rate}_backfill",
            lambda: tide("local", rate, True),
            method="tide_local",
            label=f"pg_tide → local, {rl(rate)}, while backfilling t",
            rate=rate,
            with_backfill=True,
        )

    # =================================================================================
    # B3 source overhead
    # =================================================================================
    PGB_TABLES = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"]

    def b3(self, b):
        src, tgt, P = self.src, self.tgt, self.P
        scale, dur = P["b3_scale"], P["b3_duration"]
        log(f"pgbench -i -s {scale} on the source")
        sh(pgbench_cmd(src, ["-i", "-q", "-s", str(scale)]), timeout=600, env=src.env())
        src.x("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")
        src.x("VACUUM ANALYZE")
        big_rows = P["b4_sizes"][-1]
        ensure_source_table(src, "big", big_rows)
        b["workload"] = f"pgbench -n -c {PGBENCH_CLIENTS} -j {PGBENCH_THREADS} -T {dur} (TPC-B-like), scale {scale}"

        def tps_run(r, extra_during=None):
            src.x("VACUUM ANALYZE pgbench_branches, pgbench_tellers")
            src.x("CHECKPOINT")
            tgt.x("CHECKPOINT")
            p = pgbench_start(src, ["-n", "-c", str(PGBENCH_CLIENTS), "-j", str(PGBENCH_THREADS), "-T", str(dur)])
            if extra_during:
                try:
                    extra_during(p)
                except BaseException:
                    p.terminate()
                    p.communicate()
                    _children.discard(p)
                    raise
            res = pgbench_finish(p, dur + 120)
            r["pgbench"] = res
            r["tps"] = res["tps"]
            r["lsn_after"] = src.val("SELECT pg_current_wal_lsn()::text")
            log(f"  {r['label']}: {res['tps']:,.0f} TPS (latency avg {res.get('latency_avg_ms', 0):.2f} ms)")
            return res

        def baseline():
            tps_run(b["runs"][-1])

        self.run(b, "baseline", baseline, label="nothing (baseline)", config="baseline")

        def native():
            r = b["runs"][-1]
            drop_all_native(src, tgt)
            sh(pgbench_cmd(tgt, ["-i", "-q", "-I", "dtp", "-s", str(scale)]), timeout=300, env=tgt.env())
            tgt.x("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")
            src.x("CREATE PUBLICATION bench_b3_pub FOR TABLE " + ", ".join(self.PGB_TABLES))
            try:
                t0 = time.monotonic()
                tgt.x(
                    "CREATE SUBSCRIPTION bench_b3_sub CONNECTION '"
                    + src.conninfo("bench_b3_sub")
                    + "' PUBLICATION bench_b3_pub WITH (copy_data = true)"
                )
                wait_sub_ready(tgt, "bench_b3_sub", self.PGB_TABLES, P["b3_backfill_timeout"])
                r["initial_sync_seconds"] = round(time.monotonic() - t0, 2)
                tps_run(r)
                t0 = time.monotonic()
                while True:
                    ok = src.val(
                        "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = 'bench_b3_sub'",
                        (r["lsn_after"],),
                    )
                    if ok:
                        break
                    if time.monotonic() - t0 > 300:
                        raise BenchError("the subscriber did not catch up within 300 s after the run")
                    time.sleep(0.2)
                r["catch_up_after_run_s"] = round(time.monotonic() - t0, 2)
            finally:
                drop_subscription(src, tgt, "bench_b3_sub")
                src.x("DROP PUBLICATION IF EXISTS bench_b3_pub")
                try:
                    tgt.x("DROP TABLE IF EXISTS " + ", ".join(self.PGB_TABLES))
                except Exception as e:
                    log(f"could not drop the subscriber's pgbench tables: {errtext(e)}", "warn")

        self.run(b, "native", native, label="logical replication (pub/sub)", config="native")

        def tide_setup(kind, name, schema):
            target = TideTarget(kind, schema, src, tgt)
            drop_pipeline(src, name)
            target.node.x(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            t0 = time.monotonic()
            target.create(src, name)
            for t in self.PGB_TABLES:
                src.x("SELECT tide.add_table(%s, %s::regclass, backfill => true)", (name, f"public.{t}"))
            for t in self.PGB_TABLES:
                wait_backfill(src, name, f"public.{t}", t0, P["b3_backfill_timeout"])
            return target, round(time.monotonic() - t0, 2)

        def tide_catch_up(r, name):
            t0 = time.monotonic()
            ok = src.val("SELECT tide.wait_for_pipeline(%s, '5 minutes')", (name,))
            if not ok:
                h = pipeline_health(src, name)
                raise BenchError(f"pipeline {name} did not catch up within 5 min: {h.get('last_error') or h.get('state')}")
            r["catch_up_after_run_s"] = round(time.monotonic() - t0, 2)

        def tide_teardown(target, name, schema):
            drop_pipeline(src, name)
            try:
                target.node.x(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            except Exception as e:
                log(f"could not drop schema {schema}: {errtext(e)}", "warn")

        remote_state = {}

        def tide_remote():
            r = b["runs"][-1]
            name, schema = "b3_remote", "tide_b3"
            try:
                target, secs = tide_setup("remote", name, schema)
            except Exception:
                tide_teardown(TideTarget("remote", schema, src, tgt), name, schema)
                raise
            remote_state["target"] = target
            r["initial_backfill_seconds"] = secs
            try:
                with SlotWatcher(src, name) as sw:
                    tps_run(r)
                    tide_catch_up(r, name)
                sw.record(r)
            except Exception:
                tide_teardown(target, name, schema)
                remote_state.clear()
                raise

        def tide_remote_backfill():
            r = b["runs"][-1]
            name, schema = "b3_remote", "tide_b3"
            if "target" not in remote_state:
                raise BenchError("skipped: the pg_tide remote streaming run failed")
            target = remote_state["target"]
            try:
                state = {}

                def during(p):
                    src.x("SELECT tide.add_table(%s, 'public.big', backfill => true)", (name,))
                    state["t0"] = time.monotonic()

                with SlotWatcher(src, name) as sw:
                    tps_run(r, during)
                sw.record(r)
                st = src.one(
                    "SELECT state, rows_emitted, started_at, finished_at FROM tide.backfills WHERE pipeline = %s AND source = 'public.big'::regclass ORDER BY id DESC LIMIT 1",
                    (name,),
                )
                if st:
                    r["backfill_state_at_end"] = st[0]
                    r["backfill_rows_emitted_during_run"] = st[1]
                    r["backfill_rows_per_s_during_run"] = round(st[1] / dur, 1)
                    r["backfill_active_whole_run"] = st[0] != "done"
                    log(
                        f"    backfill of public.big: {st[1]:,} rows emitted during the run, state at its end: {st[0]}"
                    )
                if st and st[0] in ("queued", "running"):
                    src.x("SELECT tide.cancel_backfill('public.big', %s)", (name,))
                tide_catch_up(r, name)
            finally:
                tide_teardown(target, name, schema)

        def tide_local():
            r = b["runs"][-1]
            name, schema = "b3_local", "replica_b3"
            target = TideTarget("local", schema, src, tgt)
            try:
                target, secs = tide_setup("local", name, schema)
                r["initial_backfill_seconds"] = secs
                with SlotWatcher(src, name) as sw:
                    tps_run(r)
                    tide_catch_up(r, name)
                sw.record(r)
            finally:
                tide_teardown(target, name, schema)

        self.run(b, "tide_remote", tide_remote, label="pg_tide streaming → remote", config="tide_remote")
        self.run(
            b,
            "tide_remote_backfill",
            tide_remote_backfill,
            label="pg_tide streaming → remote + backfilling big",
            config="tide_remote_backfill",
        )
        self.run(b, "tide_local", tide_local, label="pg_tide streaming → local table", config="tide_local")
        self.run(b, "baseline_end", baseline, label="nothing (baseline, again at the end)", config="baseline")

        base = [r["tps"] for r in b["runs"] if r.get("config") == "baseline" and r.get("ok")]
        if base:
            mean = statistics.mean(base)
            b["baseline_tps"] = round(mean, 1)
            b["baseline_spread_pct"] = round(100 * (max(base) - min(base)) / mean, 1) if len(base) > 1 else None
            for r in b["runs"]:
                if r.get("ok"):
                    r["pct_of_baseline"] = round(100 * r["tps"] / mean, 1)

    # =================================================================================
    # B4 bounds
    # =================================================================================
    def b4(self, b):
        src, tgt, P = self.src, self.tgt, self.P
        small, large = P["b4_sizes"]
        ensure_source_table(src, "t", small)
        ensure_source_table(src, "big", large)
        b1_runs = self.results["benchmarks"].get("B1", {}).get("runs", [])
        local_ok = any(r.get("ok") for r in b1_runs if r.get("method") == "tide_local")
        kind = "local" if (self.remote_ok is False and local_ok) else "remote"
        if kind == "local":
            log("the remote target failed in B1 and the local one worked: B4 uses the local table target")
        b["target"] = kind
        ticker = self.tmp / "ticker.sql"
        ticker.write_text("SELECT pg_current_xact_id();\n")
        os.chmod(ticker, 0o644)
        b["method"] = (
            "worker pid from tide.pipelines.worker_pid; every 200 ms: /proc/<pid>/status (VmRSS, RssAnon, RssShmem) and "
            "pg_stat_activity (age(backend_xmin), clock_timestamp() - xact_start). A fresh pipeline (fresh worker) per "
            "size; a background pgbench burns 100 xids/s so that xmin ages measure how long a snapshot is held."
        )

        def sample_loop(name, stop, samples, t0):
            conn = src.connect("pg_tide_bench_sampler")
            try:
                while not stop.is_set():
                    s = {"t": round(time.monotonic() - t0, 3)}
                    try:
                        pid = conn.execute("SELECT worker_pid FROM tide.pipelines WHERE name = %s", (name,)).fetchone()
                        pid = pid[0] if pid else None
                        s["pid"] = pid
                        if pid:
                            try:
                                with open(f"/proc/{pid}/status") as f:
                                    for line in f:
                                        k, _, v = line.partition(":")
                                        if k in ("VmRSS", "RssAnon", "RssShmem", "RssFile", "VmHWM"):
                                            s[k] = int(v.split()[0]) * 1024
                            except FileNotFoundError:
                                s["gone"] = True
                            a = conn.execute(
                                """SELECT age(backend_xmin), extract(epoch FROM clock_timestamp() - xact_start)::float8
                                     FROM pg_stat_activity WHERE pid = %s""",
                                (pid,),
                            ).fetchone()
                            if a:
                                s["xmin_age"], s["xact_age_s"] = a
                        sl = conn.execute(
                            "SELECT age(xmin), age(catalog_xmin) FROM pg_replication_slots WHERE slot_name = %s",
                            ("tide_" + name,),
                        ).fetchone()
                        if sl:
                            s["slot_xmin_age"], s["slot_catalog_xmin_age"] = sl
                    except Exception as e:
                        s["error"] = errtext(e)
                    samples.append(s)
                    stop.wait(0.2)
            finally:
                conn.close()

        def one(table, rows):
            r = b["runs"][-1]
            target = TideTarget(kind, "public" if kind == "remote" else "replica", src, tgt)
            name = f"b4_{table}"
            drop_pipeline(src, name)
            target.ensure_schema()
            create_rows_table(target.node, target.q(table))
            r["heap_bytes"] = heap_bytes(src, f"public.{table}")
            samples, stop = [], threading.Event()
            th = None
            tick = None
            try:
                target.create(src, name)
                src.x("SELECT tide.add_table(%s, %s::regclass, backfill => false)", (name, f"public.{table}"))
                wait_capturing(src, name, f"public.{table}")
                t0 = time.monotonic()
                th = threading.Thread(target=sample_loop, args=(name, stop, samples, t0), daemon=True)
                th.start()
                time.sleep(1.0)  # idle baseline
                tick = pgbench_start(src, ["-n", "-c", "1", "-R", "100", "-T", str(P["b4_timeout"] + 60), "-f", str(ticker)])
                tb = time.monotonic()
                src.x("SELECT tide.start_backfill(%s::regclass, %s)", (f"public.{table}", name))
                res = wait_backfill(src, name, f"public.{table}", tb, P["b4_timeout"], poll=0.5)
                r["backfill_seconds"] = round(res["end_monotonic"] - tb, 2)
                r["rows_per_s"] = round(rows / r["backfill_seconds"], 1)
                r["chunks_done"] = res["chunks_done"]
                r["max_slot_reread_bytes"] = res["max_slot_reread_bytes"]
                ch = src.one(
                    "SELECT max(extract(epoch FROM duration))::float8, avg(extract(epoch FROM duration))::float8 FROM tide.chunks WHERE backfill_id = %s",
                    (res["backfill_id"],),
                )
                if ch:
                    r["chunk_read_to_emit_max_s"], r["chunk_read_to_emit_avg_s"] = ch
                time.sleep(0.5)
            finally:
                stop.set()
                if th:
                    th.join(5)
                if tick and tick.poll() is None:
                    tick.terminate()
                    try:
                        tick.wait(5)
                    except Exception:
                        tick.kill()
                if tick:
                    _children.discard(tick)
                drop_pipeline(src, name)
                try:
                    target.node.x(f"DROP TABLE IF EXISTS {target.q(table)}")
                except Exception as e:
                    log(f"could not drop {target.q(table)}: {errtext(e)}", "warn")
                r["samples"] = samples
            good = [s for s in samples if s.get("VmRSS")]
            if not good:
                raise BenchError("no RSS sample of the worker was taken")

            def mx(k):
                v = [s[k] for s in samples if s.get(k) is not None]
                return max(v) if v else None

            idle = [s for s in good if s["t"] < 1.0]
            r["rows"] = rows
            r["samples_n"] = len(samples)
            r["worker_pids"] = sorted({s["pid"] for s in samples if s.get("pid")})
            r["rss_idle_bytes"] = idle[-1]["VmRSS"] if idle else None
            r["peak_rss_bytes"] = mx("VmRSS")
            r["peak_rss_anon_bytes"] = mx("RssAnon")
            r["peak_rss_shmem_bytes"] = mx("RssShmem")
            r["vm_hwm_bytes"] = mx("VmHWM")
            r["max_xmin_age"] = mx("xmin_age")
            r["max_xact_age_s"] = mx("xact_age_s")
            r["max_slot_catalog_xmin_age"] = mx("slot_catalog_xmin_age")
            r["samples_in_xact"] = sum(1 for s in samples if s.get("xact_age_s") is not None)
            log(
                f"  {rows:,} rows: {r['backfill_seconds']:.1f} s; worker peak RSS {r['peak_rss_bytes'] / 2**20:.1f} MiB "
                f"(anon {(r['peak_rss_anon_bytes'] or 0) / 2**20:.1f} MiB); max xmin age {r['max_xmin_age']}, "
                f"max xact age {r['max_xact_age_s'] or 0:.2f} s ({len(samples)} samples)"
            )

        for table, rows in (("t", small), ("big", large)):
            self.run(b, f"backfill_{rows}", lambda tb=table, n=rows: one(tb, n), label=f"{rows:,} rows", table=table)

        ok = [r for r in b["runs"] if r.get("ok")]
        if len(ok) == 2:
            s, l = ok
            summ = {"size_ratio": round(l["rows"] / s["rows"], 2)}
            for k in ("peak_rss_bytes", "peak_rss_anon_bytes", "max_xmin_age", "max_xact_age_s"):
                if s.get(k) and l.get(k) is not None:
                    summ[k + "_ratio"] = round(l[k] / s[k], 2)
            # Flat: the large table's peaks stay within 1.5x of the small one's (the size grew 5x).
            summ["rss_flat"] = summ.get("peak_rss_anon_bytes_ratio", summ.get("peak_rss_bytes_ratio", 99)) <= 1.5
            summ["snapshot_flat"] = summ.get("max_xact_age_s_ratio", 99) <= 1.5 if "max_xact_age_s_ratio" in summ else None
            b["summary"] = summ
            log(f"  ratios {large:,}/{small:,}: {summ}")


# ---------------------------------------------------------------------------------------
# Report: RESULTS.md and plots
# ---------------------------------------------------------------------------------------
def fmt(v, spec=",.0f", none="–"):
    if v is None:
        return none
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def md_escape(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def mb(v):
    return fmt(v / 1e6 if v is not None else None, ".1f")


def status(r):
    if r.get("ok"):
        return "ok"
    e = r.get("error") or "failed"
    return "FAILED: " + md_escape(e[:300])


def write_report(res):
    out = []
    m, sw, st = res.get("machine", {}), res.get("software", {}), res.get("settings", {})
    so = sw.get("pg_tide_so", {})
    out.append("# pg_tide benchmark results\n")
    out.append(
        f"Mode **{res.get('mode')}**, run {res.get('started_at', '')[:19]} UTC, took {fmt(res.get('duration_s'), '.0f')} s. "
        f"Generated by `bench/run.sh`{' --quick' if res.get('mode') == 'quick' else ''}; raw data in `results.json`.\n"
    )
    out.append("| machine | |\n|---|---|")
    out.append(f"| CPUs (nproc) | {m.get('nproc')} — {m.get('cpu_model')} |")
    out.append(f"| memory | {m.get('memory_gib')} GiB |")
    out.append(f"| kernel | {m.get('kernel')} |")
    out.append(f"| PostgreSQL | {sw.get('postgresql_version')} |")
    out.append(
        f"| pg_tide | {sw.get('pg_tide')} ({so.get('build_guess', '?')} build, pg_tide.so {fmt((so.get('bytes') or 0) / 1e6, '.1f')} MB, sha256 {so.get('sha256')}) |"
    )
    out.append(f"| git commit | {sw.get('git_commit')}{' (working tree modified)' if sw.get('git_dirty') else ''} |")
    out.append(
        "| settings | "
        + ", ".join(f"{k} = {v}" for k, v in st.items())
        + " (both clusters; scratch clusters run with fsync = off) |"
    )
    if so.get("build_guess") == "debug":
        out.append("\n> **The installed pg_tide.so was a debug build: pg_tide's figures below are not representative.**\n")
    out.append(
        "\nBoth clusters run on the same host and share its CPUs: every figure includes the "
        "competition between source, target and the replication machinery.\n"
    )
    B = res.get("benchmarks", {})

    def header(key):
        b = B.get(key)
        if b is None:
            out.append(f"\n## {key}\n\nNot run.\n")
            return None
        out.append(f"\n## {key} — {b.get('title')}\n")
        if b.get("error"):
            out.append(f"**Benchmark error:** {md_escape(b['error'])}\n")
        return b

    # B1
    b = header("B1")
    if b:
        out.append(
            f"{fmt(b.get('rows'))} rows of ~{fmt(b.get('bytes_per_row'), '.0f')} bytes (source heap "
            f"{fmt((b.get('heap_bytes') or 0) / 1e6, '.0f')} MB); every target has the same primary key and extra index. "
            "Time = from the first command (CREATE SUBSCRIPTION / create_pipeline / the COPY pipe) until the target "
            "holds every row (subscription state `r`; `tide.wait_for_backfill` true). MB/s = source heap size / time.\n"
        )
        out.append("| method | chunk | rows | seconds | rows/s | MB/s | vs native | vs COPY | status |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in b["runs"]:
            out.append(
                f"| {md_escape(r.get('label'))} | {fmt(r.get('chunk_size'))} | {fmt(r.get('rows'))} | {fmt(r.get('seconds'), '.2f')} | "
                f"{fmt(r.get('rows_per_s'))} | {fmt(r.get('mb_per_s'), '.1f')} | {fmt(r.get('ratio_vs_native'), '.2f')} | "
                f"{fmt(r.get('ratio_vs_copy'), '.2f')} | {status(r)} |"
            )
        tide_runs = [r for r in b["runs"] if r.get("ok") and r.get("chunk_read_to_emit_avg_s") is not None]
        if tide_runs:
            out.append("\npg_tide chunk timing (from `tide.chunks`):\n")
            out.append("| run | chunks | read→emitted avg s | max s | chunk interval avg s | max restart gap MB |")
            out.append("|---|---:|---:|---:|---:|---:|")
            for r in tide_runs:
                rr = r.get("max_slot_reread_bytes")
                out.append(
                    f"| {md_escape(r['label'])} | {fmt(r.get('chunks_done'))} | {fmt(r.get('chunk_read_to_emit_avg_s'), '.3f')} | "
                    f"{fmt(r.get('chunk_read_to_emit_max_s'), '.3f')} | {fmt(r.get('chunk_interval_avg_s'), '.3f')} | "
                    f"{fmt(rr / 1e6 if rr is not None else None, '.1f')} |"
                )
            out.append(
                "\n*max restart gap* = largest distance seen between the pg_tide slot's `restart_lsn` and its "
                "`confirmed_flush_lsn`: WAL retained behind the stream, which a restarted worker decodes again "
                "(the running worker keeps one decoding session and reads each record once)."
            )
        out.append("\n![backfill throughput](b1_backfill_throughput.png)\n")

    # B2
    b = header("B2")
    if b:
        out.append(f"Workload: {b.get('workload')}. Latency: {b.get('latency_definition')}\n")
        out.append(
            "| method | source tx/s | applied rows/s | p50 ms | p90 ms | p99 ms | max ms | applied p50 / p99 ms | drain s | max restart gap MB | status |"
        )
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in b["runs"]:
            L = r.get("latency") or {}
            out.append(
                f"| {md_escape(r.get('label'))} | {fmt(r.get('source_tps'))} | {fmt(r.get('apply_rows_per_s'))} | {fmt(L.get('p50_ms'), '.1f')} | "
                f"{fmt(L.get('p90_ms'), '.1f')} | {fmt(L.get('p99_ms'), '.1f')} | {fmt(L.get('max_ms'), '.1f')} | "
                f"{fmt(L.get('applied_p50_ms'), '.1f')} / {fmt(L.get('applied_p99_ms'), '.1f')} | "
                f"{fmt(r.get('drain_seconds'), '.1f')} | {mb(r.get('max_slot_reread_bytes'))} | {status(r)} |"
            )
        out.append(
            "\n*applied rows/s* = target rows / (last row visible at the target − first row committed at the source); "
            "*drain* = seconds from the end of the workload until the target had every row."
        )
        bf = [r for r in b["runs"] if r.get("latency_during_backfill")]
        if bf:
            out.append("\nWhile a backfill of `t` ran in the same pipeline (rows committed inside the backfill's window):\n")
            out.append("| run | window s | rows | p50 ms | p99 ms | max ms | backfill rows/s | backfill finished in the run |")
            out.append("|---|---:|---:|---:|---:|---:|---:|---|")
            for r in bf:
                L = r["latency_during_backfill"]
                out.append(
                    f"| {md_escape(r['label'])} | {fmt(r.get('backfill_window_s'), '.1f')} | {fmt(L.get('rows'))} | {fmt(L.get('p50_ms'), '.1f')} | "
                    f"{fmt(L.get('p99_ms'), '.1f')} | {fmt(L.get('max_ms'), '.1f')} | {fmt(r.get('backfill_rows_per_s'))} | "
                    f"{r.get('backfill_finished_during_workload')} |"
                )
        ratios = []
        byname = {r["name"]: r for r in b["runs"]}
        for r in b["runs"]:
            if r.get("method") == "tide_remote" and r.get("ok") and not r.get("with_backfill"):
                nat = byname.get(f"native_{r.get('rate') or 'max'}")
                if nat and nat.get("ok"):
                    ratios.append(
                        f"| {r.get('rate') or 'full speed'} | {fmt(r['latency'].get('p50_ms') / nat['latency'].get('p50_ms'), '.2f')} | "
                        f"{fmt(r['latency'].get('p99_ms') / nat['latency'].get('p99_ms'), '.2f')} | "
                        f"{fmt((r.get('apply_rows_per_s') or 0) / (nat.get('apply_rows_per_s') or 1), '.2f')} |"
                    )
        if ratios:
            out.append("\npg_tide (remote) / logical replication:\n")
            out.append("| rate | p50 ratio | p99 ratio | applied rows/s ratio |\n|---|---:|---:|---:|")
            out.extend(ratios)
        out.append("\n![latency](b2_latency.png)\n\n![latency over time](b2_latency_timeline.png)\n")

    # B3
    b = header("B3")
    if b:
        out.append(
            f"Workload: {b.get('workload')}. Baseline = mean of the first and last run "
            f"({fmt(b.get('baseline_tps'))} TPS, spread {fmt(b.get('baseline_spread_pct'), '.1f')} %).\n"
        )
        out.append("| configuration | TPS | % of baseline | latency avg ms | catch-up after run s | max restart gap MB | status |")
        out.append("|---|---:|---:|---:|---:|---:|---|")
        for r in b["runs"]:
            pg = r.get("pgbench") or {}
            out.append(
                f"| {md_escape(r.get('label'))} | {fmt(r.get('tps'))} | {fmt(r.get('pct_of_baseline'), '.1f')} | "
                f"{fmt(pg.get('latency_avg_ms'), '.2f')} | {fmt(r.get('catch_up_after_run_s'), '.1f')} | "
                f"{mb(r.get('max_slot_reread_bytes'))} | {status(r)} |"
            )
        for r in b["runs"]:
            if r.get("backfill_rows_emitted_during_run") is not None:
                out.append(
                    f"\n{r['label']}: the backfill emitted {fmt(r['backfill_rows_emitted_during_run'])} rows during the run "
                    f"(state at its end: {r.get('backfill_state_at_end')})."
                )
        out.append("\n![overhead](b3_overhead.png)\n")

    # B4
    b = header("B4")
    if b:
        out.append(f"Target: {b.get('target')}. Method: {b.get('method')}\n")
        out.append(
            "| table rows | backfill s | rows/s | peak VmRSS MiB | peak RssAnon MiB | peak RssShmem MiB | max age(backend_xmin) | max xact age s | samples (in a xact) | status |"
        )
        out.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        mib = lambda v: fmt(v / 2**20 if v is not None else None, ".1f")  # noqa: E731
        for r in b["runs"]:
            out.append(
                f"| {fmt(r.get('rows'))} | {fmt(r.get('backfill_seconds'), '.1f')} | {fmt(r.get('rows_per_s'))} | "
                f"{mib(r.get('peak_rss_bytes'))} | {mib(r.get('peak_rss_anon_bytes'))} | {mib(r.get('peak_rss_shmem_bytes'))} | "
                f"{fmt(r.get('max_xmin_age'))} | {fmt(r.get('max_xact_age_s'), '.2f')} | {fmt(r.get('samples_n'))} ({fmt(r.get('samples_in_xact'))}) | {status(r)} |"
            )
        s = b.get("summary")
        if s:
            out.append(
                f"\nLarge / small ({fmt(s.get('size_ratio'), '.1f')}x the rows): peak RSS x{fmt(s.get('peak_rss_bytes_ratio'), '.2f')}, "
                f"peak RssAnon x{fmt(s.get('peak_rss_anon_bytes_ratio'), '.2f')}, max xmin age x{fmt(s.get('max_xmin_age_ratio'), '.2f')}, "
                f"max transaction age x{fmt(s.get('max_xact_age_s_ratio'), '.2f')}. Memory flat: **{s.get('rss_flat')}**; "
                f"snapshot age flat: **{s.get('snapshot_flat')}** (flat = ratio ≤ 1.5)."
            )
        out.append("\n![bounds](b4_bounds.png)\n")
    if res.get("plot_error"):
        out.append(f"\nPlots failed: {md_escape(res['plot_error'])}\n")
    (RESULTS / "RESULTS.md").write_text("\n".join(out) + "\n")


def rate_series(series, window=1.0):
    """(t, cumulative rows) -> (t, rows/s over the trailing `window` seconds)."""
    out = []
    j = 0
    for i, (t, n) in enumerate(series):
        while j < i and series[j][0] < t - window:
            j += 1
        if i > j and t > series[j][0]:
            out.append((t, (n - series[j][1]) / (t - series[j][0])))
    return out


def write_plots(res):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    B = res.get("benchmarks", {})
    sub = f"{res.get('machine', {}).get('nproc')} CPUs, pg_tide {res.get('software', {}).get('pg_tide')} ({res.get('software', {}).get('pg_tide_so', {}).get('build_guess', '?')}), {res.get('mode')}"

    # B1: throughput over time
    b = B.get("B1")
    if b:
        runs = [r for r in b["runs"] if r.get("series")]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5))
        for r in runs:
            s = r["series"]
            a1.plot([p[0] for p in s], [p[1] for p in s], label=r["label"])
            rs = rate_series(s)
            a2.plot([p[0] for p in rs], [p[1] for p in rs], label=r["label"])
        a1.set_xlabel("seconds")
        a1.set_ylabel("rows copied")
        a1.set_title("B1 rows at the target over time")
        a2.set_xlabel("seconds")
        a2.set_ylabel("rows/s (1 s window)")
        a2.set_title("B1 backfill throughput over time")
        if runs:
            a1.legend(fontsize=7)
        fig.suptitle(sub, fontsize=8)
        fig.tight_layout()
        fig.savefig(RESULTS / "b1_backfill_throughput.png", dpi=110)
        plt.close(fig)

    # B2: latency percentiles + timeline
    b = B.get("B2")
    if b:
        runs = [r for r in b["runs"] if r.get("latency", {}).get("rows")]
        if runs:
            fig, ax = plt.subplots(figsize=(13, 5))
            w = 0.27
            xs = range(len(runs))
            for k, (key, lab) in enumerate((("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max"))):
                ax.bar([x + (k - 1) * w for x in xs], [max(r["latency"][key], 0.01) for r in runs], w, label=lab)
            ax.set_yscale("log")
            ax.set_xticks(list(xs))
            ax.set_xticklabels([r["label"] for r in runs], rotation=20, ha="right", fontsize=7)
            ax.set_ylabel("commit-to-target latency, ms (log)")
            ax.set_title("B2 streaming latency")
            ax.legend()
            fig.suptitle(sub, fontsize=8)
            fig.tight_layout()
            fig.savefig(RESULTS / "b2_latency.png", dpi=110)
            plt.close(fig)
            fig, ax = plt.subplots(figsize=(13, 5))
            for r in runs:
                ps = r.get("per_second") or []
                ax.plot([p[0] for p in ps], [max(p[3], 0.01) for p in ps], label=r["label"] + " p99")
            ax.set_yscale("log")
            ax.set_xlabel("seconds since workload start")
            ax.set_ylabel("p99 latency per second, ms (log)")
            ax.set_title("B2 latency over time (p99 of rows committed in each second)")
            ax.legend(fontsize=7)
            fig.suptitle(sub, fontsize=8)
            fig.tight_layout()
            fig.savefig(RESULTS / "b2_latency_timeline.png", dpi=110)
            plt.close(fig)

    # B3: overhead bars
    b = B.get("B3")
    if b:
        runs = [r for r in b["runs"] if r.get("ok") and r.get("pct_of_baseline") is not None]
        if runs:
            fig, ax = plt.subplots(figsize=(10, 5))
            ax.bar(range(len(runs)), [r["pct_of_baseline"] for r in runs], color="tab:blue")
            for i, r in enumerate(runs):
                ax.text(i, r["pct_of_baseline"] + 1, f"{r['tps']:,.0f} TPS\n{r['pct_of_baseline']:.0f}%", ha="center", fontsize=8)
            ax.axhline(100, color="grey", lw=0.8)
            ax.set_xticks(range(len(runs)))
            ax.set_xticklabels([r["label"] for r in runs], rotation=15, ha="right", fontsize=8)
            ax.set_ylabel("% of baseline TPS")
            ax.set_ylim(0, max(120, max(r["pct_of_baseline"] for r in runs) + 20))
            ax.set_title("B3 source overhead (pgbench TPC-B)")
            fig.suptitle(sub, fontsize=8)
            fig.tight_layout()
            fig.savefig(RESULTS / "b3_overhead.png", dpi=110)
            plt.close(fig)

    # B4: bounds
    b = B.get("B4")
    if b:
        runs = [r for r in b["runs"] if r.get("samples")]
        if runs:
            fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5))
            for r in runs:
                s = [x for x in r["samples"] if x.get("VmRSS")]
                a1.plot([x["t"] for x in s], [x["VmRSS"] / 2**20 for x in s], label=f"{r['label']} VmRSS")
                a1.plot([x["t"] for x in s], [x.get("RssAnon", 0) / 2**20 for x in s], "--", label=f"{r['label']} RssAnon")
                s2 = [x for x in r["samples"] if x.get("xact_age_s") is not None]
                a2.scatter([x["t"] for x in s2], [x["xact_age_s"] for x in s2], s=6, label=f"{r['label']}")
            a1.set_xlabel("seconds")
            a1.set_ylabel("worker memory, MiB")
            a1.set_title("B4 pg_tide worker RSS during a backfill")
            a1.legend(fontsize=7)
            a2.set_xlabel("seconds")
            a2.set_ylabel("age of the worker's open transaction, s")
            a2.set_title("B4 worker transaction age when sampled")
            a2.legend(fontsize=7)
            fig.suptitle(sub, fontsize=8)
            fig.tight_layout()
            fig.savefig(RESULTS / "b4_bounds.png", dpi=110)
            plt.close(fig)


def report(res):
    RESULTS.mkdir(parents=True, exist_ok=True)
    try:
        write_plots(res)
        res.pop("plot_error", None)
    except Exception as e:
        res["plot_error"] = errtext(e)
        log(f"plots failed: {errtext(e)}", "error")
        log(traceback.format_exc().rstrip(), "error")
    write_report(res)


# ---------------------------------------------------------------------------------------
def main():
    global _log_file
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small scale, to check the harness (~3 min)")
    ap.add_argument("--only", default="B1,B2,B3,B4", help="comma-separated benchmarks to run (default all)")
    ap.add_argument("--budget", type=int, default=None, help="overall time budget in seconds; later runs are skipped")
    ap.add_argument("--report-only", action="store_true", help="re-render RESULTS.md and plots from results.json")
    args = ap.parse_args()

    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        res = json.loads((RESULTS / "results.json").read_text())
        report(res)
        log(f"wrote {RESULTS / 'RESULTS.md'}")
        return 0

    # Remove the previous run's outputs so nothing stale is mistaken for this run's.
    for f in list(RESULTS.glob("*.png")) + [RESULTS / "results.json", RESULTS / "RESULTS.md"]:
        try:
            f.unlink()
        except FileNotFoundError:
            pass
    _log_file = open(RESULTS / "bench.log", "w")

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    only = [x.strip().upper() for x in args.only.split(",") if x.strip()]
    suite = Suite(args)
    rc = 0
    try:
        suite.setup()
        table = {
            "B1": ("backfill throughput: pg_tide vs logical replication initial sync vs COPY", suite.b1),
            "B2": ("streaming: apply throughput and commit-to-target latency", suite.b2),
            "B4": ("bounds: worker memory and oldest snapshot vs table size", suite.b4),
            "B3": ("source overhead: pgbench TPS", suite.b3),
        }
        # B4 before B3: B3 backfills B4's large table during its run.
        for key in ("B1", "B2", "B4", "B3"):
            if key in only:
                suite.bench(key, table[key][0], table[key][1])
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); cleaning up", "error")
        suite.results["interrupted"] = True
        rc = 130
    except Exception as e:
        log(f"setup failed: {errtext(e)}", "error")
        log(traceback.format_exc().rstrip(), "error")
        suite.results["setup_error"] = errtext(e)
        rc = 1
    finally:
        try:
            suite.cleanup()
        except BaseException as e:  # noqa: BLE001 - cleanup must not hide the results
            log(f"cleanup failed: {errtext(e)}", "warn")
        suite.save()
        report(suite.results)
        log(f"results: {RESULTS / 'results.json'}, {RESULTS / 'RESULTS.md'}, plots in {RESULTS}")
        failed = [
            f"{k}/{r['name']}"
            for k, b in suite.results["benchmarks"].items()
            for r in b.get("runs", [])
            if not r.get("ok")
        ] + [k for k, b in suite.results["benchmarks"].items() if b.get("error")]
        if failed:
            log(f"failed soft: {', '.join(failed)}", "warn")
        log(f"total {time.monotonic() - T_START:.0f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())
