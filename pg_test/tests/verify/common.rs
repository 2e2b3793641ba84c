//! The verify suite's prelude: everything of `pg_test`, plus `tide.verify` and `tide.repair`
//! called and their rows read ([`verify`], [`repair`]), the row of `tide.verifications`, and the
//! writers that run meanwhile.

pub use pg_test::*;
use std::time::{Duration, Instant};

pub const POLL: Duration = Duration::from_millis(100);
/// The columns compared, source against target.
pub const COLS: &str = "id, v, note";

#[derive(Debug, Clone)]
pub struct VRow {
    pub range: Option<i32>,
    pub key_from: Option<Vec<String>>,
    pub key_to: Option<Vec<String>>,
    pub source_rows: i64,
    pub target_rows: i64,
    pub missing: i64,
    pub extra: i64,
    pub changed: i64,
    pub kind: String,
    pub columns: Option<Vec<String>>,
}

/// The result of one `tide.verify` call.
#[derive(Debug)]
pub struct Verify {
    /// Rows for differing ranges (`range` not NULL).
    pub ranges: Vec<VRow>,
    /// Rows of kind 'column values' (from `sample`).
    pub columns: Vec<VRow>,
    pub summary: VRow,
    pub checked: i64,
    pub differ: i64,
    pub took: Duration,
}

impl Verify {
    pub fn dump(&self) -> String {
        let mut s = String::new();
        for r in self.ranges.iter().chain(&self.columns) {
            s.push_str(&format!("  {r:?}\n"));
        }
        s.push_str(&format!("  {:?}", self.summary));
        s
    }
}

/// "summary: N ranges checked, M differ..." → (N, M).
pub fn parse_summary(kind: &str) -> Option<(i64, i64)> {
    let rest = kind.strip_prefix("summary: ")?;
    let (n, rest) = rest.split_once(" ranges checked, ")?;
    let m = rest.split_whitespace().next()?;
    Some((n.parse().ok()?, m.parse().ok()?))
}

pub fn try_verify(c: &Cluster, args: &str) -> Result<Verify, postgres::Error> {
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
pub fn verify(c: &Cluster, args: &str) -> Verify {
    try_verify(c, args).unwrap_or_else(|e| {
        panic!(
            "tide.verify({args}) failed: {}\n{}",
            describe_error(&e),
            diag(c)
        )
    })
}

/// Table `t` (id, v, note) with `rows` rows (v = 10 id, note 'n' || id), added with its backfill
/// to a new pipeline `v` of `target` with `options`; waits for the backfill (`secs` at most) and
/// returns how long that took.
pub fn replicated_t(c: &Cluster, rows: i64, target: &str, options: &str, secs: u32) -> Duration {
    exec(
        c,
        &format!(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
             INSERT INTO t SELECT g, g * 10, 'n' || g FROM generate_series(1, {rows}) g;"
        ),
    );
    create_pipeline(c, "v", target, options);
    exec(c, "SELECT tide.add_table('v', 'public.t')");
    wait_backfill(c, "public.t", "v", secs)
}

/// One random single-statement write per transaction on a key in [lo, hi]: an update, a delete
/// or an upsert (single-row autocommit statements: no deadlocks between clients).
pub fn writer_script(lo: i64, hi: i64) -> String {
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
pub fn bench_connected(c: &Cluster) -> bool {
    c.try_query_scalar::<i64>(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'",
    )
    .map(|n| n > 0)
    .unwrap_or(false)
}

/// Stop pgbench by terminating its sessions (its exit status is then non-zero: that is
/// expected). Returns (transactions processed, elapsed, pgbench's status line and tps).
pub fn stop_bench(c: &Cluster, mut b: PgbenchRun) -> (u64, Duration, String) {
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
pub struct VerificationRow {
    pub verification_id: i64,
    pub finished: bool,
    pub ranges_checked: Option<i32>,
    pub ranges_differing: Option<i32>,
    pub source_rows: Option<i64>,
    pub target_rows: Option<i64>,
    pub missing: Option<i64>,
    pub extra: Option<i64>,
    pub changed: Option<i64>,
    pub repair_backfill_id: Option<i64>,
    pub repair_state: Option<String>,
}

pub fn verification(c: &Cluster, pipeline: &str, source: &str) -> VerificationRow {
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
pub struct Repair {
    pub ranges_differing: i32,
    pub rows_missing_or_changed: i64,
    pub rows_extra: i64,
    pub backfill_id: Option<i64>,
    pub action: String,
}

#[track_caller]
pub fn repair(c: &Cluster, args: &str) -> Repair {
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

/// Rows of the table `t` the corruption and heavy-writes tests start from.
pub const ROWS: i64 = 10_000;
