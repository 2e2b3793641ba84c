//! Waits end on interrupts. A worker whose remote target does not answer (its statement waits
//! for a lock held at the remote) still stops at once when it is told to: `pg_terminate_backend`
//! and `tide.drop_pipeline` do not wait for the remote sink's timeout (60 s, twice that during
//! COMMIT), because the main thread looks at interrupts every 100 ms while it waits for the
//! sink thread.

use pg_test::*;
use std::time::{Duration, Instant};

/// Far below the remote sink's 60 s reply timeout, far above the 100 ms the check takes.
const PROMPT: Duration = Duration::from_secs(10);

fn worker_pid(c: &Cluster) -> Option<i32> {
    pg_test::worker_pid(c, "p")
}

/// Wait until the pipeline's worker has an apply statement waiting for a lock at the target, on
/// a connection opened after `since` (the target's clock).
fn wait_until_stalled(c: &Cluster, tgt: &Cluster, since: &str) -> i32 {
    c.wait_until(
        "a worker",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || Ok(worker_pid(c).is_some()),
    );
    tgt.wait_until(
        "the worker's remote statement to wait for the lock",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            Ok(tgt.try_query_scalar::<i64>(&format!(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE wait_event_type = 'Lock' AND backend_start > '{since}'::timestamptz"
            ))? > 0)
        },
    );
    worker_pid(c).expect("the worker's pid")
}

#[test]
fn a_stalled_remote_target_does_not_delay_stopping() {
    let (c, tgt) = setup_remote("stall");
    c.execute(r#"SELECT tide.create_pipeline('p', 'postgres', '{"server": "tgt"}')"#);
    c.execute("CREATE TABLE s (id int PRIMARY KEY, v int)");
    c.execute("SELECT tide.add_table('p', 's')");
    wait_for_pipeline(&c, "p", 60, || diag(&c));

    let mut blocker = tgt.client();
    blocker
        .batch_execute("BEGIN; LOCK TABLE public.s IN ACCESS EXCLUSIVE MODE")
        .expect("lock at the target");
    c.execute("INSERT INTO s VALUES (1, 1)");

    // pg_terminate_backend: the worker exits while its remote statement still waits.
    let start: String = tgt.query_scalar("SELECT '-infinity'::timestamptz::text");
    let pid = wait_until_stalled(&c, &tgt, &start);
    let since: String = tgt.query_scalar("SELECT now()::text");
    let t = Instant::now();
    c.execute(&format!("SELECT pg_terminate_backend({pid})"));
    c.wait_until(
        "the terminated worker to exit",
        Duration::from_secs(90),
        Duration::from_millis(20),
        || {
            Ok(c.try_query_scalar::<i64>(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"
            ))? == 0)
        },
    );
    let took = t.elapsed();
    assert!(
        took < PROMPT,
        "the worker took {took:.1?} to exit on SIGTERM while waiting for its remote target\n{}",
        diag(&c)
    );

    // drop_pipeline, while the next worker is stalled the same way.
    let pid2 = wait_until_stalled(&c, &tgt, &since);
    assert_ne!(pid2, pid, "the launcher started a new worker");
    let t = Instant::now();
    c.execute("SELECT tide.drop_pipeline('p')");
    let took = t.elapsed();
    assert!(
        took < PROMPT,
        "tide.drop_pipeline took {took:.1?} while the worker waited for its remote target\n{}",
        diag(&c)
    );
    let left: i64 = c.query_scalar("SELECT count(*) FROM tide.pipelines");
    assert_eq!(left, 0, "the pipeline was dropped");
    blocker.batch_execute("ROLLBACK").expect("release the lock");
}

/// A remote target commits a batch before the worker's own transaction records what the batch
/// passed in the catalog (tables now captured, tables removed, re-reads after a rewrite). When
/// that record fails (here: the worker's UPDATE of the added table's row waits for a lock and is
/// cancelled), the retry reads the batch again as a replay, since the remote already has it: its
/// catalog effects must still be recorded, or the table added in it stays `pending` forever
/// (seen once in benchmark B7). The add_table and a captured write share one source transaction,
/// so both are in the batch the remote commits.
#[test]
fn a_failed_catalog_record_after_the_remote_commit_is_redone() {
    let (c, tgt) = setup_remote("rerecord");
    c.execute(r#"SELECT tide.create_pipeline('p', 'postgres', '{"server": "tgt"}')"#);
    c.execute(
        "CREATE TABLE s (id int PRIMARY KEY, v int); CREATE TABLE x (id int PRIMARY KEY, v int)",
    );
    c.execute("SELECT tide.add_table('p', 's')");
    wait_for_pipeline(&c, "p", 60, || diag(&c));

    // The worker is held at the remote (a lock there) while x is added, so the row it will
    // update to mark x captured can be locked before it gets there.
    let mut blocker = tgt.client();
    blocker
        .batch_execute("BEGIN; LOCK TABLE public.s IN ACCESS EXCLUSIVE MODE")
        .expect("lock at the target");
    let since: String = tgt.query_scalar("SELECT '-infinity'::timestamptz::text");
    c.execute("INSERT INTO s VALUES (1, 1)");
    wait_until_stalled(&c, &tgt, &since);
    c.execute(
        "BEGIN; SELECT tide.add_table('p', 'x', backfill => false); INSERT INTO s VALUES (2, 2); COMMIT;",
    );
    let mut holder = c.client();
    holder
        .batch_execute(
            "BEGIN; SELECT 1 FROM tide.pipeline_table WHERE relid = 'x'::regclass FOR UPDATE",
        )
        .unwrap();
    blocker.batch_execute("ROLLBACK").unwrap();

    // The worker applies the add_table's transaction at the remote, then waits for the row.
    tgt.wait_until(
        "the add_table's transaction at the remote",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || Ok(tgt.try_query_scalar::<i64>("SELECT count(*) FROM public.s WHERE id = 2")? == 1),
    );
    c.wait_until(
        "the worker's catalog UPDATE to wait for the row lock",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE backend_type = 'pg_tide worker' AND wait_event_type = 'Lock'",
            )? == 1)
        },
    );
    let pid = worker_pid(&c).expect("the worker");
    c.execute(&format!("SELECT pg_cancel_backend({pid})"));
    c.wait_until(
        "the cancelled iteration's error",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT last_error_sqlstate IS NOT NULL FROM tide.pipelines WHERE name = 'p'",
            )?)
        },
    );
    let state: String =
        c.query_scalar("SELECT state FROM tide.tables WHERE source = 'x'::regclass");
    assert_eq!(
        state,
        "pending",
        "the failed record left x pending\n{}",
        diag(&c)
    );
    holder.batch_execute("ROLLBACK").unwrap();

    c.wait_until(
        "x captured after the retry",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT state = 'capturing' FROM tide.tables WHERE source = 'x'::regclass), false)",
            )?)
        },
    );
    c.execute("INSERT INTO x VALUES (7, 7); INSERT INTO s VALUES (3, 3)");
    tgt.wait_until(
        "x's row at the remote",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            Ok(tgt.try_query_scalar::<i64>(
                "SELECT (SELECT count(*) FROM public.x WHERE id = 7) + (SELECT count(*) FROM public.s)",
            )? == 4)
        },
    );
}
