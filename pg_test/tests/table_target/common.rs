//! The table-target suite's prelude: everything of `pg_test` (source and target compared with
//! [`assert_same_rows`]), plus LSNs parsed.

pub use pg_test::*;
use std::time::Duration;

pub const POLL: Duration = Duration::from_millis(100);

/// "X/Y" → u64.
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// A session on the remote target `t` holding `<schema>.tide_applied` (created here) locked
/// ACCESS EXCLUSIVE in an open transaction: a pipeline worker's first iteration on that target
/// then waits in its `begin` (reading its applied position), after it read its table list and
/// before it decodes. Release it with `ROLLBACK`. See [`wait_worker_held`].
pub fn hold_applied(t: &Cluster, schema: &str) -> Client {
    t.execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE {schema}.tide_applied (pipeline text PRIMARY KEY, applied_lsn pg_lsn NOT NULL,
                                             applied_at timestamptz NOT NULL DEFAULT now());"
    ));
    let mut lock = t.client();
    // A failure here is the test's failure (the target cluster is the test's own).
    lock.batch_execute(&format!(
        "BEGIN; LOCK TABLE {schema}.tide_applied IN ACCESS EXCLUSIVE MODE"
    ))
    .expect("lock the target's tide_applied");
    lock
}

/// Wait until a session on `t` waits for the lock [`hold_applied`] holds on
/// `<schema>.tide_applied`: the worker's first iteration is held in its window.
pub fn wait_worker_held(t: &Cluster, schema: &str) {
    t.wait_until(
        "the worker's first iteration waiting on the target's tide_applied",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            Ok(t.try_query_scalar::<i64>(&format!(
                "SELECT count(*) FROM pg_locks
                  WHERE relation = '{schema}.tide_applied'::regclass AND NOT granted"
            ))? > 0)
        },
    );
}
