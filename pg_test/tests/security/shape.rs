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

/// Column masks (`tide.add_table(..., masks => ...)`), attacked as a `tide_admin` member
/// (`mallory`) and as a role with nothing (`nobody`), and with hostile mask options by the owner
/// (`alice`) herself:
/// - the salt: `tide.mask_salt` (the table) is readable by neither, nor by alice (she reads her
///   pipeline's salt with `tide.mask_salt(pipeline)`, which refuses them: 42501); neither can
///   rotate it; `tide.tables` shows mallory none of alice's masks; alice rotates it, and the next
///   change is hashed with the new salt;
/// - neither can set masks on alice's pipeline, nor on alice's table through a pipeline of their
///   own (42501);
/// - a constant full of quotes and a column name with quotes go through as data: the table
///   target is created with the column, the events carry the constant verbatim, `tide.verify`
///   (whose SQL holds both) is clean, and nothing else ran (`victim.secret` is still there); a
///   mask naming a column with SQL in it is an unknown column (42703).
#[test]
fn mask_attacks() {
    let c = secured("sec_masks");
    alice_pipeline(&c);
    let constant = "a'); DROP TABLE victim.secret; --\\ $$ '' \"";
    ok_as(
        &c,
        "alice",
        r#"CREATE TABLE alice.m (id int PRIMARY KEY, "col""q'x" text, v text, n int);
           INSERT INTO alice.m SELECT g, 'clear' || g, 'v' || g, 1000 + g FROM generate_series(1, 50) g;
           CREATE SCHEMA copy;"#,
    );
    ok_as(
        &c,
        "alice",
        r#"SELECT tide.create_pipeline('pt', 'table', '{"schema": "copy"}')"#,
    );
    let masks = serde_json::json!({
        "col\"q'x": {"constant": constant},
        "v": "hash",
        "n": {"truncate": 2},
    })
    .to_string();
    let add = |role: &str, pipeline: &str| {
        connect_as(&c, role).execute(
            "SELECT tide.add_table($1, 'alice.m'::regclass, masks => $2::text::jsonb)",
            &[&pipeline, &masks],
        )
    };
    for role in ["mallory", "nobody"] {
        expect_fail_with(
            &format!("as {role}: masks on alice's pipeline"),
            add(role, "p"),
            "42501",
            None,
        );
    }
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('mp')");
    expect_fail_with(
        "as mallory: masks on alice's table in her own pipeline",
        add("mallory", "mp"),
        "42501",
        None,
    );
    expect_fail_with(
        "a mask on a column whose name holds SQL",
        connect_as(&c, "alice").batch_execute(
            r#"SELECT tide.add_table('p', 'alice.m', masks => '{"v\" text); DROP TABLE victim.secret; --": "hash"}')"#,
        ),
        "42703",
        Some("pg_attribute"),
    );
    for p in ["p", "pt"] {
        add("alice", p)
            .unwrap_or_else(|e| panic!("alice adds alice.m to {p}: {}", describe_error(&e)));
    }
    ok_as(&c, "alice", "UPDATE alice.m SET v = 'w' || id, \"col\"\"q'x\" = 'again' WHERE id % 2 = 0; DELETE FROM alice.m WHERE id = 3;");
    for p in ["p", "pt"] {
        wait_for_backfill(&c, "alice.m", Some(p), 60, || diag(&c));
        wait_for_pipeline(&c, p, 60, || diag(&c));
    }
    let victim: bool = c.query_scalar("SELECT to_regclass('victim.secret') IS NOT NULL");
    assert!(victim, "a mask's text ran as SQL: victim.secret is gone");
    // The constant arrived verbatim, in every event of the outbox and every target row.
    let (events, verbatim): (i64, i64) = {
        let r = c
            .client()
            .query_one(
                "SELECT count(*), count(*) FILTER (WHERE \"row\"->>'col\"q''x' = $1)
                   FROM tide.outbox WHERE pipeline = 'p' AND relation = 'alice.m' AND op IN ('read', 'insert', 'update')",
                &[&constant],
            )
            .expect("outbox");
        (r.get(0), r.get(1))
    };
    // 25 updates always (add_table committed before them); the reads are 49 or 50, or 24 when
    // the UPDATE and DELETE fall inside the chunk's window (their 26 keys are dropped from it,
    // the stream carries them): at least 49 events in every interleaving.
    assert!(
        events >= 49 && events == verbatim,
        "{verbatim} of {events} events carry the constant verbatim"
    );
    let rows: i64 = c
        .client()
        .query_one("SELECT count(*) FROM copy.m WHERE \"col\"\"q'x\" = $1 AND length(v) = 64 AND length(n) <= 2", &[&constant])
        .expect("copy.m")
        .get(0);
    assert_eq!(rows, 49, "every target row masked");
    let verify: i64 = scalar_as(
        &c,
        "alice",
        "SELECT (missing + extra + changed)::int8 FROM tide.verify('alice.m', 'pt') WHERE kind LIKE 'summary%'",
    );
    assert_eq!(verify, 0, "tide.verify under masks with quotes");
    assert!(
        c.query_scalar::<bool>("SELECT to_regclass('victim.secret') IS NOT NULL"),
        "verify ran a mask as SQL"
    );

    // The salt.
    for role in ["mallory", "nobody", "alice"] {
        expect_fail_with(
            &format!("as {role}: read tide.mask_salt"),
            exec_as(&c, role, "SELECT salt FROM tide.mask_salt"),
            "42501",
            None,
        );
    }
    for role in ["mallory", "nobody"] {
        for f in [
            "SELECT tide.mask_salt('p')",
            "SELECT tide.rotate_mask_salt('p')",
        ] {
            expect_fail_with(
                &format!("as {role}: {f}"),
                exec_as(&c, role, f),
                "42501",
                None,
            );
        }
    }
    let seen: i64 = scalar_as(
        &c,
        "mallory",
        "SELECT count(*) FROM tide.tables WHERE masks IS NOT NULL",
    );
    assert_eq!(seen, 0, "mallory sees alice's masks in tide.tables");
    let mine: Vec<u8> = scalar_as(&c, "alice", "SELECT tide.mask_salt('p')");
    let stored: Vec<u8> = c.query_scalar("SELECT salt FROM tide.mask_salt WHERE pipeline = 'p'");
    assert!(
        mine.len() == 32 && mine == stored,
        "alice reads her pipeline's salt"
    );
    ok_as(&c, "alice", "SELECT tide.rotate_mask_salt('p')");
    let rotated: Vec<u8> = c.query_scalar("SELECT salt FROM tide.mask_salt WHERE pipeline = 'p'");
    assert!(rotated.len() == 32 && rotated != stored, "rotated");
    // The next change is hashed with the new salt.
    ok_as(
        &c,
        "alice",
        "UPDATE alice.m SET v = 'after-rotation' WHERE id = 1",
    );
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    let fresh: bool = c.query_scalar(
        "SELECT (SELECT \"row\"->>'v' FROM tide.outbox WHERE pipeline = 'p' AND relation = 'alice.m' ORDER BY id DESC LIMIT 1)
              = encode(sha256((SELECT salt FROM tide.mask_salt WHERE pipeline = 'p') || convert_to('after-rotation', 'UTF8')), 'hex')",
    );
    assert!(
        fresh,
        "an event after the rotation is hashed with the new salt"
    );
}
