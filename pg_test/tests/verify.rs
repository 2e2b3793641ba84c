//! `tide.verify` / `tide.repair` e2e tests: a table target (local `'table'` or remote
//! `'postgres'`) is compared with its source range by range while writes continue, corruption
//! made behind pg_tide's back is reported in exactly the ranges that hold it (and nowhere else),
//! a repair re-seeds those ranges and deletes the extra keys without ever deleting a key inserted
//! meanwhile, and heavy writes over the whole key space never produce a false alarm (rated at
//! `TIDE_VERIFY_HEAVY_RATE` writes/s, default 3000, plus one unthrottled burst). Also: `sample`
//! names the differing columns, bad inputs have SQLSTATEs, and a text key whose remote target
//! database has another default collation is not a false alarm.
//!
//! Convergence is checked independently of `tide.verify`: the rows of the source and of the
//! target (explicit column list rendered as text) compared as multisets both ways: 0 rows.
//!
//! Needs pg_tide installed into the system PostgreSQL 15 (`scripts/install.sh`). Each test runs
//! on its own scratch cluster (pg_tide preloaded, `wal_level = logical`); the remote test adds a
//! second scratch cluster (pg_tide not preloaded) as the target.

use pg_test::*;
use std::collections::HashMap;

use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(100);
const COLS: &str = "id, v, note";

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

/// The first column (text) of every row of `sql`.
fn texts(c: &Cluster, sql: &str) -> Vec<String> {
    c.query(sql).iter().map(|r| r.get::<_, String>(0)).collect()
}

/// Multiset difference: (in `a` but not `b`, in `b` but not `a`), with multiplicity.
fn multiset_diff(a: &[String], b: &[String]) -> (Vec<String>, Vec<String>) {
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for r in a {
        *counts.entry(r.as_str()).or_default() += 1;
    }
    for r in b {
        *counts.entry(r.as_str()).or_default() -= 1;
    }
    let mut only_a = Vec::new();
    let mut only_b = Vec::new();
    for (r, n) in counts {
        for _ in 0..n.max(0) {
            only_a.push(r.to_string());
        }
        for _ in 0..(-n).max(0) {
            only_b.push(r.to_string());
        }
    }
    only_a.sort();
    only_b.sort();
    (only_a, only_b)
}

/// Source and target hold exactly the same rows (set difference both ways: 0 rows).
#[track_caller]
fn assert_same_rows(what: &str, src: &Cluster, source: &str, tgt: &Cluster, target: &str) {
    let a = texts(src, &format!("SELECT row({COLS})::text FROM {source}"));
    let b = texts(tgt, &format!("SELECT row({COLS})::text FROM {target}"));
    let (only_src, only_tgt) = multiset_diff(&a, &b);
    if !only_src.is_empty() || !only_tgt.is_empty() {
        panic!(
            "{what}: {source} ({} rows) and its target {target} ({} rows) differ: {} rows only at the source, \
             {} only at the target.\nonly at the source (first 15):\n  {}\nonly at the target (first 15):\n  {}\n{}",
            a.len(),
            b.len(),
            only_src.len(),
            only_tgt.len(),
            only_src.iter().take(15).cloned().collect::<Vec<_>>().join("\n  "),
            only_tgt.iter().take(15).cloned().collect::<Vec<_>>().join("\n  "),
            diag(src)
        );
    }
    eprintln!(
        "  {what}: {source} = {target}: {} rows, 0 differences either way",
        a.len()
    );
}

/// One row of `tide.verify`.
#[derive(Debug, Clone)]
struct VRow {
    range: Option<i32>,
    key_from: Option<Vec<String>>,
    key_to: Option<Vec<String>>,
    source_rows: i64,
    target_rows: i64,
    missing: i64,
    extra: i64,
    changed: i64,
    kind: String,
    columns: Option<Vec<String>>,
}

/// The result of one `tide.verify` call.
#[derive(Debug)]
struct Verify {
    /// Rows for differing ranges (`range` not NULL).
    ranges: Vec<VRow>,
    /// Rows of kind 'column values' (from `sample`).
    columns: Vec<VRow>,
    summary: VRow,
    checked: i64,
    differ: i64,
    took: Duration,
}

impl Verify {
    fn dump(&self) -> String {
        let mut s = String::new();
        for r in self.ranges.iter().chain(&self.columns) {
            s.push_str(&format!("  {r:?}\n"));
        }
        s.push_str(&format!("  {:?}", self.summary));
        s
    }
}

/// "summary: N ranges checked, M differ..." → (N, M).
fn parse_summary(kind: &str) -> Option<(i64, i64)> {
    let rest = kind.strip_prefix("summary: ")?;
    let (n, rest) = rest.split_once(" ranges checked, ")?;
    let m = rest.split_whitespace().next()?;
    Some((n.parse().ok()?, m.parse().ok()?))
}

fn try_verify(c: &Cluster, args: &str) -> Result<Verify, postgres::Error> {
    let t = Instant::now();
    let rows = c.try_query(&format!(
        "SELECT range, key_from, key_to, source_rows, target_rows, missing, extra, changed, kind, columns \
           FROM tide.verify({args})"
    ))?;
    let took = t.elapsed();
    let rows: Vec<VRow> = rows
        .iter()
        .map(|r| VRow {
            range: r.get(0),
            key_from: r.get(1),
            key_to: r.get(2),
            source_rows: r.get(3),
            target_rows: r.get(4),
            missing: r.get(5),
            extra: r.get(6),
            changed: r.get(7),
            kind: r.get(8),
            columns: r.get(9),
        })
        .collect();
    let summaries: Vec<&VRow> = rows
        .iter()
        .filter(|r| r.kind.starts_with("summary: "))
        .collect();
    assert_eq!(
        summaries.len(),
        1,
        "tide.verify({args}) must return exactly one summary row:\n{rows:#?}"
    );
    let summary = summaries[0].clone();
    assert!(
        rows.last().is_some_and(|r| r.kind.starts_with("summary: ")),
        "the summary row must come last:\n{rows:#?}"
    );
    assert_eq!(summary.range, None, "the summary row has range NULL");
    let (checked, differ) = parse_summary(&summary.kind)
        .unwrap_or_else(|| panic!("unparsable summary kind {:?}", summary.kind));
    let ranges: Vec<VRow> = rows.iter().filter(|r| r.range.is_some()).cloned().collect();
    let columns: Vec<VRow> = rows
        .iter()
        .filter(|r| r.kind == "column values")
        .cloned()
        .collect();
    assert_eq!(
        ranges.len() + columns.len() + 1,
        rows.len(),
        "every row is a range row, a 'column values' row or the summary:\n{rows:#?}"
    );
    assert_eq!(
        differ,
        ranges.len() as i64,
        "the summary's 'M differ' must count the range rows:\n{rows:#?}"
    );
    Ok(Verify {
        ranges,
        columns,
        summary,
        checked,
        differ,
        took,
    })
}

#[track_caller]
fn verify(c: &Cluster, args: &str) -> Verify {
    try_verify(c, args).unwrap_or_else(|e| {
        panic!(
            "tide.verify({args}) failed: {}\n{}",
            describe_error(&e),
            diag(c)
        )
    })
}

/// One random single-statement write per transaction on a key in [lo, hi]: an update, a delete
/// or an upsert (single-row autocommit statements: no deadlocks between clients).
fn writer_script(lo: i64, hi: i64) -> String {
    format!(
        "\\set k random({lo}, {hi})
\\set op random(1, 3)
\\if :op = 1
UPDATE t SET v = v + 1, note = 'u' || :k WHERE id = :k;
\\elif :op = 2
DELETE FROM t WHERE id = :k;
\\else
INSERT INTO t VALUES (:k, :k, 'i') ON CONFLICT (id) DO UPDATE SET v = t.v + 1, note = 'ui';
\\endif
"
    )
}

/// Whether pgbench's clients are connected (it has started writing).
fn bench_connected(c: &Cluster) -> bool {
    c.try_query_scalar::<i64>(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'",
    )
    .map(|n| n > 0)
    .unwrap_or(false)
}

/// Stop pgbench by terminating its sessions (its exit status is then non-zero: that is
/// expected). Returns (transactions processed, elapsed, pgbench's status line and tps).
fn stop_bench(c: &Cluster, mut b: PgbenchRun) -> (u64, Duration, String) {
    let still_running = matches!(b.child.try_wait(), Ok(None));
    if still_running {
        let _ = c.try_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgbench'",
        );
    }
    let elapsed = b.started.elapsed();
    let r = b.finish();
    if !still_running && !r.ok {
        panic!(
            "pgbench failed on its own ({}):\n{}\n{}",
            r.status, r.stderr, r.stdout
        );
    }
    let tps = pgbench_tps(&r.stdout).map_or("?".into(), |t| format!("{t:.0}"));
    let how = if still_running {
        " (stopped)"
    } else {
        " (ended by itself)"
    };
    (
        r.txns,
        elapsed,
        format!("pgbench tps {tps}, {}{how}", r.status),
    )
}

/// The one row of `tide.verifications` for (pipeline, source), as JSON (for messages) and
/// its fields.
#[derive(Debug)]
struct VerificationRow {
    verification_id: i64,
    finished: bool,
    ranges_checked: Option<i32>,
    ranges_differing: Option<i32>,
    source_rows: Option<i64>,
    target_rows: Option<i64>,
    missing: Option<i64>,
    extra: Option<i64>,
    changed: Option<i64>,
    repair_backfill_id: Option<i64>,
    repair_state: Option<String>,
}

fn verification(c: &Cluster, pipeline: &str, source: &str) -> VerificationRow {
    let rows = c.query(&format!(
        "SELECT verification_id, finished, ranges_checked::int4, ranges_differing::int4, source_rows::int8,
                target_rows::int8, missing::int8, extra::int8, changed::int8, repair_backfill_id::int8,
                repair_state::text, started_at <= finished_at AS ordered
           FROM tide.verifications WHERE pipeline = '{pipeline}' AND source = '{source}'::regclass"
    ));
    assert_eq!(
        rows.len(),
        1,
        "tide.verifications must have exactly one row for ({pipeline}, {source}):\n{}",
        sample(c, "SELECT * FROM tide.verifications", 10)
    );
    let r = &rows[0];
    let ordered: Option<bool> = r.get(11);
    assert_ne!(
        ordered,
        Some(false),
        "started_at must not be after finished_at"
    );
    VerificationRow {
        verification_id: r.get(0),
        finished: r.get(1),
        ranges_checked: r.get(2),
        ranges_differing: r.get(3),
        source_rows: r.get(4),
        target_rows: r.get(5),
        missing: r.get(6),
        extra: r.get(7),
        changed: r.get(8),
        repair_backfill_id: r.get(9),
        repair_state: r.get(10),
    }
}

/// One row of `tide.repair`.
#[derive(Debug)]
struct Repair {
    ranges_differing: i32,
    rows_missing_or_changed: i64,
    rows_extra: i64,
    backfill_id: Option<i64>,
    action: String,
}

#[track_caller]
fn repair(c: &Cluster, args: &str) -> Repair {
    let rows = c
        .try_query(&format!(
            "SELECT ranges_differing, rows_missing_or_changed, rows_extra, backfill_id, action FROM tide.repair({args})"
        ))
        .unwrap_or_else(|e| {
            panic!(
                "tide.repair({args}) failed: {}\n{}",
                describe_error(&e),
                diag(c)
            )
        });
    assert_eq!(rows.len(), 1, "tide.repair returns exactly one row");
    let r = &rows[0];
    Repair {
        ranges_differing: r.get(0),
        rows_missing_or_changed: r.get(1),
        rows_extra: r.get(2),
        backfill_id: r.get(3),
        action: r.get(4),
    }
}

// ------------------------------------------------------------------------------------------
// 1. Corruption behind pg_tide's back is found in exactly its ranges, and repaired
// ------------------------------------------------------------------------------------------

const ROWS: i64 = 10_000;

fn corruption_scenario(tag: &str, remote: bool) {
    let t0 = Instant::now();
    let c = setup(tag);
    let tgt_cluster = if remote {
        Some(target_cluster(&format!("{tag}_tgt")))
    } else {
        None
    };
    // The cluster holding the target table, and its name there.
    let (tc, target): (&Cluster, &str) = match &tgt_cluster {
        Some(t) => (t, "public.t"),
        None => (&c, "replica.t"),
    };
    exec(
        &c,
        &format!(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
             INSERT INTO t SELECT g, g * 10, 'n' || g FROM generate_series(1, {ROWS}) g;"
        ),
    );
    if let Some(t) = &tgt_cluster {
        create_server(&c, "tgt", t);
        create_pipeline(&c, "v", "postgres", r#"{"server": "tgt"}"#);
    } else {
        create_pipeline(&c, "v", "table", r#"{"schema": "replica"}"#);
    }
    exec(&c, "SELECT tide.add_table('v', 'public.t')");
    let bf = wait_backfill(&c, "public.t", "v", 120);
    assert_same_rows("after the backfill", &c, "t", tc, target);
    eprintln!(
        "[{tag}] setup + backfill of {ROWS} rows: {:.1?} (backfill wait {bf:.1?})",
        t0.elapsed()
    );

    // A clean target first: 0 ranges differ.
    let v0 = verify(&c, "'public.t', 'v'");
    eprintln!("[{tag}] clean verify: {:.1?}: {}", v0.took, v0.summary.kind);
    assert_eq!(
        v0.differ,
        0,
        "a clean target: 0 ranges differ:\n{}\n{}",
        v0.dump(),
        diag(&c)
    );
    assert!(
        v0.checked >= ROWS / 1000,
        "10,000 keys in ranges of 1000: at least 10 ranges checked, got {}",
        v0.checked
    );
    assert_eq!(v0.summary.source_rows, ROWS);
    assert_eq!(v0.summary.target_rows, ROWS);

    // A writer in keys 8001..10000 (ranges 9 and up), ~200 transactions per second.
    let script = write_script(tag, &writer_script(8001, ROWS));
    let bench = spawn_pgbench(&c, &script, 1, 120, Some(200));
    c.wait_until("pgbench to connect", Duration::from_secs(10), POLL, || {
        Ok(bench_connected(&c))
    });
    std::thread::sleep(Duration::from_secs(1));

    // Corrupt the target behind pg_tide's back, one way per range.
    let corrupt = format!(
        "DELETE FROM {target} WHERE id = 150;
         INSERT INTO {target} (id, v, note) VALUES (50000, 1, 'ghost');
         UPDATE {target} SET v = -3500 WHERE id = 3500;
         UPDATE {target} SET id = 60200 WHERE id = 6200;"
    );
    tc.execute(&corrupt);

    let v1 = verify(&c, "'public.t', 'v'");
    eprintln!(
        "[{tag}] verify of the corrupted target under writes: {:.1?}\n{}",
        v1.took,
        v1.dump()
    );
    let fail =
        |what: &str| -> String { format!("{what}\nverify returned:\n{}\n{}", v1.dump(), diag(&c)) };
    let find = |from: Option<&str>, to: Option<&str>| -> Option<&VRow> {
        v1.ranges.iter().find(|r| {
            r.key_from.as_ref().map(|v| v.join(",")).as_deref() == from
                && r.key_to.as_ref().map(|v| v.join(",")).as_deref() == to
        })
    };
    // (from, to, kind, missing, extra, changed, source_rows, target_rows)
    type Expect<'a> = (
        Option<&'a str>,
        Option<&'a str>,
        &'a str,
        i64,
        i64,
        i64,
        Option<(i64, i64)>,
    );
    let expected: [Expect; 4] = [
        (
            None,
            Some("1000"),
            "missing rows",
            1,
            0,
            0,
            Some((1000, 999)),
        ),
        (
            Some("3000"),
            Some("4000"),
            "changed values",
            0,
            0,
            1,
            Some((1000, 1000)),
        ),
        (
            Some("6000"),
            Some("7000"),
            "missing rows",
            1,
            0,
            0,
            Some((1000, 999)),
        ),
        // The last, open range: the two keys beyond the source's last key. Its row counts
        // depend on the writer, so they are not checked.
        (None, None, "extra rows", 0, 2, 0, None),
    ];
    for (from, to, kind, missing, extra, changed, counts) in expected {
        let r = if from.is_none() && to.is_none() {
            v1.ranges.iter().find(|r| r.key_to.is_none())
        } else {
            find(from, to)
        };
        let r = r.unwrap_or_else(|| {
            panic!(
                "{}",
                fail(&format!(
                    "no differing range ({}, {}] was reported (expected {kind})",
                    from.unwrap_or("-inf"),
                    to.unwrap_or("+inf")
                ))
            )
        });
        assert_eq!(
            r.kind,
            kind,
            "{}",
            fail(&format!("kind of range {:?}", r.range))
        );
        assert_eq!(
            (r.missing, r.extra, r.changed),
            (missing, extra, changed),
            "{}",
            fail(&format!("(missing, extra, changed) of range {:?}", r.range))
        );
        if let Some((s, t)) = counts {
            assert_eq!(
                (r.source_rows, r.target_rows),
                (s, t),
                "{}",
                fail(&format!(
                    "(source_rows, target_rows) of range {:?}",
                    r.range
                ))
            );
        }
    }
    assert_eq!(
        v1.ranges.len(),
        4,
        "{}",
        fail("exactly the 4 corrupted ranges differ, no other (the writer's keys must not be reported)")
    );
    assert_eq!(v1.differ, 4);
    assert!(
        v1.columns.is_empty(),
        "no sample asked: no 'column values' rows"
    );
    assert_eq!(
        (v1.summary.missing, v1.summary.extra, v1.summary.changed),
        (2, 2, 1),
        "{}",
        fail("summary totals")
    );
    // The first range: key_from NULL, range number 1; numbers increase with the keys.
    let numbers: Vec<i32> = v1.ranges.iter().map(|r| r.range.unwrap()).collect();
    assert_eq!(numbers[0], 1, "{}", fail("the range of key 150 is range 1"));
    assert!(
        numbers.windows(2).all(|w| w[0] < w[1]),
        "{}",
        fail("ranges are reported in key order")
    );
    assert_eq!(
        *numbers.last().unwrap() as i64,
        v1.checked,
        "{}",
        fail("the open range is the last range checked")
    );

    let vr = verification(&c, "v", "public.t");
    eprintln!("[{tag}] tide.verifications after verify: {vr:?}");
    assert!(vr.finished);
    assert_eq!(vr.ranges_checked.map(i64::from), Some(v1.checked));
    assert_eq!(vr.ranges_differing, Some(4));
    assert_eq!(
        (vr.missing, vr.extra, vr.changed),
        (Some(2), Some(2), Some(1))
    );
    assert_eq!(vr.source_rows, Some(v1.summary.source_rows));
    assert_eq!(vr.target_rows, Some(v1.summary.target_rows));
    assert_eq!(vr.repair_backfill_id, None);
    assert_eq!(vr.repair_state, None);

    // Repair: re-seed the 4 ranges, delete the 2 extra keys.
    let t = Instant::now();
    let rep = repair(&c, "'public.t', 'v'");
    eprintln!("[{tag}] repair: {:.1?}: {rep:?}", t.elapsed());
    assert_eq!(rep.ranges_differing, 4, "{rep:?}\n{}", diag(&c));
    assert_eq!(
        rep.rows_missing_or_changed, 3,
        "150, 6200 missing; 3500 changed: {rep:?}"
    );
    assert_eq!(rep.rows_extra, 2, "50000 and 60200: {rep:?}");
    let bf_id = rep
        .backfill_id
        .expect("a repair that re-seeds has a backfill id");
    assert!(rep.action.contains(&bf_id.to_string()), "{rep:?}");
    let vr = verification(&c, "v", "public.t");
    assert!(vr.verification_id > 0);
    assert_eq!(vr.repair_backfill_id, Some(bf_id), "{vr:?}");
    assert_eq!(vr.ranges_differing, Some(4), "{vr:?}");
    let cond: String = c.query_scalar(&format!(
        "SELECT coalesce(condition, '') FROM tide.backfills WHERE id = {bf_id}"
    ));
    eprintln!("[{tag}] repair backfill {bf_id} condition: {cond}");

    let w = wait_backfill(&c, "public.t", "v", 120);
    eprintln!("[{tag}] repair backfill done in {w:.1?}");
    let (rows_read, state): (i64, String) = {
        let r = c.query_one(&format!(
            "SELECT rows_read, state FROM tide.backfills WHERE id = {bf_id}"
        ));
        (r.get(0), r.get(1))
    };
    eprintln!("[{tag}] repair backfill read {rows_read} rows (state {state})");
    assert_eq!(state, "done");
    assert!(
        rows_read <= 4000 + 50,
        "the repair re-seeds only the differing ranges (4 x 1000 keys), read {rows_read} rows\n{}",
        diag(&c)
    );
    let vr = verification(&c, "v", "public.t");
    assert_eq!(vr.repair_state.as_deref(), Some("done"), "{vr:?}");

    // A final verify, writer still running: equal.
    let v2 = verify(&c, "'public.t', 'v'");
    eprintln!(
        "[{tag}] verify after the repair (writes continue): {:.1?}: {}",
        v2.took, v2.summary.kind
    );
    assert_eq!(
        v2.differ,
        0,
        "after the repair, 0 ranges differ:\n{}\n{}",
        v2.dump(),
        diag(&c)
    );
    let vr = verification(&c, "v", "public.t");
    assert_eq!(vr.ranges_differing, Some(0), "{vr:?}");
    assert_eq!(
        (vr.missing, vr.extra, vr.changed),
        (Some(0), Some(0), Some(0))
    );
    assert_eq!(
        vr.repair_backfill_id, None,
        "the last verification is the final verify: {vr:?}"
    );

    // Repair again: nothing to do.
    let rep2 = repair(&c, "'public.t'");
    eprintln!("[{tag}] second repair: {rep2:?}");
    assert_eq!(rep2.ranges_differing, 0, "{rep2:?}");
    assert_eq!(rep2.backfill_id, None);
    assert!(rep2.action.starts_with("nothing to repair"), "{rep2:?}");

    let (txns, elapsed, status) = stop_bench(&c, bench);
    eprintln!("[{tag}] writer: {txns} transactions in {elapsed:.1?}, {status}");
    assert!(txns > 200, "the writer did write ({txns} transactions)");
    wait_pipeline(&c, "v", 60);
    let _ = std::fs::remove_file(&script);
    assert_same_rows("after the repair", &c, "t", tc, target);
    eprintln!("[{tag}] total {:.1?}", t0.elapsed());
}

#[test]
fn corruption_detected_and_repaired_local() {
    corruption_scenario("verify_local", false);
}

#[test]
fn corruption_detected_and_repaired_remote() {
    corruption_scenario("verify_remote", true);
}

// ------------------------------------------------------------------------------------------
// 2. No false alarms under heavy writes over the whole key space
// ------------------------------------------------------------------------------------------

/// Writes per second of the rated heavy phase (3 clients in total; `TIDE_VERIFY_HEAVY_RATE`,
/// 0 = unthrottled). The default stays below what the pipeline applies on a small machine:
/// pgbench unthrottled writes several times faster than a pipeline applies (12,900 tx/s against
/// a few thousand applied per second on the 2-core test box), the lag then grows without bound
/// and every re-check of `tide.verify` waits for a catch-up that does not come.
fn heavy_rate() -> Option<u32> {
    match std::env::var("TIDE_VERIFY_HEAVY_RATE") {
        Ok(v) => match v.trim().parse::<u32>() {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => panic!("TIDE_VERIFY_HEAVY_RATE must be a number, not {v:?}"),
        },
        Err(_) => Some(3000),
    }
}

fn lag_bytes(c: &Cluster) -> String {
    c.try_query_scalar::<Option<i64>>("SELECT lag_bytes::int8 FROM tide.pipelines WHERE name = 'v'")
        .ok()
        .flatten()
        .map_or("?".into(), |l| l.to_string())
}

#[test]
fn no_false_alarms_under_heavy_writes() {
    let t0 = Instant::now();
    let c = setup("verify_heavy");
    exec(
        &c,
        &format!(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
             INSERT INTO t SELECT g, g * 10, 'n' || g FROM generate_series(1, {ROWS}) g;"
        ),
    );
    create_pipeline(&c, "v", "table", r#"{"schema": "replica"}"#);
    exec(&c, "SELECT tide.add_table('v', 'public.t')");
    wait_backfill(&c, "public.t", "v", 120);
    let script = write_script("verify_heavy", &writer_script(1, ROWS));
    let mut failures = Vec::new();

    // Phase A: 3 clients writing random keys over the whole key space, at a rate the pipeline
    // sustains; at least 5 verify runs while they write.
    let rate = heavy_rate();
    let bench = spawn_pgbench(&c, &script, 3, 600, rate);
    c.wait_until("pgbench to connect", Duration::from_secs(10), POLL, || {
        Ok(bench_connected(&c))
    });
    std::thread::sleep(Duration::from_secs(2));
    const RUNS: usize = 6;
    let mut times = Vec::new();
    for i in 1..=RUNS {
        let lag = lag_bytes(&c);
        let v = verify(&c, "'public.t', 'v'");
        let writing = bench_connected(&c);
        eprintln!(
            "[heavy] verify run {i}: {:.2?} (lag before: {lag} bytes; writer still running: {writing}): {}",
            v.took, v.summary.kind
        );
        times.push(v.took);
        // A wait that timed out is reported as such (inconclusive), not as a difference; only a
        // reported difference on this uncorrupted target is a false alarm.
        if v.differ != 0 {
            failures.push(format!("rated run {i}:\n{}", v.dump()));
        }
        assert!(
            writing,
            "the writer must still be running after verify run {i}"
        );
    }
    let (txns, elapsed, status) = stop_bench(&c, bench);
    eprintln!("[heavy] writer (rate {rate:?}): {txns} transactions in {elapsed:.1?}, {status}");
    eprintln!(
        "[heavy] verify times: {}",
        times
            .iter()
            .map(|t| format!("{:.2}s", t.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let caught_up = wait_pipeline(&c, "v", 120);
    eprintln!("[heavy] pipeline caught up {caught_up:.1?} after the writer stopped");
    assert_same_rows("after the rated writes", &c, "t", &c, "replica.t");

    // Phase B: an unthrottled burst (15 s); one verify started 2 s into it. The pipeline falls
    // behind, so the re-checks wait for it: the run is slow, but must report nothing.
    let burst = spawn_pgbench(&c, &script, 3, 15, None);
    c.wait_until("pgbench to connect", Duration::from_secs(10), POLL, || {
        Ok(bench_connected(&c))
    });
    std::thread::sleep(Duration::from_secs(2));
    let lag = lag_bytes(&c);
    let v = verify(&c, "'public.t', 'v'");
    let writing = bench_connected(&c);
    eprintln!(
        "[heavy] verify during an unthrottled burst: {:.2?} (lag at start: {lag} bytes; writer still running at its end: {writing}): {}",
        v.took, v.summary.kind
    );
    // A wait that timed out is reported as such (inconclusive), not as a difference; only a
    // reported difference on this uncorrupted target is a false alarm.
    if v.differ != 0 {
        failures.push(format!("burst run:\n{}", v.dump()));
    }
    let (txns, elapsed, status) = stop_bench(&c, burst);
    eprintln!("[heavy] burst writer: {txns} transactions in {elapsed:.1?}, {status}");
    let _ = std::fs::remove_file(&script);
    let caught_up = wait_pipeline(&c, "v", 180);
    eprintln!("[heavy] pipeline caught up {caught_up:.1?} after the burst");
    // Independent check that the target really was equal (so any report was a false alarm).
    assert_same_rows("after the burst", &c, "t", &c, "replica.t");
    assert!(
        failures.is_empty(),
        "false alarms: {} verify runs reported differing ranges on an uncorrupted target:\n{}\n{}",
        failures.len(),
        failures.join("\n"),
        diag(&c)
    );
    let v = verify(&c, "'public.t', 'v'");
    assert_eq!(v.differ, 0, "quiet: 0 differ\n{}", v.dump());
    eprintln!("[heavy] total {:.1?}", t0.elapsed());
}

// ------------------------------------------------------------------------------------------
// 3. sample => N names the differing columns
// ------------------------------------------------------------------------------------------

#[test]
fn sample_reports_column_names() {
    let c = setup("verify_sample");
    exec(
        &c,
        // e, f, g: types whose output function and text cast differ (t/true, 'ab   '/'ab',
        // ::1/::1/128), which once made every row of a clean target look changed.
        "CREATE TABLE s (id int PRIMARY KEY, a int, b text, c timestamptz, d numeric,
                         e boolean, f char(5), g inet);
         INSERT INTO s SELECT g, g, 'b' || g, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 hour', g / 3.0,
                              g % 2 = 0, 'ab', CASE WHEN g % 2 = 0 THEN '::1' ELSE '10.0.0.1' END::inet
           FROM generate_series(1, 60) g;",
    );
    create_pipeline(&c, "v", "table", r#"{"schema": "replica"}"#);
    exec(&c, "SELECT tide.add_table('v', 'public.s')");
    wait_backfill(&c, "public.s", "v", 60);

    // Sampling a clean target reports nothing (and types render alike on both sides).
    let v0 = verify(&c, "'public.s', 'v', sample => 60");
    assert_eq!(v0.differ, 0, "{}", v0.dump());
    assert!(
        v0.columns.is_empty(),
        "clean target, no column rows:\n{}",
        v0.dump()
    );

    exec(
        &c,
        "UPDATE replica.s SET b = 'corrupt', d = -1 WHERE id = 17",
    );
    let v = verify(&c, "'public.s', 'v', sample => 60");
    eprintln!("[sample] {:.1?}\n{}", v.took, v.dump());
    assert_eq!(
        v.columns.len(),
        1,
        "exactly one 'column values' row:\n{}",
        v.dump()
    );
    let r = &v.columns[0];
    assert_eq!(r.key_from, Some(vec!["17".to_string()]), "{r:?}");
    let mut cols = r.columns.clone().unwrap_or_default();
    cols.sort();
    assert_eq!(cols, vec!["b".to_string(), "d".to_string()], "{r:?}");
    assert_eq!(r.range, None, "{r:?}");
    // The range check reports the same row as changed.
    assert_eq!(v.differ, 1, "{}", v.dump());
    assert_eq!(v.ranges[0].kind, "changed values");
    assert_eq!(v.ranges[0].changed, 1);

    // A sample smaller than the table reports at most that row; sample 0 reports none.
    let v = verify(&c, "'public.s', 'v', sample => 0");
    assert!(v.columns.is_empty());
    let v = verify(&c, "'public.s', 'v', sample => 1000");
    assert_eq!(
        v.columns.len(),
        1,
        "sample larger than the table: {}",
        v.dump()
    );
}

// ------------------------------------------------------------------------------------------
// 4. A repair never deletes a key inserted at the source meanwhile
// ------------------------------------------------------------------------------------------

/// When the key K is inserted at the source, relative to the repair.
#[derive(Debug, Clone, Copy)]
enum When {
    /// In the repair's own transaction (committed with the queued backfill).
    SameTx,
    /// Right after the repair returns, after sleeping this many ms.
    After(u64),
    /// Inserted (uncommitted) before the repair; committed as soon as the repair backfill has
    /// written its low watermark ('low') or its high watermark ('high') for this backfill.
    HeldUntil(&'static str),
}

#[test]
fn repair_never_deletes_a_key_inserted_meanwhile() {
    let t0 = Instant::now();
    let c = setup("verify_race");
    exec(
        &c,
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
         INSERT INTO t SELECT g, g * 10, 'n' || g FROM generate_series(1, 3000) g;",
    );
    create_pipeline(&c, "v", "table", r#"{"schema": "replica"}"#);
    exec(&c, "SELECT tide.add_table('v', 'public.t')");
    wait_backfill(&c, "public.t", "v", 60);

    let cases: &[(i64, When)] = &[
        (1500, When::After(0)),
        (2500, When::After(0)),
        (9000, When::After(0)), // beyond the last source key: the open range
        (500, When::After(50)),
        (1200, When::After(200)),
        (2800, When::SameTx),
        (1700, When::HeldUntil("low")),
        (2200, When::HeldUntil("low")),
        (9100, When::HeldUntil("low")),
        (700, When::HeldUntil("high")),
        (9200, When::HeldUntil("high")),
    ];
    let mut places = Vec::new();
    for &(k, when) in cases {
        // K exists at the target only.
        exec(&c, &format!("DELETE FROM t WHERE id = {k}"));
        wait_pipeline(&c, "v", 60);
        exec(
            &c,
            &format!("INSERT INTO replica.t VALUES ({k}, -1, 'ghost')"),
        );
        let v = verify(&c, "'public.t', 'v'");
        assert_eq!(v.differ, 1, "K={k}: the extra key is found:\n{}", v.dump());
        assert_eq!(
            (v.ranges[0].extra, v.ranges[0].missing, v.ranges[0].changed),
            (1, 0, 0)
        );

        let insert_sql = format!("INSERT INTO t VALUES ({k}, 42, 'real')");
        let repair_sql =
            "SELECT ranges_differing, rows_extra, backfill_id FROM tide.repair('public.t', 'v')";
        let mut client = c.client();
        let lsn = |cl: &mut Client| -> String {
            cl.query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
                .unwrap()
                .get(0)
        };
        let (row, lsn_lo, lsn_hi) = match when {
            When::SameTx => {
                let mut tx = client.transaction().unwrap();
                let r = tx.query_one(repair_sql, &[]).unwrap();
                tx.batch_execute(&insert_sql).unwrap();
                let lo: String = tx
                    .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
                    .unwrap()
                    .get(0);
                tx.commit().unwrap();
                let hi = lsn(&mut client);
                (r, lo, hi)
            }
            When::After(ms) => {
                let r = client.query_one(repair_sql, &[]).unwrap();
                if ms > 0 {
                    std::thread::sleep(Duration::from_millis(ms));
                }
                let lo = lsn(&mut client);
                client.batch_execute(&insert_sql).unwrap();
                let hi = lsn(&mut client);
                (r, lo, hi)
            }
            When::HeldUntil(kind) => {
                let mut holder = c.client();
                holder.batch_execute("BEGIN").unwrap();
                holder.batch_execute(&insert_sql).unwrap();
                let r = client.query_one(repair_sql, &[]).unwrap();
                let bf: Option<i64> = r.get(2);
                let bf = bf.unwrap_or(-1);
                let q = format!(
                    "SELECT EXISTS (SELECT 1 FROM tide.signal WHERE pipeline = 'v' AND backfill_id = {bf} AND kind = '{kind}')
                         OR EXISTS (SELECT 1 FROM tide.backfill WHERE id = {bf} AND state NOT IN ('queued', 'running'))"
                );
                if let Err(msg) =
                    poll_every(Duration::from_secs(30), Duration::from_millis(1), || {
                        Ok(client.query_one(q.as_str(), &[])?.get::<_, bool>(0))
                    })
                {
                    panic!(
                        "K={k}: the repair backfill never wrote its {kind} watermark: {msg}\n{}",
                        diag(&c)
                    );
                }
                let lo = lsn(&mut client);
                holder.batch_execute("COMMIT").unwrap();
                let hi = lsn(&mut client);
                (r, lo, hi)
            }
        };
        let rep: (i32, i64, Option<i64>) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(
            (rep.0, rep.1),
            (1, 1),
            "K={k}: repair of one range with one extra key: {rep:?}"
        );
        let bf = rep.2.expect("a backfill id");
        wait_backfill(&c, "public.t", "v", 60);
        wait_pipeline(&c, "v", 60);
        // Where did the insert's commit land relative to the repair chunks' watermarks?
        let place: String = c.query_scalar(&format!(
            "SELECT coalesce(string_agg(
                 CASE WHEN '{lsn_hi}'::pg_lsn <= low_lsn THEN 'before LW'
                      WHEN '{lsn_lo}'::pg_lsn >= high_lsn THEN 'after HW'
                      WHEN '{lsn_lo}'::pg_lsn >= low_lsn AND '{lsn_hi}'::pg_lsn <= high_lsn THEN 'between LW and HW'
                      ELSE 'around a watermark' END
                 || format(' (chunk %s: %s rows read, %s dropped, %s emitted)', chunk, rows_read, rows_dropped, rows_emitted), '; ' ORDER BY chunk), '?')
               FROM tide.chunks WHERE backfill_id = {bf}"
        ));
        let target_row: Option<String> = c.query_scalar(&format!(
            "SELECT (SELECT row({COLS})::text FROM replica.t WHERE id = {k})"
        ));
        eprintln!("[race] K={k} {when:?}: insert {place}; target row {target_row:?}");
        places.push(format!("{when:?}: {place}"));
        assert_eq!(
            target_row.as_deref(),
            Some(format!("({k},42,real)").as_str()),
            "K={k} ({when:?}): the key inserted during the repair must be at the target with the source's values\n{}",
            diag(&c)
        );
        assert_same_rows(&format!("K={k}"), &c, "t", &c, "replica.t");
    }
    let v = verify(&c, "'public.t', 'v'");
    assert_eq!(v.differ, 0, "{}", v.dump());
    eprintln!("[race] total {:.1?}", t0.elapsed());
}

// ------------------------------------------------------------------------------------------
// 6. A text key whose target database sorts differently
// ------------------------------------------------------------------------------------------

/// The source sorts its text key with its own collation (here "C.UTF-8", the scratch clusters'
/// default); the remote target lives in a database whose default collation is ICU en-US, as
/// happens whenever two servers were initialized with different locales. The target is an exact
/// copy, so `tide.verify` must report 0 differing ranges, and `tide.repair` must not lose a row.
#[test]
fn text_key_target_with_another_collation() {
    let c = setup("verify_coll");
    let tgt = target_cluster("verify_coll_tgt");
    tgt.execute(
        "CREATE DATABASE tdb TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'",
    );
    c.execute(&format!(
        "CREATE EXTENSION postgres_fdw;
         CREATE SERVER tgt FOREIGN DATA WRAPPER postgres_fdw
                OPTIONS (host '127.0.0.1', port '{}', dbname 'tdb');
         CREATE USER MAPPING FOR postgres SERVER tgt OPTIONS (user 'postgres');",
        tgt.port()
    ));
    // Mixed-case keys: "C" puts every upper-case letter before every lower-case one, en-US
    // interleaves them (a A b B ...).
    exec(
        &c,
        "CREATE TABLE k (id text PRIMARY KEY, v int NOT NULL, note text);
         INSERT INTO k SELECT chr(65 + (g % 2) * 32 + (g / 2) % 26) || g, g, 'n' || g
           FROM generate_series(1, 3000) g;",
    );
    create_pipeline(&c, "r", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('r', 'public.k')");
    wait_backfill(&c, "public.k", "r", 60);
    let tdb = || tgt.connect_db("tdb");
    let count: i64 = tdb()
        .query_one("SELECT count(*) FROM public.k", &[])
        .unwrap()
        .get(0);
    assert_eq!(count, 3000, "the backfill copied every row");

    let v = verify(&c, "'public.k', 'r'");
    eprintln!("[collation] verify of an exact copy:\n{}", v.dump());
    // Whatever verify says, a repair must never lose a row.
    let rep = repair(&c, "'public.k', 'r'");
    eprintln!("[collation] repair: {rep:?}");
    if rep.backfill_id.is_some() {
        wait_backfill(&c, "public.k", "r", 60);
    }
    wait_pipeline(&c, "r", 60);
    let src = texts(&c, &format!("SELECT row({COLS})::text FROM k"));
    let dst: Vec<String> = tdb()
        .query(&format!("SELECT row({COLS})::text FROM public.k"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (only_src, only_dst) = multiset_diff(&src, &dst);
    assert!(
        only_src.is_empty() && only_dst.is_empty(),
        "after the repair: {} rows only at the source, {} only at the target",
        only_src.len(),
        only_dst.len()
    );
    assert_eq!(
        v.differ,
        0,
        "false alarm: an exact copy in a database with another collation is reported as differing \
         (source_rows {} vs target_rows {} in the summary: the target's key ranges are evaluated in \
         the target's collation):\n{}",
        v.summary.source_rows,
        v.summary.target_rows,
        v.dump()
    );
    assert_eq!(rep.ranges_differing, 0, "{rep:?}");
}

// ------------------------------------------------------------------------------------------
// 5. Bad inputs
// ------------------------------------------------------------------------------------------

#[track_caller]
fn expect_fail(c: &Cluster, sql: &str, code: &str, hint: Option<&str>) {
    let res = c.try_query(sql);
    if let Err(e) = &res {
        eprintln!(
            "  {sql}\n    -> {}",
            describe_error(e).replace('\n', "\n       ")
        );
    }
    assert_sql_fails(res.map(|r| r.len()), code, hint);
}

#[test]
fn bad_inputs() {
    let c = setup("verify_bad");
    exec(
        &c,
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
         INSERT INTO t SELECT g, g, 'n' FROM generate_series(1, 2000) g;
         CREATE TABLE u (id int PRIMARY KEY);
         CREATE TABLE o (id int PRIMARY KEY);",
    );
    create_pipeline(&c, "v", "table", r#"{"schema": "replica"}"#);
    create_pipeline(&c, "ob", "outbox", "{}");
    exec(&c, "SELECT tide.add_table('v', 'public.t')");
    exec(
        &c,
        "SELECT tide.add_table('ob', 'public.o', backfill => false)",
    );
    wait_backfill(&c, "public.t", "v", 60);

    // An outbox pipeline has no target table.
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.o', 'ob')",
        "55000",
        Some("outbox"),
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.o')",
        "55000",
        Some("table targets"),
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.repair('public.o', 'ob')",
        "55000",
        Some("outbox"),
    );

    // A table the pipeline does not capture.
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.u', 'v')",
        "55000",
        None,
    );
    expect_fail(&c, "SELECT * FROM tide.verify('public.u')", "55000", None);
    expect_fail(
        &c,
        "SELECT * FROM tide.repair('public.u', 'v')",
        "55000",
        None,
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.o', 'v')",
        "55000",
        None,
    );

    // ranges <= 0, sample < 0.
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.t', 'v', ranges => 0)",
        "22023",
        None,
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.t', 'v', ranges => -3)",
        "22023",
        None,
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.t', 'v', sample => -1)",
        "22023",
        None,
    );

    // A valid `ranges`: the table in about that many ranges (reltuples after ANALYZE).
    exec(&c, "ANALYZE t");
    let v = verify(&c, "'public.t', 'v', ranges => 4");
    eprintln!("  ranges => 4 on 2000 analyzed rows: {}", v.summary.kind);
    assert_eq!(v.differ, 0);
    assert!(
        (4..=5).contains(&v.checked),
        "ranges => 4: about 4 ranges checked, got {}",
        v.checked
    );

    // A backfill still paused / queued for the table.
    exec(
        &c,
        "BEGIN; SELECT tide.start_backfill('public.t', 'v'); SELECT tide.pause_backfill('public.t', 'v'); COMMIT;",
    );
    let state: String = c.query_scalar(
        "SELECT state FROM tide.backfills WHERE relation = 'public.t' ORDER BY id DESC LIMIT 1",
    );
    assert_eq!(state, "paused");
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.t', 'v')",
        "55000",
        Some("wait_for_backfill"),
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.repair('public.t', 'v')",
        "55000",
        Some("wait_for_backfill"),
    );
    exec(&c, "SELECT tide.cancel_backfill('public.t', 'v')");

    exec(&c, "SELECT tide.pause_pipeline('v')");
    exec(&c, "SELECT tide.start_backfill('public.t', 'v')");
    let state: String = c.query_scalar(
        "SELECT state FROM tide.backfills WHERE relation = 'public.t' ORDER BY id DESC LIMIT 1",
    );
    assert_eq!(state, "queued");
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.t', 'v')",
        "55000",
        Some("wait_for_backfill"),
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.repair('public.t')",
        "55000",
        Some("wait_for_backfill"),
    );
    exec(&c, "SELECT tide.resume_pipeline('v')");
    wait_backfill(&c, "public.t", "v", 60);

    // Fine again, with the pipeline defaulted.
    let v = verify(&c, "'public.t'");
    assert_eq!(v.differ, 0, "{}", v.dump());
    let r = repair(&c, "'public.t'");
    assert_eq!(r.ranges_differing, 0);
    assert!(r.action.starts_with("nothing to repair"), "{r:?}");

    // Never analyzed: `ranges => 4` must still mean about 4 ranges (observation, printed).
    exec(
        &c,
        "CREATE TABLE w (id int PRIMARY KEY, v int);
         INSERT INTO w SELECT g, g FROM generate_series(1, 3000) g;
         ALTER TABLE w SET (autovacuum_enabled = false);",
    );
    exec(&c, "SELECT tide.add_table('v', 'public.w')");
    wait_backfill(&c, "public.w", "v", 60);
    let reltuples: f32 = c.query_scalar("SELECT reltuples FROM pg_class WHERE oid = 'w'::regclass");
    let v = verify(&c, "'public.w', 'v', ranges => 4");
    eprintln!(
        "  ranges => 4 on 3000 never-analyzed rows (reltuples {reltuples}): {} in {:.2?}",
        v.summary.kind, v.took
    );
}
