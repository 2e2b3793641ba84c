#!/usr/bin/env python3
"""Side-by-side table of bench/versions.sh: one column per PostgreSQL version.

    bench/versions_table.py DIR 15 18 > DIR/RESULTS.md

Reads DIR/pgNN/results.json (bench/run.sh's raw data) and prints Markdown: for B1 each run's
rows/s and its ratio to the same version's logical replication initial sync and COPY; for B2
each run's rate, p50 and p99 commit-to-target latency. A version whose run is missing or failed
shows what its results say ("missing", or the run's error).
"""
import json
import os
import sys


def load(d, v):
    p = os.path.join(d, f"pg{v}", "results.json")
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"_error": f"missing ({e.__class__.__name__})"}


def runs(res, b):
    bench = res.get("benchmarks", {}).get(b)
    if not bench:
        return {}
    return {r["name"]: r for r in bench.get("runs", [])}


def cell(text):
    """A table cell's text: a `|` would end the cell."""
    return str(text).replace("|", "\\|")


def fmt(x, spec):
    return "–" if x is None else format(x, spec)


def main():
    d, versions = sys.argv[1], sys.argv[2:]
    res = {v: load(d, v) for v in versions}
    out = ["# pg_tide benchmarks by PostgreSQL version", ""]
    out.append("Made by `bench/versions.sh`: `bench/run.sh` once per version, one after the other "
               "on one machine; each version's full results are in `pgNN/RESULTS.md`. Ratios are "
               "against the same version's logical replication and COPY, measured in its own run.")
    out.append("")
    out.append("| | " + " | ".join(f"PostgreSQL {v}" for v in versions) + " |")
    out.append("|---|" + "---|" * len(versions))
    for key, label in [("postgresql_version", "server"), ("pg_tide", "pg_tide"),
                       ("git_commit", "commit")]:
        cells = []
        for v in versions:
            r = res[v]
            cells.append(r.get("_error") or str(r.get("software", {}).get(key, "–"))[:40])
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    cells = [" ".join(f"{x:.1f}" for x in res[v].get("machine", {}).get("loadavg_at_start") or []) or "–"
             for v in versions]
    out.append("| load average at start | " + " | ".join(cells) + " |")
    cells = [fmt(res[v].get("duration_s"), ".0f") + (" s" if res[v].get("duration_s") else "")
             for v in versions]
    out.append("| run took | " + " | ".join(cells) + " |")
    out.append("")

    b1 = {v: runs(res[v], "B1") for v in versions}
    names = []
    for v in versions:
        for n in b1[v]:
            if n not in names:
                names.append(n)
    if names:
        out += ["## B1 — backfill throughput (1M rows)", "",
                "rows/s, and in brackets the ratio to the same version's logical replication "
                "initial sync / COPY pipe.", ""]
        out.append("| run | " + " | ".join(f"PostgreSQL {v}" for v in versions) + " |")
        out.append("|---|" + "---:|" * len(versions))
        for n in names:
            label = next((b1[v][n].get("label", n) for v in versions if n in b1[v]), n)
            cells = []
            for v in versions:
                r = b1[v].get(n)
                if r is None:
                    cells.append("–")
                    continue
                if not r.get("ok"):
                    cells.append(f"failed: {str(r.get('error'))[:60]}")
                    continue
                native = next((x for x in b1[v].values() if x.get("method") == "native" and x.get("ok")), None)
                copy = next((x for x in b1[v].values() if x.get("method") == "copy" and x.get("ok")), None)
                rate = r.get("rows_per_s")
                ratio = ""
                if r.get("method") not in ("native", "copy") and rate:
                    rn = rate / native["rows_per_s"] if native else None
                    rc = rate / copy["rows_per_s"] if copy else None
                    ratio = f" ({fmt(rn, '.2f')} / {fmt(rc, '.2f')})"
                cells.append(f"{fmt(rate, ',.0f')}{ratio}")
            out.append(f"| {cell(label)} | " + " | ".join(cell(c) for c in cells) + " |")
        out.append("")

    b2 = {v: runs(res[v], "B2") for v in versions}
    names = []
    for v in versions:
        for n in b2[v]:
            if n not in names:
                names.append(n)
    if names:
        out += ["## B2 — streaming: commit-to-target latency", "",
                "p50 / p99 in ms (commit timestamp to the row at the target), and the source's "
                "TPS.", ""]
        out.append("| run | " + " | ".join(f"PostgreSQL {v}" for v in versions) + " |")
        out.append("|---|" + "---:|" * len(versions))
        for n in names:
            label = next((b2[v][n].get("label", n) for v in versions if n in b2[v]), n)
            cells = []
            for v in versions:
                r = b2[v].get(n)
                if r is None:
                    cells.append("–")
                elif not r.get("ok"):
                    cells.append(f"failed: {str(r.get('error'))[:60]}")
                else:
                    lat = r.get("latency") or {}
                    cells.append(f"{fmt(lat.get('p50_ms'), '.1f')} / {fmt(lat.get('p99_ms'), '.1f')}"
                                 f" at {fmt(r.get('source_tps'), ',.0f')} tx/s")
            out.append(f"| {cell(label)} | " + " | ".join(cell(c) for c in cells) + " |")
        out.append("")
    print("\n".join(out))


if __name__ == "__main__":
    main()
