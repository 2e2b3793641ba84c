//! What a pipeline may read and what other roles see (issue 29, classes 5, 6 and 7): capture
//! follows the owner's read rights continuously (row-level security, a revoked SELECT), outbox
//! events belong to the pipeline and not to its name, and the views do not leak through a
//! function in the viewer's WHERE clause.

use super::*;

/// Class 5: a table whose row-level security applies to the owner is refused at add_table
/// (mallory would SELECT none of its rows; the pipeline would deliver all of them).
#[test]
fn row_level_security_of_the_owner_is_refused() {
    let c = secured("sec_rls");
    c.execute(
        "CREATE TABLE victim.rls (id int PRIMARY KEY, v text);
         INSERT INTO victim.rls VALUES (1, 'hidden by its policy');
         ALTER TABLE victim.rls ENABLE ROW LEVEL SECURITY;
         CREATE POLICY none_for_mallory ON victim.rls FOR SELECT TO mallory USING (false);
         GRANT USAGE ON SCHEMA victim TO mallory;
         GRANT SELECT ON victim.rls TO mallory;",
    );
    let seen: i64 = scalar_as(&c, "mallory", "SELECT count(*) FROM victim.rls");
    assert_eq!(seen, 0, "the policy hides the row from mallory");
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m')");
    let mut m = connect_as(&c, "mallory");
    let e = expect_db_error(m.batch_execute("SELECT tide.add_table('m', 'victim.rls')"));
    assert_eq!(e.code().code(), "42501", "{e:?}");
    assert!(
        e.message().contains("row-level security")
            && e.hint().is_some_and(|h| h.contains("BYPASSRLS")),
        "{e:?}"
    );
    let n: i64 = c.query_scalar("SELECT count(*) FROM tide.outbox");
    assert_eq!(n, 0, "nothing of victim.rls was delivered");
    // The table's owner (not forced) and a BYPASSRLS role may capture it.
    c.execute("ALTER ROLE mallory BYPASSRLS");
    ok_as(&c, "mallory", "SELECT tide.add_table('m', 'victim.rls')");
    wait_for_backfill(&c, "victim.rls", Some("m"), 60, || diag(&c));
}

/// Class 5: after `REVOKE SELECT` (or a new policy that applies to the owner), the next change
/// of the table fails the pipeline with the reason, and nothing more of it is delivered; another
/// owner's pipeline keeps applying; a GRANT back delivers the change.
#[test]
fn revoked_select_stops_the_table() {
    let c = secured("sec_revoke");
    c.execute(
        "CREATE TABLE victim.shared (id int PRIMARY KEY, v text);
         INSERT INTO victim.shared VALUES (1, 'one');
         GRANT USAGE ON SCHEMA victim TO mallory;
         GRANT SELECT ON victim.shared TO mallory;",
    );
    alice_pipeline(&c);
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m')");
    ok_as(&c, "mallory", "SELECT tide.add_table('m', 'victim.shared')");
    wait_for_backfill(&c, "victim.shared", Some("m"), 60, || diag(&c));
    c.execute("INSERT INTO victim.shared VALUES (2, 'two')");
    wait_for_pipeline(&c, "m", 30, || diag(&c));

    for (revoke, regrant, key) in [
        (
            "REVOKE SELECT ON victim.shared FROM mallory",
            "GRANT SELECT ON victim.shared TO mallory",
            3,
        ),
        (
            "ALTER TABLE victim.shared ENABLE ROW LEVEL SECURITY;
             CREATE POLICY few ON victim.shared FOR SELECT TO mallory USING (id < 2)",
            "DROP POLICY few ON victim.shared; ALTER TABLE victim.shared DISABLE ROW LEVEL SECURITY",
            4,
        ),
    ] {
        c.execute(revoke);
        c.execute(&format!(
            "INSERT INTO victim.shared VALUES ({key}, 'after the revoke')"
        ));
        c.wait_until(
            "mallory's pipeline to fail with 42501",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || {
                Ok(c.try_query_scalar::<i64>(
                    "SELECT count(*) FROM tide.pipelines WHERE name = 'm' AND last_error_sqlstate = '42501'",
                )? == 1)
            },
        );
        // Give it several more tries: still nothing.
        std::thread::sleep(Duration::from_secs(2));
        let delivered: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM tide.outbox WHERE pipeline = 'm' AND key->>'id' = '{key}'"
        ));
        assert_eq!(
            delivered,
            0,
            "a row of a table mallory may no longer read was delivered\n{}",
            diag(&c)
        );
        // alice's pipeline is not disturbed.
        c.execute(&format!("INSERT INTO alice.t VALUES ({}, 0)", 1000 + key));
        wait_for_pipeline(&c, "p", 30, || diag(&c));
        let error: String = c.query_scalar("SELECT last_error FROM tide.pipelines WHERE name = 'm'");
        assert!(error.contains("victim.shared"), "{error}");
        // The right back: the change arrives.
        c.execute(regrant);
        wait_for_pipeline(&c, "m", 60, || diag(&c));
        let delivered: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM tide.outbox WHERE pipeline = 'm' AND key->>'id' = '{key}'"
        ));
        assert_eq!(delivered, 1, "{}", diag(&c));
    }
}

/// Class 6: a dropped pipeline's outbox events are not readable by a later pipeline of the same
/// name (another role's): they go with the pipeline.
#[test]
fn outbox_events_belong_to_the_pipeline_not_its_name() {
    let c = secured("sec_outbox_name");
    alice_pipeline(&c);
    ok_as(&c, "alice", "SELECT tide.start_backfill('alice.t', 'p')");
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    let alices: i64 = scalar_as(&c, "alice", "SELECT count(*) FROM tide.outbox");
    assert_eq!(alices, 100, "alice reads her events");
    ok_as(&c, "alice", "SELECT tide.drop_pipeline('p')");
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('p')");
    let seen: i64 = scalar_as(&c, "mallory", "SELECT count(*) FROM tide.outbox");
    assert_eq!(
        seen, 0,
        "mallory's pipeline named like alice's dropped one reads alice's events"
    );
    let left: i64 = c.query_scalar("SELECT count(*) FROM tide.outbox");
    assert_eq!(left, 0, "drop_pipeline deleted its events");
}

/// Class 7: a cheap function in the viewer's WHERE clause sees only the rows the view shows.
#[test]
fn views_do_not_leak_to_functions_in_where() {
    let c = secured("sec_leaky");
    alice_pipeline(&c);
    ok_as(
        &c,
        "alice",
        "SELECT tide.start_backfill('alice.t', 'p', 10)",
    );
    wait_for_backfill(&c, "alice.t", Some("p"), 60, || diag(&c));
    ok_as(
        &c,
        "mallory",
        "CREATE TABLE mallory.seen (what text);
         CREATE FUNCTION mallory.peek(text) RETURNS bool LANGUAGE plpgsql COST 0.0000001 AS $$
         BEGIN INSERT INTO mallory.seen VALUES ($1); RETURN true; END $$;",
    );
    let views = [
        ("pipelines", "name"),
        ("tables", "pipeline"),
        ("backfills", "pipeline"),
        ("chunks", "pipeline"),
        ("verifications", "pipeline"),
        ("readiness", "pipeline"),
        ("consumers", "pipeline"),
        ("outbox_retention", "pipeline"),
    ];
    for (view, col) in views {
        let shown: i64 = scalar_as(
            &c,
            "mallory",
            &format!("SELECT count(*) FROM tide.{view} WHERE mallory.peek({col})"),
        );
        assert_eq!(shown, 0, "tide.{view} shows mallory none of alice's rows");
    }
    let leaked: Vec<String> = connect_as(&c, "mallory")
        .query("SELECT DISTINCT what FROM mallory.seen", &[])
        .expect("read mallory.seen")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        leaked.is_empty(),
        "a function in mallory's WHERE clause saw rows the views hide: {leaked:?}"
    );
}

/// The output plugin's options (`streaming` among them) are no way to read a pipeline's slot:
/// decoding needs the REPLICATION attribute, which neither a tide_admin member nor a role with
/// nothing has, whatever options it passes, and the slot stays the worker's.
#[test]
fn plugin_options_do_not_open_the_slot() {
    let c = secured("sec_plugin_options");
    alice_pipeline(&c);
    for role in ["alice", "nobody"] {
        for opts in ["'streaming', 'on'", "'streaming', 'off'", "'tables', '1'"] {
            let sql = format!(
                "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('tide_5_p', NULL, NULL, \
                 'proto_version', '4', {opts})"
            );
            let e = expect_fail_with(&sql, exec_as(&c, role, &sql), "42501", None);
            assert!(
                e.message().contains("replication"),
                "as {role}: {}",
                e.message()
            );
        }
    }
    let active: bool = c.query_scalar(
        "SELECT active_pid = (SELECT worker_pid FROM tide.pipelines WHERE name = 'p')
           FROM pg_replication_slots WHERE slot_name = 'tide_5_p'",
    );
    assert!(active, "the worker still holds its slot");
}
