"""B2: streaming apply throughput and commit-to-target latency, also during a backfill.

`run(suite, b)` is called by Suite.b2."""

import os

from .common import *  # noqa: F401,F403


def run(self, b):
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
        while_pgbench_runs(p, on_running)
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

    # BENCH_B2_BACKFILL_CHUNK=n: the backfill of the "while backfilling" runs reads chunks of n
    # rows (default: the extension's default chunk size).
    bf_chunk = int(os.environ.get("BENCH_B2_BACKFILL_CHUNK", "0") or 0)

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
                if bf_chunk:
                    src.x("SELECT tide.start_backfill('public.t', %s, chunk_size => %s::int)", (name, bf_chunk))
                else:
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

    # BENCH_B2_RUNS=tide_local_2000_backfill,...: run only the listed runs (by name).
    only = [x.strip() for x in os.environ.get("BENCH_B2_RUNS", "").split(",") if x.strip()]

    def run_one(name, fn, **meta):
        if only and name not in only:
            return None
        return self.run(b, name, fn, **meta)

    def rl(rate):
        return f"{rate} tx/s" if rate else "full speed"

    for rate in P["b2_rates"]:
        run_one(
            f"tide_remote_{rate or 'max'}",
            lambda rt=rate: tide("remote", rt),
            method="tide_remote",
            label=f"pg_tide → remote, {rl(rate)}",
            rate=rate,
        )
        run_one(
            f"native_{rate or 'max'}",
            lambda rt=rate: native(rt),
            method="native",
            label=f"logical replication, {rl(rate)}",
            rate=rate,
        )
    rate = P["b2_backfill_rate"]
    run_one(
        f"tide_remote_{rate}_backfill",
        lambda: tide("remote", rate, True),
        method="tide_remote",
        label=f"pg_tide → remote, {rl(rate)}, while backfilling t",
        rate=rate,
        with_backfill=True,
    )
    # Reference points with the local table target (also covers a remote target that fails).
    run_one(
        "tide_local_2000",
        lambda: tide("local", 2000),
        method="tide_local",
        label=f"pg_tide → local, {rl(2000)}",
        rate=2000,
    )
    run_one(
        f"tide_local_{rate}_backfill",
        lambda: tide("local", rate, True),
        method="tide_local",
        label=f"pg_tide → local, {rl(rate)}, while backfilling t",
        rate=rate,
        with_backfill=True,
    )
