//! Table rewrites while a backfill runs: no backfill may finish with rows missing, whatever DDL
//! commits during a chunk read.
//!
//! PostgreSQL's "MVCC caveat": after TRUNCATE and the table-rewriting forms of ALTER TABLE, the
//! table looks empty to a snapshot taken before the rewrite committed. A chunk transaction that
//! takes its snapshot and then waits for the rewrite's ACCESS EXCLUSIVE lock reads 0 rows, takes
//! them for the end of the table and ends the backfill with the rest never read.
//!
//! Each case here holds a rewrite in the middle of a multi-chunk, throttled backfill: a blocker
//! session holds ACCESS SHARE on the tables, the DDL queues behind it for ACCESS EXCLUSIVE (so
//! the backfill's next chunk meets a queued rewrite), then the blocker lets go and the rewrite
//! commits. Writers run the whole time. Afterwards, for an outbox pipeline (replayed onto an empty
//! copy) and a table-target pipeline, the target must equal the source both ways, every backfill
//! must be `done`, and no chunk but a backfill's last may read fewer rows than its chunk size.
//!
//! A rewrite that may change values without any row event (ALTER COLUMN TYPE, ADD COLUMN with a
//! volatile default) makes pg_tide read the table again; the ADD COLUMN ... DEFAULT random()
//! case shows it (no row event carries the new column's values).
//!
//! Also here: `tide.verify` during a held rewrite reports no difference, and `tide.repair`
//! during one deletes no good row.

use pg_test::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const ROWS: i64 = 12_000;
const CHUNK: i64 = 400;

fn connect(c: &Cluster) -> postgres::Client {
    c.client()
}

/// A table of `ROWS` rows with a primary key, an int and some padding.
fn create_source(c: &Cluster, t: &str) {
    c.execute(&format!(
        "CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL, pad text);
         INSERT INTO {t} SELECT g, g % 1000, repeat('x', 40) FROM generate_series(1, {ROWS}) g;
         ANALYZE {t};"
    ));
}

/// Writers: random updates, inserts (inside and past the key range) and deletes on `tables`
/// until `stop` is set. Each statement picks its key once (an InitPlan), so it touches one row.
fn spawn_writer(c: &Cluster, tables: &[&str], stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    let mut cl = connect(c);
    let tables: Vec<String> = tables.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            for t in &tables {
                let sql = churn_sql(t, ROWS);
                // A statement may fail while a rewrite changes the table under it (e.g. a cached
                // plan); the next round goes on.
                if cl.batch_execute(&sql).is_ok() {
                    n += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(15));
        }
        n
    })
}

/// Run `ddl` on a connection of its own and return once it waits for a lock (another session
/// holds one that conflicts); the handle gives its outcome when it has run.
fn queue_ddl(c: &Cluster, ddl: &str) -> JoinHandle<Result<(), postgres::Error>> {
    let mut client = connect(c);
    let pid: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .expect("pid")
        .get(0);
    let sql = ddl.to_string();
    let runner = std::thread::spawn(move || client.batch_execute(&sql));
    c.wait_until(
        "the DDL to queue for its lock",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || {
            Ok(c.try_query_scalar::<bool>(&format!(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = {pid} AND NOT granted)"
            ))?)
        },
    );
    runner
}

/// Hold `ddl` (run in one implicit transaction on another connection) behind a session that
/// holds ACCESS SHARE on `tables`, until the backfills of `tables` have both moved past
/// `after_chunks` chunks and the DDL is queued; then let it commit. Returns when it committed.
fn hold_rewrite(c: &Cluster, tables: &[&str], ddl: &str) {
    hold_rewrite_then(c, tables, ddl, || {});
}

/// [`hold_rewrite`], calling `queued` as soon as the DDL waits for its lock.
fn hold_rewrite_then(c: &Cluster, tables: &[&str], ddl: &str, queued: impl FnOnce()) {
    let mut blocker = connect(c);
    let list = tables.join(", ");
    blocker
        .batch_execute(&format!("BEGIN; LOCK TABLE {list} IN ACCESS SHARE MODE"))
        .expect("blocker lock");
    let runner = queue_ddl(c, ddl);
    queued();
    // Let the backfills' next chunks meet the queued rewrite.
    std::thread::sleep(Duration::from_millis(1500));
    blocker.batch_execute("COMMIT").expect("blocker commit");
    runner
        .join()
        .expect("ddl thread")
        .unwrap_or_else(|e| panic!("{ddl} failed: {}", describe_error(&e)));
}

/// `a EXCEPT ALL b` and `b EXCEPT ALL a` must both be empty.
#[track_caller]
fn assert_same(c: &Cluster, a: &str, b: &str, what: &str) {
    let r = c.query_one(&format!(
        "SELECT (SELECT count(*) FROM (TABLE {a} EXCEPT ALL TABLE {b}) x),
                (SELECT count(*) FROM (TABLE {b} EXCEPT ALL TABLE {a}) y),
                (SELECT count(*) FROM {a})"
    ));
    let (missing, extra, total): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
    assert!(
        missing == 0 && extra == 0,
        "{what}: {b} differs from {a} ({total} rows): {missing} rows of {a} missing or different in {b}, \
         {extra} rows of {b} not in {a}\n--- {a} EXCEPT {b} ---\n{}\n--- {b} EXCEPT {a} ---\n{}\n{}",
        sample(c, &format!("TABLE {a} EXCEPT ALL TABLE {b}"), 5),
        sample(c, &format!("TABLE {b} EXCEPT ALL TABLE {a}"), 5),
        diag(c)
    );
}

/// Every backfill of `table` is done, and no chunk but a backfill's last read fewer rows than
/// its chunk size (a short chunk ends a backfill; one in the middle would mean rows skipped).
#[track_caller]
fn assert_backfills_whole(c: &Cluster, table: &str) {
    let not_done: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.backfills WHERE source = '{table}'::regclass AND state <> 'done'"
    ));
    assert_eq!(
        not_done,
        0,
        "a backfill of {table} is not done\n{}",
        diag(c)
    );
    let short_mid: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.chunks ch JOIN tide.backfills b ON b.id = ch.backfill_id
          WHERE b.source = '{table}'::regclass AND ch.rows_read < b.chunk_size
            AND ch.chunk < (SELECT max(chunk) FROM tide.chunks WHERE backfill_id = b.id)"
    ));
    assert_eq!(
        short_mid,
        0,
        "a chunk of {table} read fewer rows than asked before the end\n{}",
        diag(c)
    );
}

/// Wait until each pipeline has applied everything committed so far (so the worker has seen
/// every rewrite and queued or restarted the backfills it causes), then until the backfills are
/// done, then until the pipelines caught up with their last chunk.
fn settle(c: &Cluster, pairs: &[(&str, &str)]) {
    for (_, p) in pairs {
        wait_for_pipeline(c, p, 60, || diag(c));
    }
    for (t, p) in pairs {
        wait_for_backfill(c, t, Some(p), 120, || diag(c));
    }
    for (_, p) in pairs {
        wait_for_pipeline(c, p, 60, || diag(c));
    }
}

fn wait_chunks(c: &Cluster, tables: &[&str], at_least: i64) {
    for t in tables {
        c.wait_until(
            &format!("{at_least} chunks of the backfill of {t}"),
            Duration::from_secs(60),
            Duration::from_millis(20),
            || {
                Ok(c.try_query_scalar::<i64>(&format!(
                    "SELECT coalesce(max(chunks_done), 0) FROM tide.backfills
                      WHERE source = '{t}'::regclass AND state IN ('running', 'queued')"
                ))? >= at_least)
            },
        );
    }
}

/// How a case's DDL runs.
#[derive(Clone, Copy, PartialEq)]
enum Hold {
    /// Both tables' statements in one transaction, held once.
    Together,
    /// One statement per table, each held on its own (for statements that cannot run in a
    /// transaction block, such as VACUUM FULL).
    Apart,
}

/// One case: `ddl(table)` is the statement(s) held in the middle of the backfills of an outbox
/// pipeline (table `o`) and a table-target pipeline (table `t`).
fn rewrite_case(name: &str, hold: Hold, ddl: impl Fn(&str) -> String) {
    let c = setup(&format!("rewrite_{name}"));
    create_source(&c, "o");
    create_source(&c, "t");
    c.execute("SELECT tide.create_pipeline('po')");
    c.execute(r#"SELECT tide.create_pipeline('pt', 'table', '{"schema": "replica"}')"#);
    c.execute("SELECT tide.add_table('po', 'o', backfill => false)");
    c.execute("SELECT tide.add_table('pt', 't', backfill => false)");
    wait_for_pipeline(&c, "po", 30, || diag(&c));
    wait_for_pipeline(&c, "pt", 30, || diag(&c));

    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&c, &["o", "t"], stop.clone());
    // About 4 s per table: a rewrite in the middle is met by several chunks.
    c.execute(&format!(
        "BEGIN;
         SELECT tide.start_backfill('o', 'po', chunk_size => {CHUNK});
         SELECT tide.alter_backfill('o', 'po', rows_per_second => 3000);
         SELECT tide.start_backfill('t', 'pt', chunk_size => {CHUNK});
         SELECT tide.alter_backfill('t', 'pt', rows_per_second => 3000);
         COMMIT;"
    ));
    wait_chunks(&c, &["o", "t"], 3);
    let started = Instant::now();
    match hold {
        Hold::Together => hold_rewrite(&c, &["o", "t"], &format!("{}; {}", ddl("o"), ddl("t"))),
        Hold::Apart => {
            hold_rewrite(&c, &["o"], &ddl("o"));
            hold_rewrite(&c, &["t"], &ddl("t"));
        }
    }
    eprintln!(
        "rewrite {name} held and committed in {:.1?}",
        started.elapsed()
    );
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::SeqCst);
    let rounds = writer.join().expect("writer");
    assert!(rounds > 10, "the writer barely ran ({rounds} rounds)");

    settle(&c, &[("o", "po"), ("t", "pt")]);

    assert_backfills_whole(&c, "o");
    assert_backfills_whole(&c, "t");
    assert_same(&c, "t", "replica.t", &format!("{name}: table target"));
    outbox_copy(&c, "o", "public.o", "o_copy");
    let events: i64 = c.query_scalar("SELECT o_copy_replay('po')");
    assert!(events > 0);
    assert_same(&c, "o", "o_copy", &format!("{name}: outbox replay"));
}

#[test]
fn alter_column_type_during_backfill() {
    rewrite_case("alter_type", Hold::Together, |t| {
        format!("ALTER TABLE {t} ALTER COLUMN v TYPE numeric(12,2)")
    });
}

#[test]
fn add_column_volatile_default_during_backfill() {
    rewrite_case("add_column", Hold::Together, |t| {
        format!("ALTER TABLE {t} ADD COLUMN r float8 DEFAULT random()")
    });
}

#[test]
fn truncate_during_backfill() {
    rewrite_case("truncate", Hold::Together, |t| format!("TRUNCATE {t}"));
}

#[test]
fn vacuum_full_during_backfill() {
    // VACUUM FULL cannot run in a transaction block: one statement, one table each.
    rewrite_case("vacuum_full", Hold::Apart, |t| format!("VACUUM FULL {t}"));
}

#[test]
fn cluster_during_backfill() {
    rewrite_case("cluster", Hold::Together, |t| {
        format!("CLUSTER {t} USING {t}_pkey")
    });
}

/// `tide.verify` while a rewrite of the source commits reports nothing, and `tide.repair` while
/// one commits deletes no good row: the keys it was asked to delete were inserted at the source
/// meanwhile, so they must stay.
#[test]
fn verify_and_repair_during_rewrite() {
    let c = setup("rewrite_verify");
    create_source(&c, "t");
    c.execute(r#"SELECT tide.create_pipeline('pt', 'table', '{"schema": "replica"}')"#);
    c.execute("SELECT tide.add_table('pt', 't')");
    settle(&c, &[("t", "pt")]);
    assert_same(&c, "t", "replica.t", "after the initial backfill");

    // Verify, throttled to a few seconds (verify honours the table's backfill throttle), with a
    // rewrite held and committed while it runs.
    c.execute("UPDATE tide.backfill SET rows_per_second = 4000");
    let cfg = c.config("postgres");
    let verifier = std::thread::spawn(move || {
        let mut v = cfg.connect(NoTls).expect("connect");
        v.query_one(
            "SELECT count(*), coalesce(json_agg(v)::text, '') FROM tide.verify('t', 'pt', ranges => 30) v
              WHERE kind NOT LIKE 'summary%'",
            &[],
        )
        .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)))
    });
    std::thread::sleep(Duration::from_millis(700));
    let mut ddl = connect(&c);
    ddl.batch_execute("ALTER TABLE t ALTER COLUMN v TYPE bigint")
        .expect("alter during verify");
    let (reported, rows) = verifier
        .join()
        .expect("verifier")
        .unwrap_or_else(|e| panic!("verify failed: {}", describe_error(&e)));
    assert_eq!(
        reported,
        0,
        "verify reported differences while the source was rewritten: {rows}\n{}",
        diag(&c)
    );
    settle(&c, &[("t", "pt")]);
    assert_same(&c, "t", "replica.t", "after verify and the rewrite");

    // Extra rows at the target. A repair finds them (its verification runs first) and, in the
    // same transaction, the source gets the same keys: they are good rows by the time the
    // repair's chunk decides which of them "no longer exist". That chunk is read while a rewrite
    // is held, so a chunk whose snapshot predates the rewrite would see the table empty and
    // delete all 50 at its high watermark.
    c.execute("UPDATE tide.backfill SET rows_per_second = NULL");
    c.execute("INSERT INTO replica.t SELECT g, 7, 'extra' FROM generate_series(100001, 100050) g");
    let extra: i64 =
        c.query_scalar("SELECT extra FROM tide.verify('t', 'pt') WHERE kind LIKE 'summary%'");
    assert_eq!(extra, 50, "verify did not find the 50 extra rows");
    // Hold the worker's next low-watermark write (its row in tide.signal) so the repair's chunk
    // cannot be read before the rewrite is queued.
    let mut signal_lock = connect(&c);
    signal_lock
        .batch_execute("BEGIN; SELECT 1 FROM tide.signal WHERE pipeline = 'pt' FOR UPDATE")
        .expect("lock the signal row");
    c.execute(
        "BEGIN;
         SELECT count(*) FROM tide.repair('t', 'pt');
         INSERT INTO t SELECT g, 7, 'extra' FROM generate_series(100001, 100050) g;
         COMMIT;",
    );
    let repairs: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.backfill WHERE repair_deletes IS NOT NULL AND state IN ('queued', 'running')",
    );
    assert_eq!(
        repairs,
        1,
        "the repair did not queue a backfill\n{}",
        diag(&c)
    );
    hold_rewrite_then(
        &c,
        &["t"],
        "ALTER TABLE t ALTER COLUMN v TYPE numeric",
        || {
            signal_lock
                .batch_execute("COMMIT")
                .expect("release the signal row");
        },
    );
    settle(&c, &[("t", "pt")]);
    assert_same(&c, "t", "replica.t", "after the repair during a rewrite");
    let kept: i64 = c.query_scalar("SELECT count(*) FROM replica.t WHERE id > 100000");
    assert_eq!(kept, 50, "the repair deleted good rows\n{}", diag(&c));
}

/// Issue 30 (a silent-divergence window): after a table rewrite that changes values without any
/// row event, `tide.wait_for_pipeline` and `tide.wait_for_backfill` must not say done before the
/// rewritten rows are at the target, also when the rewrite is decoded after a pause and a
/// resume. The interleaving is made, not hoped for: a session holds ACCESS EXCLUSIVE on the
/// source table, so the backfill that reads it again cannot read, while the stream (shown by
/// another table's row arriving) goes on.
#[test]
fn waits_do_not_report_a_rewrite_before_its_rows() {
    let c = setup("rewrite_waits");
    c.execute(
        "CREATE SCHEMA rep;
         CREATE TABLE t (id int PRIMARY KEY, w int);
         INSERT INTO t SELECT g, g FROM generate_series(1, 500) g;
         CREATE TABLE other (id int PRIMARY KEY);",
    );
    c.execute(r#"SELECT tide.create_pipeline('tt', 'table', '{"schema": "rep"}')"#);
    c.execute("SELECT tide.add_table('tt', 't')");
    c.execute("SELECT tide.add_table('tt', 'other', backfill => false)");
    wait_for_backfill(&c, "t", Some("tt"), 60, || diag(&c));
    assert_same(&c, "t", "rep.t", "after the first backfill");

    c.execute("SELECT tide.pause_pipeline('tt')");
    c.wait_until(
        "the pipeline to pause",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            Ok(
                c.try_query_scalar::<String>("SELECT state FROM tide.pipelines WHERE name = 'tt'")?
                    == "paused",
            )
        },
    );
    // Every row's value changes, and no row event says so.
    c.execute("ALTER TABLE t ALTER COLUMN w TYPE bigint USING w + 1000");
    let mut holder = connect(&c);
    holder
        .batch_execute("BEGIN; LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        .expect("lock t");
    c.execute("SELECT tide.resume_pipeline('tt')");
    // Right after the resume the worker may not have decoded the rewrite yet: the backfill that
    // is done now does not cover it.
    let backfill_done: bool =
        c.query_scalar("SELECT tide.wait_for_backfill('t', 'tt', interval '1 second')");
    // The stream runs: a row of another table arrives.
    c.execute("INSERT INTO other VALUES (1)");
    c.wait_until(
        "the stream to deliver other's row",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || Ok(c.try_query_scalar::<i64>("SELECT count(*) FROM rep.other")? == 1),
    );
    let applied: bool = c.query_scalar("SELECT tide.wait_for_pipeline('tt', interval '3 seconds')");
    // (t itself is locked: after the rewrite its w is id + 1000 everywhere.)
    let stale: i64 =
        c.query_scalar("SELECT count(*) FROM rep.t r WHERE r.w IS DISTINCT FROM r.id + 1000");
    assert!(
        stale > 0,
        "the premise: the target is stale while the table is locked\n{}",
        diag(&c)
    );
    assert!(
        !applied,
        "tide.wait_for_pipeline said everything was applied while {stale} rewritten rows were not at the target\n{}",
        diag(&c)
    );
    assert!(
        !backfill_done,
        "tide.wait_for_backfill said done while {stale} rewritten rows were not at the target\n{}",
        diag(&c)
    );
    let backfill_done: bool =
        c.query_scalar("SELECT tide.wait_for_backfill('t', 'tt', interval '1 second')");
    assert!(
        !backfill_done,
        "wait_for_backfill with the re-read queued\n{}",
        diag(&c)
    );
    let readiness: String = c.query_scalar(
        "SELECT readiness FROM tide.readiness WHERE pipeline = 'tt' AND source = 't'::regclass",
    );
    assert_ne!(readiness, "ready", "{}", diag(&c));

    holder.batch_execute("ROLLBACK").expect("unlock t");
    wait_for_pipeline(&c, "tt", 120, || diag(&c));
    assert_same(&c, "t", "rep.t", "once wait_for_pipeline says so");
    wait_for_backfill(&c, "t", Some("tt"), 60, || diag(&c));
    let readiness: String = c.query_scalar(
        "SELECT readiness FROM tide.readiness WHERE pipeline = 'tt' AND source = 't'::regclass",
    );
    assert_eq!(readiness, "ready", "{}", diag(&c));
}
