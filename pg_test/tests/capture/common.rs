//! The capture suite's prelude: everything of `pg_test`, plus outbox pipelines created and
//! waited for (with this suite's diagnostics: the pipeline's row and the server log), the events
//! of a table as "op:id", and the ordering and exactly-once invariants of one pipeline's stream.

pub use pg_test::*;
use std::time::Duration;

pub const WORKER: &str = "pg_tide worker";
pub const POLL: Duration = Duration::from_millis(100);

/// Create a pipeline and wait until its worker has finished a first iteration.
pub fn create_pipeline(c: &Cluster, name: &str) {
    pg_test::create_pipeline(c, name, "outbox", "{}");
}

/// An outbox pipeline `name` ([`create_pipeline`]) capturing `table` from now on
/// (`tide.add_table(name, table, backfill => false)`).
pub fn capture_table(c: &Cluster, name: &str, table: &str) {
    create_pipeline(c, name);
    c.execute(&format!(
        "SELECT tide.add_table('{name}', '{table}', backfill => false)"
    ));
}

/// `tide.wait_for_pipeline`, which must return true within `secs`.
#[track_caller]
pub fn wait_pipeline(c: &Cluster, name: &str, secs: u32) {
    wait_for_pipeline(c, name, secs, || diag(c));
}

/// `row->>'id'` of the pipeline's events on `relation`, in outbox order, as "op:id".
pub fn events(c: &Cluster, pipeline: &str, relation: &str) -> Vec<String> {
    c.client()
        .query(
            "SELECT op || ':' || coalesce(\"row\"->>'id', key->>'id', '?')
               FROM tide.outbox WHERE pipeline = $1 AND relation = $2 ORDER BY id",
            &[&pipeline, &relation],
        )
        .expect("read tide.outbox")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

pub fn inserts(ids: impl IntoIterator<Item = i32>) -> Vec<String> {
    ids.into_iter().map(|i| format!("insert:{i}")).collect()
}

/// Ordering and exactly-once invariants of one pipeline's outbox stream.
pub fn assert_stream_invariants(c: &Cluster, pipeline: &str) {
    let p = format!("SELECT * FROM tide.outbox WHERE pipeline = '{pipeline}'");
    assert_no_rows(
        c,
        "(commit_lsn, position) delivered more than once",
        &format!(
            "SELECT commit_lsn, position, count(*) FROM ({p}) o GROUP BY 1, 2 HAVING count(*) > 1"
        ),
    );
    assert_no_rows(
        c,
        "a source transaction's events are not contiguous in the outbox",
        &format!(
            // By the pipeline's own order (ids are shared: two pipelines writing at once
            // interleave theirs, and that is no gap in either stream).
            "SELECT commit_lsn, min(n), max(n), count(*)
               FROM (SELECT row_number() OVER (ORDER BY id) AS n, * FROM ({p}) o) o GROUP BY 1
              HAVING max(n) - min(n) + 1 <> count(*)"
        ),
    );
    assert_no_rows(
        c,
        "positions are not 1..n in id order within a source transaction",
        &format!(
            "SELECT id, commit_lsn, position, prev_lsn, prev_pos FROM (
                 SELECT id, commit_lsn, position,
                        lag(commit_lsn) OVER w AS prev_lsn, lag(position) OVER w AS prev_pos
                   FROM ({p}) o WINDOW w AS (ORDER BY id)) x
              WHERE CASE WHEN prev_lsn IS NOT DISTINCT FROM commit_lsn THEN position <> prev_pos + 1
                         ELSE position <> 1 END"
        ),
    );
    assert_no_rows(
        c,
        "commit_lsn decreases in id order (transactions out of commit order)",
        &format!(
            "SELECT id, commit_lsn, prev FROM (
                 SELECT id, commit_lsn, lag(commit_lsn) OVER (ORDER BY id) AS prev FROM ({p}) o) x
              WHERE commit_lsn < prev"
        ),
    );
    assert_no_rows(
        c,
        "one commit_lsn with several xids or commit times",
        &format!(
            "SELECT commit_lsn FROM ({p}) o GROUP BY 1
              HAVING count(DISTINCT xid) > 1 OR count(DISTINCT commit_time) > 1"
        ),
    );
}

pub fn slot_exists(c: &Cluster, slot: &str) -> bool {
    c.query_scalar(&format!(
        "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = '{slot}')"
    ))
}

pub fn pid_alive(c: &Cluster, pid: i32) -> TestResult<bool> {
    Ok(c.try_query_scalar::<bool>(&format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = {pid})"
    ))?)
}
