"""B4: bounds: worker RSS and oldest snapshot during backfills.

`run(suite, b)` is called by Suite.b4."""

from .common import *  # noqa: F401,F403


def run(self, b):
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
                CHILDREN.discard(tick)
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
