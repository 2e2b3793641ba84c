//! The operations controls of issue 32 (bounded `chunk_size` / `rows_per_second` taking bigint,
//! repeated pause/resume as a NOTICE, an empty condition refused, `tide.skip_transaction`,
//! `tide.read_outbox(..., wait => ...)`, `tide.add_tables_in_schema`, `tide.alter_pipeline`) on
//! someone else's pipeline: a `tide_admin` member who does not own it and a role with no pg_tide
//! rights get 42501 for every call, before any
//! argument is looked at (a bound or a NOTICE would tell them the pipeline's state) and before
//! any wait, and nothing changes. Also resume and cancel of a failed backfill (issue 43).

use super::*;

#[test]
fn operations_controls_of_anothers_pipeline() {
    let c = secured("sec_operations");
    alice_pipeline(&c);
    // An active backfill (paused, so it stays so) and a paused pipeline: the states a repeated
    // pause would be a no-op on.
    ok_as(
        &c,
        "alice",
        "BEGIN; SELECT tide.start_backfill('alice.t', 'p', chunk_size => 10); SELECT tide.pause_backfill('alice.t', 'p'); COMMIT;
         SELECT tide.pause_pipeline('p');
         SELECT tide.create_consumer('p', 'c');",
    );
    let calls = [
        "SELECT tide.pause_pipeline('p')",
        "SELECT tide.resume_pipeline('p')",
        "SELECT tide.pause_backfill('alice.t', 'p')",
        "SELECT tide.resume_backfill('alice.t', 'p')",
        "SELECT tide.alter_backfill('alice.t', 'p', chunk_size => 3000000000)",
        "SELECT tide.alter_backfill('alice.t', 'p', rows_per_second => 3000000000)",
        "SELECT tide.alter_backfill('alice.t', 'p', chunk_size => 2000000000)",
        "SELECT tide.alter_backfill('alice.t', 'p', rows_per_second => 1)",
        "SELECT tide.start_backfill('alice.t', 'p', chunk_size => 3000000000)",
        "SELECT tide.start_backfill('alice.t', 'p', condition => '')",
        "SELECT tide.alter_backfill('alice.t', chunk_size => 3000000000)",
        "SELECT tide.skip_transaction('p', '0/1')",
        "SELECT tide.skip_transaction('p', pg_current_wal_lsn())",
        "SELECT * FROM tide.read_outbox('p', 'c', wait => '20 seconds')",
        "SELECT tide._outbox_wait('p', 'c', '20 seconds')",
        // Refused before the schema is looked at: an unknown schema is 42501 too.
        "SELECT tide.add_tables_in_schema('p', 'alice')",
        "SELECT tide.add_tables_in_schema('p', 'mallory', backfill => false)",
        "SELECT tide.add_tables_in_schema('p', 'no_such_schema')",
        "SELECT tide.add_tables_in_schema('p', 'alice', follow => true)",
        "SELECT tide.stop_following_schema('p', 'alice')",
        "SELECT tide.stop_following_schema('p', 'no_such_schema')",
        "SELECT tide.alter_pipeline('p')",
        "SELECT tide.alter_pipeline('p', options => '{}')",
        r#"SELECT tide.alter_pipeline('p', options => '{"schema_changes": "pause"}')"#,
        "SELECT tide.alter_pipeline('p', new_name => 'q')",
    ];
    let t = Instant::now();
    for role in ["mallory", "nobody"] {
        for sql in calls {
            expect_fail_with(
                &format!("as {role}: {sql}"),
                exec_as(&c, role, sql),
                "42501",
                None,
            );
        }
    }
    ok_as(&c, "alice", "CREATE TABLE alice.u (id int PRIMARY KEY)");
    for role in ["mallory", "nobody"] {
        expect_fail_with(
            &format!("as {role}: add_tables_in_schema with a table to add"),
            exec_as(&c, role, "SELECT tide.add_tables_in_schema('p', 'alice')"),
            "42501",
            None,
        );
    }
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.pipeline_table WHERE pipeline = 'p'"),
        1,
        "another role added tables to alice's pipeline"
    );
    // Refused before any wait.
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "a refused read_outbox waited"
    );
    let r = connect_as(&c, "alice")
        .query_one(
            "SELECT (SELECT enabled FROM tide.pipelines WHERE name = 'p'),
                    (SELECT string_agg(format('%s %s %s %s', state, chunk_size, rows_per_second, condition), ';')
                       FROM tide.backfills WHERE pipeline = 'p')",
            &[],
        )
        .expect("alice reads her pipeline");
    let (enabled, backfills): (bool, String) = (r.get(0), r.get(1));
    assert!(!enabled, "another role resumed alice's pipeline");
    assert_eq!(
        backfills, "paused 10  ",
        "another role changed alice's backfills"
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.skipped_transaction"),
        0,
        "another role made alice's pipeline skip a transaction"
    );
    assert_eq!(
        c.query_scalar::<String>(
            "SELECT name || ' ' || options::text FROM tide.pipeline WHERE name = 'p'"
        ),
        "p {}",
        "another role altered alice's pipeline"
    );
}

/// `add_table(..., truncate_target => true)` empties only a table the pipeline's owner may
/// write: mallory, a `tide_admin` member, pointing her own pipeline's target at a table she
/// may not write (victim.secret, alice's table) gets 42501 and the table keeps its rows; a role
/// with nothing gets 42501 before anything. `remove_table`'s text overload (a dropped table's
/// name) on alice's pipeline is 42501 for both, and alice's table stays captured.
#[test]
fn truncate_target_and_remove_by_name_of_anothers() {
    let c = secured("sec_truncate_target");
    alice_pipeline(&c);
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.keep (id int PRIMARY KEY, v text); INSERT INTO alice.keep VALUES (1, 'kept');",
    );
    ok_as(
        &c,
        "mallory",
        "CREATE TABLE mallory.m (id int PRIMARY KEY, v text); INSERT INTO mallory.m VALUES (2, 'x');",
    );
    ok_as(
        &c,
        "mallory",
        r#"SELECT tide.create_pipeline('mp', 'table', '{"schema": "mallory"}')"#,
    );
    for target in ["victim.secret", "alice.keep"] {
        for role in ["mallory", "nobody"] {
            expect_fail_with(
                &format!("as {role}: truncate_target into {target}"),
                exec_as(
                    &c,
                    role,
                    &format!(
                        "SELECT tide.add_table('mp', 'mallory.m', target_table => '{target}', truncate_target => true)"
                    ),
                ),
                "42501",
                None,
            );
        }
    }
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT (SELECT count(*) FROM victim.secret) + (SELECT count(*) FROM alice.keep)"
        ),
        2,
        "a refused truncate_target emptied a table its caller may not write"
    );
    for role in ["mallory", "nobody"] {
        for sql in [
            "SELECT tide.remove_table('p', 'alice.t'::text)",
            "SELECT tide.remove_table('p', 'alice.gone'::text)",
        ] {
            expect_fail_with(
                &format!("as {role}: {sql}"),
                exec_as(&c, role, sql),
                "42501",
                None,
            );
        }
    }
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM tide.pipeline_table WHERE pipeline = 'p' AND NOT removing"
        ),
        1,
        "another role removed a table from alice's pipeline"
    );
}

/// Issue 43: `tide.resume_backfill` and `tide.cancel_backfill` now also act on a table's latest
/// backfill when it `failed`. On alice's failed backfill, a `tide_admin` member who does not own
/// the pipeline and a role with no pg_tide rights get 42501 and change nothing; alice resumes it
/// and gives it up.
#[test]
fn failed_backfill_of_anothers_pipeline() {
    let c = secured("sec_failed_backfill");
    alice_pipeline(&c);
    // A chunk that cannot be read (division by zero at id 50) fails its backfill.
    ok_as(
        &c,
        "alice",
        "SELECT tide.start_backfill('alice.t', 'p', chunk_size => 10, condition => '10 / (id - 50) IS NOT NULL')",
    );
    let state = || -> String {
        c.query_scalar("SELECT state || ' ' || coalesce(error_sqlstate, '-') FROM tide.backfills WHERE source = 'alice.t'::regclass")
    };
    c.wait_until(
        "alice's backfill to fail",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok(state() == "failed 22012"),
    );
    for role in ["mallory", "nobody"] {
        for call in [
            "SELECT tide.resume_backfill('alice.t', 'p')",
            "SELECT tide.cancel_backfill('alice.t', 'p')",
        ] {
            assert_sql_fails(exec_as(&c, role, call), "42501", None);
        }
    }
    assert_eq!(
        state(),
        "failed 22012",
        "changed by another role\n{}",
        diag(&c)
    );
    ok_as(&c, "alice", "SELECT tide.resume_backfill('alice.t', 'p')");
    assert!(!state().starts_with("failed"), "resumed: {}", state());
    c.wait_until(
        "alice's resumed backfill to fail again",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || Ok(state() == "failed 22012"),
    );
    ok_as(&c, "alice", "SELECT tide.cancel_backfill('alice.t', 'p')");
    assert!(state().starts_with("cancelled"), "{}", state());
}
