//! Row filters (`tide.add_table(..., row_filter => ...)`), attacked as a `tide_admin` member
//! (`mallory`) and as a role with nothing (`nobody`), and by the pipeline's owner (`alice`)
//! herself:
//!
//! - a filter calling the owner's own function (declared IMMUTABLE, which would make the worker
//!   run it while decoding) is refused (0A000) and the function never runs;
//! - a filter calling a built-in function the owner may not execute is refused (42501); one the
//!   owner could execute when it was stored but no longer can fails the backfill and stops the
//!   stream with the reason (the owner's rights now, not when the filter was stored);
//! - another role cannot give (or read) a filter of alice's pipeline: 42501 for both, and
//!   `tide.tables` shows mallory none of alice's filters.

use super::*;

#[test]
fn row_filter_attacks() {
    let c = secured("sec_row_filter");
    alice_pipeline(&c);
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.f (id int PRIMARY KEY, v text);
         ALTER TABLE alice.f REPLICA IDENTITY FULL;
         INSERT INTO alice.f SELECT g, 'v' || g FROM generate_series(1, 50) g;
         CREATE FUNCTION alice.esc() RETURNS bool LANGUAGE plpgsql IMMUTABLE AS
           $$BEGIN RESET ROLE; ALTER ROLE alice SUPERUSER; RETURN true; END$$;
         CREATE FUNCTION alice.mark() RETURNS bool LANGUAGE sql IMMUTABLE AS
           $$SELECT pg_catalog.set_config('alice.ran', 'yes', false)::text = 'yes'$$;",
    );
    // The owner's own functions: refused before anything runs them.
    for f in ["alice.esc()", "alice.mark()", "v = 'x' AND alice.mark()"] {
        expect_fail_with(
            &format!("alice's filter {f}"),
            exec_as(
                &c,
                "alice",
                &format!("SELECT tide.add_table('p', 'alice.f', row_filter => $f${f}$f$)"),
            ),
            "0A000",
            Some("immutable built-in"),
        );
    }
    let superuser: bool = c.query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = 'alice'");
    assert!(!superuser, "a row filter made alice a superuser");
    // A built-in function the owner may not execute.
    c.execute("REVOKE EXECUTE ON FUNCTION pg_catalog.md5(text) FROM PUBLIC");
    expect_fail_with(
        "a filter calling md5(), which alice may not execute",
        exec_as(
            &c,
            "alice",
            "SELECT tide.add_table('p', 'alice.f', row_filter => 'md5(v) <> ''x''')",
        ),
        "42501",
        Some("GRANT EXECUTE"),
    );
    // Another role, on alice's pipeline: refused before the filter is looked at.
    for role in ["mallory", "nobody"] {
        expect_fail_with(
            &format!("as {role}: a filter on alice's pipeline"),
            exec_as(
                &c,
                role,
                "SELECT tide.add_table('p', 'alice.f', row_filter => 'id > 0')",
            ),
            "42501",
            None,
        );
    }
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM tide.pipeline_table WHERE relid = 'alice.f'::regclass"
        ),
        0,
        "a refused filter added the table"
    );
    // Allowed while alice may execute it; then revoked: her rights now decide.
    c.execute("GRANT EXECUTE ON FUNCTION pg_catalog.md5(text) TO PUBLIC");
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_table('p', 'alice.f', backfill => false, row_filter => 'md5(v) <> ''x''')",
    );
    // Others do not see it.
    let seen: i64 = scalar_as(
        &c,
        "mallory",
        "SELECT count(*) FROM tide.tables WHERE row_filter IS NOT NULL",
    );
    assert_eq!(seen, 0, "mallory sees alice's row filter in tide.tables");
    for role in ["mallory", "nobody"] {
        expect_fail_with(
            &format!("as {role}: read pg_tide's table of filters"),
            exec_as(&c, role, "SELECT row_filter FROM tide.pipeline_table"),
            "42501",
            None,
        );
    }
    expect_fail_with(
        "as nobody: tide.tables",
        exec_as(&c, "nobody", "SELECT row_filter FROM tide.tables"),
        "42501",
        None,
    );
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    c.execute("REVOKE EXECUTE ON FUNCTION pg_catalog.md5(text) FROM PUBLIC");
    ok_as(&c, "alice", "SELECT tide.start_backfill('alice.f', 'p')");
    c.wait_until(
        "the backfill to fail",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.backfill WHERE relid = 'alice.f'::regclass AND state = 'failed'",
            )? == 1)
        },
    );
    let error: String = c.query_scalar(
        "SELECT error FROM tide.backfill WHERE relid = 'alice.f'::regclass AND state = 'failed'",
    );
    assert!(
        error.contains("permission denied for function md5()"),
        "the failed backfill says why: {error}"
    );
    let events_before: i64 =
        c.query_scalar("SELECT count(*) FROM tide.outbox WHERE relation = 'alice.f'");
    ok_as(
        &c,
        "alice",
        "INSERT INTO alice.f VALUES (1000, 'after the revoke')",
    );
    c.wait_until(
        "the stream to stop with the reason",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<Option<String>>(
                "SELECT last_error FROM tide.pipeline WHERE name = 'p'",
            )?
            .is_some_and(|e| e.contains("permission denied for function md5()")))
        },
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.outbox WHERE relation = 'alice.f'"),
        events_before,
        "a change was delivered through a filter the owner may no longer execute"
    );
}
