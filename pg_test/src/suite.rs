//! Helpers every suite shares: diagnostics for failure messages, statements that panic with
//! them, pipelines created and waited for, and the outbox replayed onto a copy.

use crate::*;
use std::time::Duration;

/// The suites' diagnostics for a failure message: `tide.pipelines`, `tide.backfills`,
/// `tide.verifications` (each a few JSON lines) and the last 40 lines of the server log.
pub fn diag(c: &Cluster) -> String {
    format!(
        "--- tide.pipelines ---\n{}\n--- tide.backfills ---\n{}\n--- tide.verifications ---\n{}\n--- last 40 lines of {} ---\n{}\n--- end of server log ---",
        sample(
            c,
            "SELECT name, target, state, enabled, worker_pid, applied_lsn, lag_bytes, events_applied, \
                    last_error, last_error_sqlstate, remedy FROM tide.pipelines ORDER BY name",
            10
        ),
        sample(
            c,
            "SELECT id, pipeline, relation, state, generation, condition, chunk_size, chunks_done, \
                    rows_read, rows_dropped, rows_emitted, last_key, error FROM tide.backfills ORDER BY id",
            20
        ),
        sample(c, "SELECT * FROM tide.verifications", 10),
        c.log_path().display(),
        c.log_tail(40)
    )
}

/// The pipeline's worker pid, if it has one now.
pub fn worker_pid(c: &Cluster, pipeline: &str) -> Option<i32> {
    c.try_query_scalar::<Option<i32>>(&format!(
        "SELECT (SELECT worker_pid FROM tide.pipelines WHERE name = '{pipeline}')"
    ))
    .ok()
    .flatten()
}

/// Run statements, panicking with the error and [`diag`].
#[track_caller]
pub fn exec(c: &Cluster, sql: &str) {
    if let Err(e) = c.try_execute(sql) {
        panic!("SQL failed: {sql}\n{}\n{}", describe_error(&e), diag(c));
    }
}

/// `tide.create_pipeline(name, target, options)` in a transaction of its own, then wait (30 s
/// at most) until its worker streams.
#[track_caller]
pub fn create_pipeline(c: &Cluster, name: &str, target: &str, options: &str) {
    exec(
        c,
        &format!("SELECT tide.create_pipeline('{name}', '{target}', '{options}')"),
    );
    wait_streaming(c, name, Duration::from_secs(30));
}

/// Wait until the pipeline is `streaming` with a worker; panics with [`diag`] after `timeout`.
#[track_caller]
pub fn wait_streaming(c: &Cluster, name: &str, timeout: Duration) {
    if let Err(msg) = poll_every(timeout, Duration::from_millis(100), || {
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

/// [`wait_for_pipeline`] with [`diag`].
#[track_caller]
pub fn wait_pipeline(c: &Cluster, name: &str, secs: u32) -> Duration {
    wait_for_pipeline(c, name, secs, || diag(c))
}

/// [`wait_for_backfill`] of `table` in `pipeline`, with [`diag`].
#[track_caller]
pub fn wait_backfill(c: &Cluster, table: &str, pipeline: &str, secs: u32) -> Duration {
    wait_for_backfill(c, table, Some(pipeline), secs, || diag(c))
}

/// An empty copy of `source` (a table keyed by `id`) and a plpgsql function
/// `<copy>_replay(pipeline)` that replays the outbox events of `relation` onto it in id order
/// (upsert by `id`, delete, truncate; unchanged TOAST columns are refused) and returns how many.
pub fn outbox_copy(c: &Cluster, source: &str, relation: &str, copy: &str) {
    c.execute(&format!(
        r#"
CREATE TABLE {copy} (LIKE {source});
ALTER TABLE {copy} ADD PRIMARY KEY (id);
CREATE FUNCTION {copy}_replay(p_pipeline text) RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE e record; n bigint := 0;
BEGIN
    FOR e IN SELECT o.op, o.key, o."row", o.unchanged FROM tide.outbox o
              WHERE o.pipeline = p_pipeline AND o.relation = '{relation}' ORDER BY o.id
    LOOP
        n := n + 1;
        IF e.op IN ('read', 'insert', 'update') THEN
            IF coalesce(cardinality(e.unchanged), 0) > 0 THEN
                RAISE EXCEPTION 'unchanged columns %', e.unchanged;
            END IF;
            DELETE FROM {copy} c USING jsonb_populate_record(NULL::{copy}, e.key) k WHERE c.id = k.id;
            INSERT INTO {copy} SELECT * FROM jsonb_populate_record(NULL::{copy}, e."row");
        ELSIF e.op = 'delete' THEN
            DELETE FROM {copy} c USING jsonb_populate_record(NULL::{copy}, e.key) k WHERE c.id = k.id;
        ELSIF e.op = 'truncate' THEN
            DELETE FROM {copy};
        ELSE
            RAISE EXCEPTION 'unknown op %', e.op;
        END IF;
    END LOOP;
    RETURN n;
END
$f$;
"#
    ));
}
