//! Security, third round (issue 44): a pipeline worker's temporary files are bounded like a
//! session's. The worker writes its decoded output past 8 MB and its streamed transactions'
//! spools to files under `base/pgsql_tmp` with the file system's calls, which `temp_file_limit`
//! does not see: any role that may write a captured table could fill the disk with one large
//! transaction.

use super::*;

/// With `temp_file_limit = 2MB` (and `tide.spool_file_limit` at its default, -1: follow it),
/// alice's transaction of ~10 MB of changes on her captured table makes her pipeline fail with
/// SQLSTATE 53400, naming the pipeline and the setting, in `tide.pipelines`; none of it is
/// applied meanwhile. Once a superuser raises `tide.spool_file_limit` (which only a superuser
/// may set) the pipeline applies the whole transaction, each row once. On main the files were
/// not counted and the transaction went through at once.
#[test]
fn spool_files_count_against_temp_file_limit() {
    let c = secured_with(
        "sec_spool",
        &[
            "temp_file_limit = '2MB'",
            "tide.decoding_work_mem = '1MB'",
            "tide.max_retry_delay = 2",
            "max_wal_size = '1GB'",
        ],
    );
    settings_refused(
        &c,
        &[
            "SET tide.spool_file_limit = -1",
            "ALTER SYSTEM SET tide.spool_file_limit = -1",
        ],
    );
    alice_pipeline(&c);
    ok_as(&c, "alice", "ALTER TABLE alice.t ADD COLUMN pad text");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    ok_as(
        &c,
        "alice",
        "INSERT INTO alice.t SELECT g, g, repeat(md5(g::text), 8) FROM generate_series(1001, 31000) g",
    );
    c.wait_until(
        "the pipeline to stop at the limit with 53400",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT last_error_sqlstate = '53400'
                                         AND last_error LIKE '%pipeline \"p\"%temp_file_limit%'
                                    FROM tide.pipelines WHERE name = 'p'), false)",
            )?)
        },
    );
    let applied: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE pipeline = 'p' AND (key->>'id')::int > 1000",
    );
    assert_eq!(applied, 0, "rows of the transaction applied past the limit");
    let hint: String =
        c.query_scalar("SELECT coalesce(remedy, '') FROM tide.pipelines WHERE name = 'p'");
    assert!(
        hint.contains("tide.spool_file_limit"),
        "the remedy does not name the setting: {hint}"
    );
    c.execute("ALTER SYSTEM SET tide.spool_file_limit = '256MB'");
    c.execute("SELECT pg_reload_conf()");
    wait_for_pipeline(&c, "p", 120, || diag(&c));
    let (rows, distinct): (i64, i64) = {
        let r = c.query_one(
            "SELECT count(*), count(DISTINCT key->>'id') FROM tide.outbox
              WHERE pipeline = 'p' AND (key->>'id')::int > 1000",
        );
        (r.get(0), r.get(1))
    };
    assert_eq!((rows, distinct), (30_000, 30_000), "{}", diag(&c));
}
