//! pg_tide's security model, tested as the roles a DBA would create, with only the documented
//! grant (`GRANT tide_admin TO <role>`): each attack found against the previous design is a test
//! here, and each failed on that design.
//!
//! Roles: `alice` and `mallory` are pg_tide users (members of `tide_admin`, LOGIN, no other
//! attribute); `nobody` has no pg_tide rights at all. `victim.secret` belongs to the superuser and
//! is granted to no one.

use pg_test::*;

mod alter_table;
mod escalation;
mod fence;
mod follow;
mod kafka;
mod keyless;
mod names;
mod operations;
mod reads;
mod remote;
mod restore;
mod serverwide;
mod shape;
mod shares;
mod spool;
mod stalls;
use std::time::{Duration, Instant};

/// A cluster with pg_tide and the roles and tables described in the module doc.
fn secured(name: &str) -> Cluster {
    secured_with(name, &[])
}

/// [`secured`], with extra `postgresql.conf` lines.
fn secured_with(name: &str, conf: &[&str]) -> Cluster {
    let mut b = Cluster::builder(name);
    for line in conf {
        b = b.conf(line);
    }
    let c = start_cluster(b);
    init_extension(&c);
    c.execute(
        "CREATE ROLE alice LOGIN; CREATE ROLE mallory LOGIN; CREATE ROLE nobody LOGIN;
         GRANT tide_admin TO alice, mallory;
         CREATE SCHEMA alice AUTHORIZATION alice;
         CREATE SCHEMA mallory AUTHORIZATION mallory;
         CREATE SCHEMA victim;
         CREATE TABLE victim.secret (id int PRIMARY KEY, v text);
         INSERT INTO victim.secret VALUES (1, 'the secret');
         GRANT CREATE ON DATABASE postgres TO alice, mallory;",
    );
    c
}

/// Each of `sqls` (setting a server setting, one way or another) fails as mallory (a
/// `tide_admin` member) and as nobody, with 55P02 (cannot be changed now) or 42501.
#[track_caller]
fn settings_refused(c: &Cluster, sqls: &[&str]) {
    for role in ["mallory", "nobody"] {
        for sql in sqls {
            let e = exec_as(c, role, sql).expect_err(sql);
            let code = e.code().map(|s| s.code().to_string());
            assert!(
                matches!(code.as_deref(), Some("55P02") | Some("42501")),
                "as {role}: {sql}: {}",
                describe_error(&e)
            );
        }
    }
}

fn exec_as(c: &Cluster, role: &str, sql: &str) -> Result<(), postgres::Error> {
    connect_as(c, role).batch_execute(sql)
}

#[track_caller]
fn ok_as(c: &Cluster, role: &str, sql: &str) {
    if let Err(e) = exec_as(c, role, sql) {
        panic!(
            "as {role}: {sql}\nfailed: {}\n{}",
            describe_error(&e),
            diag(c)
        );
    }
}

fn scalar_as<T: for<'a> postgres::types::FromSql<'a>>(c: &Cluster, role: &str, sql: &str) -> T {
    connect_as(c, role)
        .query_one(sql, &[])
        .unwrap_or_else(|e| panic!("as {role}: {sql}\nfailed: {}", describe_error(&e)))
        .get(0)
}

/// alice's pipeline `p` (outbox) capturing `alice.t` (100 rows), streaming.
fn alice_pipeline(c: &Cluster) {
    ok_as(
        c,
        "alice",
        "CREATE TABLE alice.t (id int PRIMARY KEY, v int);
         INSERT INTO alice.t SELECT g, g FROM generate_series(1, 100) g;",
    );
    // (A slot is created in a transaction of its own.)
    ok_as(c, "alice", "SELECT tide.create_pipeline('p')");
    ok_as(
        c,
        "alice",
        "SELECT tide.add_table('p', 'alice.t', backfill => false)",
    );
    wait_for_pipeline(c, "p", 30, || diag(c));
}

/// 1. A backfill condition that calls the owner's function, which tries to climb back to the
/// worker's superuser identity, fails its backfill (with the reason) and changes no role.
#[test]
fn condition_cannot_escalate() {
    let c = secured("sec_condition");
    alice_pipeline(&c);
    ok_as(
        &c,
        "alice",
        "CREATE FUNCTION alice.esc() RETURNS bool LANGUAGE plpgsql AS
           $$BEGIN RESET ROLE; ALTER ROLE alice SUPERUSER; RETURN true; END$$;
         CREATE FUNCTION alice.esc2() RETURNS bool LANGUAGE plpgsql AS
           $$BEGIN SET ROLE postgres; ALTER ROLE alice SUPERUSER; RETURN true; END$$;",
    );
    for f in ["alice.esc()", "alice.esc2()"] {
        // The API checks the condition as alice: the function exists and is boolean.
        ok_as(
            &c,
            "alice",
            &format!("SELECT tide.start_backfill('alice.t', 'p', 100, '{f}')"),
        );
        c.wait_until(
            &format!("the backfill with {f} to fail"),
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                Ok(c.try_query_scalar::<i64>(
                    "SELECT count(*) FROM tide.backfill WHERE state = 'failed'",
                )? >= 1)
            },
        );
        let superuser: bool =
            c.query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = 'alice'");
        assert!(
            !superuser,
            "the condition {f} made alice a superuser\n{}",
            diag(&c)
        );
        let error: String = scalar_as(
            &c,
            "alice",
            "SELECT error FROM tide.backfills WHERE state = 'failed' ORDER BY id DESC LIMIT 1",
        );
        assert!(
            error.contains("security-restricted")
                || error.contains("security-definer")
                || error.contains("permission denied"),
            "the failed backfill says why: {error}"
        );
        c.execute("DELETE FROM tide.backfill");
    }
    // The worker survived and still streams.
    c.execute("INSERT INTO alice.t VALUES (1000, 1)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    let n: i64 = c.query_scalar("SELECT count(*) FROM tide.outbox WHERE key->>'id' = '1000'");
    assert_eq!(n, 1);
}

/// 2. A table target writes only where its owner may write: another role's table, a system
/// catalog, information_schema and pg_tide's schema are refused at add_table; a right revoked
/// afterwards makes the pipeline fail with the reason, and nothing is written.
#[test]
fn table_target_writes_only_where_the_owner_may() {
    let c = secured("sec_target");
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.s (id int PRIMARY KEY, v text);
         INSERT INTO alice.s VALUES (1, 'a'), (2, 'b');",
    );
    ok_as(
        &c,
        "alice",
        r#"SELECT tide.create_pipeline('pt', 'table', '{"schema": "alice_copy"}')"#,
    );
    let mut a = connect_as(&c, "alice");
    for (target, code) in [
        ("victim.secret", "42501"),
        ("pg_catalog.pg_description", "22023"),
        ("information_schema.sql_features", "22023"),
        ("tide.x", "22023"),
        ("tide.outbox", "22023"),
    ] {
        assert_sql_fails(
            a.batch_execute(&format!(
                "SELECT tide.add_table('pt', 'alice.s', true, '{target}')"
            )),
            code,
            None,
        );
    }
    let secret: String = c.query_scalar("SELECT v FROM victim.secret WHERE id = 1");
    assert_eq!(secret, "the secret");

    // A shared target the DBA granted, then revoked.
    c.execute(
        "CREATE SCHEMA shared; CREATE TABLE shared.tgt (id int PRIMARY KEY, v text);
         GRANT USAGE ON SCHEMA shared TO alice;
         GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON shared.tgt TO alice;",
    );
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_table('pt', 'alice.s', true, 'shared.tgt')",
    );
    wait_for_backfill(&c, "alice.s", Some("pt"), 60, || diag(&c));
    wait_for_pipeline(&c, "pt", 30, || diag(&c));
    let n: i64 = c.query_scalar("SELECT count(*) FROM shared.tgt");
    assert_eq!(n, 2);
    // verify and repair work for the owner with the documented grant alone.
    let differing: i64 = scalar_as(
        &c,
        "alice",
        "SELECT count(*) FROM tide.verify('alice.s', 'pt') WHERE kind NOT LIKE 'summary%'",
    );
    assert_eq!(differing, 0, "{}", diag(&c));
    ok_as(&c, "alice", "SELECT * FROM tide.repair('alice.s', 'pt')");
    assert_sql_fails(
        exec_as(&c, "mallory", "SELECT * FROM tide.verify('alice.s', 'pt')"),
        "42501",
        None,
    );
    c.execute("REVOKE INSERT, UPDATE ON shared.tgt FROM alice");
    ok_as(&c, "alice", "INSERT INTO alice.s VALUES (3, 'c')");
    c.wait_until(
        "the pipeline to report the revoked right",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let e: Option<String> =
                c.try_query_scalar("SELECT last_error FROM tide.pipeline WHERE name = 'pt'")?;
            Ok(e.is_some_and(|e| e.contains("permission denied")))
        },
    );
    let n: i64 = c.query_scalar("SELECT count(*) FROM shared.tgt WHERE id = 3");
    assert_eq!(
        n, 0,
        "the row was written although the owner lost the right"
    );

    // A pipeline cannot capture its own target, nor write into a table it captures.
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.u (id int PRIMARY KEY, v text)",
    );
    assert_sql_fails(
        a.batch_execute("SELECT tide.add_table('pt', 'alice.u', false, 'alice.s')"),
        "22023",
        None,
    );
    assert_sql_fails(
        a.batch_execute("SELECT tide.add_table('pt', 'shared.tgt', false)"),
        "22023",
        None,
    );
}

/// 3. A logical message with pg_tide's prefix, written by a role with no pg_tide rights at all,
/// is ignored (not even decoded, so not logged either: see stalls.rs): the table keeps being
/// captured.
#[test]
fn markers_cannot_be_forged() {
    let c = secured("sec_marker");
    alice_pipeline(&c);
    let relid: i64 = c.query_scalar("SELECT 'alice.t'::regclass::oid::int8");
    ok_as(
        &c,
        "nobody",
        &format!("SELECT pg_logical_emit_message(true, 'pg_tide', E'remove_table\\tp\\t{relid}')"),
    );
    c.execute("INSERT INTO alice.t VALUES (500, 5)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    let n: i64 = c.query_scalar("SELECT count(*) FROM tide.outbox WHERE key->>'id' = '500'");
    assert_eq!(
        n,
        1,
        "a row committed after the forged marker was not delivered\n{}",
        diag(&c)
    );
    let state: String = c.query_scalar("SELECT state FROM tide.tables WHERE pipeline = 'p'");
    assert_eq!(state, "capturing");
}

/// 4 and 5. The documented grant is enough for the whole API; pg_tide's own tables cannot be
/// written (or read) directly; another pg_tide user cannot act on alice's pipeline, nor see it.
#[test]
fn grant_is_enough_and_ownership_is_checked() {
    let c = secured("sec_owner");
    alice_pipeline(&c);
    // The whole life of a pipeline as alice.
    ok_as(
        &c,
        "alice",
        "SELECT tide.start_backfill('alice.t', 'p', 10);
         SELECT tide.pause_backfill('alice.t', 'p');
         SELECT tide.resume_backfill('alice.t', 'p');
         SELECT tide.alter_backfill('alice.t', 'p', chunk_size => 20);",
    );
    let done: bool = scalar_as(
        &c,
        "alice",
        "SELECT tide.wait_for_backfill('alice.t', 'p', '60 seconds')",
    );
    assert!(done, "{}", diag(&c));
    let seen: i64 = scalar_as(
        &c,
        "alice",
        "SELECT count(*) FROM tide.outbox WHERE op = 'read'",
    );
    assert_eq!(seen, 100, "alice reads her pipeline's outbox");
    let last_key: Option<Vec<String>> =
        scalar_as(&c, "alice", "SELECT last_key FROM tide.backfills LIMIT 1");
    assert!(last_key.is_some(), "alice sees her own keys");
    ok_as(
        &c,
        "alice",
        "SELECT tide.pause_pipeline('p'); SELECT tide.resume_pipeline('p')",
    );

    // No DML on pg_tide's tables, for alice or anyone else without superuser.
    let mut a = connect_as(&c, "alice");
    for sql in [
        "INSERT INTO tide.backfill (pipeline, relid, relation, key_columns, owner, generation, chunk_size)
           VALUES ('p', 'victim.secret'::regclass, 'victim.secret', '{id}', 'postgres', 9, 10)",
        "UPDATE tide.pipeline SET owner = 'postgres'",
        "INSERT INTO tide.pipeline_table (pipeline, relid, relation, key_columns) VALUES ('p', 'victim.secret'::regclass, 'x', '{id}')",
        "SELECT * FROM tide.pipeline",
        "DELETE FROM tide.signal",
    ] {
        assert_sql_fails(a.batch_execute(sql), "42501", None);
    }

    // mallory: a pg_tide user too, but not alice.
    let mut m = connect_as(&c, "mallory");
    for sql in [
        "SELECT tide.pause_pipeline('p')",
        "SELECT tide.resume_pipeline('p')",
        "SELECT tide.drop_pipeline('p')",
        "SELECT tide.remove_table('p', 'alice.t')",
        "SELECT tide.wait_for_pipeline('p', '1 second')",
    ] {
        assert_sql_fails(m.batch_execute(sql), "42501", None);
    }
    m.batch_execute("CREATE TABLE mallory.m (id int PRIMARY KEY)")
        .unwrap();
    assert_sql_fails(
        m.batch_execute("SELECT tide.add_table('p', 'mallory.m')"),
        "42501",
        None,
    );
    let visible: i64 = scalar_as(
        &c,
        "mallory",
        "SELECT (SELECT count(*) FROM tide.pipelines) + (SELECT count(*) FROM tide.backfills)
              + (SELECT count(*) FROM tide.tables) + (SELECT count(*) FROM tide.chunks)
              + (SELECT count(*) FROM tide.readiness) + (SELECT count(*) FROM tide.outbox)",
    );
    assert_eq!(visible, 0, "mallory sees alice's pipeline");
    // nobody has no pg_tide rights.
    assert_sql_fails(
        exec_as(&c, "nobody", "SELECT tide.create_pipeline('q')"),
        "42501",
        None,
    );

    // A member of alice's role may act for her; the owner drops her own pipeline (no
    // REPLICATION attribute, no superuser).
    c.execute("GRANT alice TO mallory");
    ok_as(
        &c,
        "mallory",
        "SELECT tide.pause_pipeline('p'); SELECT tide.resume_pipeline('p')",
    );
    c.execute("REVOKE alice FROM mallory");
    ok_as(&c, "alice", "SELECT tide.drop_pipeline('p')");
    let left: i64 = c.query_scalar(
        "SELECT (SELECT count(*) FROM tide.pipeline) + (SELECT count(*) FROM pg_replication_slots)",
    );
    assert_eq!(left, 0, "the pipeline or its slot is left\n{}", diag(&c));
}

/// 6 and 7. Conditions are parsed by PostgreSQL's parser (the escape the hand-written lexer let
/// through is refused), and a slow or hostile condition fails its backfill with the reason
/// instead of holding the stream or killing the worker.
#[test]
fn conditions_cannot_escape_stall_or_kill() {
    let c = secured("sec_cond_stall");
    c.execute("ALTER SYSTEM SET tide.chunk_timeout = '1s'");
    c.execute("SELECT pg_reload_conf()");
    alice_pipeline(&c);
    ok_as(&c, "alice", "ALTER TABLE alice.t ADD COLUMN name text");
    let mut a = connect_as(&c, "alice");
    assert_sql_fails(
        a.batch_execute(
            r#"SELECT tide.start_backfill('alice.t', 'p', 100, $c$name'\' IS NOT NULL) OR (true OR E'\'' IS NULL$c$)"#,
        ),
        "42601",
        None,
    );
    let pid_before: i32 = c.query_scalar("SELECT worker_pid FROM tide.pipelines WHERE name = 'p'");
    ok_as(
        &c,
        "alice",
        "SELECT tide.start_backfill('alice.t', 'p', 10, '(select pg_sleep(8)) is null')",
    );
    // While the chunk is cancelled after 1 s, the stream goes on.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    c.execute("INSERT INTO alice.t VALUES (2000, 2)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(6),
        "the stream waited {took:?} behind an 8 s condition"
    );
    c.wait_until(
        "the slow backfill to fail",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.backfill WHERE state = 'failed' AND error LIKE '%tide.chunk_timeout%'",
            )? == 1)
        },
    );
    c.execute("DELETE FROM tide.backfill");
    ok_as(
        &c,
        "alice",
        "SELECT tide.start_backfill('alice.t', 'p', 10, 'pg_terminate_backend(pg_backend_pid())')",
    );
    c.wait_until(
        "the killing backfill to fail",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.backfill WHERE state = 'failed' AND error IS NOT NULL",
            )? == 1)
        },
    );
    let pid_after: i32 = c.query_scalar("SELECT worker_pid FROM tide.pipelines WHERE name = 'p'");
    assert_eq!(
        pid_before,
        pid_after,
        "the condition killed the worker\n{}",
        diag(&c)
    );
}

/// 10. What other roles see: keys and error texts of tables the viewer cannot SELECT are hidden.
#[test]
fn views_hide_keys_of_unreadable_tables() {
    let c = secured("sec_views");
    c.execute(
        "CREATE SCHEMA shared; CREATE TABLE shared.data (id int PRIMARY KEY, v text);
         INSERT INTO shared.data SELECT g, 'v' || g FROM generate_series(1, 50) g;
         GRANT USAGE ON SCHEMA shared TO alice; GRANT SELECT ON shared.data TO alice;",
    );
    ok_as(&c, "alice", "SELECT tide.create_pipeline('p')");
    ok_as(&c, "alice", "SELECT tide.add_table('p', 'shared.data')");
    wait_for_backfill(&c, "shared.data", Some("p"), 60, || diag(&c));
    let (keys, chunk_keys): (i64, i64) = {
        let r = connect_as(&c, "alice")
            .query_one(
                "SELECT (SELECT count(last_key) FROM tide.backfills),
                        (SELECT count(key_to) FROM tide.chunks)",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(
        keys == 1 && chunk_keys >= 1,
        "alice sees the keys of a table she may read"
    );
    c.execute("REVOKE SELECT ON shared.data FROM alice");
    let r = connect_as(&c, "alice")
        .query_one(
            "SELECT (SELECT count(*) FROM tide.backfills), (SELECT count(last_key) FROM tide.backfills),
                    (SELECT count(key_to) FROM tide.chunks)",
            &[],
        )
        .unwrap();
    let (rows, keys, chunk_keys): (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
    assert_eq!(rows, 1, "alice still sees her backfill");
    assert_eq!(
        keys + chunk_keys,
        0,
        "keys of a table alice may no longer read are shown"
    );
}

/// 9. Loops are impossible: a table target is never captured (refused at add_table, in either
/// order), and what a table target writes carries pg_tide's replication origin, so even a
/// pipeline that captured the table before it became a target never sees pg_tide's writes.
#[test]
fn loops_are_impossible() {
    // (track_commit_timestamp: the worker's commits carry its origin, and must keep their real
    // commit time.)
    let c = start_cluster(Cluster::builder("sec_loops").conf("track_commit_timestamp = on"));
    c.execute("CREATE EXTENSION pg_tide");
    c.execute(
        "CREATE TABLE a (id int PRIMARY KEY, v int); CREATE TABLE b (id int PRIMARY KEY, v int);
         CREATE TABLE cc (id int PRIMARY KEY, v int);",
    );
    c.execute(r#"SELECT tide.create_pipeline('p1', 'table', '{"schema": "public"}')"#);
    c.execute(r#"SELECT tide.create_pipeline('p2', 'table', '{"schema": "public"}')"#);
    c.execute("SELECT tide.create_pipeline('watch')");
    c.execute("SELECT tide.add_table('p1', 'a', false, 'public.b')");
    // b is p1's target: no pipeline may capture it (it would feed a back to itself through p2).
    assert_sql_fails(
        c.try_execute("SELECT tide.add_table('p2', 'b', false, 'public.a')"),
        "22023",
        None,
    );
    // Within one pipeline, a captured table cannot be a target either.
    c.execute("CREATE TABLE d (id int PRIMARY KEY, v int)");
    assert_sql_fails(
        c.try_execute("SELECT tide.add_table('p1', 'd', false, 'public.a')"),
        "22023",
        None,
    );
    // 'watch' captured cc before it became p1's target: it sees a direct write to cc, never
    // p1's writes.
    c.execute("SELECT tide.add_table('watch', 'cc', false)");
    c.execute("CREATE TABLE e (id int PRIMARY KEY, v int)");
    c.execute("SELECT tide.add_table('p1', 'e', false, 'public.cc')");
    for p in ["p1", "watch"] {
        wait_for_pipeline(&c, p, 30, || diag(&c));
    }
    c.execute("INSERT INTO e SELECT g, g FROM generate_series(1, 50) g");
    c.execute("INSERT INTO cc VALUES (1000, 1)");
    c.execute("INSERT INTO a VALUES (1, 1)");
    for p in ["p1", "watch"] {
        wait_for_pipeline(&c, p, 30, || diag(&c));
    }
    let at_target: i64 = c.query_scalar("SELECT count(*) FROM cc");
    assert_eq!(at_target, 51, "p1 wrote its target\n{}", diag(&c));
    // A row is committed at the target after it was committed at the source.
    let before_source: i64 = c.query_scalar(
        "SELECT count(*) FROM cc JOIN e USING (id)
          WHERE pg_xact_commit_timestamp(cc.xmin) IS NULL
             OR pg_xact_commit_timestamp(cc.xmin) < pg_xact_commit_timestamp(e.xmin)",
    );
    assert_eq!(
        before_source, 0,
        "target rows carry a commit timestamp older than their source's (a stale origin timestamp)"
    );
    let seen = texts(
        &c,
        "SELECT key->>'id' FROM tide.outbox WHERE pipeline = 'watch' ORDER BY id",
    );
    assert_eq!(
        seen,
        vec!["1000".to_string()],
        "the watcher must see the direct write only, never pg_tide's writes"
    );
    let b: i64 = c.query_scalar("SELECT count(*) FROM b");
    assert_eq!(b, 1);
    // Nothing goes round: the counts stay put.
    std::thread::sleep(Duration::from_millis(1500));
    let events: i64 = c.query_scalar("SELECT count(*) FROM tide.outbox");
    assert_eq!(events, 1);
}

/// 10. Clean errors: NULL arguments (22004, naming the argument), an OID that names no relation
/// (42P01), huge intervals (clamped, not overflowing), huge names (truncated in the message), and
/// no Rust backtrace in any DETAIL.
#[test]
fn clean_errors() {
    let c = setup("sec_errors");
    c.execute("CREATE TABLE t (id int PRIMARY KEY)");
    c.execute("SELECT tide.create_pipeline('p')");
    c.execute("SELECT tide.add_table('p', 't', false)");
    for (sql, arg) in [
        ("SELECT tide.create_pipeline(NULL)", "name"),
        ("SELECT tide.create_pipeline('q', NULL)", "target"),
        ("SELECT tide.drop_pipeline(NULL)", "name"),
        ("SELECT tide.pause_pipeline(NULL)", "name"),
        ("SELECT tide.resume_pipeline(NULL)", "name"),
        ("SELECT tide.wait_for_pipeline(NULL)", "name"),
        ("SELECT tide.wait_for_pipeline('p', NULL)", "timeout"),
        ("SELECT tide.add_table(NULL, 't')", "pipeline"),
        ("SELECT tide.add_table('p', NULL)", "source"),
        ("SELECT tide.add_table('p', 't', NULL)", "backfill"),
        ("SELECT tide.remove_table('p', NULL)", "source"),
        ("SELECT tide.start_backfill(NULL)", "source"),
        ("SELECT tide.pause_backfill(NULL)", "source"),
        ("SELECT tide.alter_backfill(NULL)", "source"),
        ("SELECT tide.wait_for_backfill(NULL)", "source"),
        ("SELECT tide.wait_for_backfill('t', 'p', NULL)", "timeout"),
        ("SELECT * FROM tide.verify(NULL)", "source"),
        ("SELECT * FROM tide.repair(NULL)", "source"),
    ] {
        let e = expect_db_error(c.try_execute(sql));
        assert_eq!(e.code().code(), "22004", "{sql}: {e:?}");
        assert!(
            e.message().contains(&format!("\"{arg}\"")),
            "{sql}: the message names the argument {arg}: {e:?}"
        );
    }
    for sql in [
        "SELECT tide.add_table('p', 0::regclass)",
        "SELECT tide.start_backfill(0::regclass)",
        "SELECT * FROM tide.verify(0::regclass)",
        "SELECT tide.remove_table('p', 12345678::regclass)",
    ] {
        let e = expect_db_error(c.try_execute(sql));
        assert_eq!(e.code().code(), "42P01", "{sql}: {e:?}");
        assert!(
            !e.detail().unwrap_or("").contains("backtrace"),
            "{sql}: a backtrace in DETAIL: {e:?}"
        );
    }
    let t = Instant::now();
    let ok: bool = c.query_scalar("SELECT tide.wait_for_pipeline('p', '300000 years')");
    assert!(
        ok,
        "a huge timeout must not overflow into an immediate false"
    );
    assert!(t.elapsed() < Duration::from_secs(30));
    let long = "x".repeat(100_000);
    let e = expect_db_error(c.try_execute(&format!("SELECT tide.pause_pipeline('{long}')")));
    assert_eq!(e.code().code(), "42704");
    assert!(
        e.message().len() < 300,
        "the name is echoed in full ({} bytes)",
        e.message().len()
    );
    let e = expect_db_error(c.try_execute(&format!("SELECT tide.create_pipeline('{long}')")));
    assert_eq!(e.code().code(), "22023");
    assert!(
        e.message().len() < 300,
        "the name is echoed in full ({} bytes)",
        e.message().len()
    );
}
