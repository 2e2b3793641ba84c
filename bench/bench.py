#!/usr/bin/env python3
"""pg_tide benchmark suite. Run it through bench/run.sh, which sets up the machine, the
Python environment and the two scratch clusters (bench_src, bench_tgt) this script expects.

    bench.py [--quick] [--only B1,B2,B3,B4,B5,B6,B7,B8] [--budget SECONDS]
    bench.py --report-only        (re-render RESULTS.md and the plots from results.json)

Benchmarks (see bench/README.md):
  B1  backfill throughput: pg_tide (remote and local table targets, three chunk sizes) vs
      PostgreSQL logical replication initial sync vs a COPY pipe
  B2  streaming: apply throughput and commit-to-target latency, pg_tide vs logical
      replication, at fixed rates and at full speed, and pg_tide while a backfill runs
  B3  source overhead: pgbench TPC-B TPS with nothing / native replication / pg_tide
  B4  bounds: pg_tide worker RSS and oldest snapshot during backfills of two table sizes
  B5  the kafka target next to the outbox, and the broker's own produce ceiling
  B6  one large transaction (1M and 10M rows): worker memory and commit-to-applied time per
      target, next to logical replication with streaming = off and on
  B7  many small tables (200 x 5,000 rows) added at once: time until every table is ready,
      pg_tide (local and remote table targets) vs logical replication initial sync of one
      publication (max_sync_workers_per_subscription 2 and 4)
  B8  side by side with Debezium 3.6.1 in Kafka Connect 4.4.0 (scripts/debezium.sh): a 1M-row
      snapshot against pg_tide's backfill, streaming latency at 2,000 tx/s, CPU s and peak
      RSS per million rows, the source's TPS while each captures

Every run fails soft: its error is recorded in results.json and RESULTS.md and the suite
goes on. Results are written after every benchmark, so an interrupted run keeps what it had.
"""


import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tide_bench.common import *  # noqa: E402,F401,F403
from tide_bench.common import set_log_file  # noqa: E402
from tide_bench.report import report, write_report  # noqa: E402,F401
from tide_bench.suite import Suite  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small scale, to check the harness (~3 min)")
    ap.add_argument("--only", default="B1,B2,B3,B4,B5,B6,B7,B8", help="comma-separated benchmarks to run (default all)")
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
    set_log_file(open(RESULTS / "bench.log", "w"))

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
            "B5": ("the kafka target next to the outbox: backfill rows/s, streaming rows/s, commit-to-consumer latency", suite.b5),
            "B6": ("one large transaction: worker memory and commit-to-applied time per target, next to logical replication", suite.b6),
            "B7": ("many small tables added at once: time until every table is ready, next to logical replication's initial sync", suite.b7),
            "B8": ("side by side with Debezium (Kafka Connect): snapshot/backfill time, streaming latency, CPU and memory, source TPS", suite.b8),
        }
        # B4 before B3: B3 backfills B4's large table during its run.
        for key in ("B1", "B2", "B4", "B3", "B5", "B6", "B7", "B8"):
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
