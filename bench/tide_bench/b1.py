"""B1: backfill throughput, pg_tide vs logical replication initial sync vs a COPY pipe.

`run(suite, b)` is called by Suite.b1."""

import os

from .common import *  # noqa: F401,F403


def run(self, b):
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
        CHILDREN.add(p)
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
        CHILDREN.discard(p)
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

    # (e) pg_tide -> outbox, default chunk: every row becomes a `read` event in tide.outbox.
    def tide_outbox():
        r = b["runs"][-1]
        name = "b1_outbox"
        drop_pipeline(src, name)
        src.x("DELETE FROM tide.outbox WHERE pipeline = %s", (name,))
        settle()
        t0 = time.monotonic()
        try:
            src.x("SELECT tide.create_pipeline(%s, 'outbox')", (name,))
            src.x("SELECT tide.add_table(%s, 'public.t', backfill => true)", (name,))
            res = wait_backfill(src, name, "public.t", t0, P["b1_timeout"])
            secs = res["end_monotonic"] - t0
            got = src.val("SELECT count(*) FROM tide.outbox WHERE pipeline = %s AND op = 'read'", (name,))
            if got != n:
                raise BenchError(f"the outbox has {got:,} read events, expected {n:,}")
            rate(r, n, secs)
            r["series"] = res["series"]
            r["chunks_done"] = res["chunks_done"]
        finally:
            drop_pipeline(src, name)
            src.x("DELETE FROM tide.outbox WHERE pipeline = %s", (name,))

    self.run(
        b,
        "tide_outbox_chunk5000",
        tide_outbox,
        method="tide_outbox",
        label="pg_tide → outbox, chunk 5000 (default)",
        target="bench_src (tide.outbox)",
        chunk_size=DEFAULT_CHUNK,
    )

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

    # Several readers of one table (tide.max_backfill_readers): BENCH_B1_READERS=2,3 adds a run
    # of each target at the default chunk size per listed count (the runs above use the default,
    # 1), in this same run so the ratios compare.
    readers = [int(x) for x in os.environ.get("BENCH_B1_READERS", "").split(",") if x.strip()]
    for n_readers in readers:
        src.x(f"ALTER SYSTEM SET tide.max_backfill_readers = {n_readers}")
        src.x("SELECT pg_reload_conf()")
        try:
            self.run(
                b,
                f"tide_outbox_chunk5000_readers{n_readers}",
                tide_outbox,
                method="tide_outbox",
                label=f"pg_tide → outbox, chunk 5000, {n_readers} readers",
                target="bench_src (tide.outbox)",
                chunk_size=DEFAULT_CHUNK,
                readers=n_readers,
            )
            for kind in ("local", "remote"):
                if kind == "remote" and not self.remote_ok:
                    continue
                self.run(
                    b,
                    f"tide_{kind}_chunk{DEFAULT_CHUNK}_readers{n_readers}",
                    lambda k=kind: tide(k, DEFAULT_CHUNK),
                    method=f"tide_{kind}",
                    label=f"pg_tide → {kind} table, chunk {DEFAULT_CHUNK}, {n_readers} readers",
                    target="bench_tgt" if kind == "remote" else "bench_src (schema replica)",
                    chunk_size=DEFAULT_CHUNK,
                    readers=n_readers,
                )
        finally:
            src.x("ALTER SYSTEM RESET tide.max_backfill_readers")
            src.x("SELECT pg_reload_conf()")

    # ratios
    by = {r["name"]: r for r in b["runs"]}
    native_rate = by.get("native_initial_sync", {}).get("rows_per_s") if by.get("native_initial_sync", {}).get("ok") else None
    copy_rate = by.get("copy_pipe", {}).get("rows_per_s") if by.get("copy_pipe", {}).get("ok") else None
    for r in b["runs"]:
        if r.get("ok") and r["method"].startswith("tide"):
            r["ratio_vs_native"] = round(r["rows_per_s"] / native_rate, 3) if native_rate else None
            r["ratio_vs_copy"] = round(r["rows_per_s"] / copy_rate, 3) if copy_rate else None
