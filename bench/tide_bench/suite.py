"""The suite: scales, the clusters, one run per benchmark with its budget and soft failures,
results saved after every benchmark. The benchmarks themselves are b1..b7."""

from .common import *  # noqa: F401,F403
from . import b1, b2, b3, b4, b5, b6, b7, b8


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

    # Tables of B2 (streaming) and B3 (source overhead), used as self.EV_SRC, ...
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
    PGB_TABLES = ["pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history"]

    def b1(self, b):
        return b1.run(self, b)

    def b2(self, b):
        return b2.run(self, b)

    def b3(self, b):
        return b3.run(self, b)

    def b4(self, b):
        return b4.run(self, b)

    def b5(self, b):
        return b5.run(self, b)

    def b6(self, b):
        return b6.run(self, b)

    def b7(self, b):
        return b7.run(self, b)

    def b8(self, b):
        return b8.run(self, b)
