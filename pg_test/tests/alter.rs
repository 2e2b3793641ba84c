//! `tide.alter_pipeline` (issue 32 item 9), as a DBA runs it: every call is made by `alice`, a
//! member of `tide_admin` with no other attribute, on her own pipeline.
//!
//! - the worker uses the new options: a table target's `schema_changes` turned from `propagate`
//!   to `pause` makes the next `ALTER TABLE` at the source pause the pipeline instead of adding
//!   the column, and turned back (a key set to `null` returns to its default) lets it through;
//! - what cannot change without a new slot or without breaking the target (`schema`, an unknown
//!   key, a bad value) is refused with 22023 and nothing changes; a new name is refused with
//!   0A000 (the slot's name holds it);
//! - another `tide_admin` member (`mallory`) gets 42501 (as does a role with nothing, in
//!   security/operations.rs).

use pg_test::*;
use std::time::Duration;

fn diag(c: &Cluster) -> String {
    diag_of(
        c,
        &[(
            "pipelines",
            "SELECT name, state, enabled, last_error, options FROM tide.pipelines",
            10,
        )],
        30,
    )
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

fn columns_of(c: &Cluster, table: &str) -> Vec<String> {
    c.query(&format!(
        "SELECT attname::text FROM pg_attribute WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
    ))
    .iter()
    .map(|r| r.get(0))
    .collect()
}

fn options(c: &Cluster) -> String {
    c.query_scalar("SELECT options::text FROM tide.pipeline WHERE name = 'p'")
}

#[test]
fn alter_pipeline_schema_changes() {
    let c = setup("alter_pipeline");
    c.execute(
        "CREATE ROLE alice LOGIN; CREATE ROLE mallory LOGIN;
         GRANT tide_admin TO alice, mallory;
         CREATE SCHEMA alice AUTHORIZATION alice;
         CREATE SCHEMA copy AUTHORIZATION alice;",
    );
    let mut a = connect_as(&c, "alice");
    ok(
        &mut a,
        &c,
        "CREATE TABLE alice.t (id int PRIMARY KEY, v int);
         INSERT INTO alice.t SELECT g, g FROM generate_series(1, 50) g;",
    );
    ok(
        &mut a,
        &c,
        r#"SELECT tide.create_pipeline('p', 'table', '{"schema": "copy"}')"#,
    );
    ok(&mut a, &c, "SELECT tide.add_table('p', 'alice.t')");
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));

    // The default, propagate: a new column reaches the target.
    ok(
        &mut a,
        &c,
        "ALTER TABLE alice.t ADD COLUMN w int; UPDATE alice.t SET w = 1 WHERE id = 1;",
    );
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    assert_eq!(columns_of(&c, "copy.t"), ["id", "v", "w"], "{}", diag(&c));

    // Refused: what cannot change, an unknown key, a bad value, a new name.
    let refused: &[(&str, &str, &str)] = &[
        (
            r#"SELECT tide.alter_pipeline('p', options => '{"schema": "alice"}')"#,
            "22023",
            "only schema_changes, session_replication_role can change",
        ),
        (
            r#"SELECT tide.alter_pipeline('p', options => '{"scheme": "x"}')"#,
            "22023",
            "only schema_changes, session_replication_role can change",
        ),
        (
            r#"SELECT tide.alter_pipeline('p', options => '{"schema_changes": "later"}')"#,
            "22023",
            "schema_changes is 'propagate'",
        ),
        (
            r#"SELECT tide.alter_pipeline('p', options => '[]')"#,
            "22023",
            "jsonb object",
        ),
        (
            "SELECT tide.alter_pipeline('p', new_name => 'q')",
            "0A000",
            "Drop it and create a pipeline of the new name",
        ),
        (
            "SELECT tide.alter_pipeline('nope', options => '{}')",
            "42704",
            "tide.create_pipeline creates one",
        ),
    ];
    for (sql, code, hint) in refused {
        expect_fail_with(sql, a.batch_execute(sql), code, Some(hint));
    }
    let mut m = connect_as(&c, "mallory");
    let sql = r#"SELECT tide.alter_pipeline('p', options => '{"schema_changes": "pause"}')"#;
    expect_fail_with(sql, m.batch_execute(sql), "42501", Some("Ask its owner"));
    assert_eq!(
        options(&c),
        r#"{"schema": "copy"}"#,
        "a refused call changed the options"
    );

    // Pause on schema changes: the worker uses it from the next change on.
    ok(
        &mut a,
        &c,
        r#"SELECT tide.alter_pipeline('p', options => '{"schema_changes": "pause"}')"#,
    );
    assert_eq!(
        options(&c),
        r#"{"schema": "copy", "schema_changes": "pause"}"#
    );
    ok(
        &mut a,
        &c,
        "ALTER TABLE alice.t ADD COLUMN x int; UPDATE alice.t SET x = 2 WHERE id = 2;",
    );
    if let Err(e) = poll_every(Duration::from_secs(60), Duration::from_millis(100), || {
        Ok(c.try_query_scalar::<bool>(
            "SELECT NOT enabled AND last_error IS NOT NULL FROM tide.pipelines WHERE name = 'p'",
        )?)
    }) {
        panic!("pipeline p did not pause: {e}\n{}", diag(&c));
    }
    assert_eq!(
        columns_of(&c, "copy.t"),
        ["id", "v", "w"],
        "the column was propagated after schema_changes = pause\n{}",
        diag(&c)
    );

    // Back to the default (null removes the key), resumed: the column goes through.
    ok(
        &mut a,
        &c,
        r#"SELECT tide.alter_pipeline('p', options => '{"schema_changes": null}');
           SELECT tide.resume_pipeline('p');"#,
    );
    assert_eq!(options(&c), r#"{"schema": "copy"}"#);
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    assert_eq!(
        columns_of(&c, "copy.t"),
        ["id", "v", "w", "x"],
        "{}",
        diag(&c)
    );
    assert_eq!(
        c.query_scalar::<Option<i32>>("SELECT x FROM copy.t WHERE id = 2"),
        Some(2),
        "{}",
        diag(&c)
    );
}
