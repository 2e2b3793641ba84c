//! `tide.alter_table` (a captured table's row filter, column list and masks), attacked as a `tide_admin`
//! member (`mallory`) and as a role with nothing (`nobody`), and by the pipeline's owner
//! (`alice`) herself:
//!
//! - another role cannot change alice's table: 42501 for both (mallory: not the owner; nobody:
//!   no EXECUTE), and nothing changes (no pending alteration, the filter stays, no masks);
//! - alice cannot plant her own function in the stream through a new filter (declared IMMUTABLE,
//!   which would make the worker run it while decoding): refused (0A000) and never run, nor a
//!   built-in function she may not execute (42501);
//! - the filter alice may set is applied (the worker passed the marker: only rows it passes
//!   arrive afterwards).

use super::*;

#[test]
fn alter_table_attacks() {
    let c = secured("sec_alter_table");
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.f (id int PRIMARY KEY, v text);
         ALTER TABLE alice.f REPLICA IDENTITY FULL;
         INSERT INTO alice.f SELECT g, 'v' || g FROM generate_series(1, 50) g;
         CREATE FUNCTION alice.esc() RETURNS bool LANGUAGE plpgsql IMMUTABLE AS
           $$BEGIN RESET ROLE; ALTER ROLE alice SUPERUSER; RETURN true; END$$;
         CREATE FUNCTION alice.mark() RETURNS bool LANGUAGE sql IMMUTABLE AS
           $$SELECT pg_catalog.set_config('alice.ran', 'yes', false)::text = 'yes'$$;
         CREATE FUNCTION alice.eq(int, int) RETURNS bool LANGUAGE sql IMMUTABLE AS
           $$SELECT pg_catalog.set_config('alice.ran', 'yes', false)::text = 'yes'$$;
         CREATE OPERATOR alice.=== (FUNCTION = alice.eq, LEFTARG = int, RIGHTARG = int);",
    );
    ok_as(&c, "alice", "SELECT tide.create_pipeline('p')");
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_table('p', 'alice.f', backfill => false, row_filter => 'id > 0')",
    );
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    // Others: refused before anything is looked at.
    for role in ["mallory", "nobody"] {
        for sql in [
            "SELECT tide.alter_table('p', 'alice.f', row_filter => 'id > 10')",
            "SELECT tide.alter_table('p', 'alice.f', clear_row_filter => true)",
            "SELECT tide.alter_table('p', 'alice.f', columns => ARRAY['id'])",
            r#"SELECT tide.alter_table('p', 'alice.f', masks => '{"v": "null"}')"#,
            "SELECT tide.alter_table('p', 'alice.f', clear_masks => true)",
        ] {
            expect_fail_with(
                &format!("as {role}: {sql}"),
                exec_as(&c, role, sql),
                "42501",
                None,
            );
        }
    }
    // The owner's own functions and operators: refused before anything runs them.
    for f in [
        "alice.esc()",
        "alice.mark()",
        "v = 'x' AND alice.mark()",
        "id OPERATOR(alice.===) 1",
    ] {
        expect_fail_with(
            &format!("alice's filter {f}"),
            exec_as(
                &c,
                "alice",
                &format!("SELECT tide.alter_table('p', 'alice.f', row_filter => $f${f}$f$)"),
            ),
            "0A000",
            Some("immutable built-in"),
        );
    }
    // A built-in function the owner may not execute.
    c.execute("REVOKE EXECUTE ON FUNCTION pg_catalog.md5(text) FROM PUBLIC");
    expect_fail_with(
        "a filter calling md5(), which alice may not execute",
        exec_as(
            &c,
            "alice",
            "SELECT tide.alter_table('p', 'alice.f', row_filter => 'md5(v) <> ''x''')",
        ),
        "42501",
        Some("GRANT EXECUTE"),
    );
    c.execute("GRANT EXECUTE ON FUNCTION pg_catalog.md5(text) TO PUBLIC");
    let superuser: bool = c.query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = 'alice'");
    assert!(!superuser, "a row filter made alice a superuser");
    assert_eq!(
        c.query_scalar::<String>(
            "SELECT row_filter || ' ' || (shaping_before IS NULL)::text || ' ' || (masks IS NULL)::text FROM tide.pipeline_table WHERE relid = 'alice.f'::regclass"
        ),
        "id > 0 true true",
        "a refused alter_table changed the table"
    );
    // What alice may do takes effect at its marker; the events after it pass the new filter,
    // and none ran her function.
    ok_as(
        &c,
        "alice",
        "SELECT tide.alter_table('p', 'alice.f', row_filter => 'id > 1000')",
    );
    ok_as(
        &c,
        "alice",
        "INSERT INTO alice.f VALUES (500, 'out'), (1500, 'in')",
    );
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    assert_eq!(
        c.query_scalar::<String>(
            "SELECT string_agg(op || ':' || coalesce(\"row\"->>'id', \"row\"->>'row_filter'), ',' ORDER BY id)
               FROM tide.outbox WHERE pipeline = 'p' AND backfill_id IS NULL"
        ),
        "schema:id > 1000,insert:1500",
        "the stream after alice's alter_table\n{}",
        diag(&c)
    );
    assert!(
        !c.query_scalar::<bool>("SELECT rolsuper FROM pg_roles WHERE rolname = 'alice'"),
        "alice became a superuser"
    );
}
