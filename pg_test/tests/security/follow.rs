//! Followed schemas (`tide.add_tables_in_schema(..., follow => true)`): the event trigger runs in
//! the session of whoever creates a table. alice's table-target pipeline `pt` follows schema
//! `shared`, where `mallory` (a `tide_admin` member) and `nobody` (no pg_tide rights) may create
//! objects. What they create there, with crafted names, a domain whose CHECK calls their function,
//! an index predicate the planner would fold, a grant of SELECT to alice, is never captured (it
//! is not alice's), their DDL never fails because of pg_tide, nothing they wrote ever runs as
//! alice or pg_tide, and they can neither call the trigger function, nor see or change alice's
//! follow.

use super::*;

/// The function `who` plants: every call leaves `SPY-RAN-AS <current_user>` in the server log.
fn spy(who: &str) -> String {
    format!(
        "CREATE FUNCTION shared.{who}_spy(int) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS
           $$BEGIN RAISE LOG 'SPY-RAN-AS %', current_user; RETURN true; END$$;
         CREATE DOMAIN shared.{who}_dom AS int CHECK (shared.{who}_spy(VALUE));"
    )
}

#[test]
fn followed_schema_runs_nothing_of_others() {
    let c = secured("sec_follow");
    c.execute(
        "CREATE SCHEMA shared AUTHORIZATION alice;
         GRANT USAGE, CREATE ON SCHEMA shared TO mallory, nobody;",
    );
    ok_as(
        &c,
        "alice",
        r#"SELECT tide.create_pipeline('pt', 'table', '{"schema": "alice_copy"}')"#,
    );
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_tables_in_schema('pt', 'shared', follow => true)",
    );
    for who in ["mallory", "nobody"] {
        ok_as(&c, who, &spy(who));
        // Each statement alone: a skipped table never fails the DDL.
        for ddl in [
            format!("CREATE TABLE shared.{who}_t (id int PRIMARY KEY, v text)"),
            format!("GRANT SELECT ON shared.{who}_t TO alice"),
            format!("INSERT INTO shared.{who}_t VALUES (1, 'x')"),
            format!(
                "CREATE TABLE shared.\"{who}'); SELECT tide.drop_pipeline('pt'); --\" (id int PRIMARY KEY)"
            ),
            format!("CREATE TABLE shared.{who}_d (id int PRIMARY KEY, x shared.{who}_dom)"),
            format!("GRANT SELECT ON shared.{who}_d TO alice"),
            format!("CREATE TABLE shared.{who}_i (id int PRIMARY KEY, v int)"),
            format!("CREATE INDEX ON shared.{who}_i (v) WHERE shared.{who}_spy(1)"),
            format!("GRANT SELECT ON shared.{who}_i TO alice"),
            format!("ALTER TABLE shared.{who}_i ADD COLUMN w int"),
            format!("CREATE TABLE shared.{who}_ctas AS SELECT 1 AS id"),
            format!("ALTER TABLE shared.{who}_ctas ADD PRIMARY KEY (id)"),
            format!("CREATE TABLE {who}.moved (id int PRIMARY KEY)"),
            format!("ALTER TABLE {who}.moved SET SCHEMA shared"),
        ] {
            if who == "nobody" && ddl.starts_with("CREATE TABLE nobody.") {
                continue; // nobody has no schema of its own
            }
            if who == "nobody" && ddl.starts_with("ALTER TABLE nobody.") {
                continue;
            }
            ok_as(&c, who, &ddl);
        }
        // Calling the trigger function directly.
        expect_fail_with(
            &format!("{who} calls tide._follow_tables()"),
            exec_as(&c, who, "SELECT tide._follow_tables()"),
            "42501",
            None,
        );
        // alice's follow: neither changed nor seen.
        for sql in [
            "SELECT tide.stop_following_schema('pt', 'shared')",
            "SELECT tide.stop_following_schema('pt', 'no_such_schema')",
            "SELECT tide.add_tables_in_schema('pt', 'shared', follow => true)",
        ] {
            expect_fail_with(
                &format!("as {who}: {sql}"),
                exec_as(&c, who, sql),
                "42501",
                None,
            );
        }
    }
    // A tide_admin member sees none of alice's follow; a role with nothing cannot read the views.
    let seen: i64 = scalar_as(
        &c,
        "mallory",
        "SELECT (SELECT count(*) FROM tide.followed_schemas) + (SELECT count(*) FROM tide.skipped_tables)",
    );
    assert_eq!(seen, 0, "mallory sees alice's follow");
    for view in [
        "tide.followed_schemas",
        "tide.skipped_tables",
        "tide.followed_schema",
    ] {
        expect_fail_with(
            &format!("nobody reads {view}"),
            exec_as(&c, "nobody", &format!("SELECT * FROM {view}")),
            "42501",
            None,
        );
    }
    // The function refuses any call but an event trigger's (here a superuser's).
    expect_fail_with(
        "a superuser calls tide._follow_tables()",
        c.try_execute("SELECT tide._follow_tables()"),
        "39P01",
        Some("by itself"),
    );
    // A table target's insert would have run the domain's CHECK as alice: nothing ran as her.
    ok_as(&c, "nobody", "INSERT INTO shared.nobody_d VALUES (1, 1)");
    ok_as(
        &c,
        "alice",
        "CREATE TABLE shared.alices (id int PRIMARY KEY, v text)",
    );
    ok_as(&c, "alice", "INSERT INTO shared.alices VALUES (1, 'a')");
    wait_for_pipeline(&c, "pt", 60, || diag(&c));
    assert_eq!(
        c.query_scalar::<String>(
            "SELECT string_agg(relation, ',' ORDER BY relation) FROM tide.pipeline_table"
        ),
        "shared.alices",
        "only alice's own table is captured\n{}",
        diag(&c)
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM alice_copy.alices"),
        1,
        "alice's table streams"
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.pipeline WHERE name = 'pt'"),
        1,
        "the crafted name ran SQL"
    );
    for role in ["alice", "postgres"] {
        assert_eq!(
            c.log_count(&format!("SPY-RAN-AS {role}")),
            0,
            "a planted function ran as {role}"
        );
    }
    // Each of their tables is recorded, with the role whose DDL met it.
    let skipped: String = c.query_scalar(
        "SELECT string_agg(DISTINCT by_role::text || ':' || sqlstate, ',') FROM tide.skipped_tables",
    );
    assert_eq!(skipped, "mallory:42501,nobody:42501", "{}", diag(&c));
}

/// alice's own table of another role's domain: the domain's owner could change its CHECK, which
/// a table target evaluates as alice; a follow skips it (tide.add_table by alice would take it).
#[test]
fn followed_table_of_anothers_type_is_skipped() {
    let c = secured("sec_follow_type");
    c.execute(
        "CREATE SCHEMA shared AUTHORIZATION alice;
         GRANT USAGE, CREATE ON SCHEMA shared TO nobody;",
    );
    ok_as(&c, "nobody", &spy("nobody"));
    ok_as(
        &c,
        "alice",
        r#"SELECT tide.create_pipeline('pt', 'table', '{"schema": "alice_copy"}')"#,
    );
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_tables_in_schema('pt', 'shared', follow => true)",
    );
    ok_as(
        &c,
        "alice",
        "CREATE TABLE shared.mine (id int PRIMARY KEY, x shared.nobody_dom[])",
    );
    // (Rows written by a superuser: whoever writes runs the domain's CHECK. Had the table been
    // captured, its backfill and changes would be written to alice_copy.mine as alice.)
    c.execute("INSERT INTO shared.mine VALUES (1, ARRAY[1]), (2, ARRAY[2])");
    wait_for_pipeline(&c, "pt", 60, || diag(&c));
    let reason: String =
        c.query_scalar("SELECT reason FROM tide.skipped_tables WHERE relation = 'shared.mine'");
    assert!(
        reason.contains("type shared.nobody_dom") && reason.contains("\"nobody\""),
        "{reason}"
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.pipeline_table"),
        0,
        "alice's table of nobody's type was captured"
    );
    assert_eq!(c.log_count("SPY-RAN-AS alice"), 0);
}
