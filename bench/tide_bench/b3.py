"""B3: source overhead: pgbench TPC-B TPS with nothing / native replication / pg_tide.

`run(suite, b)` is called by Suite.b3."""

from .common import *  # noqa: F401,F403


def run(self, b):
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
        while_pgbench_runs(p, extra_during)
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
