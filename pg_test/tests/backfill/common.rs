//! The backfill suite's prelude: everything of `pg_test`, plus tables added and waited for,
//! `tide.backfills` read, the replay of a pipeline's outbox onto a copy ([`outbox_copy_keyed`])
//! compared with its source, and the invariants every finished backfill must satisfy.

pub use pg_test::*;
use std::time::Duration;

pub const POLL: Duration = Duration::from_millis(100);

/// Create an outbox pipeline and wait until its worker streams.
pub fn create_pipeline(c: &Cluster, name: &str) {
    pg_test::create_pipeline(c, name, "outbox", "{}");
}

/// `tide.add_table` (with or without the automatic backfill), then wait until it captures.
pub fn add_table(c: &Cluster, pipeline: &str, table: &str, backfill: bool) {
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
pub fn wait_backfill(c: &Cluster, table: &str, secs: u32) -> Duration {
    wait_for_backfill(c, table, None, secs, || diag(c))
}

/// One integer column of a backfill's row in `tide.backfills`.
pub fn bf_i64(c: &Cluster, id: i64, col: &str) -> i64 {
    c.query_scalar(&format!(
        "SELECT {col}::int8 FROM tide.backfills WHERE id = {id}"
    ))
}

pub fn bf_state(c: &Cluster, id: i64) -> String {
    c.query_scalar(&format!("SELECT state FROM tide.backfills WHERE id = {id}"))
}

/// Empty `copy` and replay the pipeline's events onto it; returns the number of events.
pub fn replay(c: &Cluster, copy: &str, pipeline: &str, skip_deletes: bool) -> i64 {
    c.execute(&format!("TRUNCATE {copy}"));
    c.query_scalar(&format!(
        "SELECT {copy}_replay('{pipeline}', {skip_deletes})"
    ))
}

/// (rows in source not in copy, rows in copy not in source).
pub fn set_difference(c: &Cluster, source: &str, copy: &str) -> (i64, i64) {
    let r = c.query_one(&format!(
        "SELECT (SELECT count(*) FROM (SELECT * FROM {source} EXCEPT ALL SELECT * FROM {copy}) a),
                (SELECT count(*) FROM (SELECT * FROM {copy} EXCEPT ALL SELECT * FROM {source}) b)"
    ));
    (r.get(0), r.get(1))
}

#[track_caller]
pub fn assert_converged(c: &Cluster, source: &str, copy: &str) {
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
pub fn check_backfill_invariants(c: &Cluster, id: i64) -> i64 {
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

pub fn all_done(c: &Cluster, ids: &[i64]) -> TestResult<bool> {
    let list = ids
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",");
    Ok(c.try_query_scalar::<bool>(&format!(
        "SELECT bool_and(state = 'done') FROM tide.backfill WHERE id IN ({list})"
    ))?)
}

/// `start` (a query of `tide.start_backfill`) and then `then` (statements) in one transaction, so
/// that the worker finds the backfill as `then` left it (paused, throttled). Returns the
/// backfill's id.
pub fn start_backfill_then(c: &Cluster, start: &str, then: &str) -> i64 {
    let mut cl = c.client();
    let mut tx = cl.transaction().unwrap();
    let id: i64 = tx.query_one(start, &[]).unwrap().get(0);
    tx.batch_execute(then).unwrap();
    tx.commit().unwrap();
    id
}
