//! A commit that becomes visible only after a chunk's low watermark: the chunk's stale row must
//! not overwrite it at the target.

use crate::common::*;
use std::time::Duration;

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
    let cfg = c.config("postgres");
    let waiter = std::thread::spawn(move || {
        let mut a = cfg.connect(NoTls).expect("connect");
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
