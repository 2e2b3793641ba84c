//! Scenarios of PostgreSQL's subscription TAP tests (`src/test/subscription/t/*.pl`) that
//! pg_tide failed when ported (issue 45), at a local table target and a remote one.

use crate::common::*;
use std::time::Duration;

/// 001_rep_changes, `tab_include`: a primary key with INCLUDE columns is a key of its key
/// columns only. pg_tide took every column of the index as the key: the local target was
/// created with `UNIQUE (a, b)` and `b NOT NULL` (the insert of rows without `b` failed with
/// 23502), and a remote target made as the source is (`PRIMARY KEY (a) INCLUDE (b)`) refused
/// `ON CONFLICT (a, b)` with 42P10. Now both converge to PostgreSQL's expected `20|-20|-1`, and
/// the local target's key is `a` alone with `b` nullable.
#[test]
fn primary_key_with_include_columns() {
    let (c, t) = setup_remote("sub_include");
    let ddl =
        "CREATE TABLE tab_include (a int, b text, CONSTRAINT covering PRIMARY KEY (a) INCLUDE (b))";
    c.execute(&format!("{ddl}; CREATE SCHEMA loc;"));
    t.execute(ddl);
    create_pipeline(&c, "l", "table", r#"{"schema": "loc"}"#);
    create_pipeline(&c, "r", "postgres", r#"{"server": "tgt"}"#);
    exec(
        &c,
        "SELECT tide.add_table('l', 'tab_include', backfill => false);
         SELECT tide.add_table('r', 'tab_include', backfill => false);",
    );
    c.execute("INSERT INTO tab_include SELECT generate_series(1, 50)");
    c.execute("DELETE FROM tab_include WHERE a > 20");
    c.execute("UPDATE tab_include SET a = -a");
    wait_pipeline(&c, "l", 60);
    wait_pipeline(&c, "r", 60);
    let expect = "20|-20|-1";
    let shown = |cl: &Cluster, table: &str| -> String {
        cl.query_scalar(&format!(
            "SELECT count(*) || '|' || min(a) || '|' || max(a) FROM {table}"
        ))
    };
    assert_eq!(shown(&c, "tab_include"), expect, "the source");
    assert_eq!(
        shown(&c, "loc.tab_include"),
        expect,
        "the local target\n{}",
        diag(&c)
    );
    assert_eq!(
        shown(&t, "tab_include"),
        expect,
        "the remote target\n{}",
        diag(&c)
    );
    let key: Vec<String> = c
        .query(
            "SELECT a.attname::text FROM pg_index i
               JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, ord) ON k.ord <= i.indnkeyatts
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              WHERE i.indrelid = 'loc.tab_include'::regclass AND i.indisunique",
        )
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(key, ["a"], "the local target's key");
    let b_nullable: bool = c.query_scalar(
        "SELECT NOT attnotnull FROM pg_attribute WHERE attrelid = 'loc.tab_include'::regclass AND attname = 'b'",
    );
    assert!(b_nullable, "b is an ordinary column at the local target");
    assert_same_rows(
        "loc = source",
        &c,
        "tab_include",
        &c,
        "loc.tab_include",
        "a, b",
    );
}

/// `min|max|count` of column `col` of `table` (empty values when it has no rows).
fn summary(cl: &Cluster, table: &str, col: &str) -> String {
    cl.query_scalar(&format!(
        "SELECT count(*) || '|' || coalesce(min({col})::text, '') || '|' || coalesce(max({col})::text, '') FROM {table}"
    ))
}

/// `last_error_sqlstate` of pipeline `p` (empty when it has none).
fn sqlstate(c: &Cluster, p: &str) -> String {
    c.query_scalar::<Option<String>>(&format!(
        "SELECT last_error_sqlstate FROM tide.pipelines WHERE name = '{p}'"
    ))
    .unwrap_or_default()
}

/// 010_truncate, `TRUNCATE tab3, tab4` where the subscriber has `tab4.y REFERENCES tab3`:
/// PostgreSQL's apply worker truncates a TRUNCATE message's relations in one
/// `ExecuteTruncateGuts`, so the foreign key between them does not refuse it. pg_tide truncated
/// one target table at a time, and both targets failed with 0A000 ("cannot truncate a table
/// referenced in a foreign key constraint"); now each applies one `TRUNCATE` of both tables
/// and goes on.
#[test]
fn truncate_of_tables_linked_by_a_foreign_key_at_the_target() {
    let (c, t) = setup_remote("sub_truncate_fk");
    c.execute(
        "CREATE TABLE tab3 (a int PRIMARY KEY);
         CREATE TABLE tab4 (x int PRIMARY KEY, y int);
         CREATE SCHEMA loc;
         CREATE TABLE loc.tab3 (a int PRIMARY KEY);
         CREATE TABLE loc.tab4 (x int PRIMARY KEY, y int REFERENCES loc.tab3);",
    );
    t.execute(
        "CREATE TABLE tab3 (a int PRIMARY KEY);
         CREATE TABLE tab4 (x int PRIMARY KEY, y int REFERENCES tab3);",
    );
    create_pipeline(&c, "l", "table", r#"{"schema": "loc"}"#);
    create_pipeline(&c, "r", "postgres", r#"{"server": "tgt"}"#);
    exec(
        &c,
        "SELECT tide.add_table(p, t, backfill => false)
           FROM (VALUES ('l'), ('r')) p(p), (VALUES ('tab3'), ('tab4')) t(t);",
    );
    c.execute("INSERT INTO tab3 VALUES (1), (2), (3)");
    c.execute("INSERT INTO tab4 VALUES (1, 1), (2, 2)");
    wait_pipeline(&c, "l", 30);
    wait_pipeline(&c, "r", 30);
    assert_eq!(summary(&c, "loc.tab4", "x"), "2|1|2", "{}", diag(&c));
    assert_eq!(summary(&t, "tab4", "x"), "2|1|2", "{}", diag(&c));
    c.execute("TRUNCATE tab3, tab4");
    c.execute("INSERT INTO tab3 VALUES (7)");
    wait_pipeline(&c, "l", 30);
    wait_pipeline(&c, "r", 30);
    for (who, cl, prefix) in [("local", &c, "loc."), ("remote", &t, "")] {
        assert_eq!(
            summary(cl, &format!("{prefix}tab3"), "a"),
            "1|7|7",
            "{who}: tab3 emptied, then 7\n{}",
            diag(&c)
        );
        assert_eq!(
            summary(cl, &format!("{prefix}tab4"), "x"),
            "0||",
            "{who}: tab4 emptied\n{}",
            diag(&c)
        );
    }
    assert_eq!(sqlstate(&c, "l"), "", "{}", diag(&c));
    assert_eq!(sqlstate(&c, "r"), "", "{}", diag(&c));
}

/// 010_truncate with the subscriber's foreign key `DEFERRABLE INITIALLY DEFERRED` (what pg_tide's
/// README recommends between two target tables, whose statements may run in another order
/// than the source's): a source transaction that inserts the referencing row first. The local
/// target failed at the first insert with 42501 "cannot fire deferred trigger within
/// security-restricted operation" (its writes run as the owner, security-restricted) and 0 rows
/// arrived. Now the constraint is checked at the target transaction's commit, as PostgreSQL's
/// apply worker checks it: the rows arrive, and a row the source inserts without its referenced
/// row fails that commit (23503) until the target has it.
#[test]
fn deferred_foreign_key_between_target_tables() {
    let (c, t) = setup_remote("sub_deferred_fk");
    let fk = "REFERENCES tab3 DEFERRABLE INITIALLY DEFERRED";
    c.execute(
        "CREATE TABLE tab3 (a int PRIMARY KEY);
         CREATE TABLE tab4 (x int PRIMARY KEY, y int);
         CREATE SCHEMA loc;
         CREATE TABLE loc.tab3 (a int PRIMARY KEY);
         CREATE TABLE loc.tab4 (x int PRIMARY KEY, y int REFERENCES loc.tab3 DEFERRABLE INITIALLY DEFERRED);",
    );
    t.execute(&format!(
        "CREATE TABLE tab3 (a int PRIMARY KEY);
         CREATE TABLE tab4 (x int PRIMARY KEY, y int {fk});"
    ));
    create_pipeline(&c, "l", "table", r#"{"schema": "loc"}"#);
    create_pipeline(&c, "r", "postgres", r#"{"server": "tgt"}"#);
    exec(
        &c,
        "SELECT tide.add_table(p, t, backfill => false)
           FROM (VALUES ('l'), ('r')) p(p), (VALUES ('tab4'), ('tab3')) t(t);",
    );
    // The referencing row first: its table's statement runs first at the target too.
    c.execute(
        "BEGIN;
         INSERT INTO tab4 VALUES (1, 1), (2, 2);
         INSERT INTO tab3 VALUES (1), (2), (3);
         COMMIT;",
    );
    wait_pipeline(&c, "l", 30);
    wait_pipeline(&c, "r", 30);
    for (who, cl, prefix) in [("local", &c, "loc."), ("remote", &t, "")] {
        assert_eq!(
            summary(cl, &format!("{prefix}tab3"), "a"),
            "3|1|3",
            "{who}\n{}",
            diag(&c)
        );
        assert_eq!(
            summary(cl, &format!("{prefix}tab4"), "x"),
            "2|1|2",
            "{who}\n{}",
            diag(&c)
        );
    }
    // A row whose referenced row the target does not have: the constraint is checked (at the
    // target transaction's commit), not skipped.
    c.execute("INSERT INTO tab4 VALUES (9, 99)");
    let failed = poll_every(Duration::from_secs(30), Duration::from_millis(100), || {
        Ok(sqlstate(&c, "l") == "23503")
    });
    assert!(
        failed.is_ok(),
        "the local target refuses 9 -> 99\n{}",
        diag(&c)
    );
    assert_eq!(summary(&c, "loc.tab4", "x"), "2|1|2", "{}", diag(&c));
    c.execute("INSERT INTO loc.tab3 VALUES (99)");
    t.execute("INSERT INTO tab3 VALUES (99)");
    wait_pipeline(&c, "l", 30);
    wait_pipeline(&c, "r", 30);
    assert_eq!(summary(&c, "loc.tab4", "x"), "3|1|9", "{}", diag(&c));
    assert_eq!(summary(&t, "tab4", "x"), "3|1|9", "{}", diag(&c));
    c.execute("TRUNCATE tab3, tab4");
    wait_pipeline(&c, "l", 30);
    wait_pipeline(&c, "r", 30);
    assert_eq!(summary(&c, "loc.tab3", "a"), "0||", "{}", diag(&c));
    assert_eq!(summary(&t, "tab3", "a"), "0||", "{}", diag(&c));
}

/// The log of which triggers fired, and the three triggers (ordinary, `ENABLE REPLICA`,
/// `ENABLE ALWAYS`) on `table`, each logging its name into `log`.
fn trigger_setup(table: &str, log: &str) -> String {
    format!(
        "CREATE TABLE {log} (trig text);
         CREATE FUNCTION {log}_f() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO {log} VALUES (TG_ARGV[0]); RETURN NEW; END $$;
         CREATE TRIGGER ordinary AFTER INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {log}_f('ordinary');
         CREATE TRIGGER replica AFTER INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {log}_f('replica');
         CREATE TRIGGER always AFTER INSERT ON {table} FOR EACH ROW EXECUTE FUNCTION {log}_f('always');
         ALTER TABLE {table} ENABLE REPLICA TRIGGER replica;
         ALTER TABLE {table} ENABLE ALWAYS TRIGGER always;"
    )
}

/// The triggers that fired, as `name:count,...`.
fn fired(cl: &Cluster, log: &str) -> String {
    cl.query_scalar::<Option<String>>(&format!(
        "SELECT string_agg(trig || ':' || n, ',' ORDER BY trig) FROM (SELECT trig, count(*) n FROM {log} GROUP BY trig) s"
    ))
    .unwrap_or_default()
}

/// 003, 011, 013 rely on PostgreSQL's apply worker writing with `session_replication_role =
/// replica`: a subscriber's ordinary triggers do not fire, `ENABLE REPLICA` and `ENABLE ALWAYS`
/// ones do. The pipeline option `session_replication_role => 'replica'` does that at a local
/// and a remote target; the default (`origin`, pg_tide's behaviour until now) fires ordinary and
/// `ALWAYS` triggers, not `REPLICA` ones; `tide.alter_pipeline` switches it, and
/// `tide.pipelines.options` shows it. A remote user that may not set it is refused at
/// `create_pipeline` (42501, the hint names the GRANT), and accepted once granted.
#[test]
fn session_replication_role_chooses_the_triggers_that_fire() {
    let (c, t) = setup_remote("sub_replica_role");
    c.execute(&format!(
        "CREATE TABLE tab (a int PRIMARY KEY);
         CREATE SCHEMA rep; CREATE SCHEMA org;
         CREATE TABLE rep.tab (a int PRIMARY KEY);
         CREATE TABLE org.tab (a int PRIMARY KEY);
         {}
         {}",
        trigger_setup("rep.tab", "rep_log"),
        trigger_setup("org.tab", "org_log")
    ));
    t.execute(&format!(
        "CREATE TABLE tab (a int PRIMARY KEY); {}",
        trigger_setup("tab", "tab_log")
    ));
    create_pipeline(
        &c,
        "l",
        "table",
        r#"{"schema": "rep", "session_replication_role": "replica"}"#,
    );
    create_pipeline(&c, "o", "table", r#"{"schema": "org"}"#);
    create_pipeline(
        &c,
        "r",
        "postgres",
        r#"{"server": "tgt", "session_replication_role": "replica"}"#,
    );
    assert_eq!(
        c.query_scalar::<String>(
            "SELECT string_agg(name || '=' || coalesce(options->>'session_replication_role', '-'), ',' ORDER BY name) FROM tide.pipelines"
        ),
        "l=replica,o=-,r=replica"
    );
    exec(
        &c,
        "SELECT tide.add_table(p, 'tab', backfill => false) FROM (VALUES ('l'), ('o'), ('r')) p(p)",
    );
    c.execute("INSERT INTO tab SELECT generate_series(1, 3)");
    for p in ["l", "o", "r"] {
        wait_pipeline(&c, p, 30);
    }
    assert_eq!(fired(&c, "rep_log"), "always:3,replica:3", "{}", diag(&c));
    assert_eq!(fired(&c, "org_log"), "always:3,ordinary:3", "{}", diag(&c));
    assert_eq!(fired(&t, "tab_log"), "always:3,replica:3", "{}", diag(&c));
    // Switched back to pg_tide's behaviour.
    exec(
        &c,
        r#"SELECT tide.alter_pipeline('l', options => '{"session_replication_role": "origin"}')"#,
    );
    wait_streaming(&c, "l", Duration::from_secs(30));
    c.execute("INSERT INTO tab VALUES (4)");
    wait_pipeline(&c, "l", 30);
    assert_eq!(
        fired(&c, "rep_log"),
        "always:4,ordinary:1,replica:3",
        "{}",
        diag(&c)
    );

    // A remote user that may not set it.
    t.execute(
        "CREATE ROLE plain LOGIN; GRANT ALL ON SCHEMA public TO plain;
         GRANT CREATE ON DATABASE postgres TO plain;",
    );
    c.execute(&format!(
        "CREATE SERVER tgt_plain FOREIGN DATA WRAPPER postgres_fdw
                OPTIONS (host '127.0.0.1', port '{}', dbname 'postgres');
         CREATE USER MAPPING FOR postgres SERVER tgt_plain OPTIONS (user 'plain');",
        t.port()
    ));
    let e = expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('rp', 'postgres', '{"server": "tgt_plain", "session_replication_role": "replica"}')"#,
        "42501",
        Some("GRANT SET ON PARAMETER session_replication_role"),
    );
    assert!(
        e.message().contains("session_replication_role"),
        "{}",
        e.message()
    );
    t.execute("GRANT SET ON PARAMETER session_replication_role TO plain");
    create_pipeline(
        &c,
        "rp",
        "postgres",
        r#"{"server": "tgt_plain", "schema": "rp", "session_replication_role": "replica"}"#,
    );
}
