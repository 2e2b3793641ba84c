//! A chunk the target refuses (a CHECK only the target has) fails its backfill, with the error,
//! its SQLSTATE, the attempts and a remedy in `tide.backfills` (and the count in
//! `tide.pipelines.failed_backfills`), while the stream goes on; nothing is tried again until
//! the remedy as printed is followed: fix the row, `tide.resume_backfill`, and the table
//! converges. At a local and at a remote table target.

use crate::common::*;
use std::time::Duration;

/// Source rows of `items` (id 1500, in the second chunk of 1000, has `v = -1`).
const ROWS: i64 = 3000;

/// The scenario on source `c`, whose pipeline `p` writes `items` into `target` (a table with
/// `CHECK (v >= 0)` on `tgt`, created before the table is added) and `ev` alongside.
fn refused_chunk(c: &Cluster, tgt: &Cluster, p: &str, target: &str) {
    exec(
        c,
        &format!(
            "CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL);
             INSERT INTO items SELECT g, CASE WHEN g = 1500 THEN -1 ELSE g END FROM generate_series(1, {ROWS}) g;
             CREATE TABLE ev (id bigserial PRIMARY KEY, v int NOT NULL);"
        ),
    );
    exec(
        c,
        &format!("SELECT tide.add_table('{p}', 'ev', backfill => false)"),
    );
    wait_pipeline(c, p, 60);
    let script = write_script("table_target_refused", "INSERT INTO ev (v) VALUES (1);\n");
    let bench = spawn_pgbench(c, &script, 1, 25, Some(40));
    exec(
        c,
        &format!(
            "SELECT tide.add_table('{p}', 'items', backfill => true, target_table => '{target}')"
        ),
    );
    let failed = poll_every(Duration::from_secs(60), POLL, || {
        Ok(c.try_query_scalar::<bool>(
            "SELECT coalesce((SELECT state = 'failed' FROM tide.backfills WHERE source = 'items'::regclass), false)",
        )?)
    });
    assert!(
        failed.is_ok(),
        "the backfill of items did not fail: {}\n{}",
        sample(c, "SELECT * FROM tide.backfills", 5),
        diag(c)
    );
    let row = c.query_one(
        "SELECT error, error_sqlstate, remedy, attempts, error_at IS NOT NULL, chunks_done
           FROM tide.backfills WHERE source = 'items'::regclass",
    );
    let (error, sqlstate, remedy): (String, String, String) = (row.get(0), row.get(1), row.get(2));
    let (attempts, at, chunks): (i32, bool, i64) = (row.get(3), row.get(4), row.get(5));
    assert!(error.contains("items_v_check"), "error: {error}");
    // A local refusal keeps its SQLSTATE; a remote one is an FDW error naming its own.
    if target.contains("local") {
        assert_eq!(sqlstate, "23514", "{error}");
    } else {
        assert_eq!(sqlstate, "HV000", "{error}");
        assert!(error.contains("23514"), "the remote SQLSTATE in {error}");
    }
    let resume = format!("SELECT tide.resume_backfill('public.items', '{p}');");
    assert!(remedy.contains(&resume), "remedy: {remedy}");
    assert!(
        remedy.contains(&format!(
            "SELECT tide.cancel_backfill('public.items', '{p}');"
        )),
        "remedy: {remedy}"
    );
    assert!((1..=2).contains(&attempts), "attempts {attempts}");
    assert!(at, "error_at is set");
    assert_eq!(chunks, 1, "the first chunk was written, not the second");
    let r = c.query_one(&format!(
        "SELECT state, failed_backfills FROM tide.pipelines WHERE name = '{p}'"
    ));
    assert_eq!(r.get::<_, String>(0), "streaming", "{}", pipeline_row(c, p));
    assert_eq!(r.get::<_, i64>(1), 1, "{}", pipeline_row(c, p));

    // Nothing loops: no chunk is tried again while nobody acts, and the stream goes on.
    let attempts_then: i32 =
        c.query_scalar("SELECT attempts FROM tide.backfills WHERE source = 'items'::regclass");
    let failures_then = c.log_count("failed (SQLSTATE");
    std::thread::sleep(Duration::from_secs(4));
    let (n, ok, summary) = bench.finish_summary();
    assert!(ok && n > 0, "pgbench failed: {summary}");
    wait_pipeline(c, p, 60);
    let ev_target = if target.contains("local") {
        "tgt_local.ev"
    } else {
        "public.ev"
    };
    assert_same_rows("ev", c, "public.ev", tgt, ev_target, "id, v");
    assert_eq!(
        c.query_scalar::<i32>(
            "SELECT attempts FROM tide.backfills WHERE source = 'items'::regclass"
        ),
        attempts_then,
        "the failed chunk was tried again\n{}",
        diag(c)
    );
    assert_eq!(
        c.log_count("failed (SQLSTATE"),
        failures_then,
        "failures logged after the backfill failed\n{}",
        c.log_tail(30)
    );

    // The remedy, as printed: fix the row, resume; the table converges.
    exec(c, "UPDATE items SET v = 1500 WHERE id = 1500");
    exec(c, &resume);
    wait_backfill(c, "items", p, 120);
    wait_pipeline(c, p, 60);
    assert_same_rows("items", c, "public.items", tgt, target, "id, v");
    let r = c.query_one(
        "SELECT state, attempts, error IS NULL AND error_sqlstate IS NULL FROM tide.backfills WHERE source = 'items'::regclass",
    );
    assert_eq!(r.get::<_, String>(0), "done");
    assert_eq!(
        r.get::<_, i32>(1),
        0,
        "attempts cleared by the next chunk written"
    );
    assert!(
        r.get::<_, bool>(2),
        "error cleared by the next chunk written"
    );
    assert_eq!(
        c.query_scalar::<i64>(&format!(
            "SELECT failed_backfills FROM tide.pipelines WHERE name = '{p}'"
        )),
        0
    );
}

#[test]
fn refused_chunk_fails_its_backfill_local() {
    let c = setup("tt_refused_local");
    c.execute(
        "CREATE SCHEMA tgt_local;
         CREATE TABLE tgt_local.items (id int PRIMARY KEY, v int NOT NULL, CONSTRAINT items_v_check CHECK (v >= 0));",
    );
    create_pipeline(&c, "rl", "table", r#"{"schema": "tgt_local"}"#);
    refused_chunk(&c, &c, "rl", "tgt_local.items");
}

#[test]
fn refused_chunk_fails_its_backfill_remote() {
    let (c, t) = setup_remote("tt_refused_remote");
    t.execute(
        "CREATE TABLE public.items (id int PRIMARY KEY, v int NOT NULL, CONSTRAINT items_v_check CHECK (v >= 0));",
    );
    create_pipeline(&c, "rr", "postgres", r#"{"server": "tgt"}"#);
    refused_chunk(&c, &t, "rr", "public.items");
}
