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
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(100);

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

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

/// Create an outbox pipeline and wait until its worker streams.
fn create_pipeline(c: &Cluster, name: &str) {
    pg_test::create_pipeline(c, name, "outbox", "{}");
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

/// `tide.wait_for_backfill`, which must return true within `secs`. Returns how long it took.
#[track_caller]
fn wait_backfill(c: &Cluster, table: &str, secs: u32) -> Duration {
    wait_for_backfill(c, table, None, secs, || diag(c))
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
    // Fresh statistics, or the self-join of the outbox below becomes a nested loop.
    c.execute("ANALYZE tide.outbox, tide.chunk");
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
    // The reconciliation rule itself: a row the stream changed between a chunk's low and high
    // watermarks must have been dropped from that chunk, not emitted (it would be stale).
    assert_no_rows(
        c,
        &format!("backfill {id}: a key changed inside its chunk's watermark window was emitted"),
        &format!(
            "SELECT r.id, r.chunk, r.key, s.id AS stream_id, s.op, s.commit_lsn, ch.low_lsn, ch.high_lsn
               FROM tide.outbox r
               JOIN tide.chunk ch ON ch.backfill_id = r.backfill_id AND ch.chunk = r.chunk
               JOIN tide.outbox s ON s.pipeline = r.pipeline AND s.relation = r.relation AND s.backfill_id IS NULL
                                 AND s.key = r.key AND s.commit_lsn > ch.low_lsn AND s.commit_lsn < ch.high_lsn
              WHERE r.backfill_id = {id}"
        ),
    );
    let null_lsns: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.chunk WHERE backfill_id = {id} AND (low_lsn IS NULL OR high_lsn IS NULL OR low_lsn >= high_lsn)"
    ));
    assert_eq!(
        null_lsns, 0,
        "backfill {id}: chunks without a proper low < high watermark"
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
CREATE INDEX ON universe (a, b);
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
/// random existing and new keys of the three tables. 60% of them hit the next ~600 keys after
/// the table's backfill progress (`last_key`), i.e. the chunk being read: the worst case for
/// the watermark windows.
const CONVERGE_SCRIPT: &str = r#"\set k random(1, 15000)
\set k2 random(1, 15000)
\set v random(1, 1000000)
\set off random(0, 600)
\set h random(1, 100)
SELECT coalesce((SELECT u.k FROM universe u WHERE u.k > (SELECT coalesce(b.last_key[1]::int, 0) FROM tide.backfill b WHERE b.relation = 'public.t_int' ORDER BY b.id DESC LIMIT 1) ORDER BY u.k OFFSET :off LIMIT 1), :k) AS fi, coalesce((SELECT u.k FROM universe u WHERE (u.a, u.b) > (SELECT coalesce(b.last_key[1]::int, 0), coalesce(b.last_key[2], '') FROM tide.backfill b WHERE b.relation = 'public.t_comp' ORDER BY b.id DESC LIMIT 1) ORDER BY u.a, u.b OFFSET :off LIMIT 1), :k) AS fc, coalesce((SELECT u.k FROM universe u WHERE u.u > (SELECT coalesce(b.last_key[1]::uuid, '00000000-0000-0000-0000-000000000000') FROM tide.backfill b WHERE b.relation = 'public.t_uuid' ORDER BY b.id DESC LIMIT 1) ORDER BY u.u OFFSET :off LIMIT 1), :k) AS fu \gset
\set ki case when :h <= 60 then :fi else :k end
\set kc case when :h <= 60 then :fc else :k end
\set ku case when :h <= 60 then :fu else :k end
\set a (:kc - 1) / 10 + 1
\set bn (:kc - 1) % 10
\set r random(1, 99)
\if :r <= 11
INSERT INTO t_int VALUES (:ki, :v, 'w ' || :v) ON CONFLICT (id) DO UPDATE SET v = excluded.v, s = excluded.s;
\elif :r <= 19
UPDATE t_int SET v = v + 1, s = 'u ' || :v WHERE id = :ki;
\elif :r <= 21
SELECT move_int(:ki, :k2);
\elif :r <= 29
DELETE FROM t_int WHERE id = :ki;
\elif :r <= 33
BEGIN;
DELETE FROM t_int WHERE id = :ki;
INSERT INTO t_int VALUES (:ki, :v, 'again ' || :v) ON CONFLICT (id) DO UPDATE SET v = excluded.v, s = excluded.s;
UPDATE t_int SET v = -v WHERE id = :k2;
COMMIT;
\elif :r <= 44
INSERT INTO t_comp VALUES (:a, format('b %s''s', :bn), :v) ON CONFLICT (a, b) DO UPDATE SET v = excluded.v;
\elif :r <= 52
UPDATE t_comp SET v = v + 1 WHERE a = :a AND b = format('b %s''s', :bn);
\elif :r <= 54
SELECT move_comp(:kc, :k2);
\elif :r <= 62
DELETE FROM t_comp WHERE a = :a AND b = format('b %s''s', :bn);
\elif :r <= 66
BEGIN;
DELETE FROM t_comp WHERE a = :a AND b = format('b %s''s', :bn);
INSERT INTO t_comp VALUES (:a, format('b %s''s', :bn), :v) ON CONFLICT (a, b) DO UPDATE SET v = excluded.v;
UPDATE t_comp SET v = -v WHERE (a, b) = (SELECT a, b FROM universe WHERE k = :k2);
COMMIT;
\elif :r <= 77
INSERT INTO t_uuid SELECT u, :v FROM universe WHERE k = :ku ON CONFLICT (id) DO UPDATE SET v = excluded.v;
\elif :r <= 85
UPDATE t_uuid SET v = v + 1 WHERE id = (SELECT u FROM universe WHERE k = :ku);
\elif :r <= 87
SELECT move_uuid(:ku, :k2);
\elif :r <= 95
DELETE FROM t_uuid WHERE id = (SELECT u FROM universe WHERE k = :ku);
\else
BEGIN;
DELETE FROM t_uuid WHERE id = (SELECT u FROM universe WHERE k = :ku);
INSERT INTO t_uuid SELECT u, :v FROM universe WHERE k = :ku ON CONFLICT (id) DO UPDATE SET v = excluded.v;
UPDATE t_uuid SET v = -v WHERE id = (SELECT u FROM universe WHERE k = :k2);
COMMIT;
\endif
"#;

/// Total pgbench rate of the writers. "Full speed" (no -R) outruns the pipeline worker on a
/// 2-core machine (hundreds of MB of lag within a minute), and a backfill chunk cannot be emitted
/// before the stream reaches its high watermark, so the writers run at a rate the worker sustains.
const WRITE_TPS: u32 = 1200;

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
    /// The pipeline's signal row: (backfill id, chunk, kind) of the last watermark written.
    signal: Option<(i64, i64, String)>,
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
    let signal = tx
        .query_opt(
            "SELECT backfill_id, chunk, kind FROM tide.signal WHERE pipeline = 'conv'",
            &[],
        )
        .expect("signal row")
        .map(|r| (r.get(0), r.get(1), r.get(2)));
    tx.commit().expect("commit");
    KillPoint {
        max_outbox_id,
        progress,
        signal,
    }
}

impl KillPoint {
    /// The chunk read (high watermark written) but not yet emitted at the kill, if any.
    fn pending_chunk(&self) -> Option<(i64, i64)> {
        let (id, chunk, kind) = self.signal.clone()?;
        let done = self.progress.iter().find(|p| p.0 == id)?.1;
        (kind == "high" && chunk > done).then_some((id, chunk))
    }
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
    let script = write_script("backfill_converge", CONVERGE_SCRIPT);

    // Phase 1: writers at full speed; once their changes stream, start the three backfills.
    let mut run = spawn_pgbench(&c, &script, 4, 120, Some(WRITE_TPS));
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

    // kill -9 of the worker in the middle of each table's backfill (the backfills of a pipeline
    // run one at a time, in order); pgbench dies with the server's backends each time and is
    // restarted.
    let mut kills: Vec<KillPoint> = Vec::new();
    let mut txns_total = 0u64;
    for (k, id) in ids.iter().enumerate() {
        let k = k + 1;
        let target = if k == 1 { 4 } else { 3 };
        c.wait_until(
            &format!("backfill {id} to emit {target} chunks before kill {k}"),
            Duration::from_secs(120),
            Duration::from_millis(50),
            || Ok(bf_i64(&c, *id, "chunks_done") >= target),
        );
        // Try for a moment to kill while a chunk is read but not yet emitted (it must then be
        // read again, not lost); otherwise kill anyway.
        let _ = poll_every(Duration::from_secs(2), Duration::from_millis(2), || {
            Ok(c.try_query_scalar::<bool>(&format!(
                "SELECT coalesce((SELECT s.kind = 'high' AND s.chunk > b.chunks_done
                                    FROM tide.signal s JOIN tide.backfill b ON b.id = s.backfill_id
                                   WHERE s.pipeline = '{P}' AND b.id = {id}), false)"
            ))?)
        });
        let kp = kill_point(&c, &ids);
        let (_, done, state) = kp.progress.iter().find(|p| p.0 == *id).cloned().unwrap();
        assert!(
            state == "running" && done >= target,
            "kill {k}: backfill {id} is {state} with {done} chunks done; the kill would not land mid-backfill\n{}",
            diag(&c)
        );
        let victim = worker_pid(&c, P).unwrap_or_else(|| panic!("no worker to kill\n{}", diag(&c)));
        kill9(victim);
        let (txns, _ok, summary) = run.finish_summary();
        txns_total += txns;
        let back = wait_recovered(&c, P, Some(victim));
        eprintln!(
            "converge: kill {k}: kill -9 worker {victim} at {:.1?} into the backfill, progress {:?}, \
             chunk read but not emitted: {:?}; pgbench {txns} txns ({summary}); worker back in {back:.1?}",
            t_backfill.elapsed(),
            kp.progress,
            kp.pending_chunk()
        );
        kills.push(kp);
        if k == ids.len() {
            break;
        }
        run = spawn_pgbench(&c, &script, 4, 120, Some(WRITE_TPS));
        if k == 1 {
            // Table rewrites while the backfills run and the writers go on: VACUUM FULL of the
            // table being backfilled (a new relation file, the same rows: its chunks must
            // neither stop early nor skip rows) and a rewriting ALTER COLUMN TYPE of a table
            // whose backfill is queued (the worker answers it by reading that table again).
            c.execute("VACUUM FULL t_int");
            c.execute("ALTER TABLE t_uuid ALTER COLUMN v TYPE bigint");
        }
    }
    // Keep writing, in bounded rounds, until every backfill is done.
    let mut rounds = 0;
    while !all_done(&c, &ids).unwrap_or(false) {
        rounds += 1;
        assert!(
            rounds <= 30,
            "the backfills did not finish within 30 rounds of writes\n{}",
            diag(&c)
        );
        let (txns, ok, summary) =
            spawn_pgbench(&c, &script, 4, 3, Some(WRITE_TPS)).finish_summary();
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
    for (k, kp) in kills.iter().enumerate() {
        if let Some((id, chunk)) = kp.pending_chunk() {
            // Lost with the worker, read again under new watermarks, emitted once, after the kill.
            let (n, first): (i64, Option<i64>) = {
                let r = c.query_one(&format!(
                    "SELECT count(*), min(id) FROM tide.outbox WHERE backfill_id = {id} AND chunk = {chunk}"
                ));
                (r.get(0), r.get(1))
            };
            let rows: i64 = c.query_scalar(&format!(
                "SELECT rows_emitted::int8 FROM tide.chunks WHERE backfill_id = {id} AND chunk = {chunk}"
            ));
            assert_eq!(n, rows, "kill {}: chunk {chunk} of backfill {id}", k + 1);
            assert!(
                n == 0 || first.unwrap_or(0) > kp.max_outbox_id,
                "kill {}: chunk {chunk} of backfill {id} was pending at the kill but has events before it",
                k + 1
            );
        }
    }
    assert!(
        resumed >= kills.len(),
        "expected each kill to interrupt a backfill that had emitted chunks ({resumed} did)"
    );
    // Positive control for the window check in check_backfill_invariants: read events and stream
    // events of the same key do join (keys render identically in both).
    let same_key: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.outbox r JOIN tide.outbox s
             ON s.relation = r.relation AND s.key = r.key AND s.backfill_id IS NULL
          WHERE r.backfill_id IN ({}, {}, {})",
        ids[0], ids[1], ids[2]
    ));
    assert!(
        same_key > 1000,
        "only {same_key} stream events share a key with a read event"
    );
    let (chunk_rows, in_window): (i64, i64) = {
        let r = c.query_one(&format!(
            "SELECT (SELECT count(*) FROM tide.chunks WHERE backfill_id IN ({0}, {1}, {2})),
                    (SELECT count(*) FROM tide.chunks ch JOIN tide.outbox o
                         ON o.relation = ch.relation AND o.backfill_id IS NULL
                        AND o.commit_lsn > ch.low_lsn AND o.commit_lsn < ch.high_lsn
                      WHERE ch.backfill_id IN ({0}, {1}, {2}))",
            ids[0], ids[1], ids[2]
        ));
        (r.get(0), r.get(1))
    };
    eprintln!(
        "converge: rows_dropped total {dropped}; {chunk_rows} chunks; {in_window} stream events of the table inside chunk windows; max read events per key per backfill {max_reads}; \
         whole test {:.1?}",
        t_all.elapsed()
    );
}

// ------------------------------------------------------------------------------------------
// 2. The replay check is sensitive: a broken replay is caught
// ------------------------------------------------------------------------------------------

#[test]
fn broken_variant_is_caught() {
    const P: &str = "brk";
    let c = setup("bf_broken");
    c.execute(
        "CREATE TABLE small (id int PRIMARY KEY, v int, s text);
         INSERT INTO small SELECT g, g, 's ' || g FROM generate_series(1, 2000) g;",
    );
    create_pipeline(&c, P);
    make_copy(&c, "small", "public.small", "copy_small", &["id"]);
    add_table(&c, P, "small", true); // the default: a backfill is queued
    c.execute(
        "UPDATE small SET v = -v WHERE id % 7 = 0;
         DELETE FROM small WHERE id % 11 = 0;
         INSERT INTO small SELECT g, g, 'new' FROM generate_series(2001, 2100) g;",
    );
    wait_backfill(&c, "small", 60);
    // Deletes after the backfill: a replay that skips deletes must leave at least these behind.
    let deleted_after: i64 =
        c.query_scalar("SELECT count(*) FROM small WHERE id % 13 = 0 OR id % 17 = 0");
    c.execute(
        "DELETE FROM small WHERE id % 13 = 0;
         UPDATE small SET id = id + 10000 WHERE id % 17 = 0;",
    );
    wait_pipeline(&c, P, 60);

    // The correct replay converges.
    let n = replay(&c, "copy_small", P, false);
    assert_converged(&c, "small", "copy_small");
    eprintln!("broken: correct replay of {n} events converges");

    // 1. Skipping delete events (a resurrecting consumer) is caught.
    replay(&c, "copy_small", P, true);
    let (missing, extra) = set_difference(&c, "small", "copy_small");
    eprintln!("broken: replay without deletes: {missing} missing, {extra} extra rows");
    assert_eq!(missing, 0, "skipping deletes should not lose rows");
    assert!(
        extra >= deleted_after,
        "the set-difference missed skipped deletes: {extra} extra rows, expected at least {deleted_after}"
    );

    // 2. One corrupted row is caught both ways.
    replay(&c, "copy_small", P, false);
    c.execute("UPDATE copy_small SET v = v + 1 WHERE id = (SELECT min(id) FROM copy_small)");
    assert_eq!(
        set_difference(&c, "small", "copy_small"),
        (1, 1),
        "one corrupted row"
    );

    // 3. One lost row is caught.
    replay(&c, "copy_small", P, false);
    c.execute("DELETE FROM copy_small WHERE id = (SELECT max(id) FROM copy_small)");
    assert_eq!(
        set_difference(&c, "small", "copy_small"),
        (1, 0),
        "one lost row"
    );
}

// ------------------------------------------------------------------------------------------
// 3. Bounded memory and snapshot age; the stream stays live during a big backfill
// ------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct MemSample {
    at: Duration,
    rows_read: i64,
    state: String,
    pid: Option<i32>,
    vm_rss_kb: Option<i64>,
    rss_anon_kb: Option<i64>,
    rss_shmem_kb: Option<i64>,
    xmin_age: Option<i64>,
    xact_age_s: Option<f64>,
}

/// `VmRSS`, `RssAnon` and `RssShmem` (kB) from /proc/<pid>/status.
fn proc_rss(pid: i32) -> (Option<i64>, Option<i64>, Option<i64>) {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return (None, None, None);
    };
    let field = |name: &str| {
        status.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|r| r.trim().trim_end_matches("kB").trim().parse().ok())
        })
    };
    (field("VmRSS:"), field("RssAnon:"), field("RssShmem:"))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[test]
fn bounded_memory_and_snapshot_age() {
    const P: &str = "mem";
    const ROWS: i64 = 300_000;
    let c = setup("bf_memory");
    c.execute(&format!(
        "CREATE TABLE big (id int PRIMARY KEY, pad text);
         INSERT INTO big SELECT g, repeat(md5(g::text), 3) FROM generate_series(1, {ROWS}) g;
         ANALYZE big;
         CREATE TABLE light (id int PRIMARY KEY, v int);"
    ));
    let row_bytes: i64 = c.query_scalar("SELECT (pg_relation_size('big') / 300000)::int8");
    create_pipeline(&c, P);
    add_table(&c, P, "big", false);
    add_table(&c, P, "light", false);
    let script = write_script(
        "light",
        "\\set k random(1, 100000)\nINSERT INTO light VALUES (:k, 1) ON CONFLICT (id) DO UPDATE SET v = light.v + 1;\n",
    );
    let load = spawn_pgbench(&c, &script, 1, 300, Some(100));
    c.wait_until(
        "the light load to stream",
        Duration::from_secs(30),
        POLL,
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.outbox WHERE relation = 'public.light'",
            )? >= 50)
        },
    );
    let pid0 = worker_pid(&c, P).expect("worker pid");
    let xid0: i64 = c.query_scalar("SELECT txid_current()");
    let id: i64 = c.query_scalar("SELECT tide.start_backfill('big', chunk_size => 2000)");
    let t0 = Instant::now();

    let stop = AtomicBool::new(false);
    let (samples, probes, elapsed, xid1) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut cl = c.client();
            let mut out: Vec<MemSample> = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let r = cl
                    .query_one(
                        "SELECT b.rows_read, b.state, a.pid, age(a.backend_xmin)::int8,
                                extract(epoch FROM clock_timestamp() - a.xact_start)::float8
                           FROM tide.backfill b
                           LEFT JOIN pg_stat_activity a ON a.backend_type = 'pg_tide worker'
                          WHERE b.id = $1",
                        &[&id],
                    )
                    .expect("sample");
                let pid: Option<i32> = r.get(2);
                let (vm, anon, shmem) = pid.map(proc_rss).unwrap_or((None, None, None));
                out.push(MemSample {
                    at: t0.elapsed(),
                    rows_read: r.get(0),
                    state: r.get(1),
                    pid,
                    vm_rss_kb: vm,
                    rss_anon_kb: anon,
                    rss_shmem_kb: shmem,
                    xmin_age: r.get(3),
                    xact_age_s: r.get(4),
                });
                std::thread::sleep(Duration::from_millis(100));
            }
            out
        });

        // Latency probes: insert into the other captured table, time until it is in the outbox.
        let mut cl = c.client();
        let mut probes: Vec<(Duration, bool)> = Vec::new();
        let mut i = 0;
        loop {
            let running: bool = cl
                .query_one(
                    "SELECT state <> 'done' FROM tide.backfill WHERE id = $1",
                    &[&id],
                )
                .unwrap()
                .get(0);
            if !running || probes.len() >= 40 {
                break;
            }
            i += 1;
            let key = 1_000_000 + i;
            let before: i64 = cl
                .query_one("SELECT coalesce(max(id), 0) FROM tide.outbox", &[])
                .unwrap()
                .get(0);
            cl.execute("INSERT INTO light VALUES ($1, 0)", &[&key])
                .unwrap();
            let t = Instant::now();
            let key_text = key.to_string();
            if let Err(msg) = poll_every(Duration::from_secs(60), Duration::from_millis(10), || {
                Ok(cl
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM tide.outbox WHERE id > $1 AND relation = 'public.light'
                                           AND op = 'insert' AND key->>'id' = $2)",
                        &[&before, &key_text],
                    )?
                    .get(0))
            }) {
                panic!("probe {key} never reached the outbox: {msg}\n{}", diag(&c));
            }
            probes.push((t.elapsed(), running));
            std::thread::sleep(Duration::from_millis(100)); // pacing, not an assertion
        }
        let elapsed = wait_backfill(&c, "big", 300) + t0.elapsed();
        let xid1: i64 = c.query_scalar("SELECT txid_current()");
        stop.store(true, Ordering::SeqCst);
        (sampler.join().expect("sampler"), probes, elapsed, xid1)
    });
    let backfill_time = t0.elapsed();
    c.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgbench'",
    );
    let _ = load.finish_summary();
    let _ = std::fs::remove_file(&script);
    let _ = elapsed;

    assert_eq!(
        bf_i64(&c, id, "rows_emitted"),
        ROWS,
        "every row is emitted (no writes to big)"
    );
    check_backfill_invariants(&c, id);

    // The same worker did the whole backfill (no crash, no restart).
    let pids: std::collections::BTreeSet<i32> = samples.iter().filter_map(|s| s.pid).collect();
    assert_eq!(
        pids.into_iter().collect::<Vec<_>>(),
        vec![pid0],
        "the worker changed during the backfill\n{}",
        diag(&c)
    );

    // Memory: flat between 20% and 90% done.
    let at = |f: f64| {
        samples
            .iter()
            .find(|s| s.rows_read as f64 >= f * ROWS as f64 && s.rss_anon_kb.is_some())
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "no sample at {:.0}% done; samples: {}",
                    f * 100.0,
                    samples.len()
                )
            })
    };
    let (s20, s90) = (at(0.2), at(0.9));
    let anon_growth = s90.rss_anon_kb.unwrap() - s20.rss_anon_kb.unwrap();
    let vm_growth = s90.vm_rss_kb.unwrap_or(0) - s20.vm_rss_kb.unwrap_or(0);
    let shmem_growth = s90.rss_shmem_kb.unwrap_or(0) - s20.rss_shmem_kb.unwrap_or(0);
    let peak_anon = samples
        .iter()
        .filter_map(|s| s.rss_anon_kb)
        .max()
        .unwrap_or(0);
    let peak_vm = samples
        .iter()
        .filter_map(|s| s.vm_rss_kb)
        .max()
        .unwrap_or(0);

    // Snapshot age: no worker transaction lives longer than a chunk.
    let in_tx: Vec<&MemSample> = samples.iter().filter(|s| s.xact_age_s.is_some()).collect();
    let max_xact = in_tx
        .iter()
        .filter_map(|s| s.xact_age_s)
        .fold(0.0, f64::max);
    let max_xmin = samples.iter().filter_map(|s| s.xmin_age).max().unwrap_or(0);
    let xid_rate = (xid1 - xid0) as f64 / backfill_time.as_secs_f64();

    let mut during: Vec<Duration> = probes.iter().filter(|p| p.1).map(|p| p.0).collect();
    during.sort();
    let (p50, p95, pmax) = (
        percentile(&during, 0.5),
        percentile(&during, 0.95),
        percentile(&during, 1.0),
    );
    eprintln!(
        "memory: {ROWS} rows of ~{row_bytes} bytes in chunks of 2000, backfill {backfill_time:.1?}, {} samples\n\
         memory: worker RssAnon {} kB at 20% ({:.1?}) -> {} kB at 90% ({:.1?}): growth {anon_growth} kB; peak {peak_anon} kB\n\
         memory: worker VmRSS  {} kB at 20% -> {} kB at 90%: growth {vm_growth} kB, of which RssShmem (shared buffers touched) {shmem_growth} kB; peak {peak_vm} kB\n\
         memory: worker in a transaction in {}/{} samples; oldest transaction {max_xact:.3} s; max age(backend_xmin) {max_xmin} xids \
         (xid rate {xid_rate:.0}/s, {:.2} s worth)\n\
         memory: stream latency during the backfill over {} probes: p50 {p50:.0?}, p95 {p95:.0?}, max {pmax:.0?}",
        samples.len(),
        s20.rss_anon_kb.unwrap(),
        s20.at,
        s90.rss_anon_kb.unwrap(),
        s90.at,
        s20.vm_rss_kb.unwrap_or(0),
        s90.vm_rss_kb.unwrap_or(0),
        in_tx.len(),
        samples.len(),
        if xid_rate > 0.0 { max_xmin as f64 / xid_rate } else { 0.0 },
        during.len(),
    );
    assert!(
        samples.iter().filter(|s| s.state == "running").count() >= 10,
        "too few samples while the backfill ran for the figures to mean anything"
    );
    assert!(
        anon_growth < 32 * 1024,
        "worker private memory grew by {anon_growth} kB between 20% and 90% done: not bounded by a chunk"
    );
    assert!(
        max_xact < 5.0,
        "a worker transaction was {max_xact:.1} s old: the backfill holds a snapshot across chunks"
    );
    assert!(
        (max_xmin as f64) < xid_rate * 5.0 + 200.0,
        "the worker's xmin was {max_xmin} xids old ({xid_rate:.0} xids/s): older than a few seconds"
    );
    assert!(
        during.len() >= 10,
        "only {} latency probes ran during the backfill",
        during.len()
    );
    assert!(
        p95 < Duration::from_secs(2),
        "stream latency during the backfill: p95 {p95:?} >= 2 s (probes: {during:?})"
    );
}

// ------------------------------------------------------------------------------------------
// 4. Pause, immediate restart, resume; then a re-seed
// ------------------------------------------------------------------------------------------

/// Insert a row into a captured table and wait for the pipeline: proof that the worker runs
/// stream iterations (and so would read backfill chunks if one were due).
fn witness_worker_alive(c: &Cluster, pipeline: &str, table: &str, id: i32) {
    c.execute(&format!("INSERT INTO {table} VALUES ({id}, 0)"));
    wait_pipeline(c, pipeline, 60);
}

#[test]
fn resume_after_restart_and_reseed() {
    const P: &str = "res";
    const ROWS: i64 = 20_000;
    let c = setup("bf_resume");
    c.execute(&format!(
        "CREATE TABLE r1 (id int PRIMARY KEY, v int, s text);
         INSERT INTO r1 SELECT g, g, 'row ' || g FROM generate_series(1, {ROWS}) g;
         CREATE TABLE r2 (id int PRIMARY KEY, v int);
         INSERT INTO r2 SELECT g, g FROM generate_series(1, 3000) g;"
    ));
    create_pipeline(&c, P);
    add_table(&c, P, "r2", true);
    wait_backfill(&c, "r2", 60);
    add_table(&c, P, "r1", false);
    make_copy(&c, "r1", "public.r1", "copy_r1", &["id"]);

    // Small chunks, throttled so that the pause lands mid-way.
    let id: i64 = {
        let mut cl = c.client();
        let mut tx = cl.transaction().unwrap();
        let id: i64 = tx
            .query_one(
                "SELECT tide.start_backfill('r1', 'res', chunk_size => 200)",
                &[],
            )
            .unwrap()
            .get(0);
        tx.batch_execute("SELECT tide.alter_backfill('r1', rows_per_second => 2000)")
            .unwrap();
        tx.commit().unwrap();
        id
    };
    c.wait_until(
        "5 chunks of r1",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || Ok(bf_i64(&c, id, "chunks_done") >= 5),
    );
    c.execute("SELECT tide.pause_backfill('r1')");
    let at_pause = bf_i64(&c, id, "rows_emitted");
    assert_eq!(bf_state(&c, id), "paused");
    assert!(
        at_pause < ROWS,
        "the backfill finished before it could be paused"
    );

    // At most the chunk already read is still emitted; then nothing, although the worker runs.
    witness_worker_alive(&c, P, "r2", 100_001);
    let settled = bf_i64(&c, id, "rows_emitted");
    assert!(
        settled <= at_pause + 200,
        "rows_emitted went from {at_pause} to {settled} after the pause: more than the chunk in flight"
    );
    let window = Instant::now();
    while window.elapsed() < Duration::from_millis(1500) {
        assert_eq!(
            bf_i64(&c, id, "rows_emitted"),
            settled,
            "a paused backfill emitted rows"
        );
        std::thread::sleep(POLL);
    }
    witness_worker_alive(&c, P, "r2", 100_002);
    assert_eq!(
        bf_i64(&c, id, "rows_emitted"),
        settled,
        "a paused backfill emitted rows"
    );
    let chunks_at_pause = bf_i64(&c, id, "chunks_done");
    let outbox_at_pause: i64 = c.query_scalar("SELECT max(id) FROM tide.outbox");

    // Immediate shutdown (a crash for the server) and start: still paused, nothing lost or redone.
    let old = worker_pid(&c, P);
    c.stop(StopMode::Immediate);
    c.start();
    wait_recovered(&c, P, old);
    assert_eq!(
        bf_state(&c, id),
        "paused",
        "the pause did not survive the restart"
    );
    witness_worker_alive(&c, P, "r2", 100_003);
    assert_eq!(bf_i64(&c, id, "rows_emitted"), settled);
    assert_eq!(bf_i64(&c, id, "chunks_done"), chunks_at_pause);

    // Resume (unthrottled): it continues from the chunk after the last one emitted.
    c.execute("SELECT tide.alter_backfill('r1', rows_per_second => 0)");
    let rps: Option<i32> = c.query_scalar(&format!(
        "SELECT rows_per_second FROM tide.backfills WHERE id = {id}"
    ));
    assert_eq!(rps, None, "rows_per_second => 0 should remove the throttle");
    c.execute("SELECT tide.resume_backfill('r1')");
    let st = bf_state(&c, id);
    assert!(
        st == "queued" || st == "running" || st == "done",
        "state after resume: {st}"
    );
    wait_backfill(&c, "r1", 120);
    let max_reads = check_backfill_invariants(&c, id);
    assert_eq!(
        max_reads, 1,
        "a key was emitted twice without any write to r1"
    );
    let (chunks, read, dropped, emitted) = (
        bf_i64(&c, id, "chunks_done"),
        bf_i64(&c, id, "rows_read"),
        bf_i64(&c, id, "rows_dropped"),
        bf_i64(&c, id, "rows_emitted"),
    );
    eprintln!(
        "resume: paused at {at_pause} rows ({chunks_at_pause} chunks, settled {settled}); finished with {chunks} chunks, \
         {read} read, {dropped} dropped, {emitted} emitted"
    );
    assert_eq!((read, dropped, emitted), (ROWS, 0, ROWS));
    assert!(
        chunks == ROWS / 200 || chunks == ROWS / 200 + 1,
        "{chunks} chunks for {ROWS} rows in chunks of 200"
    );
    let first_after: i64 = c.query_scalar(&format!(
        "SELECT min(chunk) FROM tide.outbox WHERE backfill_id = {id} AND id > {outbox_at_pause}"
    ));
    assert_eq!(
        first_after,
        chunks_at_pause + 1,
        "the resumed backfill did not continue after the last chunk"
    );
    replay(&c, "copy_r1", P, false);
    assert_converged(&c, "r1", "copy_r1");

    // Re-seed: generation 2 re-emits every row; the other table's backfill is untouched.
    let r2_before: String = c.query_scalar(
        "SELECT row_to_json(b)::text FROM tide.backfill b WHERE relid = 'r2'::regclass",
    );
    let r2_reads: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE relation = 'public.r2' AND op = 'read'",
    );
    let id2: i64 = c.query_scalar("SELECT tide.start_backfill('r1')");
    assert!(id2 > id);
    wait_backfill(&c, "r1", 120);
    let gens: Vec<(i64, i32, String)> = c
        .query("SELECT id, generation, state FROM tide.backfills WHERE source = 'r1'::regclass ORDER BY id")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        gens,
        vec![(id, 1, "done".to_string()), (id2, 2, "done".to_string())]
    );
    check_backfill_invariants(&c, id2);
    let (n, keys): (i64, i64) = {
        let r = c.query_one(&format!(
            "SELECT count(*), count(DISTINCT key) FROM tide.outbox WHERE backfill_id = {id2}"
        ));
        (r.get(0), r.get(1))
    };
    assert_eq!(
        (n, keys),
        (ROWS, ROWS),
        "the re-seed must emit every row once"
    );
    let r2_after: String = c.query_scalar(
        "SELECT row_to_json(b)::text FROM tide.backfill b WHERE relid = 'r2'::regclass",
    );
    assert_eq!(
        r2_before, r2_after,
        "the re-seed of r1 touched r2's backfill"
    );
    let r2_reads_after: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE relation = 'public.r2' AND op = 'read'",
    );
    assert_eq!(
        r2_reads, r2_reads_after,
        "the re-seed of r1 emitted rows of r2"
    );
    replay(&c, "copy_r1", P, false);
    assert_converged(&c, "r1", "copy_r1");
}

// ------------------------------------------------------------------------------------------
// 5. Conditions, throttle and chunk size changes, queued backfills
// ------------------------------------------------------------------------------------------

#[test]
fn condition_limits_rows_and_throttle() {
    const P: &str = "cond";
    let c = setup("bf_condition");
    c.execute(
        "CREATE TABLE c1 (id int PRIMARY KEY, v int);
         INSERT INTO c1 SELECT g, g FROM generate_series(1, 10000) g;
         CREATE TABLE c2 (id int PRIMARY KEY, v int, s text);
         INSERT INTO c2 SELECT g, g, md5(g::text) FROM generate_series(1, 60000) g;
         CREATE TABLE q1 (id int PRIMARY KEY); INSERT INTO q1 SELECT generate_series(1, 3000);
         CREATE TABLE q2 (id int PRIMARY KEY); INSERT INTO q2 SELECT generate_series(1, 3000);
         CREATE TABLE q3 (id int PRIMARY KEY); INSERT INTO q3 SELECT generate_series(1, 3000);",
    );
    create_pipeline(&c, P);
    for t in ["c1", "c2", "q1", "q2", "q3"] {
        add_table(&c, P, t, false);
    }
    let mut problems: Vec<String> = Vec::new();

    // --- A condition limits the rows; the stream is unaffected. ---
    const COND: &str =
        "SELECT tide.start_backfill('c1', chunk_size => 1000, condition => 'v % 2 = 0')";
    let id: i64 = match c.try_query_scalar::<i64>(COND) {
        Ok(id) => id,
        Err(e) => {
            problems.push(format!(
                "start_backfill with the valid condition 'v % 2 = 0' failed: {}",
                describe_error(&e)
            ));
            // Go on with the same call in a transaction that already has an xid (which avoids
            // the read-only SPI EXPLAIN failure), to test the rest.
            let mut cl = c.client();
            let mut tx = cl.transaction().unwrap();
            tx.query_one("SELECT txid_current()", &[]).unwrap();
            let id: i64 = tx.query_one(COND, &[]).unwrap().get(0);
            tx.commit().unwrap();
            id
        }
    };
    // Stream changes to rows the condition excludes (odd v stays odd).
    c.execute(
        "UPDATE c1 SET v = v + 2 WHERE id IN (1, 3, 5, 7, 9, 11, 13, 15, 17, 19);
         INSERT INTO c1 VALUES (10001, 10001);",
    );
    wait_backfill(&c, "c1", 60);
    let cond: Option<String> = c.query_scalar(&format!(
        "SELECT condition FROM tide.backfills WHERE id = {id}"
    ));
    assert_eq!(cond.as_deref(), Some("v % 2 = 0"));
    assert_eq!(
        bf_i64(&c, id, "rows_emitted"),
        5000,
        "rows matching v % 2 = 0"
    );
    assert_no_rows(
        &c,
        "rows matching the condition that were not emitted, or emitted rows that do not match",
        &format!(
            "(SELECT id FROM c1 WHERE v % 2 = 0
              EXCEPT SELECT (key->>'id')::int FROM tide.outbox WHERE backfill_id = {id})
             UNION ALL
             (SELECT (key->>'id')::int FROM tide.outbox WHERE backfill_id = {id}
              EXCEPT SELECT id FROM c1 WHERE v % 2 = 0)"
        ),
    );
    check_backfill_invariants(&c, id);
    let stream: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE relation = 'public.c1' AND backfill_id IS NULL
            AND op IN ('update', 'insert') AND (\"row\"->>'v')::int % 2 = 1",
    );
    assert_eq!(stream, 11, "stream events of rows outside the condition");

    // --- Throttle and chunk size on a running backfill. ---
    let id2: i64 = c.query_scalar("SELECT tide.start_backfill('c2', chunk_size => 500)");
    c.wait_until(
        "c2 to emit 3 chunks",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || Ok(bf_i64(&c, id2, "chunks_done") >= 3),
    );
    let (r_a, t_a) = (bf_i64(&c, id2, "rows_read"), Instant::now());
    c.wait_until(
        "c2 to emit 6 more chunks",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || Ok(bf_i64(&c, id2, "rows_read") >= r_a + 3000),
    );
    let unthrottled = (bf_i64(&c, id2, "rows_read") - r_a) as f64 / t_a.elapsed().as_secs_f64();
    assert_eq!(
        bf_state(&c, id2),
        "running",
        "c2 finished too fast to be altered while running"
    );
    c.execute("SELECT tide.alter_backfill('c2', chunk_size => 250, rows_per_second => 1000)");
    let altered_at: String = c.query_scalar("SELECT now()::text");
    let (cs, rps): (i32, Option<i32>) = {
        let r = c.query_one(&format!(
            "SELECT chunk_size, rows_per_second FROM tide.backfills WHERE id = {id2}"
        ));
        (r.get(0), r.get(1))
    };
    assert_eq!(
        (cs, rps),
        (250, Some(1000)),
        "tide.backfills after alter_backfill"
    );
    // Measure once a chunk read after the change is out.
    c.wait_until("a chunk read after alter_backfill", Duration::from_secs(30), Duration::from_millis(20), || {
        Ok(c.try_query_scalar::<i64>(&format!(
            "SELECT count(*) FROM tide.chunks WHERE backfill_id = {id2} AND read_at > '{altered_at}'"
        ))? >= 1)
    });
    let (r0, t0) = (bf_i64(&c, id2, "rows_read"), Instant::now());
    c.wait_until(
        "3 s of throttled progress",
        Duration::from_secs(10),
        POLL,
        || Ok(t0.elapsed() >= Duration::from_secs(3)),
    );
    let (r1, dt) = (bf_i64(&c, id2, "rows_read"), t0.elapsed().as_secs_f64());
    let throttled = (r1 - r0) as f64 / dt;
    let big_chunks: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.chunks WHERE backfill_id = {id2} AND read_at > '{altered_at}' AND rows_read > 250"
    ));
    eprintln!(
        "throttle: unthrottled {unthrottled:.0} rows/s; rows_per_second => 1000 gives {throttled:.0} rows/s over {dt:.1} s"
    );
    assert_eq!(
        big_chunks, 0,
        "chunks read after chunk_size => 250 have more rows"
    );
    assert!(r1 > r0, "the throttled backfill made no progress");
    assert!(
        (r1 - r0) as f64 <= 1000.0 * dt + 500.0,
        "rows_per_second => 1000 read {} rows in {dt:.1} s",
        r1 - r0
    );
    if unthrottled > 3000.0 {
        assert!(
            throttled < unthrottled / 2.0,
            "the throttle did not slow the backfill"
        );
    }
    c.execute("SELECT tide.alter_backfill('c2', rows_per_second => 0)");
    wait_backfill(&c, "c2", 120);
    check_backfill_invariants(&c, id2);
    assert_eq!(bf_i64(&c, id2, "rows_emitted"), 60000);

    // --- Queued backfills of several tables progress in turn and all finish. ---
    let ids: Vec<i64> = {
        let r = c.query_one(
            "SELECT tide.start_backfill('q1', chunk_size => 300), tide.start_backfill('q2', chunk_size => 300),
                    tide.start_backfill('q3', chunk_size => 300)",
        );
        vec![r.get(0), r.get(1), r.get(2)]
    };
    let list = format!("{}, {}, {}", ids[0], ids[1], ids[2]);
    let mut max_running = 0i64;
    let mut seen_queued_behind = false;
    c.wait_until("the three queued backfills", Duration::from_secs(120), Duration::from_millis(20), || {
        let r = c.try_query_one(&format!(
            "SELECT count(*) FILTER (WHERE state = 'running'), count(*) FILTER (WHERE state = 'queued'),
                    count(*) FILTER (WHERE state = 'done') FROM tide.backfill WHERE id IN ({list})"
        ))?;
        let (running, queued, done): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
        max_running = max_running.max(running);
        seen_queued_behind |= running == 1 && queued >= 1;
        Ok(done == 3)
    });
    for (i, t) in ["q1", "q2", "q3"].iter().enumerate() {
        wait_backfill(&c, t, 60);
        check_backfill_invariants(&c, ids[i]);
        assert_eq!(bf_i64(&c, ids[i], "rows_emitted"), 3000);
    }
    assert!(
        max_running <= 1,
        "{max_running} backfills of one pipeline ran at once"
    );
    assert!(
        seen_queued_behind,
        "never saw a backfill queued behind a running one"
    );
    assert_no_rows(
        &c,
        "a queued backfill started before the previous one finished",
        &format!(
            "SELECT * FROM (SELECT id, started_at, lag(finished_at) OVER (ORDER BY id) AS prev_finished
                              FROM tide.backfill WHERE id IN ({list})) s WHERE started_at < prev_finished"
        ),
    );

    assert!(problems.is_empty(), "problems:\n{}", problems.join("\n"));
}

// ------------------------------------------------------------------------------------------
// 6. Readiness
// ------------------------------------------------------------------------------------------

#[test]
fn readiness_states() {
    const P: &str = "rdy";
    let c = setup("bf_readiness");
    c.execute(
        "CREATE TABLE rd (id int PRIMARY KEY, v int); INSERT INTO rd SELECT g, g FROM generate_series(1, 5000) g;
         CREATE TABLE rd_none (id int PRIMARY KEY); INSERT INTO rd_none SELECT generate_series(1, 10);",
    );
    create_pipeline(&c, P);
    add_table(&c, P, "rd_none", false);
    add_table(&c, P, "rd", false);
    let readiness = |t: &str| -> (Option<i64>, Option<String>, bool, bool, bool, String) {
        let r = c.query_one(&format!(
            "SELECT backfill_id, backfill_state, snapshot_read_complete, snapshot_emitted, target_caught_up, readiness
               FROM tide.readiness WHERE pipeline = '{P}' AND source = '{t}'::regclass"
        ));
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))
    };
    assert_eq!(
        readiness("rd_none"),
        (None, None, false, false, false, "no backfill".into())
    );
    assert_eq!(readiness("rd").5, "no backfill");

    // Start it paused (deterministically 'backfilling'), then resume and watch.
    let id: i64 = {
        let mut cl = c.client();
        let mut tx = cl.transaction().unwrap();
        let id: i64 = tx
            .query_one("SELECT tide.start_backfill('rd', chunk_size => 250)", &[])
            .unwrap()
            .get(0);
        tx.batch_execute("SELECT tide.pause_backfill('rd')")
            .unwrap();
        tx.commit().unwrap();
        id
    };
    assert_eq!(
        readiness("rd"),
        (
            Some(id),
            Some("paused".into()),
            false,
            false,
            false,
            "backfilling".into()
        )
    );
    c.execute("SELECT tide.resume_backfill('rd')");
    let mut seen: Vec<String> = Vec::new();
    c.wait_until(
        "readiness 'ready'",
        Duration::from_secs(60),
        Duration::from_millis(5),
        || {
            let r = readiness("rd").5;
            if seen.last() != Some(&r) {
                seen.push(r.clone());
            }
            Ok(r == "ready")
        },
    );
    eprintln!("readiness: observed {seen:?}");
    let order = ["backfilling", "catching up", "ready"];
    let ranks: Vec<usize> = seen
        .iter()
        .map(|s| {
            order
                .iter()
                .position(|o| o == s)
                .unwrap_or_else(|| panic!("unexpected readiness {s:?}"))
        })
        .collect();
    assert!(
        ranks.windows(2).all(|w| w[0] < w[1]),
        "readiness went backwards: {seen:?}"
    );
    assert_eq!(seen.first().map(String::as_str), Some("backfilling"));
    assert_eq!(
        readiness("rd"),
        (
            Some(id),
            Some("done".into()),
            true,
            true,
            true,
            "ready".into()
        )
    );
    // Once ready, wait_for_backfill answers at once and the rows are there.
    let waited = wait_backfill(&c, "rd", 5);
    assert!(
        waited < Duration::from_secs(1),
        "wait_for_backfill took {waited:?} on a ready table"
    );
    assert_eq!(bf_i64(&c, id, "rows_emitted"), 5000);
    let reads: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.outbox WHERE backfill_id = {id}"
    ));
    assert_eq!(reads, 5000);
    assert_eq!(readiness("rd_none").5, "no backfill");
}

// ------------------------------------------------------------------------------------------
// 7. Bad input and wrong states have clear SQLSTATEs
// ------------------------------------------------------------------------------------------

/// Check that `res` failed with `code` (and a hint / message prefix); record a problem if not.
fn check_err<T: std::fmt::Debug>(
    problems: &mut Vec<String>,
    label: &str,
    res: Result<T, postgres::Error>,
    code: &str,
    hint: Option<&str>,
    message_prefix: Option<&str>,
) {
    let e = match res {
        Ok(v) => {
            problems.push(format!(
                "{label}: expected SQLSTATE {code}, but it succeeded: {v:?}"
            ));
            return;
        }
        Err(e) => e,
    };
    let Some(db) = e.as_db_error() else {
        problems.push(format!(
            "{label}: expected SQLSTATE {code}, got a non-server error: {e}"
        ));
        return;
    };
    let mut bad = Vec::new();
    if db.code().code() != code {
        bad.push(format!("SQLSTATE {} instead of {code}", db.code().code()));
    }
    if let Some(h) = hint {
        if !db.hint().is_some_and(|x| x.contains(h)) {
            bad.push(format!("no hint containing {h:?}"));
        }
    }
    if let Some(m) = message_prefix {
        if !db.message().starts_with(m) {
            bad.push(format!("message does not start with {m:?}"));
        }
    }
    if bad.is_empty() {
        eprintln!("bad input: {label}: {} {}", db.code().code(), db.message());
    } else {
        let first_line = describe_error(&e)
            .lines()
            .take(3)
            .collect::<Vec<_>>()
            .join(" / ");
        problems.push(format!("{label}: {}: {first_line}", bad.join(", ")));
    }
}

#[test]
fn bad_inputs_have_sqlstates() {
    let c = setup("bf_bad_inputs");
    c.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t SELECT g, g FROM generate_series(1, 1000) g;
         CREATE TABLE nc (id int PRIMARY KEY, v int);
         CREATE TABLE free (id int PRIMARY KEY, v int);
         CREATE TABLE amb (id int PRIMARY KEY, v int);
         CREATE TABLE kc (a int PRIMARY KEY, b int NOT NULL); INSERT INTO kc SELECT g, g FROM generate_series(1, 10) g;
         CREATE TABLE kf (id int PRIMARY KEY, v int); INSERT INTO kf SELECT g, g FROM generate_series(1, 10) g;",
    );
    create_pipeline(&c, "bi");
    create_pipeline(&c, "bi2");
    for t in ["t", "amb", "kc", "kf"] {
        add_table(&c, "bi", t, false);
    }
    add_table(&c, "bi2", "nc", false);
    add_table(&c, "bi2", "amb", false);
    let mut p: Vec<String> = Vec::new();
    let q = |sql: &str| c.try_query_scalar::<Option<String>>(&format!("SELECT ({sql})::text"));
    const COND: Option<&str> = Some("invalid backfill condition");

    // Which pipeline.
    check_err(
        &mut p,
        "start: table not captured by the named pipeline",
        q("tide.start_backfill('nc', 'bi')"),
        "55000",
        Some("tide.add_table"),
        None,
    );
    check_err(
        &mut p,
        "start: table captured by no pipeline",
        q("tide.start_backfill('free')"),
        "55000",
        Some("tide.add_table"),
        None,
    );
    check_err(
        &mut p,
        "start: several pipelines, none named",
        q("tide.start_backfill('amb')"),
        "42P08",
        Some("pipeline"),
        None,
    );
    check_err(
        &mut p,
        "pause: several pipelines, none named",
        q("tide.pause_backfill('amb')"),
        "42P08",
        Some("pipeline"),
        None,
    );
    check_err(
        &mut p,
        "wait: several pipelines, none named",
        q("tide.wait_for_backfill('amb')"),
        "42P08",
        Some("pipeline"),
        None,
    );

    // Chunk size and condition.
    check_err(
        &mut p,
        "start: chunk_size 0",
        q("tide.start_backfill('t', chunk_size => 0)"),
        "22023",
        None,
        None,
    );
    check_err(
        &mut p,
        "start: chunk_size -5",
        q("tide.start_backfill('t', chunk_size => -5)"),
        "22023",
        None,
        None,
    );
    check_err(
        &mut p,
        "start: condition that does not parse",
        q("tide.start_backfill('t', condition => 'v = = 1')"),
        "42601",
        None,
        COND,
    );
    check_err(
        &mut p,
        "start: condition on an unknown column",
        q("tide.start_backfill('t', condition => 'nosuch > 1')"),
        "42703",
        None,
        COND,
    );
    check_err(
        &mut p,
        "start: condition that is not boolean",
        q("tide.start_backfill('t', condition => 'v + 1')"),
        "42804",
        None,
        COND,
    );
    check_err(
        &mut p,
        "start: condition with a statement separator",
        q("tide.start_backfill('t', condition => 'true; DROP TABLE t')"),
        "42601",
        None,
        None,
    );
    {
        // Not an expression on its own: it closes the parenthesis the worker puts around it, and
        // would OR away the keyset predicate. Called after a write, as an application would.
        let mut cl = c.client();
        let mut tx = cl.transaction().unwrap();
        tx.batch_execute("INSERT INTO free VALUES (1, 1)").unwrap();
        let res = tx
            .query_one(
                "SELECT tide.start_backfill('t', chunk_size => 10, condition => 'v > 0) OR (true')",
                &[],
            )
            .map(|r| r.get::<_, i64>(0));
        check_err(
            &mut p,
            "start: condition that escapes its parentheses",
            res,
            "42601",
            None,
            COND,
        );
        let _ = tx.rollback();
    }
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.backfill"),
        0,
        "a failed call left a backfill behind"
    );

    // Nothing active.
    check_err(
        &mut p,
        "pause: nothing active",
        q("tide.pause_backfill('t')"),
        "55000",
        None,
        None,
    );
    check_err(
        &mut p,
        "resume: nothing active",
        q("tide.resume_backfill('t')"),
        "55000",
        None,
        None,
    );
    check_err(
        &mut p,
        "cancel: nothing active",
        q("tide.cancel_backfill('t')"),
        "55000",
        None,
        None,
    );

    // Wrong states. Throttled hard so that it stays active.
    let id: i64 = {
        let mut cl = c.client();
        let mut tx = cl.transaction().unwrap();
        let id: i64 = tx
            .query_one("SELECT tide.start_backfill('t', chunk_size => 10)", &[])
            .unwrap()
            .get(0);
        tx.batch_execute("SELECT tide.alter_backfill('t', rows_per_second => 10); SELECT tide.pause_backfill('t')")
            .unwrap();
        tx.commit().unwrap();
        id
    };
    check_err(
        &mut p,
        "start: while paused",
        q("tide.start_backfill('t')"),
        "55006",
        None,
        None,
    );
    check_err(
        &mut p,
        "pause: while paused",
        q("tide.pause_backfill('t')"),
        "55000",
        None,
        None,
    );
    c.execute("SELECT tide.resume_backfill('t')");
    check_err(
        &mut p,
        "resume: while queued/running",
        q("tide.resume_backfill('t')"),
        "55000",
        None,
        None,
    );
    check_err(
        &mut p,
        "start: while queued/running",
        q("tide.start_backfill('t', 'bi')"),
        "55006",
        None,
        None,
    );
    check_err(
        &mut p,
        "alter: chunk_size 0",
        q("tide.alter_backfill('t', chunk_size => 0)"),
        "22023",
        None,
        None,
    );
    check_err(
        &mut p,
        "alter: rows_per_second -1",
        q("tide.alter_backfill('t', rows_per_second => -1)"),
        "22023",
        None,
        None,
    );
    let t = Instant::now();
    let timed_out: bool = c.query_scalar("SELECT tide.wait_for_backfill('t', timeout => '300 ms')");
    assert!(
        !timed_out,
        "wait_for_backfill returned true for an unfinished, throttled backfill"
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "wait_for_backfill ignored its timeout"
    );
    c.execute("SELECT tide.cancel_backfill('t')");
    assert_eq!(bf_state(&c, id), "cancelled");
    check_err(
        &mut p,
        "wait: cancelled",
        q("tide.wait_for_backfill('t', timeout => '5 s')"),
        "55000",
        None,
        None,
    );
    check_err(
        &mut p,
        "pause: cancelled",
        q("tide.pause_backfill('t')"),
        "55000",
        None,
        None,
    );
    eprintln!(
        "bad input: readiness of a table whose latest backfill was cancelled: {}",
        sample(
            &c,
            "SELECT backfill_state, readiness FROM tide.readiness WHERE source = 't'::regclass",
            1
        )
    );

    // Two concurrent starts: the second waits for the first, then fails like any start of an
    // active backfill.
    {
        let mut a = c.client();
        let mut tx = a.transaction().unwrap();
        tx.query_one("SELECT tide.start_backfill('t', chunk_size => 10)", &[])
            .unwrap();
        let cfg = c.config("postgres");
        let other = std::thread::spawn(move || {
            let mut b = cfg.connect(NoTls).expect("connect");
            b.query_one("SELECT tide.start_backfill('t', chunk_size => 10)", &[])
                .map(|r| r.get::<_, i64>(0))
        });
        c.wait_until("the second start_backfill to wait for the first", Duration::from_secs(30), Duration::from_millis(20), || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%start_backfill%'",
            )? >= 1)
        });
        tx.commit().unwrap();
        let res = other.join().expect("second session");
        check_err(
            &mut p,
            "start: concurrently with another start",
            res,
            "55006",
            None,
            None,
        );
        c.execute("SELECT tide.cancel_backfill('t')");
    }

    // A backfill that fails in the worker: its key column is renamed before it runs.
    {
        let mut cl = c.client();
        let mut tx = cl.transaction().unwrap();
        tx.batch_execute("SELECT tide.start_backfill('kf'); SELECT tide.pause_backfill('kf')")
            .unwrap();
        tx.commit().unwrap();
    }
    c.execute("ALTER TABLE kf RENAME COLUMN id TO kid; SELECT tide.resume_backfill('kf')");
    c.wait_until(
        "the kf backfill to fail",
        Duration::from_secs(30),
        POLL,
        || {
            Ok(c.try_query_scalar::<String>(
                "SELECT state FROM tide.backfills WHERE source = 'kf'::regclass",
            )? == "failed")
        },
    );
    let (err, remedy): (Option<String>, Option<String>) = {
        let r =
            c.query_one("SELECT error, remedy FROM tide.backfills WHERE source = 'kf'::regclass");
        (r.get(0), r.get(1))
    };
    eprintln!("bad input: failed backfill: error {err:?}; remedy {remedy:?}");
    assert!(
        err.is_some() && remedy.is_some(),
        "a failed backfill must say why and what to do"
    );
    check_err(
        &mut p,
        "wait: failed",
        q("tide.wait_for_backfill('kf', timeout => '5 s')"),
        "55000",
        None,
        None,
    );

    // The key changed since the table was added.
    c.execute("ALTER TABLE kc DROP CONSTRAINT kc_pkey, ADD PRIMARY KEY (b)");
    check_err(
        &mut p,
        "start: key changed since add_table",
        q("tide.start_backfill('kc')"),
        "55000",
        None,
        None,
    );

    assert!(p.is_empty(), "{} problems:\n{}", p.len(), p.join("\n"));
}

// ------------------------------------------------------------------------------------------
// 8. Text, timestamp and composite keys under concurrent updates
// ------------------------------------------------------------------------------------------

const KEYS_SCHEMA: &str = r#"
CREATE FUNCTION tkey(g int) RETURNS text LANGUAGE sql IMMUTABLE
    AS $$ SELECT format('key %s ''q'' "dq" \ é,{x} (y)', g) $$;
CREATE FUNCTION tskey(g int) RETURNS timestamp LANGUAGE sql IMMUTABLE
    AS $$ SELECT '2024-02-28 23:59:58'::timestamp + g * interval '1 second 1 microsecond' $$;
CREATE TABLE k_text (k text PRIMARY KEY, v int);
CREATE TABLE k_ts (ts timestamp PRIMARY KEY, v int);
CREATE TABLE k_comp (a int, b text, v int, PRIMARY KEY (a, b));
INSERT INTO k_text SELECT tkey(g), g FROM generate_series(1, 3000) g;
INSERT INTO k_text VALUES (''), (' '), ('O''Brien'), ('{a,b}'), ('NULL'), ('tab	inside'), ('back\slash'), (repeat('long', 300));
INSERT INTO k_ts SELECT tskey(g), g FROM generate_series(1, 3000) g;
INSERT INTO k_ts VALUES ('infinity', 1), ('-infinity', 2), ('0044-03-15 12:00:00 BC', 3), ('1999-12-31 23:59:59.999999', 4);
INSERT INTO k_comp SELECT g / 10, format('part %s "x" ''y''', g % 10), g FROM generate_series(1, 3000) g;
CREATE FUNCTION move_text(p_from int, p_to int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN UPDATE k_text SET k = tkey(p_to) WHERE k = tkey(p_from);
EXCEPTION WHEN unique_violation THEN NULL; END $$;
CREATE FUNCTION move_ts(p_from int, p_to int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN UPDATE k_ts SET ts = tskey(p_to) WHERE ts = tskey(p_from);
EXCEPTION WHEN unique_violation THEN NULL; END $$;
"#;

/// Random upserts, updates, deletes and key changes; two thirds of the transactions update or
/// delete one of the next ~100 rows after the table's backfill progress (the chunk being read).
/// The special keys are never deleted.
const KEYS_SCRIPT: &str = r#"\set g random(1, 3300)
\set g2 random(1, 3300)
\set v random(1, 100000)
\set off random(0, 100)
\set r random(1, 90)
\if :r > 30
\set r2 random(1, 6)
\if :r2 = 1
UPDATE k_text SET v = v + 1 WHERE k = (SELECT k FROM k_text WHERE k > (SELECT coalesce(last_key[1], '') FROM tide.backfill WHERE relation = 'public.k_text' ORDER BY id DESC LIMIT 1) ORDER BY k OFFSET :off LIMIT 1);
\elif :r2 = 2
DELETE FROM k_text WHERE k = (SELECT k FROM k_text WHERE k > (SELECT coalesce(last_key[1], '') FROM tide.backfill WHERE relation = 'public.k_text' ORDER BY id DESC LIMIT 1) AND k LIKE 'key %' ORDER BY k OFFSET :off LIMIT 1);
\elif :r2 = 3
UPDATE k_ts SET v = v + 1 WHERE ts = (SELECT ts FROM k_ts WHERE ts > (SELECT coalesce(last_key[1]::timestamp, '-infinity') FROM tide.backfill WHERE relation = 'public.k_ts' ORDER BY id DESC LIMIT 1) ORDER BY ts OFFSET :off LIMIT 1);
\elif :r2 = 4
DELETE FROM k_ts WHERE ts = (SELECT ts FROM k_ts WHERE ts > (SELECT coalesce(last_key[1]::timestamp, '-infinity') FROM tide.backfill WHERE relation = 'public.k_ts' ORDER BY id DESC LIMIT 1) AND ts BETWEEN '2024-01-01' AND '2100-01-01' ORDER BY ts OFFSET :off LIMIT 1);
\elif :r2 = 5
UPDATE k_comp SET v = v + 1 WHERE (a, b) = (SELECT a, b FROM k_comp WHERE (a, b) > (SELECT coalesce(last_key[1]::int, -1), coalesce(last_key[2], '') FROM tide.backfill WHERE relation = 'public.k_comp' ORDER BY id DESC LIMIT 1) ORDER BY a, b OFFSET :off LIMIT 1);
\else
DELETE FROM k_comp WHERE (a, b) = (SELECT a, b FROM k_comp WHERE (a, b) > (SELECT coalesce(last_key[1]::int, -1), coalesce(last_key[2], '') FROM tide.backfill WHERE relation = 'public.k_comp' ORDER BY id DESC LIMIT 1) ORDER BY a, b OFFSET :off LIMIT 1);
\endif
\elif :r <= 3
INSERT INTO k_text VALUES (tkey(:g), :v) ON CONFLICT (k) DO UPDATE SET v = excluded.v;
\elif :r <= 6
UPDATE k_text SET v = v + 1 WHERE k = tkey(:g);
\elif :r <= 8
DELETE FROM k_text WHERE k = tkey(:g);
\elif :r <= 9
SELECT move_text(:g, :g2);
\elif :r <= 12
INSERT INTO k_ts VALUES (tskey(:g), :v) ON CONFLICT (ts) DO UPDATE SET v = excluded.v;
\elif :r <= 15
UPDATE k_ts SET v = v + 1 WHERE ts = tskey(:g);
\elif :r <= 17
DELETE FROM k_ts WHERE ts = tskey(:g);
\elif :r <= 18
SELECT move_ts(:g, :g2);
\elif :r <= 22
INSERT INTO k_comp VALUES (:g / 10, format('part %s "x" ''y''', :g % 10), :v) ON CONFLICT (a, b) DO UPDATE SET v = excluded.v;
\elif :r <= 26
UPDATE k_comp SET v = v + 1 WHERE a = :g / 10 AND b = format('part %s "x" ''y''', :g % 10);
\elif :r <= 28
DELETE FROM k_comp WHERE a = :g / 10 AND b = format('part %s "x" ''y''', :g % 10);
\else
UPDATE k_comp SET b = format('part %s "x" ''y''', :g2 % 10 + 10) WHERE a = :g / 10 AND b = format('part %s "x" ''y''', :g % 10) AND NOT EXISTS (SELECT 1 FROM k_comp WHERE a = :g / 10 AND b = format('part %s "x" ''y''', :g2 % 10 + 10));
\endif
"#;

#[test]
fn composite_text_timestamp_keys() {
    const P: &str = "keys";
    let c = setup("bf_keys");
    c.execute(KEYS_SCHEMA);
    create_pipeline(&c, P);
    let tables: [(&str, &[&str]); 3] = [
        ("k_text", &["k"]),
        ("k_ts", &["ts"]),
        ("k_comp", &["a", "b"]),
    ];
    for (t, keys) in tables {
        add_table(&c, P, t, false);
        make_copy(&c, t, &format!("public.{t}"), &format!("copy_{t}"), keys);
    }
    let script = write_script("backfill_keys", KEYS_SCRIPT);
    let run = spawn_pgbench(&c, &script, 2, 300, Some(600));
    c.wait_until(
        "the writes to stream",
        Duration::from_secs(30),
        POLL,
        || Ok(c.try_query_scalar::<i64>("SELECT count(*) FROM tide.outbox")? >= 100),
    );
    let ids: Vec<i64> = {
        let r = c.query_one(
            "SELECT tide.start_backfill('k_text', chunk_size => 100), tide.start_backfill('k_ts', chunk_size => 100),
                    tide.start_backfill('k_comp', chunk_size => 100)",
        );
        vec![r.get(0), r.get(1), r.get(2)]
    };
    let t0 = Instant::now();
    c.wait_until(
        "the three backfills",
        Duration::from_secs(120),
        POLL,
        || all_done(&c, &ids),
    );
    let took = t0.elapsed();
    // Keep the writes going a little past the end, then stop them.
    std::thread::sleep(Duration::from_millis(500)); // more writes, not an assertion
    c.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgbench'",
    );
    let (txns, _ok, summary) = run.finish_summary();
    let _ = std::fs::remove_file(&script);
    for (t, _) in tables {
        wait_backfill(&c, t, 60);
    }
    wait_pipeline(&c, P, 60);
    eprintln!(
        "keys: backfills took {took:.1?} under {txns} concurrent txns ({summary})\n{}",
        sample(&c, "SELECT relation, chunks_done, rows_read, rows_dropped, rows_emitted FROM tide.backfills ORDER BY id", 5)
    );
    for id in &ids {
        check_backfill_invariants(&c, *id);
    }
    let dropped: i64 = c.query_scalar(&format!(
        "SELECT sum(rows_dropped)::int8 FROM tide.backfills WHERE id IN ({}, {}, {})",
        ids[0], ids[1], ids[2]
    ));
    assert!(
        dropped > 0,
        "no chunk row was dropped: stream keys never matched chunk keys (or the writes missed the windows)"
    );
    for (t, _) in tables {
        let n = replay(&c, &format!("copy_{t}"), P, false);
        eprintln!("keys: replayed {n} events onto copy_{t}");
        assert_converged(&c, t, &format!("copy_{t}"));
    }
    // The odd keys made it through as themselves.
    for (t, cond) in [
        ("k_text", "k IN ('', ' ', 'O''Brien', '{a,b}', 'NULL', 'tab\tinside', 'back\\slash', repeat('long', 300))"),
        ("k_ts", "ts IN ('infinity', '-infinity', '0044-03-15 12:00:00 BC', '1999-12-31 23:59:59.999999')"),
    ] {
        let n: i64 = c.query_scalar(&format!("SELECT count(*) FROM copy_{t} WHERE {cond}"));
        assert_eq!(n, 4 + if t == "k_text" { 4 } else { 0 }, "{t}: special keys in the copy");
    }
}

/// The race the DBLog argument misses on PostgreSQL: a transaction writes its commit record
/// (so the stream delivers it before the low watermark) before it becomes visible to other
/// snapshots (so the chunk still reads the old row). Synchronous replication to a standby that
/// never answers holds a committed transaction in exactly that state, deterministically. The
/// chunk's stale row must not overwrite the newer value at the target.
#[test]
fn commit_visible_after_low_watermark_is_not_overwritten() {
    let c = Cluster::builder("invisible_commit")
        .conf("synchronous_standby_names='nosuchstandby'")
        .conf("synchronous_commit=local")
        .start();
    c.execute("CREATE EXTENSION pg_tide");
    c.execute("CREATE TABLE t (id int PRIMARY KEY, v text NOT NULL)");
    c.execute("INSERT INTO t SELECT g, 'old' FROM generate_series(1, 100) g");
    c.execute("SELECT tide.create_pipeline('p', 'table', '{\"schema\": \"replica\"}')");
    c.execute("SELECT tide.add_table('p', 't', backfill => false)");
    let ok: bool = c.query_scalar("SELECT tide.wait_for_pipeline('p', '30 seconds')");
    assert!(ok, "the pipeline did not start");

    // Session A: commit record written and flushed, then stuck waiting for the standby; the
    // row is 'new' in the WAL but invisible to every other snapshot.
    let port = c.port();
    let waiter = std::thread::spawn(move || {
        let mut a = postgres::Client::connect(
            &format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"),
            postgres::NoTls,
        )
        .expect("connect");
        a.batch_execute("SET synchronous_commit = on; UPDATE t SET v = 'new' WHERE id = 42")
            .ok();
    });
    c.wait_until(
        "session A waiting for synchronous replication",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || {
            let n: i64 = c.try_query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
            )?;
            Ok(n == 1)
        },
    );
    let still_old: String = c.query_scalar("SELECT v FROM t WHERE id = 42");
    assert_eq!(still_old, "old", "the update must still be invisible");

    // Backfill now. A chunk read now could not see the update, which the stream has already
    // delivered: pg_tide must not emit such a chunk. It waits, and says why.
    c.execute("SELECT tide.start_backfill('t', 'p', chunk_size => 1000)");
    c.wait_until(
        "tide.backfills to say the backfill waits for an invisible commit",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || {
            let e: Option<String> =
                c.try_query_scalar("SELECT error FROM tide.backfills WHERE relation = 'public.t'")?;
            Ok(e.is_some_and(|e| e.starts_with("waiting")))
        },
    );
    let emitted: i64 =
        c.query_scalar("SELECT rows_emitted FROM tide.backfills WHERE relation = 'public.t'");
    assert_eq!(
        emitted, 0,
        "a chunk was emitted while a committed transaction was invisible"
    );

    // Release session A: its commit was durable all along, now it becomes visible.
    c.execute("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'");
    waiter.join().expect("session A");
    let done: bool = c.query_scalar("SELECT tide.wait_for_backfill('t', 'p', '60 seconds')");
    assert!(done, "backfill did not finish");
    let now_new: String = c.query_scalar("SELECT v FROM t WHERE id = 42");
    assert_eq!(now_new, "new");
    let ok: bool = c.query_scalar("SELECT tide.wait_for_pipeline('p', '30 seconds')");
    assert!(ok);
    let target: String = c.query_scalar("SELECT v FROM replica.t WHERE id = 42");
    assert_eq!(
        target, "new",
        "the backfill chunk overwrote a committed change with the row it read before that \
         transaction became visible"
    );
    let diff: i64 = c.query_scalar(
        "SELECT (SELECT count(*) FROM (TABLE t EXCEPT TABLE replica.t) a)
              + (SELECT count(*) FROM (TABLE replica.t EXCEPT TABLE t) b)",
    );
    assert_eq!(diff, 0);
}
