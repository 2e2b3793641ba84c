//! Production operations (issue 32: controls, bounds, throttles, progress, skipping), as a DBA
//! runs them: every call here is made by `alice`, a member of `tide_admin` with no other
//! attribute (the documented grant), on her own pipelines.
//!
//! - bounds: `chunk_size` and `rows_per_second` have bounds (22023, with them in the hint), and a
//!   `bigint` beyond `integer` is refused with 22003, not "function does not exist" (42883);
//! - throttle: a throttle belongs to its backfill: neither the next backfill of the pipeline,
//!   nor the one a table rewrite queues, nor `tide.verify` is paced by a throttle of a backfill
//!   that ended;
//! - controls: pausing what is paused, or resuming what runs, is a no-op with a NOTICE, for
//!   pipelines and backfills alike; an empty or blank condition is an error (22023);
//! - progress: the estimated total of a backfill holds on sparse and skewed keys.

use pg_test::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn diag(c: &Cluster) -> String {
    diag_of(
        c,
        &[
            (
                "pipelines",
                "SELECT name, state, enabled, last_error FROM tide.pipelines",
                10,
            ),
            (
                "backfills",
                "SELECT id, relation, state, chunk_size, rows_per_second, chunks_done, rows_read, estimated_rows, error FROM tide.backfill ORDER BY id",
                20,
            ),
        ],
        30,
    )
}

/// A cluster with pg_tide, `alice` (LOGIN, member of tide_admin, owner of schemas `alice` and
/// `copy`) and `nobody` (LOGIN, nothing else).
fn cluster(name: &str) -> Cluster {
    let c = setup(name);
    c.execute(
        "CREATE ROLE alice LOGIN; CREATE ROLE nobody LOGIN;
         GRANT tide_admin TO alice;
         CREATE SCHEMA alice AUTHORIZATION alice;
         CREATE SCHEMA copy AUTHORIZATION alice;",
    );
    c
}

/// A connection as `role` whose NOTICEs are collected in the returned list.
fn connect_noticed(c: &Cluster, role: &str) -> (Client, Arc<Mutex<Vec<String>>>) {
    let notices = Arc::new(Mutex::new(Vec::new()));
    let sink = notices.clone();
    let mut cfg = c.config("postgres");
    cfg.user(role);
    cfg.notice_callback(move |n| sink.lock().expect("notices").push(n.message().to_string()));
    let client = cfg
        .connect(NoTls)
        .unwrap_or_else(|e| panic!("connect as {role}: {}", describe_error(&e)));
    (client, notices)
}

#[track_caller]
fn ok(cl: &mut Client, c: &Cluster, sql: &str) {
    if let Err(e) = cl.batch_execute(sql) {
        panic!(
            "as alice: {sql}\nfailed: {}\n{}",
            describe_error(&e),
            diag(c)
        );
    }
}

fn scalar<T: for<'a> postgres::types::FromSql<'a>>(cl: &mut Client, c: &Cluster, sql: &str) -> T {
    cl.query_one(sql, &[])
        .unwrap_or_else(|e| {
            panic!(
                "as alice: {sql}\nfailed: {}\n{}",
                describe_error(&e),
                diag(c)
            )
        })
        .get(0)
}

/// alice's outbox pipeline `p` capturing `alice.t` (`rows` rows, no backfill), streaming.
fn alice_outbox(c: &Cluster, cl: &mut Client, rows: i64) {
    ok(
        cl,
        c,
        &format!(
            "CREATE TABLE alice.t (id int PRIMARY KEY, v int);
             INSERT INTO alice.t SELECT g, g FROM generate_series(1, {rows}) g;"
        ),
    );
    ok(cl, c, "SELECT tide.create_pipeline('p')");
    ok(
        cl,
        c,
        "SELECT tide.add_table('p', 'alice.t', backfill => false)",
    );
    wait_for_pipeline(c, "p", 30, || diag(c));
}

/// Item 5: bounds on chunk_size and rows_per_second; bigint values refused with 22003.
#[test]
fn chunk_size_and_throttle_bounds() {
    let c = cluster("ops_bounds");
    let (mut alice, _) = connect_noticed(&c, "alice");
    alice_outbox(&c, &mut alice, 100);
    let cases: &[(&str, &str, &str)] = &[
        // (call, SQLSTATE, hint)
        (
            "SELECT tide.start_backfill('alice.t', 'p', chunk_size => 2000000000)",
            "22023",
            "chunk_size is rows per chunk",
        ),
        (
            "SELECT tide.start_backfill('alice.t', 'p', chunk_size => 3000000000)",
            "22003",
            "chunk_size is rows per chunk",
        ),
        (
            "SELECT tide.start_backfill('alice.t', 'p', chunk_size => 1000001)",
            "22023",
            "from 1 to 1000000",
        ),
        (
            "SELECT tide.start_backfill('alice.t', 'p', chunk_size => 0)",
            "22023",
            "from 1 to 1000000",
        ),
        (
            "SELECT tide.start_backfill('alice.t', 'p', chunk_size => -9000000000)",
            "22003",
            "from 1 to 1000000",
        ),
    ];
    for (sql, code, hint) in cases {
        expect_fail_with(sql, alice.batch_execute(sql), code, Some(hint));
    }
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.backfill"),
        0,
        "a refused start left a backfill behind"
    );
    // An active backfill to alter: paused, so it stays active.
    ok(
        &mut alice,
        &c,
        "BEGIN; SELECT tide.start_backfill('alice.t', 'p', chunk_size => 10); SELECT tide.pause_backfill('alice.t', 'p'); COMMIT;",
    );
    let cases: &[(&str, &str, &str)] = &[
        (
            "SELECT tide.alter_backfill('alice.t', 'p', chunk_size => 2000000000)",
            "22023",
            "from 1 to 1000000",
        ),
        (
            "SELECT tide.alter_backfill('alice.t', 'p', chunk_size => 3000000000)",
            "22003",
            "from 1 to 1000000",
        ),
        (
            "SELECT tide.alter_backfill('alice.t', 'p', rows_per_second => 3000000000)",
            "22003",
            "rows_per_second is the backfill's throttle",
        ),
        (
            "SELECT tide.alter_backfill('alice.t', 'p', rows_per_second => 2000000000)",
            "22023",
            "from 0 to 100000000",
        ),
        (
            "SELECT tide.alter_backfill('alice.t', 'p', rows_per_second => -1)",
            "22023",
            "0 removes it",
        ),
    ];
    for (sql, code, hint) in cases {
        expect_fail_with(sql, alice.batch_execute(sql), code, Some(hint));
    }
    // The bounds themselves are accepted, and nothing refused changed the backfill.
    let (size, rps): (i32, Option<i32>) = {
        let r = alice
            .query_one(
                "SELECT chunk_size, rows_per_second FROM tide.backfills WHERE source = 'alice.t'::regclass",
                &[],
            )
            .expect("the backfill");
        (r.get(0), r.get(1))
    };
    assert_eq!(
        (size, rps),
        (10, None),
        "a refused alter changed the backfill"
    );
    ok(
        &mut alice,
        &c,
        "SELECT tide.alter_backfill('alice.t', 'p', chunk_size => 1000000, rows_per_second => 100000000)",
    );
    ok(
        &mut alice,
        &c,
        "SELECT tide.alter_backfill('alice.t', 'p', chunk_size => 1, rows_per_second => 0)",
    );
}

/// Item 7: a throttle belongs to its backfill only.
#[test]
fn throttle_belongs_to_its_backfill() {
    let c = cluster("ops_throttle");
    let (mut alice, _) = connect_noticed(&c, "alice");
    ok(
        &mut alice,
        &c,
        "CREATE TABLE alice.t (id int PRIMARY KEY, v int);
         INSERT INTO alice.t SELECT g, g FROM generate_series(1, 1000) g;
         CREATE TABLE alice.u (id int PRIMARY KEY, v int);
         INSERT INTO alice.u SELECT g, g FROM generate_series(1, 10) g;",
    );
    ok(
        &mut alice,
        &c,
        r#"SELECT tide.create_pipeline('p', 'table', '{"schema": "copy"}')"#,
    );
    ok(
        &mut alice,
        &c,
        "SELECT tide.add_table('p', 'alice.t', backfill => false);
         SELECT tide.add_table('p', 'alice.u', backfill => false);",
    );
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    // One chunk holds the whole table, throttled to 1 row/s from the start: were the throttle
    // to outlive the chunk, whatever comes next would wait 1000 s.
    ok(
        &mut alice,
        &c,
        "BEGIN;
         SELECT tide.start_backfill('alice.t', 'p', chunk_size => 5000);
         SELECT tide.alter_backfill('alice.t', 'p', rows_per_second => 1);
         COMMIT;",
    );
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    assert_eq!(
        scalar::<Option<i32>>(
            &mut alice,
            &c,
            "SELECT rows_per_second FROM tide.backfills WHERE source = 'alice.t'::regclass ORDER BY id DESC LIMIT 1"
        ),
        Some(1),
        "the finished backfill keeps its own throttle"
    );
    // The next backfill of the pipeline (another table) is not held back.
    ok(&mut alice, &c, "SELECT tide.start_backfill('alice.u', 'p')");
    let t = Instant::now();
    let done: bool = scalar(
        &mut alice,
        &c,
        "SELECT tide.wait_for_backfill('alice.u', 'p', interval '20 seconds')",
    );
    assert!(
        done,
        "the backfill after a throttled one waited for the old throttle ({:.1?})\n{}",
        t.elapsed(),
        diag(&c)
    );
    // verify reads the table in several ranges: paced at 1 row/s it would sleep for minutes.
    ok(&mut alice, &c, "SET statement_timeout = '30s'");
    let t = Instant::now();
    let res = alice.query(
        "SELECT row_to_json(v)::text FROM tide.verify('alice.t', 'p', ranges => 10) v WHERE kind NOT LIKE 'summary%'",
        &[],
    );
    match res {
        Ok(rows) => assert!(
            rows.is_empty(),
            "verify found differences: {:?}\n{}",
            rows.iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>(),
            diag(&c)
        ),
        Err(e) => panic!(
            "tide.verify was paced by the finished backfill's throttle: {} after {:.1?}",
            describe_error(&e),
            t.elapsed()
        ),
    }
    ok(&mut alice, &c, "RESET statement_timeout");
    // A rewrite queues a backfill that reads the table again: without the old throttle.
    ok(
        &mut alice,
        &c,
        "ALTER TABLE alice.t ALTER COLUMN v TYPE bigint",
    );
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    let (gen, rps): (i32, Option<i32>) = {
        let r = alice
            .query_one(
                "SELECT generation, rows_per_second FROM tide.backfills WHERE source = 'alice.t'::regclass ORDER BY id DESC LIMIT 1",
                &[],
            )
            .expect("the rewrite's backfill");
        (r.get(0), r.get(1))
    };
    assert_eq!(gen, 2, "the rewrite queued no backfill\n{}", diag(&c));
    assert_eq!(
        rps, None,
        "the backfill a rewrite queued inherited the finished backfill's throttle"
    );
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
}

/// Item 8: pause/resume of pipelines and backfills are no-ops with a NOTICE when repeated; an
/// empty or blank condition is an error.
#[test]
fn controls_are_idempotent() {
    let c = cluster("ops_controls");
    let (mut alice, notices) = connect_noticed(&c, "alice");
    alice_outbox(&c, &mut alice, 100);
    let expect_notice = |cl: &mut Client, sql: &str, needle: Option<&str>| {
        notices.lock().expect("notices").clear();
        ok(cl, &c, sql);
        let got = notices.lock().expect("notices").clone();
        match needle {
            Some(n) => assert!(
                got.iter().any(|m| m.contains(n)),
                "{sql}: expected a NOTICE containing {n:?}, got {got:?}"
            ),
            None => assert!(got.is_empty(), "{sql}: expected no NOTICE, got {got:?}"),
        }
    };
    let enabled = |cl: &mut Client| -> bool {
        scalar(
            cl,
            &c,
            "SELECT enabled FROM tide.pipelines WHERE name = 'p'",
        )
    };
    expect_notice(&mut alice, "SELECT tide.pause_pipeline('p')", None);
    expect_notice(
        &mut alice,
        "SELECT tide.pause_pipeline('p')",
        Some("pipeline \"p\" is already paused"),
    );
    assert!(!enabled(&mut alice));
    expect_notice(&mut alice, "SELECT tide.resume_pipeline('p')", None);
    expect_notice(
        &mut alice,
        "SELECT tide.resume_pipeline('p')",
        Some("pipeline \"p\" is not paused"),
    );
    assert!(enabled(&mut alice));

    // A backfill kept active by its throttle.
    ok(
        &mut alice,
        &c,
        "BEGIN; SELECT tide.start_backfill('alice.t', 'p', chunk_size => 10); SELECT tide.alter_backfill('alice.t', 'p', rows_per_second => 1); COMMIT;",
    );
    let state = |cl: &mut Client| -> String {
        scalar(
            cl,
            &c,
            "SELECT state FROM tide.backfills WHERE source = 'alice.t'::regclass ORDER BY id DESC LIMIT 1",
        )
    };
    expect_notice(
        &mut alice,
        "SELECT tide.pause_backfill('alice.t', 'p')",
        None,
    );
    expect_notice(
        &mut alice,
        "SELECT tide.pause_backfill('alice.t', 'p')",
        Some("is already paused"),
    );
    assert_eq!(state(&mut alice), "paused");
    expect_notice(
        &mut alice,
        "SELECT tide.resume_backfill('alice.t', 'p')",
        None,
    );
    expect_notice(
        &mut alice,
        "SELECT tide.resume_backfill('alice.t', 'p')",
        Some("nothing to resume"),
    );
    assert!(
        ["queued", "running"].contains(&state(&mut alice).as_str()),
        "a second resume changed the state"
    );
    ok(
        &mut alice,
        &c,
        "SELECT tide.cancel_backfill('alice.t', 'p')",
    );
    // Nothing active: still an error, not a no-op (there is no backfill to pause).
    let sql = "SELECT tide.pause_backfill('alice.t', 'p')";
    expect_fail_with(sql, alice.batch_execute(sql), "55000", None);

    // An empty or blank condition is a mistake, not "every row".
    for cond in ["''", "'   '", "E'\\n\\t '"] {
        let sql = format!("SELECT tide.start_backfill('alice.t', 'p', condition => {cond})");
        expect_fail_with(
            &sql,
            alice.batch_execute(&sql),
            "22023",
            Some("omit condition"),
        );
    }
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.backfill WHERE state <> 'cancelled'"),
        0,
        "an empty condition started a backfill"
    );
}

/// Item 6: the estimated total of a backfill holds on sparse and skewed keys, with statistics
/// (the key's histogram) and without (the key range is weighed against the planner's estimate).
#[test]
fn estimate_holds_on_sparse_and_skewed_keys() {
    let c = cluster("ops_estimate");
    let (mut alice, _) = connect_noticed(&c, "alice");
    // 5000 rows, the last one moved to id 50000; 5000 rows, 4000 dense and 1000 spread over
    // a range a thousand times wider.
    ok(
        &mut alice,
        &c,
        "CREATE TABLE alice.sparse (id int PRIMARY KEY, v int, pad text) WITH (autovacuum_enabled = false);
         INSERT INTO alice.sparse SELECT g, g, repeat('p', 28) FROM generate_series(1, 5000) g;
         UPDATE alice.sparse SET id = 50000 WHERE id = 5000;
         CREATE TABLE alice.sparse_fresh (LIKE alice.sparse INCLUDING ALL) WITH (autovacuum_enabled = false);
         INSERT INTO alice.sparse_fresh SELECT * FROM alice.sparse;
         CREATE TABLE alice.skewed (id bigint PRIMARY KEY, v int, pad text) WITH (autovacuum_enabled = false);
         INSERT INTO alice.skewed SELECT g, g, repeat('p', 28) FROM generate_series(1, 4000) g;
         INSERT INTO alice.skewed SELECT 1000000 + g * 1000, g, repeat('p', 28) FROM generate_series(1, 1000) g;
         ANALYZE alice.sparse; ANALYZE alice.skewed;",
    );
    ok(&mut alice, &c, "SELECT tide.create_pipeline('p')");
    for t in ["sparse", "sparse_fresh", "skewed"] {
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.add_table('p', 'alice.{t}', backfill => false)"),
        );
    }
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    for t in ["sparse", "sparse_fresh", "skewed"] {
        // 20 chunks of 250 rows, 2500 rows a second: about 2 s, sampled every 50 ms.
        ok(
            &mut alice,
            &c,
            &format!(
                "BEGIN;
                 SELECT tide.start_backfill('alice.{t}', 'p', chunk_size => 250);
                 SELECT tide.alter_backfill('alice.{t}', 'p', rows_per_second => 2500);
                 COMMIT;"
            ),
        );
        let started = Instant::now();
        let mut seen = Vec::new();
        loop {
            let r = alice
                .query_one(
                    &format!(
                        "SELECT state, chunks_done, estimated_rows, extract(epoch FROM estimated_time_left)::float8
                           FROM tide.backfills WHERE source = 'alice.{t}'::regclass ORDER BY id DESC LIMIT 1"
                    ),
                    &[],
                )
                .expect("tide.backfills");
            let state: String = r.get(0);
            if state == "done" {
                break;
            }
            let chunks: i64 = r.get(1);
            let est: Option<i64> = r.get(2);
            let eta: Option<f64> = r.get(3);
            if state == "running" && chunks >= 1 {
                seen.push((chunks, est, eta));
                let e = est.unwrap_or(0);
                assert!(
                    (2_500..=10_000).contains(&e),
                    "after {chunks} chunks the estimate of alice.{t} is {est:?} rows (ETA {eta:?} s) for 5000 rows\n{}",
                    diag(&c)
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the backfill of alice.{t} did not finish\n{}",
                diag(&c)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("alice.{t}: (chunks, estimated rows, ETA s) seen: {seen:?}");
        assert!(
            seen.len() >= 5,
            "only {} samples saw the backfill of alice.{t} running past its first chunk",
            seen.len()
        );
    }
}

/// Item 9: `tide.skip_transaction`. A source transaction that fails at the target stops the
/// pipeline with an error whose hint names its commit LSN (the transactions before it in the
/// same batch are applied); skipping that LSN lets the rest through, recorded with who asked.
#[test]
fn skip_transaction_skips_the_failing_one() {
    let c = cluster("ops_skip");
    let (mut alice, notices) = connect_noticed(&c, "alice");
    ok(
        &mut alice,
        &c,
        "CREATE TABLE alice.s (id int PRIMARY KEY, v int);",
    );
    ok(
        &mut alice,
        &c,
        r#"SELECT tide.create_pipeline('k', 'table', '{"schema": "copy"}')"#,
    );
    ok(
        &mut alice,
        &c,
        "SELECT tide.add_table('k', 'alice.s', backfill => false)",
    );
    wait_for_pipeline(&c, "k", 30, || diag(&c));
    // The target refuses what the source accepts: a transaction that cannot be applied.
    ok(
        &mut alice,
        &c,
        "ALTER TABLE copy.s ADD CONSTRAINT small CHECK (v < 100)",
    );
    // Three transactions in one batch: good, bad, good.
    ok(&mut alice, &c, "SELECT tide.pause_pipeline('k')");
    let lsn_after = |cl: &mut Client, sql: &str| -> String {
        ok(cl, &c, sql);
        scalar(cl, &c, "SELECT pg_current_wal_lsn()::text")
    };
    let after1 = lsn_after(&mut alice, "INSERT INTO alice.s VALUES (1, 1)");
    let after2 = lsn_after(&mut alice, "INSERT INTO alice.s VALUES (2, 500)");
    lsn_after(&mut alice, "INSERT INTO alice.s VALUES (3, 3)");
    ok(&mut alice, &c, "SELECT tide.resume_pipeline('k')");
    let mut named = String::new();
    c.wait_until(
        "the pipeline's error to name the failing transaction",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let r = c.try_query_one(
                "SELECT coalesce(last_error_sqlstate, ''), coalesce(remedy, '') FROM tide.pipelines WHERE name = 'k'",
            )?;
            let (code, remedy): (String, String) = (r.get(0), r.get(1));
            let needle = "SELECT tide.skip_transaction('k', '";
            if let Some(i) = remedy.find(needle) {
                assert_eq!(code, "23514", "the error is the target's CHECK violation: {remedy}");
                let rest = &remedy[i + needle.len()..];
                named = rest[..rest.find('\'').unwrap_or(0)].to_string();
                return Ok(true);
            }
            Ok(false)
        },
    );
    // The named LSN is the second transaction's commit.
    let within: bool = scalar(
        &mut alice,
        &c,
        &format!("SELECT '{named}'::pg_lsn >= '{after1}'::pg_lsn AND '{named}'::pg_lsn < '{after2}'::pg_lsn"),
    );
    assert!(
        within,
        "the named LSN {named} is not the failing transaction's commit (between {after1} and {after2})"
    );
    // The transaction before it reached the target; it and the one after did not.
    let ids = |cl: &mut Client| -> String {
        scalar(
            cl,
            &c,
            "SELECT coalesce(string_agg(id::text, ',' ORDER BY id), '') FROM copy.s",
        )
    };
    assert_eq!(
        ids(&mut alice),
        "1",
        "what reached the target before the skip"
    );

    // Bad input.
    for (sql, code) in [
        ("SELECT tide.skip_transaction('k', NULL)", "22004"),
        ("SELECT tide.skip_transaction('k', '0/0')", "22023"),
        ("SELECT tide.skip_transaction('k', '0/1')", "22023"),
        ("SELECT tide.skip_transaction('k', 'nonsense')", "22P02"),
        ("SELECT tide.skip_transaction('nosuch', '0/1')", "42704"),
    ] {
        expect_fail_with(sql, alice.batch_execute(sql), code, None);
    }

    ok(
        &mut alice,
        &c,
        &format!("SELECT tide.skip_transaction('k', '{named}')"),
    );
    notices.lock().expect("notices").clear();
    ok(
        &mut alice,
        &c,
        &format!("SELECT tide.skip_transaction('k', '{named}')"),
    );
    assert!(
        notices
            .lock()
            .expect("notices")
            .iter()
            .any(|n| n.contains("already skips")),
        "a second skip of the same LSN says so"
    );
    wait_for_pipeline(&c, "k", 60, || diag(&c));
    assert_eq!(
        ids(&mut alice),
        "1,3",
        "the skipped transaction reached the target, or the next did not"
    );
    let r = alice
        .query_one(
            "SELECT lsn::text, requested_by::text, skipped_at IS NOT NULL, xid IS NOT NULL
               FROM tide.skipped_transactions WHERE pipeline = 'k'",
            &[],
        )
        .expect("tide.skipped_transactions");
    let (lsn, by, skipped, xid): (String, String, bool, bool) =
        (r.get(0), r.get(1), r.get(2), r.get(3));
    assert_eq!(
        (lsn.as_str(), by.as_str(), skipped, xid),
        (named.as_str(), "alice", true, true)
    );
    let err: Option<String> = scalar(
        &mut alice,
        &c,
        "SELECT last_error FROM tide.pipelines WHERE name = 'k'",
    );
    assert_eq!(err, None, "the error stays after the skip");
    // Later changes flow as usual.
    ok(&mut alice, &c, "INSERT INTO alice.s VALUES (4, 4)");
    wait_for_pipeline(&c, "k", 30, || diag(&c));
    assert_eq!(ids(&mut alice), "1,3,4");
}

/// Item 9: an outbox consumer waits instead of polling: `tide.read_outbox(..., wait => ...)`
/// returns as soon as the pipeline writes an event (a write made while the read waits), or
/// nothing after the wait.
#[test]
fn outbox_consumer_waits() {
    let c = cluster("ops_wait");
    let (mut alice, _) = connect_noticed(&c, "alice");
    alice_outbox(&c, &mut alice, 0);
    ok(
        &mut alice,
        &c,
        "SELECT tide.create_consumer('p', 'c', 'latest')",
    );
    // Nothing comes: empty after the wait, not before.
    let t = Instant::now();
    let n = alice
        .query(
            "SELECT * FROM tide.read_outbox('p', 'c', wait => '500 ms')",
            &[],
        )
        .expect("read_outbox with wait")
        .len();
    let waited = t.elapsed();
    assert_eq!(n, 0);
    assert!(
        waited >= Duration::from_millis(450) && waited < Duration::from_secs(10),
        "an empty read_outbox with wait => 500 ms returned after {waited:?}"
    );
    // A row written while the read waits (the writer starts once alice's read is in its wait).
    let writer = {
        let c2 = connect_as(&c, "alice");
        let mut watch = c.client();
        std::thread::spawn(move || {
            let mut c2 = c2;
            let start = Instant::now();
            loop {
                let waiting: bool = watch
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE usename = 'alice' AND state = 'active'
                                          AND query LIKE '%read_outbox%wait%' AND now() - query_start > interval '200 ms')",
                        &[],
                    )
                    .expect("pg_stat_activity")
                    .get(0);
                if waiting {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the read never waited"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            // Taken before the write: its commit can wake the read, and the read return, before
            // this thread gets the INSERT's reply.
            let writing = Instant::now();
            c2.batch_execute("INSERT INTO alice.t VALUES (42, 42)")
                .expect("the write");
            writing
        })
    };
    let t = Instant::now();
    let rows = alice
        .query(
            "SELECT id, op, row->>'v' FROM tide.read_outbox('p', 'c', wait => '60 seconds')",
            &[],
        )
        .expect("read_outbox with wait");
    let returned = Instant::now();
    let wrote = writer.join().expect("writer");
    assert_eq!(
        rows.len(),
        1,
        "the waiting read returned {} events",
        rows.len()
    );
    let (op, v): (String, Option<String>) = (rows[0].get(1), rows[0].get(2));
    assert_eq!((op.as_str(), v.as_deref()), ("insert", Some("42")));
    assert!(
        returned >= wrote && returned.duration_since(wrote) < Duration::from_secs(10),
        "the read returned {:?} after the write (waited {:?} in all)",
        returned.saturating_duration_since(wrote),
        returned.duration_since(t)
    );
    // Events already there: no wait at all.
    let t = Instant::now();
    let n = alice
        .query(
            "SELECT * FROM tide.read_outbox('p', 'c', 10, '60 seconds')",
            &[],
        )
        .expect("read_outbox")
        .len();
    assert_eq!(n, 1);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "read_outbox waited with events to read"
    );
    // Refusals.
    for (sql, code) in [
        (
            "SELECT * FROM tide.read_outbox('p', 'c', wait => '-1 second')",
            "22023",
        ),
        (
            "SELECT * FROM tide.read_outbox('p', 'c', wait => NULL)",
            "22004",
        ),
        (
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT * FROM tide.read_outbox('p', 'nosuch', wait => '1 second')",
            "42704",
        ),
    ] {
        expect_fail_with(sql, alice.batch_execute(sql), code, None);
        let _ = alice.batch_execute("ROLLBACK");
    }
    let sql = "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT * FROM tide.read_outbox('p', 'c', wait => '1 second')";
    expect_fail_with(
        sql,
        alice.batch_execute(sql),
        "0A000",
        Some("READ COMMITTED"),
    );
    let _ = alice.batch_execute("ROLLBACK");
}

/// Issue 43 item 7: `tide.drop_pipeline` reads the worker's pid and then signals it; a worker
/// that exits in between (a backfill's end, an `alter_pipeline`, a server shutdown) must cost
/// the caller nothing: no `WARNING: PID n is not a PostgreSQL backend process` (which also broke
/// the upgrade suite's golden transcript). The interleaving is forced, not hoped for: gdb stops
/// alice's backend where it looks the worker's process up (`BackendPidGetProc` with the worker's
/// pid), the worker is ended and gone, and only then does the backend go on.
#[test]
fn drop_pipeline_is_silent_when_its_worker_exits_first() {
    let c = cluster("drop_exited");
    let (mut cl, notices) = connect_noticed(&c, "alice");
    ok(&mut cl, &c, "SELECT tide.create_pipeline('gone')");
    c.wait_until(
        "the worker",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || Ok(worker_pid(&c, "gone").is_some()),
    );
    let worker = worker_pid(&c, "gone").expect("a worker");
    let backend: i32 = scalar(&mut cl, &c, "SELECT pg_backend_pid()");
    let ready = std::env::temp_dir().join(format!("pg_tide_gdb_ready_{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    // The first argument's register at the function's entry.
    let arg = if cfg!(target_arch = "aarch64") {
        "$x0"
    } else {
        "$rdi"
    };
    let gdb = std::process::Command::new("gdb")
        .args(["-p", &backend.to_string(), "-batch", "-nx"])
        .args(["-ex", "set pagination off"])
        .args(["-ex", &format!("break BackendPidGetProc if {arg} == {worker}")])
        .args(["-ex", &format!("shell touch {}", ready.display())])
        .args(["-ex", "continue"])
        // Stopped with the worker's pid in hand: end the worker, wait until it is gone.
        .args([
            "-ex",
            &format!("shell kill -TERM {worker}; while kill -0 {worker} 2>/dev/null; do sleep 0.05; done"),
        ])
        .args(["-ex", "delete", "-ex", "detach", "-ex", "quit"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("this test needs gdb (scripts/setup.sh installs it): {e}"));
    c.wait_until(
        "gdb to stop the backend",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || Ok(ready.exists()),
    );
    // Sent while gdb holds the backend: it reads it once gdb lets it go on.
    ok(&mut cl, &c, "SELECT tide.drop_pipeline('gone')");
    let out = gdb.wait_with_output().expect("gdb ran");
    let gdb_out = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::remove_file(&ready);
    assert!(
        gdb_out.contains("Breakpoint 1, "),
        "gdb never stopped the backend at BackendPidGetProc({worker}): the interleaving was not forced\n{gdb_out}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{worker}")).exists(),
        "the worker {worker} still runs"
    );
    let seen = notices.lock().expect("notices").clone();
    assert!(
        seen.iter()
            .all(|n| !n.contains("is not a PostgreSQL backend process")),
        "tide.drop_pipeline warned about the worker that had exited: {seen:?}"
    );
    assert_eq!(
        c.log_count("is not a PostgreSQL backend process"),
        0,
        "the server log has the warning\n{}",
        c.log_tail(30)
    );
    let left: i64 = c.query_scalar(
        "SELECT (SELECT count(*) FROM tide.pipeline WHERE name = 'gone')
              + (SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'tide_5_gone')",
    );
    assert_eq!(left, 0, "the pipeline and its slot are gone");
}
