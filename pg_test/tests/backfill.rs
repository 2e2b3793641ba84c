//! Backfill e2e tests: the watermark backfill (DBLog) of existing rows, interleaved with the change
//! stream, converges under concurrent writes and worker crashes, resumes where it stopped, keeps
//! memory and snapshot age bounded, honours conditions and throttles, reports readiness, and
//! rejects bad input with clear SQLSTATEs.
//!
//! The convergence check used throughout: replay the outbox in `id` order onto an EMPTY copy of
//! each source table (`read`/`insert`/`update` = upsert of `jsonb_populate_record(NULL::copy,
//! row)` by key, `delete` = delete by key, `truncate` = empty the copy), then compare the copy
//! with the source both ways (`EXCEPT ALL`); 0 rows either way means the stream plus the backfill
//! rebuilt the table exactly.
//!
//! Needs pg_tide installed into the system PostgreSQL 15 (`scripts/install.sh`).
//! Each test runs on its own scratch cluster (pg_tide preloaded, `wal_level = logical`).

use pg_test::*;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const WORKER: &str = "pg_tide worker";
const POLL: Duration = Duration::from_millis(100);

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

/// A started cluster with the extension created and its launcher running.
fn setup(name: &str) -> Cluster {
    let c = Cluster::new(name);
    c.execute("CREATE EXTENSION pg_tide");
    c.wait_until(
        "the pg_tide launcher",
        Duration::from_secs(30),
        POLL,
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide launcher'",
            )? == 1)
        },
    );
    c
}

/// Poll without panicking; Err(message) on timeout.
fn poll_every<F>(timeout: Duration, every: Duration, mut f: F) -> Result<Duration, String>
where
    F: FnMut() -> TestResult<bool>,
{
    let start = Instant::now();
    let mut last: String;
    loop {
        match f() {
            Ok(true) => return Ok(start.elapsed()),
            Ok(false) => last = "condition was false".into(),
            Err(e) => last = format!("error: {e}"),
        }
        if start.elapsed() >= timeout {
            return Err(format!(
                "not true after {:.1?}; last: {last}",
                start.elapsed()
            ));
        }
        std::thread::sleep(every);
    }
}

/// Rows of a query as JSON lines (for failure messages), at most `limit`.
fn sample(c: &Cluster, sql: &str, limit: usize) -> String {
    match c.try_query(&format!(
        "SELECT row_to_json(q)::text FROM ({sql}) q LIMIT {limit}"
    )) {
        Ok(rows) => rows
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(query failed: {})", describe_error(&e)),
    }
}

/// Pipelines, backfills and the server log tail, for failure messages.
fn diag(c: &Cluster) -> String {
    format!(
        "--- tide.pipelines ---\n{}\n--- tide.backfills ---\n{}\n--- last 40 lines of {} ---\n{}\n--- end of server log ---",
        sample(c, "SELECT name, state, worker_pid, lag_bytes, events_applied, last_error FROM tide.pipelines", 10),
        sample(
            c,
            "SELECT id, pipeline, relation, state, generation, chunk_size, rows_per_second, chunks_done, \
                    rows_read, rows_dropped, rows_emitted, last_key, error FROM tide.backfills ORDER BY id",
            20
        ),
        c.log_path().display(),
        c.log_tail(40)
    )
}

/// Assert that a query returns no rows; the failure shows up to 20 of them.
#[track_caller]
fn assert_no_rows(c: &Cluster, what: &str, sql: &str) {
    let n: i64 = c.query_scalar(&format!("SELECT count(*) FROM ({sql}) q"));
    assert_eq!(
        n,
        0,
        "{what}: {n} offending rows, e.g.:\n{}",
        sample(c, sql, 20)
    );
}

/// Create a pipeline and wait until its worker streams.
fn create_pipeline(c: &Cluster, name: &str) {
    c.execute(&format!("SELECT tide.create_pipeline('{name}')"));
    if let Err(msg) = poll_every(Duration::from_secs(30), POLL, || {
        Ok(c.try_query_scalar::<bool>(&format!(
            "SELECT coalesce((SELECT state = 'streaming' AND worker_pid IS NOT NULL
                                FROM tide.pipelines WHERE name = '{name}'), false)"
        ))?)
    }) {
        panic!(
            "pipeline {name:?} did not reach state 'streaming': {msg}\n{}",
            diag(c)
        );
    }
}

/// `tide.add_table` (with or without the automatic backfill), then wait until it captures.
fn add_table(c: &Cluster, pipeline: &str, table: &str, backfill: bool) {
    c.execute(&format!(
        "SELECT tide.add_table('{pipeline}', '{table}', backfill => {backfill})"
    ));
    if let Err(msg) = poll_every(Duration::from_secs(30), POLL, || {
        Ok(c.try_query_scalar::<bool>(&format!(
            "SELECT coalesce((SELECT state = 'capturing' FROM tide.tables
                               WHERE pipeline = '{pipeline}' AND source = '{table}'::regclass), false)"
        ))?)
    }) {
        panic!(
            "{table} is not capturing for pipeline {pipeline:?}: {msg}\n{}",
            diag(c)
        );
    }
}

/// `tide.wait_for_pipeline`, which must return true within `secs`.
#[track_caller]
fn wait_pipeline(c: &Cluster, name: &str, secs: u32) {
    let t = Instant::now();
    let ok: bool = c.query_scalar(&format!(
        "SELECT tide.wait_for_pipeline('{name}', '{secs} seconds')"
    ));
    if !ok {
        panic!(
            "tide.wait_for_pipeline('{name}', '{secs} seconds') returned false after {:.1?}\n{}",
            t.elapsed(),
            diag(c)
        );
    }
}

/// `tide.wait_for_backfill`, which must return true within `secs`. Returns how long it took.
#[track_caller]
fn wait_backfill(c: &Cluster, table: &str, secs: u32) -> Duration {
    let t = Instant::now();
    let res = c.try_query_scalar::<bool>(&format!(
        "SELECT tide.wait_for_backfill('{table}', timeout => '{secs} seconds')"
    ));
    match res {
        Ok(true) => t.elapsed(),
        Ok(false) => panic!(
            "tide.wait_for_backfill('{table}', '{secs} seconds') returned false after {:.1?}\n{}",
            t.elapsed(),
            diag(c)
        ),
        Err(e) => panic!(
            "tide.wait_for_backfill('{table}') failed: {}\n{}",
            describe_error(&e),
            diag(c)
        ),
    }
}

fn worker_pid(c: &Cluster, pipeline: &str) -> Option<i32> {
    c.try_query_scalar::<Option<i32>>(&format!(
        "SELECT (SELECT worker_pid FROM tide.pipelines WHERE name = '{pipeline}')"
    ))
    .ok()
    .flatten()
}

/// One integer column of a backfill's row in `tide.backfills`.
fn bf_i64(c: &Cluster, id: i64, col: &str) -> i64 {
    c.query_scalar(&format!(
        "SELECT {col}::int8 FROM tide.backfills WHERE id = {id}"
    ))
}

fn bf_state(c: &Cluster, id: i64) -> String {
    c.query_scalar(&format!("SELECT state FROM tide.backfills WHERE id = {id}"))
}

fn kill9(pid: i32) {
    let st = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -9 {pid} failed: {st}");
}

/// Wait until the server accepts connections again and the pipeline has a streaming worker
/// whose pid differs from `old_pid`.
fn wait_recovered(c: &Cluster, pipeline: &str, old_pid: Option<i32>) -> Duration {
    match poll_every(Duration::from_secs(90), POLL, || {
        let pid = c.try_query_scalar::<Option<i32>>(&format!(
            "SELECT (SELECT worker_pid FROM tide.pipelines WHERE name = '{pipeline}' AND state = 'streaming')"
        ))?;
        Ok(pid.is_some() && pid != old_pid)
    }) {
        Ok(d) => d,
        Err(msg) => panic!(
            "the server or the pipeline worker did not come back: {msg}\n{}",
            diag(c)
        ),
    }
}

/// A pgbench script file readable by the postgres OS user.
fn write_script(tag: &str, body: &str) -> PathBuf {
    let path =
        std::env::temp_dir().join(format!("pg_tide_backfill_{tag}_{}.sql", std::process::id()));
    std::fs::write(&path, body).expect("write pgbench script");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    path
}

struct BenchRun {
    child: std::process::Child,
    started: Instant,
}

/// Start pgbench with `script` (not waiting for it); a crash may cut it short.
fn spawn_pgbench(
    c: &Cluster,
    script: &PathBuf,
    clients: u32,
    secs: u64,
    rate: Option<u32>,
) -> BenchRun {
    let mut cmd = command_as_postgres(pg_bin().join("pgbench"));
    cmd.current_dir("/")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &c.port().to_string(),
            "-U",
            "postgres",
        ])
        .arg("-n")
        .arg("-f")
        .arg(script)
        .args([
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
            "-T",
            &secs.to_string(),
        ])
        .arg("--max-tries=20");
    if let Some(r) = rate {
        cmd.args(["-R", &r.to_string()]);
    }
    cmd.arg("postgres")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start pgbench: {e}"));
    BenchRun {
        child,
        started: Instant::now(),
    }
}

/// Wait for pgbench to end; returns (transactions processed, success, summary).
fn finish_pgbench(run: BenchRun) -> (u64, bool, String) {
    let out = run.child.wait_with_output().expect("wait for pgbench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let txns = stdout
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("number of transactions actually processed: ")
        })
        .and_then(|s| s.split(|ch: char| !ch.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let failed = stdout
        .lines()
        .find(|l| l.trim().starts_with("number of failed transactions"))
        .unwrap_or("")
        .trim()
        .to_string();
    let errs: Vec<&str> = stderr.lines().take(3).collect();
    (
        txns,
        out.status.success(),
        format!(
            "{} after {:.1?}; {failed}{}",
            out.status,
            run.started.elapsed(),
            if errs.is_empty() {
                String::new()
            } else {
                format!(" [{}]", errs.join(" | "))
            }
        ),
    )
}

/// An empty copy of `source` (same columns and key) named `copy`, and a plpgsql function
/// `<copy>_replay(pipeline, skip_deletes)` that replays the outbox events of `relation` onto it
/// in id order. Static SQL, so plans are cached: ~tens of thousands of events per second.
fn make_copy(c: &Cluster, source: &str, relation: &str, copy: &str, keys: &[&str]) {
    let matches = keys
        .iter()
        .map(|k| format!("c.\"{k}\" = k.\"{k}\""))
        .collect::<Vec<_>>()
        .join(" AND ");
    let rel = relation.replace('\'', "''");
    c.execute(&format!(
        r#"
CREATE TABLE {copy} (LIKE {source} INCLUDING ALL);
CREATE FUNCTION {copy}_replay(p_pipeline text, p_skip_deletes boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE
    e record;
    n bigint := 0;
BEGIN
    FOR e IN SELECT o.id, o.op, o.key, o."row", o.unchanged FROM tide.outbox o
              WHERE o.pipeline = p_pipeline AND o.relation = '{rel}' ORDER BY o.id
    LOOP
        n := n + 1;
        IF e.op IN ('read', 'insert', 'update') THEN
            IF coalesce(cardinality(e.unchanged), 0) > 0 THEN
                RAISE EXCEPTION 'event % has unchanged columns %; this replay does not merge them', e.id, e.unchanged;
            END IF;
            -- upsert by key
            DELETE FROM {copy} c USING jsonb_populate_record(NULL::{copy}, e.key) k WHERE {matches};
            INSERT INTO {copy} SELECT * FROM jsonb_populate_record(NULL::{copy}, e."row");
        ELSIF e.op = 'delete' THEN
            IF NOT p_skip_deletes THEN
                DELETE FROM {copy} c USING jsonb_populate_record(NULL::{copy}, e.key) k WHERE {matches};
            END IF;
        ELSIF e.op = 'truncate' THEN
            DELETE FROM {copy};
        ELSE
            RAISE EXCEPTION 'event % has unknown op %', e.id, e.op;
        END IF;
    END LOOP;
    RETURN n;
END
$f$;
"#
    ));
}

/// Empty `copy` and replay the pipeline's events onto it; returns the number of events.
fn replay(c: &Cluster, copy: &str, pipeline: &str, skip_deletes: bool) -> i64 {
    c.execute(&format!("TRUNCATE {copy}"));
    c.query_scalar(&format!(
        "SELECT {copy}_replay('{pipeline}', {skip_deletes})"
    ))
}

/// (rows in source not in copy, rows in copy not in source).
fn set_difference(c: &Cluster, source: &str, copy: &str) -> (i64, i64) {
    let r = c.query_one(&format!(
        "SELECT (SELECT count(*) FROM (SELECT * FROM {source} EXCEPT ALL SELECT * FROM {copy}) a),
                (SELECT count(*) FROM (SELECT * FROM {copy} EXCEPT ALL SELECT * FROM {source}) b)"
    ));
    (r.get(0), r.get(1))
}

#[track_caller]
fn assert_converged(c: &Cluster, source: &str, copy: &str) {
    let (missing, extra) = set_difference(c, source, copy);
    assert!(
        missing == 0 && extra == 0,
        "replayed copy {copy} differs from {source}: {missing} source rows missing or different in the copy, \
         {extra} copy rows not in the source\n--- source EXCEPT copy ---\n{}\n--- copy EXCEPT source ---\n{}",
        sample(c, &format!("SELECT * FROM {source} EXCEPT ALL SELECT * FROM {copy}"), 10),
        sample(c, &format!("SELECT * FROM {copy} EXCEPT ALL SELECT * FROM {source}"), 10),
    );
}

/// Invariants of one finished backfill, from `tide.backfills`, `tide.chunks` and `tide.outbox`.
/// Returns the largest number of `read` events of one key in this backfill.
fn check_backfill_invariants(c: &Cluster, id: i64) -> i64 {
    let state = bf_state(c, id);
    assert_eq!(state, "done", "backfill {id} is not done\n{}", diag(c));
    let (chunks_done, rows_read, rows_dropped, rows_emitted) = (
        bf_i64(c, id, "chunks_done"),
        bf_i64(c, id, "rows_read"),
        bf_i64(c, id, "rows_dropped"),
        bf_i64(c, id, "rows_emitted"),
    );
    assert_eq!(
        rows_read,
        rows_dropped + rows_emitted,
        "backfill {id}: rows_read <> rows_dropped + rows_emitted"
    );
    let events: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.outbox WHERE backfill_id = {id}"
    ));
    assert_eq!(
        events, rows_emitted,
        "backfill {id}: {events} events in the outbox but rows_emitted = {rows_emitted}"
    );
    assert_no_rows(
        c,
        &format!("backfill {id}: events with a backfill_id that are not 'read' or lack a chunk"),
        &format!(
            "SELECT id, op, chunk FROM tide.outbox WHERE backfill_id = {id} AND (op <> 'read' OR chunk IS NULL)"
        ),
    );
    assert_no_rows(
        c,
        &format!("backfill {id}: a chunk emitted in more than one target transaction"),
        &format!(
            "SELECT chunk, count(DISTINCT commit_lsn) FROM tide.outbox WHERE backfill_id = {id}
              GROUP BY chunk HAVING count(DISTINCT commit_lsn) > 1"
        ),
    );
    assert_no_rows(
        c,
        &format!("backfill {id}: chunk numbers go backwards in outbox order (a restart)"),
        &format!(
            "SELECT * FROM (SELECT id, chunk, lag(chunk) OVER (ORDER BY id) AS prev
                              FROM tide.outbox WHERE backfill_id = {id}) s WHERE chunk < prev"
        ),
    );
    // tide.chunks: unique, numbered 1..chunks_done, contiguous key ranges, sums match.
    let r = c.query_one(&format!(
        "SELECT count(*), count(DISTINCT chunk), coalesce(min(chunk), 0), coalesce(max(chunk), 0),
                coalesce(sum(rows_read), 0)::int8, coalesce(sum(rows_dropped), 0)::int8,
                coalesce(sum(rows_emitted), 0)::int8
           FROM tide.chunks WHERE backfill_id = {id}"
    ));
    let (n, distinct, min, max, sread, sdropped, semitted): (i64, i64, i64, i64, i64, i64, i64) = (
        r.get(0),
        r.get(1),
        r.get(2),
        r.get(3),
        r.get(4),
        r.get(5),
        r.get(6),
    );
    assert_eq!(
        n, distinct,
        "backfill {id}: duplicate chunk numbers in tide.chunks"
    );
    assert!(
        chunks_done <= 1000,
        "test tables are meant to need at most 1000 chunks"
    );
    assert_eq!(
        (n, min, max),
        (chunks_done, 1, chunks_done),
        "backfill {id}: tide.chunks should hold chunks 1..{chunks_done}\n{}",
        sample(c, &format!("SELECT chunk, key_from, key_to, rows_read FROM tide.chunks WHERE backfill_id = {id} ORDER BY chunk"), 20)
    );
    assert_eq!(
        (sread, sdropped, semitted),
        (rows_read, rows_dropped, rows_emitted),
        "backfill {id}: sums over tide.chunks differ from tide.backfills"
    );
    assert_no_rows(
        c,
        &format!("backfill {id}: chunk key ranges are not contiguous"),
        &format!(
            "SELECT * FROM (SELECT chunk, key_from, lag(key_to) OVER (ORDER BY chunk) AS prev_to,
                                   lag(chunk) OVER (ORDER BY chunk) AS prev
                              FROM tide.chunks WHERE backfill_id = {id}) s
              WHERE (prev IS NULL AND key_from IS NOT NULL) OR (prev IS NOT NULL AND key_from IS DISTINCT FROM prev_to)"
        ),
    );
    let max_reads: i64 = c.query_scalar(&format!(
        "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM tide.outbox WHERE backfill_id = {id} GROUP BY key) s"
    ));
    assert!(
        max_reads <= 2,
        "backfill {id}: a key was emitted {max_reads} times (at most one chunk may be read again after a crash)\n{}",
        sample(c, &format!("SELECT key, array_agg(chunk ORDER BY id) FROM tide.outbox WHERE backfill_id = {id} GROUP BY key HAVING count(*) > 2"), 10)
    );
    max_reads
}

// ------------------------------------------------------------------------------------------
// 1. Convergence under concurrent writes, with kill -9 of the worker mid-backfill
// ------------------------------------------------------------------------------------------

const CONVERGE_SCHEMA: &str = r#"
CREATE TABLE t_int (id int PRIMARY KEY, v int, s text);
CREATE TABLE t_comp (a int, b text, v int, PRIMARY KEY (a, b));
CREATE TABLE t_uuid (id uuid PRIMARY KEY, v int);
-- The key universe: 15,000 keys per table (k -> each table's key), 10,000 of them seeded.
CREATE TABLE universe (k int PRIMARY KEY, a int NOT NULL, b text NOT NULL, u uuid NOT NULL UNIQUE);
INSERT INTO universe SELECT k, (k - 1) / 10 + 1, format('b %s''s', (k - 1) % 10), md5('tide-' || k)::uuid
  FROM generate_series(1, 15000) k;
INSERT INTO t_int SELECT k, k, 'seed ' || k FROM universe WHERE k % 3 <> 0;
INSERT INTO t_comp SELECT a, b, k FROM universe WHERE k % 3 <> 0;
INSERT INTO t_uuid SELECT u, k FROM universe WHERE k % 3 <> 0;
-- Key changes (a delete of the old key and an insert of the new one in the stream); a move onto
-- an existing key is skipped, in a subtransaction.
CREATE FUNCTION move_int(p_from int, p_to int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE t_int SET id = p_to, s = 'moved from ' || p_from WHERE id = p_from;
EXCEPTION WHEN unique_violation THEN NULL;
END $$;
CREATE FUNCTION move_comp(p_from int, p_to int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE t_comp t SET a = u2.a, b = u2.b, v = -p_from
      FROM universe u1, universe u2
     WHERE u1.k = p_from AND u2.k = p_to AND t.a = u1.a AND t.b = u1.b;
EXCEPTION WHEN unique_violation THEN NULL;
END $$;
CREATE FUNCTION move_uuid(p_from int, p_to int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE t_uuid SET id = (SELECT u FROM universe WHERE k = p_to), v = -p_from
     WHERE id = (SELECT u FROM universe WHERE k = p_from);
EXCEPTION WHEN unique_violation THEN NULL;
END $$;
"#;

/// Random inserts (upserts), updates, key changes, deletes and delete+re-insert transactions on
/// random existing and new keys of the three tables.
const CONVERGE_SCRIPT: &str = r#"\set k random(1, 15000)
\set k2 random(1, 15000)
\set v random(1, 1000000)
\set a (:k - 1) / 10 + 1
\set bn (:k - 1) % 10
\set r random(1, 99)
\if :r <= 11
INSERT INTO t_int VALUES (:k, :v, 'w ' || :v) ON CONFLICT (id) DO UPDATE SET v = excluded.v, s = excluded.s;
\elif :r <= 19
UPDATE t_int SET v = v + 1, s = 'u ' || :v WHERE id = :k;
\elif :r <= 21
SELECT move_int(:k, :k2);
\elif :r <= 29
DELETE FROM t_int WHERE id = :k;
\elif :r <= 33
BEGIN;
DELETE FROM t_int WHERE id = :k;
INSERT INTO t_int VALUES (:k, :v, 'again ' || :v) ON CONFLICT (id) DO UPDATE SET v = excluded.v, s = excluded.s;
UPDATE t_int SET v = -v WHERE id = :k2;
COMMIT;
\elif :r <= 44
INSERT INTO t_comp VALUES (:a, format('b %s''s', :bn), :v) ON CONFLICT (a, b) DO UPDATE SET v = excluded.v;
\elif :r <= 52
UPDATE t_comp SET v = v + 1 WHERE a = :a AND b = format('b %s''s', :bn);
\elif :r <= 54
SELECT move_comp(:k, :k2);
\elif :r <= 62
DELETE FROM t_comp WHERE a = :a AND b = format('b %s''s', :bn);
\elif :r <= 66
BEGIN;
DELETE FROM t_comp WHERE a = :a AND b = format('b %s''s', :bn);
INSERT INTO t_comp VALUES (:a, format('b %s''s', :bn), :v) ON CONFLICT (a, b) DO UPDATE SET v = excluded.v;
UPDATE t_comp SET v = -v WHERE (a, b) = (SELECT a, b FROM universe WHERE k = :k2);
COMMIT;
\elif :r <= 77
INSERT INTO t_uuid SELECT u, :v FROM universe WHERE k = :k ON CONFLICT (id) DO UPDATE SET v = excluded.v;
\elif :r <= 85
UPDATE t_uuid SET v = v + 1 WHERE id = (SELECT u FROM universe WHERE k = :k);
\elif :r <= 87
SELECT move_uuid(:k, :k2);
\elif :r <= 95
DELETE FROM t_uuid WHERE id = (SELECT u FROM universe WHERE k = :k);
\else
BEGIN;
DELETE FROM t_uuid WHERE id = (SELECT u FROM universe WHERE k = :k);
INSERT INTO t_uuid SELECT u, :v FROM universe WHERE k = :k ON CONFLICT (id) DO UPDATE SET v = excluded.v;
UPDATE t_uuid SET v = -v WHERE id = (SELECT u FROM universe WHERE k = :k2);
COMMIT;
\endif
"#;

const CONVERGE_TABLES: [(&str, &[&str]); 3] = [
    ("t_int", &["id"]),
    ("t_comp", &["a", "b"]),
    ("t_uuid", &["id"]),
];

/// What the backfills looked like just before a kill, in one snapshot.
struct KillPoint {
    /// Largest outbox id committed before the kill.
    max_outbox_id: i64,
    /// (backfill id, chunks_done, state) per backfill.
    progress: Vec<(i64, i64, String)>,
}

fn kill_point(c: &Cluster, ids: &[i64]) -> KillPoint {
    let mut cl = c.client();
    let mut tx = cl.transaction().expect("begin");
    tx.batch_execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .expect("repeatable read");
    let max_outbox_id: i64 = tx
        .query_one("SELECT coalesce(max(id), 0) FROM tide.outbox", &[])
        .expect("max outbox id")
        .get(0);
    let progress = ids
        .iter()
        .map(|id| {
            let r = tx
                .query_one(
                    "SELECT chunks_done, state FROM tide.backfill WHERE id = $1",
                    &[id],
                )
                .expect("backfill progress");
            (*id, r.get::<_, i64>(0), r.get::<_, String>(1))
        })
        .collect();
    tx.commit().expect("commit");
    KillPoint {
        max_outbox_id,
        progress,
    }
}

fn total_chunks(c: &Cluster, ids: &[i64]) -> TestResult<i64> {
    let list = ids
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    Ok(c.try_query_scalar::<i64>(&format!(
        "SELECT coalesce(sum(chunks_done), 0)::int8 FROM tide.backfill WHERE id IN ({list})"
    ))?)
}

fn all_done(c: &Cluster, ids: &[i64]) -> TestResult<bool> {
    let list = ids
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    Ok(c.try_query_scalar::<bool>(&format!(
        "SELECT bool_and(state = 'done') FROM tide.backfill WHERE id IN ({list})"
    ))?)
}

#[test]
fn convergence_under_concurrent_writes_with_kill9() {
    const P: &str = "conv";
    let t_all = Instant::now();
    let c = setup("bf_converge");
    c.execute(CONVERGE_SCHEMA);
    create_pipeline(&c, P);
    for (t, keys) in CONVERGE_TABLES {
        add_table(&c, P, t, false);
        make_copy(&c, t, &format!("public.{t}"), &format!("copy_{t}"), keys);
    }
    let seeded_deleted_before: i64 = c.query_scalar(
        "SELECT (SELECT count(*) FROM universe WHERE k % 3 <> 0) * 3
              - (SELECT count(*) FROM t_int) - (SELECT count(*) FROM t_comp) - (SELECT count(*) FROM t_uuid)",
    );
    assert_eq!(seeded_deleted_before, 0, "the seed is not 3 x 10,000 rows");
    let script = write_script("converge", CONVERGE_SCRIPT);

    // Phase 1: writers at full speed; once their changes stream, start the three backfills.
    let mut run = spawn_pgbench(&c, &script, 4, 120, None);
    c.wait_until(
        "the writers' changes to reach the outbox",
        Duration::from_secs(60),
        POLL,
        || {
            Ok(
                c.try_query_scalar::<i64>("SELECT count(*) FROM tide.outbox WHERE op <> 'read'")?
                    >= 500,
            )
        },
    );
    let ids: Vec<i64> = {
        let r = c.query_one(
            "SELECT tide.start_backfill('t_int', chunk_size => 500),
                    tide.start_backfill('t_comp', chunk_size => 500),
                    tide.start_backfill('t_uuid', pipeline => 'conv', chunk_size => 500)",
        );
        vec![r.get(0), r.get(1), r.get(2)]
    };
    // A throttle keeps the backfills running long enough for two crashes to land mid-way
    // (chunks still interleave with the writers: only the pause between chunks grows).
    for (t, _) in CONVERGE_TABLES {
        c.execute(&format!(
            "SELECT tide.alter_backfill('{t}', rows_per_second => 2500)"
        ));
    }
    let t_backfill = Instant::now();

    // Two kill -9 of the worker while the backfills run; pgbench dies with the server's
    // backends each time and is restarted.
    let mut kills: Vec<KillPoint> = Vec::new();
    let mut txns_total = 0u64;
    let mut chunks_before = 0i64;
    for k in 1..=2 {
        let target = chunks_before + 4;
        c.wait_until(
            &format!("{target} backfill chunks before kill {k}"),
            Duration::from_secs(120),
            Duration::from_millis(50),
            || Ok(total_chunks(&c, &ids)? >= target),
        );
        let kp = kill_point(&c, &ids);
        assert!(
            kp.progress
                .iter()
                .any(|(_, _, s)| s == "running" || s == "queued"),
            "kill {k}: every backfill already finished; the kill would not hit a backfill\n{}",
            diag(&c)
        );
        let victim = worker_pid(&c, P).unwrap_or_else(|| panic!("no worker to kill\n{}", diag(&c)));
        kill9(victim);
        let (txns, _ok, summary) = finish_pgbench(run);
        txns_total += txns;
        let back = wait_recovered(&c, P, Some(victim));
        eprintln!(
            "converge: kill {k}: kill -9 worker {victim} at {:.1?} into the backfill, progress {:?}; \
             pgbench {txns} txns ({summary}); worker back in {back:.1?}",
            t_backfill.elapsed(),
            kp.progress
        );
        kills.push(kp);
        // Kill again only once the resumed worker made progress.
        chunks_before = total_chunks(&c, &ids).expect("backfill progress");
        if k == 1 {
            run = spawn_pgbench(&c, &script, 4, 120, None);
        } else {
            break;
        }
    }
    // Lift the throttle and keep writing, in bounded rounds, until every backfill is done.
    for (t, _) in CONVERGE_TABLES {
        c.execute(&format!(
            "SELECT tide.alter_backfill('{t}', rows_per_second => 0)"
        ));
    }
    let mut rounds = 0;
    while !all_done(&c, &ids).unwrap_or(false) {
        rounds += 1;
        assert!(
            rounds <= 30,
            "the backfills did not finish within 30 rounds of writes\n{}",
            diag(&c)
        );
        let (txns, ok, summary) = finish_pgbench(spawn_pgbench(&c, &script, 4, 3, None));
        txns_total += txns;
        assert!(
            ok,
            "pgbench failed without a crash: {summary}\n{}",
            diag(&c)
        );
    }
    let backfill_time = t_backfill.elapsed();
    let _ = std::fs::remove_file(&script);

    let t_wait = Instant::now();
    for (t, _) in CONVERGE_TABLES {
        wait_backfill(&c, t, 180);
    }
    wait_pipeline(&c, P, 180);
    let catch_up = t_wait.elapsed();

    // Event counts.
    eprintln!(
        "converge: {txns_total} pgbench txns; backfills took {backfill_time:.1?} (+{rounds} write rounds after the kills); \
         catch-up {catch_up:.1?}\n{}\n{}",
        sample(
            &c,
            "SELECT relation, op, count(*) FROM tide.outbox WHERE pipeline = 'conv' GROUP BY 1, 2 ORDER BY 1, 2",
            30
        ),
        sample(
            &c,
            "SELECT id, relation, state, chunks_done, rows_read, rows_dropped, rows_emitted FROM tide.backfills ORDER BY id",
            10
        )
    );
    assert!(
        c.log_count("terminated by signal 9") >= 2,
        "expected two worker kills in the server log\n{}",
        c.log_tail(60)
    );

    // Replay onto the empty copies and compare.
    let t_replay = Instant::now();
    for (t, _) in CONVERGE_TABLES {
        let n = replay(&c, &format!("copy_{t}"), P, false);
        let rows: i64 = c.query_scalar(&format!("SELECT count(*) FROM {t}"));
        eprintln!("converge: replayed {n} events onto copy_{t}; source has {rows} rows");
        assert_converged(&c, t, &format!("copy_{t}"));
    }
    eprintln!("converge: replay took {:.1?}", t_replay.elapsed());

    // No resurrected deletes (covered above, asserted explicitly) and deletes did happen.
    for (t, keys) in CONVERGE_TABLES {
        let cols = keys.join(", ");
        let resurrected: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM (SELECT {cols} FROM copy_{t} EXCEPT SELECT {cols} FROM {t}) x"
        ));
        assert_eq!(
            resurrected, 0,
            "{t}: keys deleted at the source exist in the copy"
        );
        let deleted_seeded: i64 = c.query_scalar(&match t {
            "t_int" => "SELECT count(*) FROM universe WHERE k % 3 <> 0 AND k NOT IN (SELECT id FROM t_int)".to_string(),
            "t_comp" => "SELECT count(*) FROM universe u WHERE k % 3 <> 0 AND NOT EXISTS (SELECT 1 FROM t_comp c WHERE (c.a, c.b) = (u.a, u.b))".to_string(),
            _ => "SELECT count(*) FROM universe WHERE k % 3 <> 0 AND u NOT IN (SELECT id FROM t_uuid)".to_string(),
        });
        let deletes: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM tide.outbox WHERE relation = 'public.{t}' AND op = 'delete'"
        ));
        eprintln!("converge: {t}: {deleted_seeded} seeded keys absent at the end, {deletes} delete events");
        assert!(
            deleted_seeded > 100 && deletes > 100,
            "{t}: too few deletes for the check to mean anything"
        );
        for op in ["insert", "update", "read"] {
            let n: i64 = c.query_scalar(&format!(
                "SELECT count(*) FROM tide.outbox WHERE relation = 'public.{t}' AND op = '{op}'"
            ));
            assert!(
                n > 100,
                "{t}: only {n} {op} events; the test did not do enough work"
            );
        }
    }

    // Reconciliation actually happened.
    let dropped: i64 = c.query_scalar(&format!(
        "SELECT sum(rows_dropped)::int8 FROM tide.backfills WHERE id IN ({}, {}, {})",
        ids[0], ids[1], ids[2]
    ));
    assert!(
        dropped > 0,
        "no backfill dropped a row: the windows never overlapped a write\n{}",
        diag(&c)
    );

    // Every backfill is consistent, and those hit by a kill resumed instead of restarting.
    let mut max_reads = 0;
    for id in &ids {
        max_reads = max_reads.max(check_backfill_invariants(&c, *id));
    }
    let mut resumed = 0;
    for (k, kp) in kills.iter().enumerate() {
        for (id, done_before, state) in &kp.progress {
            if state == "done" {
                continue;
            }
            assert_no_rows(
                &c,
                &format!("kill {}: backfill {id} re-emitted chunks it had finished before the kill", k + 1),
                &format!(
                    "SELECT id, chunk FROM tide.outbox WHERE backfill_id = {id} AND id > {} AND chunk <= {done_before}",
                    kp.max_outbox_id
                ),
            );
            if *done_before > 0 {
                let first_after: Option<i64> = c.query_scalar(&format!(
                    "SELECT min(chunk) FROM tide.outbox WHERE backfill_id = {id} AND id > {}",
                    kp.max_outbox_id
                ));
                eprintln!(
                    "converge: kill {}: backfill {id} had {done_before} chunks done; first chunk emitted after the kill: {first_after:?}",
                    k + 1
                );
                resumed += 1;
            }
        }
    }
    assert!(
        resumed >= 2,
        "expected each kill to interrupt a backfill that had emitted chunks ({resumed} did)"
    );
    let chunk_rows: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.chunks WHERE backfill_id IN ({}, {}, {})",
        ids[0], ids[1], ids[2]
    ));
    eprintln!(
        "converge: rows_dropped total {dropped}; {chunk_rows} chunks; max read events per key per backfill {max_reads}; \
         whole test {:.1?}",
        t_all.elapsed()
    );
}
