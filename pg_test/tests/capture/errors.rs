//! Bad input: a specific SQLSTATE (and hint) each.

use crate::common::*;

#[test]
fn bad_inputs_have_sqlstates() {
    let c = setup("bad_inputs");
    c.execute(
        "CREATE TABLE good (id int PRIMARY KEY);
         CREATE VIEW v AS SELECT * FROM good;
         CREATE MATERIALIZED VIEW mv AS SELECT * FROM good;
         CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id);
         CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (100);
         CREATE UNLOGGED TABLE unlogged_t (id int PRIMARY KEY);
         CREATE TABLE nokey (id int, v text);
         CREATE TABLE uidx (id int NOT NULL, v text);
         CREATE UNIQUE INDEX uidx_id ON uidx (id);
         ALTER TABLE uidx REPLICA IDENTITY USING INDEX uidx_id;",
    );
    create_pipeline(&c, "p");
    let fails = |sql: &str, code: &str, hint: Option<&str>| {
        let res = c.try_execute(sql);
        if let Err(e) = &res {
            eprintln!(
                "bad_inputs: {sql}\n    -> {}",
                describe_error(e).replace('\n', "\n       ")
            );
        }
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert_sql_fails(res, code, hint)
        })) {
            Ok(()) => None,
            Err(p) => Some(format!(
                "{sql}: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
        }
    };
    let mut problems: Vec<String> = Vec::new();
    let mut check = |sql: &str, code: &str, hint: Option<&str>| {
        if let Some(p) = fails(sql, code, hint) {
            problems.push(p);
        }
    };

    // Each bad input's SQLSTATE, message and hint are in the golden transcript
    // pg_test/regress/expected/api_errors.out (pg_test/tests/regress.rs); here: what a
    // transcript cannot show.
    c.execute("SELECT tide.add_table('p', 'good', backfill => false)");
    check("SELECT tide.add_table('p', 'good')", "42710", None);
    // A write before create_pipeline in the same transaction: refused, nothing left behind.
    let res = c.try_execute(
        "BEGIN; INSERT INTO good VALUES (1); SELECT tide.create_pipeline('late'); COMMIT;",
    );
    let err = match res {
        Ok(()) => panic!("create_pipeline after a write in its transaction succeeded"),
        Err(e) => e,
    };
    eprintln!(
        "bad_inputs: create_pipeline after a write -> {}",
        describe_error(&err)
    );
    assert_eq!(
        err.as_db_error().map(|d| d.code().code()),
        Some("25001"),
        "create_pipeline after a write: {}",
        describe_error(&err)
    );

    // Valid edge cases succeed.
    c.execute("SELECT tide.add_table('p', 'parted_1', backfill => false)");
    c.execute("SELECT tide.add_table('p', 'uidx', backfill => false)");
    let key: Vec<String> = c.query_scalar(
        "SELECT key_columns FROM tide.tables WHERE pipeline = 'p' AND source = 'uidx'::regclass",
    );
    assert_eq!(key, ["id"]);
    let long47 = "b".repeat(47);
    // (drop_pipeline refuses a transaction block, which a multi-statement string is)
    c.execute(&format!("SELECT tide.create_pipeline('{long47}')"));
    c.execute(&format!("SELECT tide.drop_pipeline('{long47}')"));
    let n: i64 = c.query_scalar("SELECT count(*) FROM tide.pipeline WHERE name NOT IN ('p')");
    assert_eq!(n, 0, "a failed create_pipeline left a pipeline behind");
    let slots = texts(
        &c,
        "SELECT slot_name::text FROM pg_replication_slots ORDER BY 1",
    );
    assert_eq!(
        slots,
        ["tide_5_p"],
        "failed calls must not leave slots behind"
    );

    // Privileges: nothing is executable by PUBLIC; creating a pipeline needs tide_admin (or
    // REPLICATION, or superuser): EXECUTE alone is not enough. (security.rs tests the rest.)
    c.execute(
        "CREATE ROLE r_plain LOGIN;
         CREATE ROLE r_schema LOGIN;
         GRANT USAGE ON SCHEMA tide TO r_schema;
         CREATE ROLE r_norepl LOGIN;
         GRANT USAGE ON SCHEMA tide TO r_norepl;
         GRANT EXECUTE ON FUNCTION tide.create_pipeline(text, text, jsonb) TO r_norepl;",
    );
    let as_role = |role: &str, sql: &str| -> Result<(), postgres::Error> {
        let mut cfg = c.config("postgres");
        cfg.user(role);
        cfg.connect(NoTls)?.batch_execute(sql)
    };
    let mut check_role = |role: &str, sql: &str, msg: Option<&str>| {
        let res = as_role(role, sql);
        let desc = match &res {
            Err(e) => describe_error(e),
            Ok(()) => "succeeded".into(),
        };
        eprintln!("bad_inputs: as {role}: {sql}\n    -> {desc}");
        let code_ok = matches!(&res, Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE));
        let msg_ok = msg.is_none_or(|m| desc.contains(m));
        if !code_ok || !msg_ok {
            problems.push(format!(
                "as {role}: {sql}: expected 42501{}, got {desc}",
                msg.map(|m| format!(" mentioning {m:?}"))
                    .unwrap_or_default()
            ));
        }
    };
    check_role("r_plain", "SELECT tide.create_pipeline('x')", None);
    for f in [
        "tide.create_pipeline('x')",
        "tide.drop_pipeline('p')",
        "tide.add_table('p', 'good')",
        "tide.remove_table('p', 'good')",
        "tide.pause_pipeline('p')",
        "tide.resume_pipeline('p')",
        "tide.wait_for_pipeline('p', '1 second')",
    ] {
        check_role("r_schema", &format!("SELECT {f}"), Some("function"));
    }
    check_role("r_schema", "SELECT * FROM tide.outbox", None);
    check_role("r_schema", "SELECT * FROM tide.pipelines", None);
    check_role(
        "r_norepl",
        "SELECT tide.create_pipeline('x')",
        Some("tide_admin"),
    );

    assert!(
        problems.is_empty(),
        "{} wrong error(s):\n{}",
        problems.len(),
        problems.join("\n")
    );

    // All replication slots in use: 53400, and nothing left behind.
    let small = Cluster::builder("slots_full")
        .conf("max_replication_slots=1")
        .start();
    init_extension(&small);
    small.execute("SELECT tide.create_pipeline('one')");
    assert_sql_fails(
        small.try_execute("SELECT tide.create_pipeline('two')"),
        "53400",
        None,
    );
    let n: i64 = small.query_scalar("SELECT count(*) FROM tide.pipeline");
    assert_eq!(n, 1);
}
