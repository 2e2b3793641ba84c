"""B7: many small tables. 200 tables of 5,000 rows (B1's row shape, ~220 bytes of heap per row)
in schema `b7src`, added to a pipeline at once, timed until every table is ready; side by side,
in the same run, with PostgreSQL's initial sync of one publication of the same tables
(`max_sync_workers_per_subscription` at its default 2 and at 4).

`run(suite, b)` is called by Suite.b7. Runs:

- native logical replication: `CREATE PUBLICATION ... FOR TABLE` (the 200 tables) on the source,
  `CREATE SUBSCRIPTION ... WITH (copy_data = true)` on bench_tgt (schema `b7src` there), timed
  from CREATE SUBSCRIPTION until every table's `srsubstate` is 'r' (and, apart, the time until its
  apply worker started: PostgreSQL 15's launcher starts one at most once per
  wal_retrieve_retry_interval of its own loop, so a subscription can wait 0-5 s for it);
- pg_tide into a local table target (schema `b7rep` of the source) and a remote one (schema
  `b7tide` of bench_tgt through postgres_fdw): a fresh pipeline, then one
  `tide.add_tables_in_schema(pipeline, 'b7src')` call, or 200 `tide.add_table` calls (one
  transaction each, in name order); timed from `tide.create_pipeline` until `tide.readiness`
  says `ready` for every table (backfill done and applied).

Every method writes into target tables created beforehand (untimed) with the source's primary
key and extra index, so every method maintains the same indexes; then every target table is
counted. BENCH_B7_TABLES / BENCH_B7_ROWS change the scale; BENCH_B7_METHODS=native2,tide_local_schema
runs some methods only. The pg_tide runs use `tide.max_parallel_backfills` at its default; BENCH_B7_PARALLEL=1,2,8
adds the `add_tables_in_schema` runs at those settings too (methods tide_local_schema_p1, tide_remote_schema_p1, ...;
set on the source with ALTER SYSTEM and a reload, reset afterwards)."""

from .common import *  # noqa: F401,F403

SCHEMA = "b7src"
LOCAL_SCHEMA = "b7rep"
REMOTE_SCHEMA = "b7tide"
POLL = 0.25


def tname(i):
    return f"t{i:03d}"


def build_source(src, tables, rows):
    """SCHEMA with `tables` tables of `rows` rows each (the benchmark shape, primary key and the
    created_at index), vacuumed; rebuilt unless it is already exactly that."""
    have = src.val(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind = 'r'",
        (SCHEMA,),
    )
    if have == tables and src.val(f"SELECT count(*) FROM {SCHEMA}.{tname(tables)}") == rows:
        return
    log(f"creating {tables} source tables {SCHEMA}.t001.. of {rows:,} rows each")
    t0 = time.monotonic()
    src.x(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    src.x(f"CREATE SCHEMA {SCHEMA}")
    first = f"{SCHEMA}.{tname(1)}"
    create_rows_table(src, first)
    src.x(ROWS_FILL.format(t=first), (1, rows))
    for i in range(2, tables + 1):
        q = f"{SCHEMA}.{tname(i)}"
        create_rows_table(src, q)
        src.x(f"INSERT INTO {q} SELECT * FROM {first}")
    src.x("VACUUM (ANALYZE)")
    src.x("CHECKPOINT")
    log(f"  {tables} tables built in {time.monotonic() - t0:.0f} s")


def create_targets(node, schema, tables):
    node.x(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    node.x(f"CREATE SCHEMA {schema}")
    for i in range(1, tables + 1):
        create_rows_table(node, f"{schema}.{tname(i)}")


def count_targets(node, schema, tables, rows):
    q = " UNION ALL ".join(f"SELECT count(*) AS n FROM {schema}.{tname(i)}" for i in range(1, tables + 1))
    counts = [r[0] for r in node.all(q)]
    bad = sum(1 for c in counts if c != rows)
    if bad:
        raise BenchError(f"{bad} of {tables} target tables in {schema} do not hold {rows:,} rows (total {sum(counts):,})")
    return sum(counts)


def run(self, b):
    src, tgt, P = self.src, self.tgt, self.P
    tables = int(os.environ.get("BENCH_B7_TABLES") or P["b7_tables"])
    rows = int(os.environ.get("BENCH_B7_ROWS") or P["b7_rows"])
    only = [x.strip() for x in os.environ.get("BENCH_B7_METHODS", "").split(",") if x.strip()]
    timeout = P["b7_timeout"]
    b["tables"] = tables
    b["rows_per_table"] = rows
    b["rows"] = tables * rows
    b["method"] = (
        f"{tables} tables of {rows:,} rows each (B1's row shape, primary key and an index on created_at) in schema "
        f"{SCHEMA}. Native: CREATE PUBLICATION FOR TABLE (all of them), CREATE SUBSCRIPTION WITH (copy_data = true) on "
        "bench_tgt, timed from CREATE SUBSCRIPTION until every table's pg_subscription_rel.srsubstate = 'r'. pg_tide: "
        "timed from tide.create_pipeline, then one tide.add_tables_in_schema call (or one tide.add_table call per "
        "table), until tide.readiness says 'ready' for every table (backfill done and applied). Target tables are "
        "created beforehand (untimed) with the same primary key and index for every method; every target table is "
        "counted afterwards."
    )
    build_source(src, tables, rows)
    b["heap_bytes"] = int(
        src.val(
            "SELECT sum(pg_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r'",
            (SCHEMA,),
        )
    )
    b["loadavg_at_start"] = list(os.getloadavg())
    log(f"  {tables} x {rows:,} rows, heap {b['heap_bytes'] / 1e6:.0f} MB; load average {b['loadavg_at_start']}")

    def settle():
        src.x("CHECKPOINT")
        tgt.x("CHECKPOINT")

    def finish(r, secs, series, total):
        r["seconds"] = round(secs, 3)
        r["rows"] = total
        r["rows_per_s"] = round(total / secs, 1)
        r["tables_per_s"] = round(tables / secs, 2)
        r["series"] = series
        r["loadavg_after"] = list(os.getloadavg())
        log(
            f"  {r['label']}: {tables} tables ready in {secs:.2f} s = {r['rows_per_s']:,.0f} rows/s, "
            f"{r['tables_per_s']:.1f} tables/s; load {r['loadavg_after'][0]:.1f}"
        )

    def native(workers):
        r = b["runs"][-1]
        sub = f"bench_b7_sub{workers}"
        drop_all_native(src, tgt)
        create_targets(tgt, SCHEMA, tables)
        tgt.x(f"ALTER SYSTEM SET max_sync_workers_per_subscription = {workers}")
        tgt.x("SELECT pg_reload_conf()")
        time.sleep(0.5)
        r["max_sync_workers_per_subscription"] = tgt.val("SHOW max_sync_workers_per_subscription")
        r["max_logical_replication_workers"] = tgt.val("SHOW max_logical_replication_workers")
        listing = ", ".join(f"{SCHEMA}.{tname(i)}" for i in range(1, tables + 1))
        src.x(f"CREATE PUBLICATION bench_b7_pub FOR TABLE {listing}")
        settle()
        r["loadavg_before"] = list(os.getloadavg())
        series = []
        t0 = time.monotonic()
        try:
            tgt.x(
                f"CREATE SUBSCRIPTION {sub} CONNECTION '{src.conninfo(sub)}' PUBLICATION bench_b7_pub "
                "WITH (copy_data = true)"
            )
            r["create_subscription_s"] = round(time.monotonic() - t0, 3)
            # PostgreSQL 15's launcher starts an apply worker at most once per
            # wal_retrieve_retry_interval (5 s) of its own loop: a subscription waits 0-5 s for it.
            # Recorded apart, so the ratios can be given without it too.
            while not tgt.val("SELECT pid FROM pg_stat_subscription WHERE subname = %s AND relid IS NULL", (sub,)):
                if time.monotonic() - t0 > 60:
                    raise BenchError(f"no apply worker for {sub} 60 s after CREATE SUBSCRIPTION")
                time.sleep(0.01)
            r["apply_worker_started_s"] = round(time.monotonic() - t0, 3)
            while True:
                n_ready, n_all = tgt.one(
                    """SELECT count(*) FILTER (WHERE r.srsubstate = 'r'), count(*) FROM pg_subscription_rel r
                         JOIN pg_subscription s ON s.oid = r.srsubid WHERE s.subname = %s""",
                    (sub,),
                )
                el = time.monotonic() - t0
                series.append((round(el, 3), int(n_ready)))
                if n_all >= tables and n_ready == n_all:
                    break
                if el > timeout:
                    raise BenchError(f"{n_ready} of {tables} tables ready after {timeout} s", {"series": series})
                time.sleep(POLL)
            secs = time.monotonic() - t0
            total = count_targets(tgt, SCHEMA, tables, rows)
            finish(r, secs, series, total)
        finally:
            drop_subscription(src, tgt, sub)
            src.x("DROP PUBLICATION IF EXISTS bench_b7_pub")
            tgt.x("ALTER SYSTEM RESET max_sync_workers_per_subscription")
            tgt.x("SELECT pg_reload_conf()")
            tgt.x(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
            settle()

    def tide(kind, how, parallel=None, readers=None):
        r = b["runs"][-1]
        if parallel is not None:
            src.x(f"ALTER SYSTEM SET tide.max_parallel_backfills = {int(parallel)}")
        if readers is not None:
            src.x(f"ALTER SYSTEM SET tide.max_backfill_readers = {int(readers)}")
        if parallel is not None or readers is not None:
            src.x("SELECT pg_reload_conf()")
            time.sleep(0.5)
        r["max_parallel_backfills"] = src.val("SHOW tide.max_parallel_backfills")
        r["max_backfill_readers"] = src.val("SHOW tide.max_backfill_readers")
        schema = REMOTE_SCHEMA if kind == "remote" else LOCAL_SCHEMA
        target = TideTarget(kind, schema, src, tgt)
        name = f"b7_{kind}_{how}"
        drop_pipeline(src, name)
        create_targets(target.node, schema, tables)
        settle()
        r["loadavg_before"] = list(os.getloadavg())
        series = []
        t0 = time.monotonic()
        try:
            target.create(src, name)
            t_add = time.monotonic()
            if how == "schema":
                added = src.val("SELECT tide.add_tables_in_schema(%s, %s)", (name, SCHEMA))
                if added != tables:
                    raise BenchError(f"tide.add_tables_in_schema added {added} tables, expected {tables}")
            else:
                for i in range(1, tables + 1):
                    src.x("SELECT tide.add_table(%s, %s::regclass)", (name, f"{SCHEMA}.{tname(i)}"))
            r["add_s"] = round(time.monotonic() - t_add, 3)
            last, last_change = -1, time.monotonic()
            while True:
                st = dict(
                    src.all(
                        "SELECT readiness, count(*) FROM tide.readiness WHERE pipeline = %s GROUP BY readiness", (name,)
                    )
                )
                n_ready = int(st.get("ready", 0))
                now = time.monotonic()
                el = now - t0
                series.append((round(el, 3), n_ready))
                if n_ready == tables:
                    break
                bad = {k: v for k, v in st.items() if k not in ("ready", "backfilling", "catching up", "no backfill")}
                if bad:
                    raise BenchError(
                        f"tables in state {bad} ({n_ready} ready): {pipeline_health(src, name)}", {"series": series}
                    )
                if n_ready != last:
                    last, last_change = n_ready, now
                if now - last_change > 120:
                    raise BenchError(f"no table became ready for 120 s ({n_ready} of {tables} ready, {st}): {pipeline_health(src, name)}", {"series": series})
                if el > timeout:
                    raise BenchError(f"{n_ready} of {tables} tables ready after {timeout} s: {pipeline_health(src, name)}", {"series": series})
                time.sleep(POLL)
            secs = time.monotonic() - t0
            total = count_targets(target.node, schema, tables, rows)
            finish(r, secs, series, total)
        finally:
            drop_pipeline(src, name)
            if parallel is not None or readers is not None:
                src.x("ALTER SYSTEM RESET tide.max_parallel_backfills")
                src.x("ALTER SYSTEM RESET tide.max_backfill_readers")
                src.x("SELECT pg_reload_conf()")
            try:
                target.node.x(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            except Exception as e:
                log(f"could not drop schema {schema}: {errtext(e)}", "warn")
            settle()

    methods = [
        ("native2", "logical replication initial sync, max_sync_workers_per_subscription = 2 (default)", lambda: native(2)),
        ("native4", "logical replication initial sync, max_sync_workers_per_subscription = 4", lambda: native(4)),
        ("tide_local_schema", "pg_tide → local table, add_tables_in_schema", lambda: tide("local", "schema")),
        ("tide_remote_schema", "pg_tide → remote table, add_tables_in_schema", lambda: tide("remote", "schema")),
        ("tide_local_each", f"pg_tide → local table, {tables} × add_table", lambda: tide("local", "each")),
        ("tide_remote_each", f"pg_tide → remote table, {tables} × add_table", lambda: tide("remote", "each")),
    ]
    for n in [x.strip() for x in os.environ.get("BENCH_B7_PARALLEL", "").split(",") if x.strip()]:
        for kind in ("local", "remote"):
            methods.append(
                (
                    f"tide_{kind}_schema_p{int(n)}",
                    f"pg_tide → {kind} table, add_tables_in_schema, tide.max_parallel_backfills = {int(n)}",
                    lambda kind=kind, n=int(n): tide(kind, "schema", n),
                )
            )
    for n in [x.strip() for x in os.environ.get("BENCH_B7_READERS", "").split(",") if x.strip()]:
        for kind in ("local", "remote"):
            methods.append(
                (
                    f"tide_{kind}_schema_r{int(n)}",
                    f"pg_tide → {kind} table, add_tables_in_schema, tide.max_backfill_readers = {int(n)}",
                    lambda kind=kind, n=int(n): tide(kind, "schema", None, n),
                )
            )
    for key, label, fn in methods:
        if only and key not in only:
            continue
        self.run(b, key, fn, method=key, label=label)
    b["loadavg_at_end"] = list(os.getloadavg())
    # same-run ratios: a method's time against each native run's (ratio > 1: pg_tide faster)
    by = {r["name"]: r for r in b["runs"] if r.get("ok")}
    for r in b["runs"]:
        if not r.get("ok") or not r["name"].startswith("tide"):
            continue
        for nat in ("native2", "native4"):
            if nat in by:
                r[f"speedup_vs_{nat}"] = round(by[nat]["seconds"] / r["seconds"], 3)
                launched = by[nat]["seconds"] - by[nat].get("apply_worker_started_s", 0)
                r[f"speedup_vs_{nat}_launched"] = round(launched / r["seconds"], 3)
