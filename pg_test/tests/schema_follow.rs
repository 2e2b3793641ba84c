//! Followed schemas: `tide.add_tables_in_schema(pipeline, schema, backfill, follow => true)`
//! (issue 32 item 9, `FOR TABLES IN SCHEMA`), as a DBA runs it: every pg_tide call here is made
//! by `alice`, a member of `tide_admin` with no other attribute, on her own pipelines.
//!
//! - tables created later in a followed schema (CREATE TABLE, one created and written in the same
//!   transaction, CREATE TABLE AS and SELECT INTO made capturable by ADD PRIMARY KEY, ALTER TABLE
//!   ... SET SCHEMA into it, a partitioned table), written to all along, end equal at an outbox
//!   and at a table target; a table created in a schema not followed is not captured;
//! - a table that cannot be captured (no key; another role's) is skipped with a WARNING, the
//!   DDL succeeds, and tide.skipped_tables says why; tide.followed_schemas shows the follow;
//! - tide.stop_following_schema stops it; a table removed with tide.remove_table is not captured
//!   again by an ALTER TABLE; DROP SCHEMA and drop_pipeline forget the follow.
//!
//! Other roles' attacks are in `security/follow.rs`.

use pg_test::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
                "tables",
                "SELECT pipeline, relation, removing, target_name FROM tide.pipeline_table ORDER BY pipeline, relation",
                40,
            ),
            (
                "backfills",
                "SELECT id, pipeline, relation, state, rows_read, error FROM tide.backfill ORDER BY id",
                40,
            ),
            (
                "followed",
                "SELECT * FROM tide.followed_schemas",
                10,
            ),
            (
                "skipped",
                "SELECT pipeline, relation, kind, sqlstate, reason, by_role FROM tide.skipped_tables",
                20,
            ),
        ],
        30,
    )
}

/// A connection as `role` whose NOTICEs and WARNINGs are collected in the returned list.
fn connect_collecting(c: &Cluster, role: &str) -> (Client, Arc<Mutex<Vec<String>>>) {
    let notices = Arc::new(Mutex::new(Vec::new()));
    let sink = notices.clone();
    let mut cfg = c.config("postgres");
    cfg.user(role);
    cfg.notice_callback(move |n| {
        sink.lock()
            .expect("notices")
            .push(format!("{}: {}", n.severity(), n.message()))
    });
    let client = cfg
        .connect(NoTls)
        .unwrap_or_else(|e| panic!("connect as {role}: {}", describe_error(&e)));
    (client, notices)
}

#[track_caller]
fn ok(cl: &mut Client, c: &Cluster, sql: &str) {
    if let Err(e) = cl.batch_execute(sql) {
        panic!("{sql}\nfailed: {}\n{}", describe_error(&e), diag(c));
    }
}

fn captured(c: &Cluster, pipeline: &str) -> String {
    c.query_scalar::<Option<String>>(&format!(
        "SELECT string_agg(relation, ',' ORDER BY relation) FROM tide.pipeline_table WHERE pipeline = '{pipeline}' AND NOT removing"
    ))
    .unwrap_or_default()
}

/// Writes to every table in `tables` (as alice) until `stop`: an insert of a new id, an update
/// and a delete of an older row, each its own transaction. Returns the rounds written.
fn writer(
    c: &Cluster,
    tables: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let mut cl = connect_as(c, "alice");
    std::thread::spawn(move || {
        let mut id = 100_000;
        let mut rounds = 0;
        while !stop.load(Ordering::Relaxed) {
            let list = tables.lock().expect("tables").clone();
            for t in &list {
                id += 1;
                cl.batch_execute(&format!(
                    "INSERT INTO {t} (id, v) VALUES ({id}, 'w{id}');
                     UPDATE {t} SET v = v || '+' WHERE id = (SELECT max(id) FROM {t} WHERE id < {id});
                     DELETE FROM {t} WHERE id = (SELECT min(id) FROM {t} WHERE id > 100000 AND id % 3 = 0);"
                ))
                .unwrap_or_else(|e| panic!("writing {t}: {}", describe_error(&e)));
            }
            rounds += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        rounds
    })
}

#[test]
fn tables_created_later_are_captured_under_writes() {
    let c = setup("schema_follow");
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA app AUTHORIZATION alice;
         CREATE SCHEMA other AUTHORIZATION alice;
         CREATE SCHEMA copy AUTHORIZATION alice;
         CREATE SCHEMA check_copy;",
    );
    let (mut alice, notices) = connect_collecting(&c, "alice");
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.existing (id int PRIMARY KEY, v text);
         INSERT INTO app.existing SELECT g, 'e' || g FROM generate_series(1, 100) g;",
    );
    ok(&mut alice, &c, "SELECT tide.create_pipeline('po')");
    ok(
        &mut alice,
        &c,
        r#"SELECT tide.create_pipeline('pt', 'table', '{"schema": "copy"}')"#,
    );
    for p in ["po", "pt"] {
        let n: i32 = alice
            .query_one(
                &format!("SELECT tide.add_tables_in_schema('{p}', 'app', follow => true)"),
                &[],
            )
            .unwrap_or_else(|e| panic!("follow app for {p}: {}", describe_error(&e)))
            .get(0);
        assert_eq!(n, 1, "app.existing for {p}\n{}", diag(&c));
    }
    let shown: (String, String, bool, String) = {
        let r = alice
            .query_one(
                "SELECT pipeline, schema::text, backfill, requested_by::text FROM tide.followed_schemas WHERE pipeline = 'pt'",
                &[],
            )
            .unwrap_or_else(|e| panic!("tide.followed_schemas: {}", describe_error(&e)));
        (r.get(0), r.get(1), r.get(2), r.get(3))
    };
    assert_eq!(
        shown,
        ("pt".into(), "app".into(), true, "alice".into()),
        "the follow as tide.followed_schemas shows it"
    );

    let tables = Arc::new(Mutex::new(vec!["app.existing".to_string()]));
    let stop = Arc::new(AtomicBool::new(false));
    let w = writer(&c, tables.clone(), stop.clone());
    let add = |t: &str| tables.lock().expect("tables").push(t.to_string());

    // A plain CREATE TABLE, then written to.
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.t1 (id int PRIMARY KEY, v text)",
    );
    add("app.t1");
    // Created and written in one transaction.
    ok(
        &mut alice,
        &c,
        "BEGIN;
         CREATE TABLE app.t2 (id int PRIMARY KEY, v text);
         INSERT INTO app.t2 SELECT g, 'same transaction ' || g FROM generate_series(1, 500) g;
         UPDATE app.t2 SET v = v || ' updated' WHERE id % 10 = 0;
         COMMIT;",
    );
    add("app.t2");
    // CREATE TABLE AS: no key yet, so skipped with a WARNING; ADD PRIMARY KEY captures it, and
    // its backfill reads the rows it was created with.
    notices.lock().expect("notices").clear();
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.t3 AS SELECT g AS id, 'ctas ' || g AS v FROM generate_series(1, 1000) g",
    );
    let seen = notices.lock().expect("notices").clone();
    assert!(
        seen.iter().any(|n| n.starts_with("WARNING")
            && n.contains("app.t3")
            && n.contains("has no primary key")),
        "no WARNING naming app.t3 and why: {seen:?}"
    );
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM tide.skipped_tables WHERE relation = 'app.t3' AND kind = 'skipped' AND sqlstate = '55000' AND by_role = 'alice'"
        ),
        2,
        "one skip record per following pipeline\n{}",
        diag(&c)
    );
    ok(&mut alice, &c, "ALTER TABLE app.t3 ADD PRIMARY KEY (id)");
    add("app.t3");
    // SELECT INTO, likewise.
    ok(
        &mut alice,
        &c,
        "SELECT g AS id, 'select into ' || g AS v INTO app.t4 FROM generate_series(1, 200) g;
         ALTER TABLE app.t4 ADD PRIMARY KEY (id);",
    );
    add("app.t4");
    // Moved into the followed schema with its rows.
    ok(
        &mut alice,
        &c,
        "CREATE TABLE other.t5 (id int PRIMARY KEY, v text);
         INSERT INTO other.t5 SELECT g, 'moved ' || g FROM generate_series(1, 300) g;
         ALTER TABLE other.t5 SET SCHEMA app;",
    );
    add("app.t5");
    // A partitioned table with its partitions (the writer's ids land in the second one).
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.t6 (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);
         CREATE TABLE app.t6_a PARTITION OF app.t6 FOR VALUES FROM (0) TO (50000);
         CREATE TABLE app.t6_b PARTITION OF app.t6 FOR VALUES FROM (50000) TO (MAXVALUE);
         INSERT INTO app.t6 SELECT g, 'part ' || g FROM generate_series(1, 400) g;",
    );
    add("app.t6");
    // Not followed.
    ok(
        &mut alice,
        &c,
        "CREATE TABLE other.t7 (id int PRIMARY KEY, v text); INSERT INTO other.t7 VALUES (1, 'x');",
    );
    add("other.t7");

    // A few more rounds of writes on every table, then stop.
    let rounds_before: i64 = c.query_scalar("SELECT count(*) FROM app.t1");
    c.wait_until(
        "the writer wrote app.t6 and app.t1 a few more times",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok(c.query_scalar::<i64>("SELECT count(*) FROM app.t1") >= rounds_before + 5),
    );
    stop.store(true, Ordering::Relaxed);
    let rounds = w.join().expect("writer");
    eprintln!("  writer rounds: {rounds}");

    let expected = "app.existing,app.t1,app.t2,app.t3,app.t4,app.t5,app.t6";
    for p in ["po", "pt"] {
        assert_eq!(captured(&c, p), expected, "captured by {p}\n{}", diag(&c));
    }
    for p in ["po", "pt"] {
        for t in ["app.t3", "app.t4", "app.t5", "app.t6"] {
            wait_for_backfill(&c, t, Some(p), 120, || diag(&c));
        }
        wait_for_pipeline(&c, p, 120, || diag(&c));
    }
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.skipped_tables"),
        0,
        "app.t3's skip records went when it was captured\n{}",
        diag(&c)
    );
    for t in ["existing", "t1", "t2", "t3", "t4", "t5", "t6"] {
        assert_same_rows(
            t,
            &c,
            &format!("app.{t}"),
            &c,
            &format!("copy.{t}"),
            "id, v",
        );
        outbox_copy(
            &c,
            &format!("app.{t}"),
            &format!("app.{t}"),
            &format!("check_copy.{t}"),
        );
        let n: i64 = c.query_scalar(&format!("SELECT check_copy.{t}_replay('po')"));
        assert!(n > 0, "no outbox events of app.{t}");
        assert_same_rows(
            &format!("{t} (outbox)"),
            &c,
            &format!("app.{t}"),
            &c,
            &format!("check_copy.{t}"),
            "id, v",
        );
    }
    // The rows written in the creating transaction were streamed (not read by the backfill).
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM tide.outbox WHERE pipeline = 'po' AND relation = 'app.t2' AND op = 'insert' AND (\"row\"->>'id')::int <= 500"
        ),
        500,
        "app.t2's rows of its creating transaction as insert events"
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.outbox WHERE relation = 'other.t7'"),
        0,
        "a table of a schema not followed was captured"
    );
}

#[test]
fn skip_stop_remove_and_drop() {
    let c = setup("schema_follow_stop");
    c.execute(
        "CREATE ROLE alice LOGIN; CREATE ROLE bob LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA app AUTHORIZATION alice;
         GRANT USAGE, CREATE ON SCHEMA app TO bob;",
    );
    let (mut alice, _) = connect_collecting(&c, "alice");
    let (mut bob, bob_notices) = connect_collecting(&c, "bob");
    ok(&mut alice, &c, "SELECT tide.create_pipeline('p')");
    expect_fail_with(
        "an unknown schema",
        alice.batch_execute("SELECT tide.add_tables_in_schema('p', 'nope', follow => true)"),
        "3F000",
        Some("pg_namespace"),
    );
    expect_fail_with(
        "pg_tide's schema",
        alice.batch_execute("SELECT tide.add_tables_in_schema('p', 'tide', follow => true)"),
        "42809",
        Some("schema of your own"),
    );
    ok(
        &mut alice,
        &c,
        "SELECT tide.add_tables_in_schema('p', 'app', backfill => false, follow => true)",
    );

    // Another role's table, readable by alice: skipped with a WARNING, its DDL succeeds.
    ok(
        &mut bob,
        &c,
        "CREATE TABLE app.bobs (id int PRIMARY KEY, v text); GRANT SELECT ON app.bobs TO alice;
         CREATE UNLOGGED TABLE app.bobs_scratch (id int PRIMARY KEY);",
    );
    let seen = bob_notices.lock().expect("notices").clone();
    assert!(
        seen.iter().any(|n| n.starts_with("WARNING")
            && n.contains("app.bobs ")
            && n.contains("belongs to role \"bob\"")),
        "no WARNING for bob's table: {seen:?}"
    );
    assert_eq!(
        captured(&c, "p"),
        "",
        "bob's tables were captured\n{}",
        diag(&c)
    );
    assert_eq!(
        c.query_scalar::<String>(
            "SELECT string_agg(relation || ':' || sqlstate || ':' || by_role, ',' ORDER BY relation) FROM tide.skipped_tables"
        ),
        "app.bobs:42501:bob,app.bobs_scratch:42501:bob"
    );
    assert_eq!(
        c.query_scalar::<String>(
            "SELECT tables || '/' || skipped FROM tide.followed_schemas WHERE pipeline = 'p'"
        ),
        "0/2"
    );

    // alice's table is captured; removed, an ALTER TABLE does not capture it again.
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.a (id int PRIMARY KEY, v text)",
    );
    assert_eq!(captured(&c, "p"), "app.a");
    ok(&mut alice, &c, "SELECT tide.remove_table('p', 'app.a')");
    ok(&mut alice, &c, "ALTER TABLE app.a ADD COLUMN w int");
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    assert_eq!(
        captured(&c, "p"),
        "",
        "a removed table came back\n{}",
        diag(&c)
    );
    assert_eq!(
        c.query_scalar::<String>("SELECT kind FROM tide.skipped_tables WHERE relation = 'app.a'"),
        "removed"
    );
    // tide.add_table takes it back (and forgets the record).
    ok(
        &mut alice,
        &c,
        "SELECT tide.add_table('p', 'app.a', backfill => false)",
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.skipped_tables WHERE relation = 'app.a'"),
        0
    );

    // Stop following: a table created afterwards is not captured; stopping again is a NOTICE.
    ok(
        &mut alice,
        &c,
        "SELECT tide.stop_following_schema('p', 'app')",
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.followed_schema"),
        0
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.follow_skip"),
        0,
        "the skip records went with the follow"
    );
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.after_stop (id int PRIMARY KEY)",
    );
    assert_eq!(
        captured(&c, "p"),
        "app.a",
        "a table created after the stop was captured"
    );
    ok(
        &mut alice,
        &c,
        "SELECT tide.stop_following_schema('p', 'app')",
    );
    expect_fail_with(
        "stop with an unknown schema",
        alice.batch_execute("SELECT tide.stop_following_schema('p', 'nope')"),
        "3F000",
        Some("pg_namespace"),
    );

    // DROP SCHEMA forgets the follow; drop_pipeline too.
    c.execute("CREATE SCHEMA gone AUTHORIZATION alice");
    ok(
        &mut alice,
        &c,
        "SELECT tide.add_tables_in_schema('p', 'gone', follow => true);
         SELECT tide.add_tables_in_schema('p', 'app', follow => true);",
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.followed_schema"),
        2
    );
    ok(&mut alice, &c, "DROP SCHEMA gone");
    assert_eq!(
        c.query_scalar::<String>("SELECT string_agg(schema::text, ',') FROM tide.followed_schemas"),
        "app"
    );
    ok(&mut alice, &c, "SELECT tide.drop_pipeline('p')");
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.followed_schema"),
        0
    );
    // And a CREATE TABLE there works as before.
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.after_drop (id int PRIMARY KEY)",
    );
}

/// `min|max|count` of column `a` of `table` (empty values when it has no rows).
fn summary(c: &Cluster, table: &str) -> String {
    c.query_scalar(&format!(
        "SELECT count(*) || '|' || coalesce(min(a)::text, '') || '|' || coalesce(max(a)::text, '') FROM {table}"
    ))
}

/// Issue 45: a table that leaves a followed schema leaves the pipeline at that position, as a
/// publication's `FOR TABLES IN SCHEMA` stops publishing it (PostgreSQL's scenario: `sch1.tab3`
/// moved to `public`, then `INSERT INTO public.tab3 VALUES (12)`: the subscriber keeps
/// `11|1|11`; pg_tide kept capturing it and showed `12|1|12`). Also: in the transaction of the
/// move, the changes before it are delivered and those after it are not; a table that enters
/// the schema (back, or for the first time) is captured from there with its rows; a table
/// added with `tide.add_table` stays captured wherever it moves (a publication's `FOR TABLE`);
/// a move between two followed schemas keeps the table.
#[test]
fn tables_leave_and_enter_with_their_schema() {
    let c = setup("schema_follow_leave");
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA sch1 AUTHORIZATION alice;
         CREATE SCHEMA sch2 AUTHORIZATION alice;
         CREATE SCHEMA loc AUTHORIZATION alice;
         GRANT CREATE ON SCHEMA public TO alice;",
    );
    let (mut alice, _) = connect_collecting(&c, "alice");
    ok(
        &mut alice,
        &c,
        r#"SELECT tide.create_pipeline('p', 'table', '{"schema": "loc"}')"#,
    );
    ok(
        &mut alice,
        &c,
        r#"CREATE TABLE sch1.tab3 (a int PRIMARY KEY);
           CREATE TABLE sch1.kept (a int PRIMARY KEY);
           CREATE TABLE sch1.hop (a int PRIMARY KEY);
           SELECT tide.add_table('p', 'sch1.kept', backfill => false);
           SELECT tide.add_tables_in_schema('p', 'sch1', follow => true);
           SELECT tide.add_tables_in_schema('p', 'sch2', backfill => false, follow => true);"#,
    );
    wait_streaming(&c, "p", Duration::from_secs(30));
    assert_eq!(
        captured(&c, "p"),
        "sch1.hop,sch1.kept,sch1.tab3",
        "{}",
        diag(&c)
    );
    ok(
        &mut alice,
        &c,
        "INSERT INTO sch1.tab3 SELECT generate_series(1, 10);
         INSERT INTO sch1.kept VALUES (1);
         INSERT INTO sch1.hop VALUES (1);",
    );
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    assert_eq!(summary(&c, "loc.tab3"), "10|1|10", "{}", diag(&c));

    // PostgreSQL's scenario, with the move inside a transaction that writes before and after.
    ok(
        &mut alice,
        &c,
        "BEGIN;
         INSERT INTO sch1.tab3 VALUES (11);
         ALTER TABLE sch1.tab3 SET SCHEMA public;
         INSERT INTO public.tab3 VALUES (12);
         COMMIT;
         INSERT INTO public.tab3 VALUES (13);
         ALTER TABLE sch1.kept SET SCHEMA public;
         INSERT INTO public.kept VALUES (2);
         ALTER TABLE sch1.hop SET SCHEMA sch2;
         INSERT INTO sch2.hop VALUES (2);",
    );
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    assert_eq!(summary(&c, "public.tab3"), "13|1|13", "the source");
    assert_eq!(
        summary(&c, "loc.tab3"),
        "11|1|11",
        "the target keeps what was committed before the move\n{}",
        diag(&c)
    );
    assert_eq!(
        summary(&c, "loc.kept"),
        "2|1|2",
        "add_table's table stays\n{}",
        diag(&c)
    );
    assert_eq!(
        summary(&c, "loc.hop"),
        "2|1|2",
        "a move between followed schemas keeps the table\n{}",
        diag(&c)
    );
    assert_eq!(
        captured(&c, "p"),
        "sch1.hop,sch1.kept",
        "tab3 left the pipeline (the others keep the name they were added under)\n{}",
        diag(&c)
    );
    // Gone for good: later changes are not delivered either.
    ok(&mut alice, &c, "DELETE FROM public.tab3 WHERE a <= 5");
    // Entering: tab3 moved back, and a table new to the schema, each with its rows.
    ok(
        &mut alice,
        &c,
        "CREATE TABLE public.tab5 (a int PRIMARY KEY);
         INSERT INTO public.tab5 SELECT generate_series(1, 5);
         ALTER TABLE public.tab5 SET SCHEMA sch1;
         INSERT INTO sch1.tab5 VALUES (6);
         ALTER TABLE public.tab3 SET SCHEMA sch1;
         INSERT INTO sch1.tab3 VALUES (14);",
    );
    for t in ["sch1.tab5", "sch1.tab3"] {
        wait_for_backfill(&c, t, Some("p"), 60, || diag(&c));
    }
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    assert_eq!(summary(&c, "loc.tab5"), "6|1|6", "{}", diag(&c));
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM sch1.tab3 s FULL JOIN loc.tab3 t USING (a) WHERE s.a IS NULL OR t.a IS NULL"
        ),
        5,
        "tab3 is captured again and backfilled; only the rows deleted while it was out stay at the target\n{}",
        diag(&c)
    );
    assert_eq!(summary(&c, "loc.tab3"), "14|1|14", "{}", diag(&c));
    // Out and back in before the worker reaches the move: captured again (and read again).
    ok(
        &mut alice,
        &c,
        "BEGIN;
         ALTER TABLE sch1.tab5 SET SCHEMA public;
         INSERT INTO public.tab5 VALUES (7);
         ALTER TABLE public.tab5 SET SCHEMA sch1;
         INSERT INTO sch1.tab5 VALUES (8);
         COMMIT;",
    );
    wait_for_backfill(&c, "sch1.tab5", Some("p"), 60, || diag(&c));
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    ok(&mut alice, &c, "INSERT INTO sch1.tab5 VALUES (9)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    assert_eq!(summary(&c, "loc.tab5"), "9|1|9", "{}", diag(&c));
    assert!(
        captured(&c, "p").contains("tab5"),
        "tab5 is captured\n{}",
        diag(&c)
    );
}
