//! Named outbox consumers and the outbox retention (README, Outbox consumers): a consumer reads
//! whole source transactions in id order under concurrent writes and a backfill, "crashes"
//! without committing and reads the same events again, and what it applied equals the source;
//! the retention deletes only what every consumer has committed, in several transactions when the
//! backlog exceeds `tide.outbox_prune_batch`; a pipeline without consumers is pruned by age only;
//! a tide_admin member that does not own the pipeline cannot touch its consumers.

use pg_test::*;
use std::time::Duration;

/// A cluster with pg_tide, started with `conf` lines.
fn cluster(name: &str, conf: &[&str]) -> Cluster {
    let mut b = Cluster::builder(name);
    for l in conf {
        b = b.conf(l);
    }
    let c = start_cluster(b);
    init_extension(&c);
    c
}

/// `tide.read_outbox` applied onto `copy` (same columns as the source, key `id`) by a plpgsql
/// function `consume(consumer, n)` that returns the ids it applied, in order.
fn consume_function(c: &Cluster, pipeline: &str, copy: &str) {
    c.execute(&format!(
        r#"
CREATE FUNCTION consume(p_consumer text, p_n int) RETURNS bigint[] LANGUAGE plpgsql AS $f$
DECLARE
    e record;
    ids bigint[] := '{{}}';
BEGIN
    FOR e IN SELECT * FROM tide.read_outbox('{pipeline}', p_consumer, p_n) LOOP
        ids := ids || e.id;
        IF e.op IN ('read', 'insert', 'update') THEN
            DELETE FROM {copy} c USING jsonb_populate_record(NULL::{copy}, e.key) k WHERE c.id = k.id;
            INSERT INTO {copy} SELECT * FROM jsonb_populate_record(NULL::{copy}, e."row");
        ELSIF e.op = 'delete' THEN
            DELETE FROM {copy} c USING jsonb_populate_record(NULL::{copy}, e.key) k WHERE c.id = k.id;
        ELSIF e.op = 'truncate' THEN
            DELETE FROM {copy};
        END IF;
    END LOOP;
    RETURN ids;
END
$f$;"#
    ));
}

/// The batch `ids` (read after `after`) is the next events of the pipeline in id order, without
/// a gap, and ends at the end of a source transaction unless it is `max` events of one.
#[track_caller]
fn check_batch(c: &Cluster, pipeline: &str, after: i64, ids: &[i64], max: usize) {
    let expected: Vec<i64> = c
        .query(&format!(
            "SELECT id FROM tide.outbox WHERE pipeline = '{pipeline}' AND id > {after} ORDER BY id LIMIT {}",
            ids.len()
        ))
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        ids,
        expected.as_slice(),
        "the batch after {after} is the next events in id order"
    );
    assert!(ids.len() <= max, "at most max_events");
    let Some(last) = ids.last() else { return };
    let first = ids[0];
    // The event after the batch, if any, belongs to another transaction, unless the whole batch
    // is one transaction of more than `max` events.
    let (same_tx_follows, one_tx): (bool, bool) = {
        let r = c.query_one(&format!(
            "SELECT EXISTS (SELECT 1 FROM tide.outbox n, tide.outbox l
                             WHERE l.id = {last} AND n.pipeline = '{pipeline}' AND n.id > {last}
                               AND n.commit_lsn = l.commit_lsn),
                    (SELECT count(DISTINCT commit_lsn) = 1 FROM tide.outbox WHERE id BETWEEN {first} AND {last} AND pipeline = '{pipeline}')"
        ));
        (r.get(0), r.get(1))
    };
    assert!(
        !same_tx_follows || (one_tx && ids.len() == max),
        "batch {first}..{last} ends inside a source transaction that does not fill it alone"
    );
}

/// One consumer under concurrent writes (multi-statement transactions) and a backfill: each
/// batch is the next whole transactions; a "crash" (the connection dropped in the middle of the
/// consumer's transaction, before commit_consumer) makes the next read return exactly the same
/// events again; replaying every batch equals the source.
#[test]
fn consumer_reads_commits_crashes_and_replays() {
    let c = setup("cons_replay");
    c.execute(
        "CREATE TABLE src (id int PRIMARY KEY, v int NOT NULL, pad text);
         INSERT INTO src SELECT g, g, 'p' FROM generate_series(1, 3000) g;",
    );
    create_pipeline(&c, "p", "outbox", "{}");
    exec(&c, "SELECT tide.create_consumer('p', 'c1')");
    exec(&c, "SELECT tide.add_table('p', 'src', backfill => false)");
    exec(
        &c,
        "SELECT tide.start_backfill('src', 'p', chunk_size => 250)",
    );
    c.execute("CREATE TABLE copy (LIKE src INCLUDING ALL)");
    consume_function(&c, "p", "copy");

    let script = write_script(
        "cons_churn",
        &format!("BEGIN;\n{}\nCOMMIT;\n", churn_sql("src", 3000)),
    );
    let writers = spawn_pgbench(&c, &script, 2, 6, Some(300));

    let mut consumer = c.client();
    let max = 40usize;
    let (mut batches, mut crashes, mut events) = (0, 0, 0usize);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut writers = Some(writers);
    // (commit_lsn, position) of the last event committed, read before the commit (the retention
    // may delete it after).
    let mut last_event: Option<(String, i32)> = None;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "consumer did not drain\n{}",
            diag(&c)
        );
        let after: i64 = c.query_scalar(
            "SELECT committed_id FROM tide.consumers WHERE pipeline = 'p' AND consumer = 'c1'",
        );
        let mut tx = consumer.transaction().expect("begin");
        let ids: Vec<i64> = tx
            .query_one("SELECT consume('c1', $1)", &[&(max as i32)])
            .expect("consume")
            .get(0);
        check_batch(&c, "p", after, &ids, max);
        if ids.is_empty() {
            drop(tx);
            let done = writers.is_none()
                && c.query_scalar::<bool>(
                    "SELECT coalesce(bool_and(state = 'done'), false) FROM tide.backfills WHERE pipeline = 'p'",
                );
            if done {
                wait_pipeline(&c, "p", 60);
                let left: i64 = c
                    .query_scalar("SELECT events_behind FROM tide.consumers WHERE consumer = 'c1'");
                if left == 0 {
                    break;
                }
            }
            if let Some(w) = writers.take() {
                if w.started.elapsed() > Duration::from_secs(7) {
                    let (n, ok, summary) = w.finish_summary();
                    assert!(ok && n > 0, "writers: {summary}");
                } else {
                    writers = Some(w);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        batches += 1;
        if batches % 7 == 3 {
            // Crash: the connection goes away inside the consumer's transaction, after it
            // applied the batch and before it committed its position (no ROLLBACK sent).
            std::mem::forget(tx);
            drop(consumer);
            crashes += 1;
            consumer = c.client();
            let mut tx = consumer.transaction().expect("begin");
            let again: Vec<i64> = tx
                .query_one("SELECT consume('c1', $1)", &[&(max as i32)])
                .expect("consume again")
                .get(0);
            // The same events, from the last committed position (more may follow when the
            // first read was at the end of the outbox; never fewer, never others).
            assert!(
                again.len() >= ids.len() && again[..ids.len()] == ids[..],
                "after the crash the consumer re-reads {:?}..., not the {} events it had read: {:?}",
                &again[..again.len().min(5)],
                ids.len(),
                &ids[..ids.len().min(5)]
            );
            check_batch(&c, "p", after, &again, max);
            let last = *again.last().expect("non-empty");
            last_event = Some(event_at(&c, last));
            tx.execute("SELECT tide.commit_consumer('p', 'c1', $1)", &[&last])
                .expect("commit position");
            tx.commit().expect("commit");
            events += again.len();
        } else {
            let last = *ids.last().expect("non-empty");
            last_event = Some(event_at(&c, last));
            tx.execute("SELECT tide.commit_consumer('p', 'c1', $1)", &[&last])
                .expect("commit position");
            tx.commit().expect("commit");
            events += ids.len();
        }
        let committed: i64 =
            c.query_scalar("SELECT committed_id FROM tide.consumers WHERE consumer = 'c1'");
        assert!(committed > after, "the committed position moved forward");
    }
    if let Some(w) = writers.take() {
        let (n, ok, summary) = w.finish_summary();
        assert!(ok && n > 0, "writers: {summary}");
    }
    eprintln!("  {events} events in {batches} batches, {crashes} crashes");
    assert!(
        crashes >= 3,
        "the test crashed the consumer ({crashes} times)"
    );
    assert!(
        c.query_scalar::<i64>(
            "SELECT coalesce(sum(rows_emitted), 0)::int8 FROM tide.backfills WHERE pipeline = 'p'"
        ) > 0,
        "the backfill's events were among those consumed"
    );
    assert_same_rows("consumed replay", &c, "src", &c, "copy", "id, v, pad");
    // The retention deleted what c1 committed while it read; every event was consumed once:
    // those deleted and those left add up to what the consumer applied.
    c.wait_until(
        "the retention to delete what c1 committed",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(
                c.try_query_scalar::<i64>("SELECT count(*) FROM tide.outbox WHERE pipeline = 'p'")?
                    == 0,
            )
        },
    );
    let (pruned, transactions, reads): (i64, i64, i64) = {
        let r = c.query_one(
            "SELECT events_pruned, prune_transactions,
                    (SELECT count(*) FROM copy) FROM tide.outbox_retention WHERE pipeline = 'p'",
        );
        (r.get(0), r.get(1), r.get(2))
    };
    eprintln!("  the retention deleted {pruned} events in {transactions} transactions; {reads} rows in the copy");
    assert_eq!(
        pruned, events as i64,
        "every event was consumed exactly once, then deleted"
    );
    // The view: the committed event's (commit_lsn, position), kept after the event was deleted;
    // nothing behind.
    let (lsn, pos) = last_event.expect("events were consumed");
    let r = c.query_one(
        "SELECT committed_lsn::text, committed_position, events_behind, bytes_behind
           FROM tide.consumers WHERE consumer = 'c1'",
    );
    assert_eq!((r.get::<_, String>(0), r.get::<_, i32>(1)), (lsn, pos));
    assert_eq!(r.get::<_, i64>(2), 0);
    assert_eq!(r.get::<_, i64>(3), 0);
}

/// (commit_lsn, position) of event `id`.
fn event_at(c: &Cluster, id: i64) -> (String, i32) {
    let r = c.query_one(&format!(
        "SELECT commit_lsn::text, position FROM tide.outbox WHERE id = {id}"
    ));
    (r.get(0), r.get(1))
}

/// A single source transaction larger than max_events is returned in parts of max_events; a
/// batch never ends inside a smaller transaction.
#[test]
fn batches_hold_whole_transactions() {
    let c = setup("cons_whole");
    c.execute("CREATE TABLE t (id int PRIMARY KEY, v int)");
    create_pipeline(&c, "p", "outbox", "{}");
    exec(&c, "SELECT tide.add_table('p', 't', backfill => false)");
    exec(&c, "SELECT tide.create_consumer('p', 'c')");
    // A consumer that never commits: the retention deletes nothing here.
    exec(&c, "SELECT tide.create_consumer('p', 'hold')");
    // transactions of 3, 3, 25, 3 events
    c.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 3) g");
    c.execute("INSERT INTO t SELECT g, 0 FROM generate_series(4, 6) g");
    c.execute("INSERT INTO t SELECT g, 0 FROM generate_series(7, 31) g");
    c.execute("INSERT INTO t SELECT g, 0 FROM generate_series(32, 34) g");
    wait_pipeline(&c, "p", 30);
    let read = |n: i32| -> Vec<i32> {
        c.query(&format!(
            "SELECT (key->>'id')::int FROM tide.read_outbox('p', 'c', {n})"
        ))
        .iter()
        .map(|r| r.get(0))
        .collect()
    };
    let commit_last = || {
        exec(
            &c,
            "SELECT tide.commit_consumer('p', 'c', (SELECT max(id) FROM tide.read_outbox('p', 'c', 10)))",
        )
    };
    // 5 would end inside the second transaction: the batch is the first one.
    assert_eq!(read(5), vec![1, 2, 3]);
    assert_eq!(read(6), vec![1, 2, 3, 4, 5, 6]);
    exec(
        &c,
        "SELECT tide.commit_consumer('p', 'c', (SELECT max(id) FROM tide.read_outbox('p', 'c', 6)))",
    );
    // The 25-event transaction alone exceeds 10: its first 10, then the next 10, ...
    assert_eq!(read(10), (7..=16).collect::<Vec<_>>());
    commit_last();
    assert_eq!(read(10), (17..=26).collect::<Vec<_>>());
    commit_last();
    // 5 left of it, then a transaction of 3 that does not fit in 7 with them.
    assert_eq!(read(7), (27..=31).collect::<Vec<_>>());
    assert_eq!(read(8), (27..=34).collect::<Vec<_>>());
    // seek back and read again; commit refuses to go back or past the newest event
    let first: i64 = c.query_scalar("SELECT min(id) FROM tide.outbox");
    let newest: i64 = c.query_scalar("SELECT max(id) FROM tide.outbox");
    expect_fail(
        &c,
        &format!("SELECT tide.commit_consumer('p', 'c', {first})"),
        "22023",
        Some("tide.seek_consumer"),
    );
    expect_fail(
        &c,
        &format!("SELECT tide.commit_consumer('p', 'c', {})", newest + 1),
        "22023",
        Some("tide.read_outbox"),
    );
    exec(
        &c,
        &format!("SELECT tide.seek_consumer('p', 'c', {})", first - 1),
    );
    assert_eq!(read(4), vec![1, 2, 3]);
    expect_fail(
        &c,
        &format!("SELECT tide.seek_consumer('p', 'c', {})", first - 2),
        "22023",
        Some("older events were deleted"),
    );
    // latest: nothing to read until the next write
    exec(
        &c,
        "SELECT tide.create_consumer('p', 'late', start => 'latest')",
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.read_outbox('p', 'late')"),
        0
    );
    c.execute("INSERT INTO t VALUES (100, 0)");
    wait_pipeline(&c, "p", 30);
    assert_eq!(
        texts(&c, "SELECT key->>'id' FROM tide.read_outbox('p', 'late')"),
        vec!["100".to_string()]
    );
}

/// Two consumers: the retention deletes exactly the events both have committed, never one
/// more, and does so in batches of tide.outbox_prune_batch rows, one transaction each (counted
/// in tide.outbox_retention).
#[test]
fn retention_deletes_only_what_every_consumer_committed() {
    let c = cluster("cons_prune", &["tide.outbox_prune_batch = 100"]);
    c.execute("CREATE TABLE t (id int PRIMARY KEY, v int)");
    create_pipeline(&c, "p", "outbox", "{}");
    exec(&c, "SELECT tide.add_table('p', 't', backfill => false)");
    exec(&c, "SELECT tide.create_consumer('p', 'a')");
    exec(&c, "SELECT tide.create_consumer('p', 'b')");
    for i in 0..10 {
        c.execute(&format!(
            "INSERT INTO t SELECT g, 0 FROM generate_series({} + 1, {} + 100) g",
            i * 100,
            i * 100
        ));
    }
    wait_pipeline(&c, "p", 30);
    let ids: Vec<i64> = c
        .query("SELECT id FROM tide.outbox WHERE pipeline = 'p' ORDER BY id")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids.len(), 1000);
    // Nothing is committed yet: nothing is deleted.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.outbox"),
        1000
    );

    let retained_after = |upto: i64, what: &str| {
        c.wait_until(
            what,
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                Ok(c.try_query_scalar::<i64>(&format!(
                    "SELECT count(*) FROM tide.outbox WHERE id <= {upto}"
                ))? == 0)
            },
        );
        // ... and stays so: nothing above the position both committed goes.
        std::thread::sleep(Duration::from_secs(2));
        let left: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM tide.outbox WHERE id > {upto}"
        ));
        let expected = ids.iter().filter(|&&i| i > upto).count() as i64;
        assert_eq!(
            left,
            expected,
            "{what}: every event above {upto} is kept\n{}",
            diag(&c)
        );
        assert_eq!(
            c.query_scalar::<i64>(&format!(
                "SELECT count(*) FROM tide.outbox WHERE id <= {upto}"
            )),
            0
        );
    };
    exec(
        &c,
        &format!("SELECT tide.commit_consumer('p', 'a', {})", ids[699]),
    );
    exec(
        &c,
        &format!("SELECT tide.commit_consumer('p', 'b', {})", ids[299]),
    );
    retained_after(ids[299], "the events both committed are deleted");
    let r = c.query_one(
        "SELECT events_pruned, prune_transactions, last_pruned_id, last_prune_reason, committed_by_all
           FROM tide.outbox_retention WHERE pipeline = 'p'",
    );
    assert_eq!(r.get::<_, i64>(0), 300);
    assert!(
        r.get::<_, i64>(1) >= 3,
        "300 events in batches of 100 take 3 transactions at least, not {}",
        r.get::<_, i64>(1)
    );
    assert_eq!(r.get::<_, i64>(2), ids[299]);
    assert_eq!(r.get::<_, String>(3), "consumers");
    assert_eq!(r.get::<_, i64>(4), ids[299]);

    // b catches up past a: a's position is now the bound.
    exec(
        &c,
        &format!("SELECT tide.commit_consumer('p', 'b', {})", ids[999]),
    );
    retained_after(ids[699], "a's position bounds the retention");
    // a consumer dropped no longer holds events
    exec(&c, "SELECT tide.drop_consumer('p', 'a')");
    retained_after(
        ids[999],
        "everything b committed is deleted once a is dropped",
    );
    let tx: i64 =
        c.query_scalar("SELECT prune_transactions FROM tide.outbox_retention WHERE pipeline = 'p'");
    assert!(tx >= 10, "1000 events in batches of 100: {tx} transactions");
    // The bookkeeping survives the deletion of the committed events.
    let r = c.query_one(
        "SELECT committed_lsn IS NOT NULL, committed_position, events_behind FROM tide.consumers WHERE consumer = 'b'",
    );
    assert!(r.get::<_, bool>(0));
    assert_eq!(r.get::<_, i32>(1), 100);
    assert_eq!(r.get::<_, i64>(2), 0);
}

/// A pipeline without consumers is pruned by age (tide.outbox_retention); one with a consumer
/// keeps what the consumer has not committed, however old.
#[test]
fn retention_by_age_only_without_consumers() {
    let c = cluster(
        "cons_age",
        &[
            "tide.outbox_retention = '4s'",
            "tide.outbox_prune_batch = 7",
        ],
    );
    c.execute("CREATE TABLE t (id int PRIMARY KEY, v int)");
    create_pipeline(&c, "aged", "outbox", "{}");
    create_pipeline(&c, "held", "outbox", "{}");
    exec(&c, "SELECT tide.add_table('aged', 't', backfill => false)");
    exec(&c, "SELECT tide.add_table('held', 't', backfill => false)");
    exec(&c, "SELECT tide.create_consumer('held', 'slow')");
    c.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 50) g");
    wait_pipeline(&c, "aged", 30);
    wait_pipeline(&c, "held", 30);
    let young: i64 = c.query_scalar("SELECT count(*) FROM tide.outbox WHERE pipeline = 'aged'");
    assert_eq!(young, 50, "young events are kept");
    c.wait_until(
        "the aged pipeline's events to be deleted",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.outbox WHERE pipeline = 'aged'",
            )? == 0)
        },
    );
    let r = c.query_one(
        "SELECT events_pruned, prune_transactions, last_prune_reason FROM tide.outbox_retention WHERE pipeline = 'aged'",
    );
    assert_eq!(r.get::<_, i64>(0), 50);
    assert!(r.get::<_, i64>(1) >= 8, "50 events in batches of 7");
    assert_eq!(r.get::<_, String>(2), "age");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.outbox WHERE pipeline = 'held'"),
        50,
        "the consumer's uncommitted events are kept whatever their age\n{}",
        diag(&c)
    );
    // With the setting off (the default), nothing is deleted by age.
    c.execute("ALTER SYSTEM SET tide.outbox_retention = 0");
    c.execute("SELECT pg_reload_conf()");
    // (the launcher reads the setting at its next tick)
    std::thread::sleep(Duration::from_millis(1500));
    exec(&c, "SELECT tide.drop_consumer('held', 'slow')");
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.outbox WHERE pipeline = 'held'"),
        50,
        "no age limit: kept"
    );
}

/// A trigger a user puts on `tide.outbox` (to notify consumers, say) fires for every event:
/// the worker's bulk insert gives way to an INSERT statement while the table has one. The
/// events are the same either way: in stream order by id, every column filled.
#[test]
fn outbox_triggers_fire() {
    let c = cluster("cons_trigger", &[]);
    c.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v int, big text);
         ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL;
         INSERT INTO t SELECT g, 0, repeat('x', 3000) FROM generate_series(1, 300) g;
         CREATE TABLE seen (outbox_id bigint, op text, unchanged text[]);
         CREATE FUNCTION note_event() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN INSERT INTO public.seen VALUES (NEW.id, NEW.op, NEW.unchanged); RETURN NEW; END $$;
         CREATE TRIGGER note AFTER INSERT ON tide.outbox FOR EACH ROW EXECUTE FUNCTION note_event();",
    );
    create_pipeline(&c, "trg", "outbox", "{}");
    exec(&c, "SELECT tide.add_table('trg', 't', backfill => false)");
    // Chunks of 50: all but the first are read (and their rows parsed into jsonb) by the
    // worker's reader, and go through the INSERT statement all the same.
    exec(
        &c,
        "SELECT tide.start_backfill('t', 'trg', chunk_size => 50)",
    );
    wait_backfill(&c, "t", "trg", 60);
    c.execute("CREATE TABLE t0 AS SELECT * FROM t");
    // Updates that leave a TOASTed value unchanged (the event names it in `unchanged`).
    c.execute("UPDATE t SET v = 1 WHERE id <= 10; DELETE FROM t WHERE id > 290");
    wait_pipeline(&c, "trg", 30);
    let events: i64 = c.query_scalar("SELECT count(*) FROM tide.outbox WHERE pipeline = 'trg'");
    assert_eq!(
        events,
        320,
        "300 backfilled, 10 updated, 10 deleted\n{}",
        diag(&c)
    );
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM tide.outbox o JOIN seen s ON s.outbox_id = o.id
              WHERE s.op = o.op AND s.unchanged IS NOT DISTINCT FROM o.unchanged"
        ),
        events,
        "the trigger saw every event as it was stored"
    );
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM tide.outbox WHERE op = 'update' AND unchanged = ARRAY['big']"
        ),
        10,
        "the unchanged TOASTed column is named"
    );
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM tide.outbox o, jsonb_populate_record(NULL::t, o.\"row\") r, t0
              WHERE o.pipeline = 'trg' AND o.op = 'read' AND t0.id = (o.key->>'id')::int
                AND (r.id, r.v, r.big) = (t0.id, t0.v, t0.big)"
        ),
        300,
        "every backfilled row is stored whole, as the source had it"
    );
    let out_of_order: i64 = c.query_scalar(
        "SELECT count(*) FROM (SELECT commit_lsn, position,
                lag(commit_lsn) OVER (ORDER BY id) AS plsn, lag(position) OVER (ORDER BY id) AS ppos
           FROM tide.outbox WHERE pipeline = 'trg') e
          WHERE (commit_lsn, position) <= (plsn, ppos)",
    );
    assert_eq!(out_of_order, 0, "ids follow the stream's order");
}

/// A member of tide_admin who does not own the pipeline can neither create, read, commit,
/// seek nor drop its consumers (42501), nor see them; the owner, not a superuser, can.
#[test]
fn consumers_follow_pipeline_ownership() {
    let c = setup("cons_sec");
    c.execute(
        "CREATE ROLE alice LOGIN; CREATE ROLE mallory LOGIN;
         GRANT tide_admin TO alice, mallory;
         CREATE SCHEMA alice AUTHORIZATION alice;",
    );
    let mut alice = connect_as(&c, "alice");
    alice
        .batch_execute("CREATE TABLE alice.t (id int PRIMARY KEY, v int);")
        .expect("alice's table");
    alice
        .batch_execute("SELECT tide.create_pipeline('p')")
        .expect("alice's pipeline");
    alice
        .batch_execute(
            "SELECT tide.add_table('p', 'alice.t', backfill => false);
             SELECT tide.create_consumer('p', 'c');",
        )
        .expect("alice's consumer");
    alice
        .batch_execute("INSERT INTO alice.t SELECT g, g FROM generate_series(1, 10) g")
        .expect("alice's rows");
    wait_pipeline(&c, "p", 30);
    let n: i64 = alice
        .query_one("SELECT count(*) FROM tide.read_outbox('p', 'c')", &[])
        .expect("alice reads")
        .get(0);
    assert_eq!(n, 10);
    alice
        .batch_execute(
            "SELECT tide.commit_consumer('p', 'c', (SELECT max(id) FROM tide.read_outbox('p', 'c', 5)))",
        )
        .expect("alice commits");
    let behind: i64 = alice
        .query_one(
            "SELECT events_behind FROM tide.consumers WHERE consumer = 'c'",
            &[],
        )
        .expect("alice sees her consumer")
        .get(0);
    assert_eq!(behind, 5);

    let mut mallory = connect_as(&c, "mallory");
    let newest: i64 = c.query_scalar("SELECT max(id) FROM tide.outbox");
    for sql in [
        "SELECT tide.create_consumer('p', 'm')".to_string(),
        "SELECT * FROM tide.read_outbox('p', 'c')".to_string(),
        format!("SELECT tide.commit_consumer('p', 'c', {newest})"),
        format!("SELECT tide.seek_consumer('p', 'c', {newest})"),
        "SELECT tide.drop_consumer('p', 'c')".to_string(),
    ] {
        expect_fail_with(
            &sql,
            mallory.batch_execute(&sql),
            "42501",
            Some("grant you membership"),
        );
    }
    let seen: i64 = mallory
        .query_one("SELECT count(*) FROM tide.consumers", &[])
        .expect("mallory reads the view")
        .get(0);
    assert_eq!(seen, 0, "mallory sees no consumer of alice's");
    let seen: i64 = mallory
        .query_one("SELECT count(*) FROM tide.outbox_retention", &[])
        .expect("mallory reads the view")
        .get(0);
    assert_eq!(seen, 0, "nor alice's retention");
    let r = c.query_one(
        "SELECT committed_id, (SELECT count(*) FROM tide.consumer) FROM tide.consumers WHERE consumer = 'c'",
    );
    let committed: i64 = r.get(0);
    assert!(committed < newest, "mallory's commit changed nothing");
    assert_eq!(r.get::<_, i64>(1), 1, "and created nothing");
}

/// `drop_pipeline` takes the outbox retention's lock before it deletes anything: the launcher's
/// prune batch deletes outbox rows then counts them in `tide.outbox_prune`, and a drop that
/// deleted the pipeline (its `outbox_prune` row, cascaded) then its outbox met a batch in
/// between in the other order (40P01, seen once in benchmark B5). Shown here with a consumer's
/// seek, which holds the same lock: the drop waits for the lock itself (an advisory lock of
/// pg_tide's retention kind, `objsubid` 0x7403), not for a row that the seek's transaction has
/// locked; without the lock it would wait for the consumer's row, as a prune's rows did.
#[test]
fn drop_pipeline_waits_for_the_retention_lock_first() {
    let c = cluster("drop_ret", &[]);
    c.execute("CREATE TABLE t (id int PRIMARY KEY, v int)");
    c.execute("SELECT tide.create_pipeline('p')");
    c.execute(
        "SELECT tide.add_table('p', 't', backfill => false);
         SELECT tide.create_consumer('p', 'c');
         INSERT INTO t SELECT g, g FROM generate_series(1, 10) g;",
    );
    wait_pipeline(&c, "p", 60);
    assert!(c.query_scalar::<bool>("SELECT tide.wait_for_pipeline('p', '60 s')"));
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.outbox"),
        10
    );
    let mut seeker = c.client();
    seeker
        .batch_execute(
            "BEGIN; SELECT tide.seek_consumer('p', 'c', (SELECT max(id) FROM tide.outbox))",
        )
        .expect("seek");
    let dropper = {
        let mut cl = c.client();
        std::thread::spawn(move || cl.batch_execute("SELECT tide.drop_pipeline('p')"))
    };
    c.wait_until(
        "drop_pipeline to wait for a lock",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE query LIKE 'SELECT tide.drop_pipeline%' AND wait_event_type = 'Lock'",
            )? == 1)
        },
    );
    let waiting: String = c.query_scalar(
        "SELECT string_agg(l.locktype || ':' || coalesce(l.objsubid::text, '-'), ',')
           FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE NOT l.granted AND a.query LIKE 'SELECT tide.drop_pipeline%'",
    );
    assert_eq!(waiting, format!("advisory:{}", 0x7403), "{}", diag(&c));
    seeker.batch_execute("COMMIT").expect("commit the seek");
    dropper
        .join()
        .expect("the drop thread")
        .unwrap_or_else(|e| panic!("drop_pipeline: {}", describe_error(&e)));
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.pipelines"),
        0
    );
}
