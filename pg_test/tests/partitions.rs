//! Partitioned tables captured through their root (README, Concepts > Partitioned tables).
//!
//! Needs pg_tide installed (`scripts/install.sh`); each test runs on its own scratch cluster.
//!
//! - `through_the_root_under_load`: a partitioned table with a partition of another column
//!   order (and a dropped column), a sub-partitioned partition and a default one, captured by an
//!   outbox pipeline and a local table pipeline while writers update, move rows between
//!   partitions, insert and delete; meanwhile a table holding rows is attached, one partition is
//!   truncated; then the table pipeline's worker is killed (-9) and the writers run again. The outbox replayed onto a copy,
//!   and the table target, equal the source; a replay that ignores the partition truncate does
//!   not (the check can fail).
//! - `what_cannot_be_captured`: a root without a primary key, a partition whose replica identity
//!   lacks the key, a partition of a captured table (each a SQLSTATE and a hint at add_table),
//!   and a partition attached later with such an identity (the pipeline pauses with the reason;
//!   fixed and resumed, its rows are backfilled); a detached partition's changes stop.
//! - `a_remote_target_follows_partition_truncates`: a partition truncated at the source removes
//!   exactly its rows at a remote target.

use pg_test::*;
use std::time::Duration;

const COLS: &str = "id, region, v, pad";

#[test]
fn through_the_root_under_load() {
    let c = setup("parts");
    exec(
        &c,
        "CREATE TABLE orders (id int NOT NULL, region int NOT NULL, v int, pad text,
                              PRIMARY KEY (id, region)) PARTITION BY LIST (region);
         -- another column order, and a dropped column, than the partitioned table's
         CREATE TABLE orders_r1 (pad text, junk int, v int, region int NOT NULL, id int NOT NULL);
         ALTER TABLE orders_r1 DROP COLUMN junk;
         ALTER TABLE orders ATTACH PARTITION orders_r1 FOR VALUES IN (1);
         CREATE TABLE orders_r23 PARTITION OF orders FOR VALUES IN (2, 3) PARTITION BY LIST (region);
         CREATE TABLE orders_r2 PARTITION OF orders_r23 FOR VALUES IN (2);
         CREATE TABLE orders_r3 PARTITION OF orders_r23 FOR VALUES IN (3);
         CREATE TABLE orders_rest PARTITION OF orders DEFAULT;
         INSERT INTO orders SELECT g, g % 5, g, repeat('x', 40) FROM generate_series(1, 30000) g;
         CREATE SCHEMA copy;",
    );
    create_pipeline(&c, "po", "outbox", "{}");
    create_pipeline(&c, "pt", "table", r#"{"schema": "copy"}"#);
    exec(
        &c,
        "SELECT tide.add_table('po', 'orders'); SELECT tide.add_table('pt', 'orders');
         SELECT tide.alter_backfill('orders', 'po', chunk_size => 2000);
         SELECT tide.alter_backfill('orders', 'pt', chunk_size => 2000);",
    );
    // The target of a partitioned table is one plain table shaped like it.
    let kind: String =
        c.query_scalar("SELECT relkind::text FROM pg_class WHERE oid = 'copy.orders'::regclass");
    assert_eq!(kind, "r", "the table target is an ordinary table");

    // Writers: updates, moves between partitions (the region is part of the key), inserts and
    // deletes, over every partition.
    let script = write_script(
        "parts",
        "\\set id random(1, 36000)
         UPDATE orders SET v = v + 1 WHERE id = :id;
         UPDATE orders SET region = (region + 1) % 5 WHERE id = :id + 7;
         INSERT INTO orders VALUES (:id + 40000, :id % 5, 0, 'new') ON CONFLICT DO NOTHING;
         DELETE FROM orders WHERE id = :id + 13;",
    );
    let run = spawn_pgbench(&c, &script, 2, 8, Some(300));
    std::thread::sleep(Duration::from_secs(2));
    // A table that already holds rows becomes a partition while the pipelines run.
    exec(
        &c,
        "CREATE TABLE orders_r10 (LIKE orders);
         INSERT INTO orders_r10 SELECT g, 10, g, 'attached' FROM generate_series(100001, 104000) g;
         ALTER TABLE orders ATTACH PARTITION orders_r10 FOR VALUES IN (10);
         UPDATE orders SET v = -1 WHERE region = 10 AND id % 100 = 0;
         -- and a new partition created directly
         CREATE TABLE orders_r20 PARTITION OF orders FOR VALUES IN (20);
         INSERT INTO orders SELECT g, 20, g, 'leaf' FROM generate_series(200001, 200100) g;",
    );
    std::thread::sleep(Duration::from_secs(2));
    // One partition emptied: the others keep their rows.
    exec(&c, "TRUNCATE orders_r3");
    std::thread::sleep(Duration::from_secs(2));
    let (txns, ok, summary) = run.finish_summary();
    assert!(ok && txns > 100, "the writers ran: {summary}");
    // A worker crash (the postmaster restarts the server, so between two runs of writers).
    let pid = worker_pid(&c, "pt").expect("pt has a worker");
    kill9(pid);
    wait_recovered(&c, "pt", Some(pid), Duration::from_secs(90), || diag(&c));
    let (txns, ok, summary) = spawn_pgbench(&c, &script, 2, 4, Some(300)).finish_summary();
    assert!(ok && txns > 100, "the writers ran again: {summary}");

    // Every backfill, the attached partition's included, is done.
    for p in ["po", "pt"] {
        c.wait_until(
            &format!("{p}: a backfill of the attached partition is queued"),
            Duration::from_secs(60),
            Duration::from_millis(200),
            || {
                Ok(c.try_query_scalar::<i64>(&format!(
                    "SELECT count(*) FROM tide.backfill WHERE pipeline = '{p}' AND condition LIKE 'tableoid = ANY%'"
                ))? >= 1)
            },
        );
        wait_backfill(&c, "orders", p, 180);
        wait_pipeline(&c, p, 120);
    }
    let attach_backfills: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.backfill
          WHERE condition LIKE 'tableoid = ANY (''{%' || 'orders_r10'::regclass::oid || '%}''::oid[])'
            AND state = 'done'",
    );
    assert_eq!(
        attach_backfills,
        2,
        "each pipeline read the attached partition's rows, and only those\n{}",
        diag(&c)
    );

    // Partitions' changes arrived as the partitioned table's; the partition truncate as a
    // truncate event that says what it removed.
    let relations: Vec<String> = texts(
        &c,
        "SELECT DISTINCT relation FROM tide.outbox WHERE pipeline = 'po' ORDER BY 1",
    );
    assert_eq!(relations, vec!["public.orders".to_string()]);
    let wheres: Vec<String> = texts(
        &c,
        "SELECT \"row\"->>'partition' || ': ' || (\"row\"->>'where') FROM tide.outbox WHERE pipeline = 'po' AND op = 'truncate'",
    );
    assert_eq!(wheres.len(), 1, "one truncate event: {wheres:?}");
    assert!(
        wheres[0].starts_with("public.orders_r3: ") && wheres[0].contains("(region = 3)"),
        "the truncate of orders_r3 says its partition constraint: {wheres:?}"
    );

    outbox_copy_keyed(&c, "orders", "public.orders", "replay", &["id", "region"]);
    let n: i64 = c.query_scalar("SELECT replay_replay('po')");
    assert!(n > 30000, "{n} events replayed");
    assert_same_rows("outbox replay", &c, "orders", &c, "replay", COLS);
    assert_same_rows("table target", &c, "orders", &c, "copy.orders", COLS);
    let attached: i64 = c.query_scalar("SELECT count(*) FROM copy.orders WHERE region = 10");
    assert_eq!(
        attached, 4000,
        "the attached partition's rows reached the target"
    );
    let created: i64 = c.query_scalar("SELECT count(*) FROM copy.orders WHERE region = 20");
    assert_eq!(
        created, 100,
        "a partition created while running is captured"
    );

    // tide.verify reads the partitioned source whole, and sees a damaged target.
    let clean: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.verify('orders', 'pt', sample => 50)
          WHERE kind NOT LIKE 'summary: % ranges checked, 0 differ%'",
    );
    assert_eq!(clean, 0, "verify finds nothing to report\n{}", diag(&c));
    exec(
        &c,
        "DELETE FROM copy.orders WHERE region = 10 AND id = 100500",
    );
    let differ: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.verify('orders', 'pt') WHERE kind = 'missing rows'",
    );
    assert_eq!(differ, 1, "verify reports the row deleted at the target");

    // The broken variant: a consumer that ignores a partition truncate keeps its rows.
    exec(
        &c,
        "CREATE TABLE naive_events AS SELECT * FROM tide.outbox WHERE pipeline = 'po' AND op <> 'truncate'",
    );
    let stale: i64 = c.query_scalar(
        "SELECT count(*) FROM (
            SELECT DISTINCT ON ((key->>'id')::int, (key->>'region')::int) op, key
              FROM naive_events WHERE relation = 'public.orders'
             ORDER BY (key->>'id')::int, (key->>'region')::int, id DESC) last
          WHERE op <> 'delete' AND (key->>'region')::int = 3
            AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = (last.key->>'id')::int AND o.region = 3)",
    );
    assert!(
        stale > 1000,
        "a replay without the partition truncate would keep {stale} rows of orders_r3 the source no longer has"
    );
}

#[test]
fn what_cannot_be_captured() {
    let c = setup("parts_err");
    exec(
        &c,
        "CREATE TABLE nokey (id int, region int) PARTITION BY LIST (region);
         CREATE TABLE nokey_1 PARTITION OF nokey FOR VALUES IN (1);
         CREATE TABLE t (id int, region int, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
         CREATE TABLE t_1 PARTITION OF t FOR VALUES IN (1);
         CREATE TABLE t_2 PARTITION OF t FOR VALUES IN (2);
         ALTER TABLE t_2 REPLICA IDENTITY NOTHING;",
    );
    create_pipeline(&c, "pe", "outbox", "{}");
    expect_fail(
        &c,
        "SELECT tide.add_table('pe', 'nokey')",
        "55000",
        Some("ADD PRIMARY KEY"),
    );
    let e = expect_fail(
        &c,
        "SELECT tide.add_table('pe', 't')",
        "55000",
        Some("REPLICA IDENTITY DEFAULT"),
    );
    assert!(
        e.message().contains("public.t_2"),
        "names the partition: {}",
        e.message()
    );
    exec(&c, "ALTER TABLE t_2 REPLICA IDENTITY DEFAULT");
    exec(&c, "SELECT tide.add_table('pe', 't')");
    expect_fail(
        &c,
        "SELECT tide.add_table('pe', 't_1')",
        "42710",
        Some("partitioned table alone"),
    );
    wait_backfill(&c, "t", "pe", 60);

    // Attached later with an identity that lacks the key: the pipeline pauses, saying why.
    exec(
        &c,
        "CREATE TABLE t_3 (id int NOT NULL, region int NOT NULL);
         INSERT INTO t_3 VALUES (1, 3), (2, 3);
         ALTER TABLE t_3 REPLICA IDENTITY NOTHING;
         ALTER TABLE t ATTACH PARTITION t_3 FOR VALUES IN (3);",
    );
    c.wait_until(
        "pe pauses on the partition it cannot follow",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT NOT enabled AND last_error LIKE '%partition public.t_3 of public.t %replica identity%'
                                    FROM tide.pipeline WHERE name = 'pe'), false)",
            )?)
        },
    );
    // Fixed, resumed: the rows it held come by a backfill of their own.
    exec(
        &c,
        "ALTER TABLE t_3 REPLICA IDENTITY DEFAULT;
         SELECT tide.resume_pipeline('pe');",
    );
    c.wait_until(
        "the attached partition's rows are in the outbox",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(DISTINCT key->>'id') FROM tide.outbox WHERE pipeline = 'pe' AND key->>'region' = '3'",
            )? == 2)
        },
    );
    // Detached: its changes stop at the DETACH; what it had stays.
    exec(
        &c,
        "ALTER TABLE t DETACH PARTITION t_3;
         INSERT INTO t_3 VALUES (9, 3);
         INSERT INTO t VALUES (9, 1);",
    );
    wait_pipeline(&c, "pe", 60);
    let events: Vec<String> = texts(
        &c,
        "SELECT op || ' ' || (key->>'region') FROM tide.outbox WHERE pipeline = 'pe' AND key->>'id' = '9' ORDER BY id",
    );
    assert_eq!(
        events,
        vec!["insert 1".to_string()],
        "only the write to t itself"
    );
}

/// A remote target of a partitioned table: one table there; a partition truncated at the
/// source removes exactly that partition's rows at the target, through the same path as the
/// rest of the batch.
#[test]
fn a_remote_target_follows_partition_truncates() {
    let (c, t) = setup_remote("parts_remote");
    exec(
        &c,
        "CREATE TABLE m (id int NOT NULL, day date NOT NULL, v text, PRIMARY KEY (id, day))
                PARTITION BY RANGE (day);
         CREATE TABLE m_jan PARTITION OF m FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
         CREATE TABLE m_feb PARTITION OF m FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
         INSERT INTO m SELECT g, date '2026-01-01' + (g % 59), 'v' || g FROM generate_series(1, 5900) g;",
    );
    create_pipeline(&c, "pr", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('pr', 'm')");
    wait_backfill(&c, "m", "pr", 120);
    exec(
        &c,
        "BEGIN; INSERT INTO m VALUES (1, '2026-01-02', 'x') ON CONFLICT (id, day) DO UPDATE SET v = 'x';
                TRUNCATE m_jan;
                INSERT INTO m VALUES (7, '2026-01-03', 'after'); COMMIT;
         UPDATE m SET v = 'feb' WHERE id = 40;",
    );
    wait_pipeline(&c, "pr", 60);
    assert_same_rows("remote target", &c, "m", &t, "public.m", "id, day, v");
    let feb: i64 = t.query_scalar("SELECT count(*) FROM public.m WHERE day >= '2026-02-01'");
    assert_eq!(feb, 5900 / 59 * 28, "February's rows stay");
}
