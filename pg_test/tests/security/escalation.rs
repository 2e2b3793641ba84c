//! Paths to superuser that go through the worker's own identity (issue 29, classes 1 and 4):
//! a setting made by the owner's code must not outlive it, and a backfill runs as the pipeline's
//! owner whoever starts it. In each test the attacker is `mallory`, a member of `tide_admin` with
//! nothing else; the failure is `mallory` ending up a superuser.

use super::*;

fn is_superuser(c: &Cluster, role: &str) -> bool {
    c.query_scalar(&format!(
        "SELECT rolsuper FROM pg_roles WHERE rolname = '{role}'"
    ))
}

/// mallory's trap: functions named like the catalog functions pg_tide's worker calls, in her
/// own schema, that make her a superuser when they run as one (and do what the real function
/// does otherwise, so nothing else changes), plus `mallory.setpath()`, which puts her schema
/// first in `search_path` for the rest of the session (`set_config(..., false)`).
fn plant_trap(c: &Cluster) {
    let mut body = String::new();
    for (f, args, ret, call) in [
        ("hashtext", "text", "int", "pg_catalog.hashtext($1)"),
        ("now", "", "timestamptz", "pg_catalog.now()"),
        (
            "pg_current_wal_lsn",
            "",
            "pg_lsn",
            "pg_catalog.pg_current_wal_lsn()",
        ),
        (
            "set_config",
            "text, text, bool",
            "text",
            "pg_catalog.set_config($1, $2, $3)",
        ),
        ("to_json", "anyelement", "json", "pg_catalog.to_json($1)"),
    ] {
        body.push_str(&format!(
            "CREATE FUNCTION mallory.{f}({args}) RETURNS {ret} LANGUAGE plpgsql AS $$
             BEGIN
               BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
               RETURN {call};
             END $$;\n"
        ));
    }
    body.push_str(
        "CREATE FUNCTION mallory.setpath() RETURNS bool LANGUAGE plpgsql AS $$
         BEGIN
           PERFORM pg_catalog.set_config('search_path', 'mallory, pg_catalog', false);
           RETURN true;
         END $$;",
    );
    ok_as(c, "mallory", &body);
}

/// Class 1: a backfill condition (the owner's code, run by the worker as the owner) sets
/// `search_path` for the session; the worker's next statements must not resolve to mallory's
/// functions. The condition runs for every chunk, and the stream keeps running after it.
#[test]
fn condition_setting_does_not_leak_into_the_worker() {
    let c = secured("sec_guc_condition");
    plant_trap(&c);
    ok_as(
        &c,
        "mallory",
        "CREATE TABLE mallory.t (id int PRIMARY KEY, v int);
         INSERT INTO mallory.t SELECT g, g FROM generate_series(1, 50) g;",
    );
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m')");
    ok_as(
        &c,
        "mallory",
        "SELECT tide.add_table('m', 'mallory.t', backfill => false)",
    );
    wait_for_pipeline(&c, "m", 30, || diag(&c));
    ok_as(
        &c,
        "mallory",
        "SELECT tide.start_backfill('mallory.t', 'm', 10, 'mallory.setpath()')",
    );
    wait_for_backfill(&c, "mallory.t", Some("m"), 60, || diag(&c));
    // More iterations after the condition ran: writes, and the worker's idle polls.
    for i in 0..5 {
        ok_as(
            &c,
            "mallory",
            &format!("INSERT INTO mallory.t VALUES ({}, 0)", 100 + i),
        );
        wait_for_pipeline(&c, "m", 30, || diag(&c));
    }
    assert!(
        !is_superuser(&c, "mallory"),
        "a search_path set by mallory's condition reached the worker's statements: mallory is a superuser\n{}",
        diag(&c)
    );
    // The backfill did its work, as mallory.
    let n: i64 =
        c.query_scalar("SELECT count(*) FROM tide.outbox WHERE pipeline = 'm' AND op = 'read'");
    assert_eq!(n, 50, "every row backfilled once\n{}", diag(&c));
}

/// Class 1 again, through a trigger on the owner's own local target table (run by the worker
/// as the owner when it writes the target).
#[test]
fn target_trigger_setting_does_not_leak_into_the_worker() {
    let c = secured("sec_guc_trigger");
    plant_trap(&c);
    ok_as(
        &c,
        "mallory",
        "CREATE SCHEMA mallory_rep;
         CREATE TABLE mallory.t (id int PRIMARY KEY, v int);
         CREATE TABLE mallory_rep.t (id int PRIMARY KEY, v int);
         CREATE FUNCTION mallory.trg() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           PERFORM pg_catalog.set_config('search_path', 'mallory, pg_catalog', false);
           RETURN NEW;
         END $$;
         CREATE TRIGGER t BEFORE INSERT OR UPDATE ON mallory_rep.t
           FOR EACH ROW EXECUTE FUNCTION mallory.trg();",
    );
    ok_as(
        &c,
        "mallory",
        r#"SELECT tide.create_pipeline('mt', 'table', '{"schema": "mallory_rep"}')"#,
    );
    ok_as(
        &c,
        "mallory",
        "SELECT tide.add_table('mt', 'mallory.t', backfill => false)",
    );
    wait_for_pipeline(&c, "mt", 30, || diag(&c));
    for i in 0..10 {
        ok_as(
            &c,
            "mallory",
            &format!("INSERT INTO mallory.t VALUES ({i}, {i})"),
        );
        wait_for_pipeline(&c, "mt", 30, || diag(&c));
    }
    let n: i64 = c.query_scalar("SELECT count(*) FROM mallory_rep.t");
    assert_eq!(n, 10, "every row reached the target\n{}", diag(&c));
    assert!(
        !is_superuser(&c, "mallory"),
        "a search_path set by mallory's target trigger reached the worker's statements: mallory is a superuser\n{}",
        diag(&c)
    );
}

/// mallory's pipeline `mt` to her own local target `mallory_rep.t` (a copy of `mallory.t`),
/// after `setup` (her statements on the target table: triggers, constraints).
fn mallory_target(c: &Cluster, setup: &str) {
    ok_as(
        c,
        "mallory",
        &format!(
            "CREATE SCHEMA mallory_rep;
             CREATE TABLE mallory.t (id int PRIMARY KEY, v int);
             CREATE TABLE mallory_rep.t (id int PRIMARY KEY, v int);
             {setup}"
        ),
    );
    ok_as(
        c,
        "mallory",
        r#"SELECT tide.create_pipeline('mt', 'table', '{"schema": "mallory_rep"}')"#,
    );
    ok_as(
        c,
        "mallory",
        "SELECT tide.add_table('mt', 'mallory.t', backfill => false)",
    );
    wait_for_pipeline(c, "mt", 30, || diag(c));
}

/// Issue 45: a deferred constraint trigger on the owner's local target (what a `DEFERRABLE
/// INITIALLY DEFERRED` foreign key is made of) fires at the target transaction's commit. The
/// worker writes the target without a security-restricted operation (PostgreSQL refuses to
/// queue a deferred event inside one), so the trigger must still fire as the owner, not as
/// the worker's superuser at its commit: mallory's function records who runs it and tries to
/// make her a superuser. Before, the first insert failed with 42501 and nothing arrived.
#[test]
fn deferred_target_trigger_runs_as_the_owner() {
    let c = secured("sec_deferred_trigger");
    mallory_target(
        &c,
        "CREATE TABLE mallory.seen (who text, session_who text);
         CREATE FUNCTION mallory.deferred() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO mallory.seen VALUES (current_user, session_user);
           BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
           BEGIN EXECUTE 'SET ROLE postgres'; EXCEPTION WHEN OTHERS THEN NULL; END;
           BEGIN EXECUTE 'RESET ROLE'; EXCEPTION WHEN OTHERS THEN NULL; END;
           RETURN NULL;
         END $$;
         CREATE CONSTRAINT TRIGGER later AFTER INSERT OR UPDATE ON mallory_rep.t
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION mallory.deferred();",
    );
    for i in 0..5 {
        ok_as(
            &c,
            "mallory",
            &format!("INSERT INTO mallory.t VALUES ({i}, {i})"),
        );
    }
    wait_for_pipeline(&c, "mt", 30, || diag(&c));
    let n: i64 = c.query_scalar("SELECT count(*) FROM mallory_rep.t");
    assert_eq!(n, 5, "every row reached the target\n{}", diag(&c));
    let who: String =
        c.query_scalar("SELECT coalesce(string_agg(DISTINCT who, ','), '') FROM mallory.seen");
    assert_eq!(
        who,
        "mallory",
        "the deferred trigger ran as the owner, and only as the owner\n{}",
        diag(&c)
    );
    let fired: i64 = c.query_scalar("SELECT count(*) FROM mallory.seen");
    assert_eq!(fired, 5, "once per row\n{}", diag(&c));
    assert!(
        !is_superuser(&c, "mallory"),
        "mallory's deferred trigger ran as the worker's superuser\n{}",
        diag(&c)
    );
}

/// mallory's trigger function on her target: a cursor `WITH HOLD` over her escalating function
/// for `v = 1`, a temporary table (named to shadow a catalog) for `v = 2`.
const LEAVE_FN: &str = "CREATE OR REPLACE FUNCTION mallory.leave() RETURNS trigger LANGUAGE plpgsql AS $$
     BEGIN
       IF NEW.v = 1 THEN
         EXECUTE 'DECLARE c CURSOR WITH HOLD FOR SELECT mallory.escalate() FROM pg_catalog.generate_series(1, 3)';
       ELSIF NEW.v = 2 THEN
         EXECUTE 'CREATE TEMP TABLE pg_class (oid int)';
       END IF;
       RETURN NEW;
     END $$;";

/// What a security-restricted operation keeps user code from leaving behind, a trigger on the
/// owner's local target (now run outside one, see above) may not leave either: a cursor `WITH
/// HOLD`, whose query would run on at the worker's commit as its superuser, and a temporary
/// table in the worker's session. Each fails the write with 42501 (the pipeline shows it and
/// retries); mallory never becomes a superuser, and nothing of the batch is written.
#[test]
fn target_trigger_leaves_nothing_for_later() {
    let c = secured("sec_trigger_leftovers");
    mallory_target(
        &c,
        &format!(
            "CREATE FUNCTION mallory.escalate() RETURNS int LANGUAGE plpgsql AS $$
             BEGIN
               BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
               RETURN 1;
             END $$;
             {LEAVE_FN}
             CREATE TRIGGER leave AFTER INSERT ON mallory_rep.t
               FOR EACH ROW EXECUTE FUNCTION mallory.leave();"
        ),
    );
    for (v, what) in [(1, "a cursor WITH HOLD"), (2, "a temporary table")] {
        ok_as(
            &c,
            "mallory",
            &format!("INSERT INTO mallory.t VALUES ({v}, {v})"),
        );
        let failed = poll_every(Duration::from_secs(30), Duration::from_millis(100), || {
            Ok(c.try_query_scalar::<Option<String>>(
                "SELECT last_error FROM tide.pipelines WHERE name = 'mt' AND last_error_sqlstate = '42501'",
            )?
            .is_some_and(|e| e.contains(what)))
        });
        assert!(failed.is_ok(), "{what} refused\n{}", diag(&c));
        assert!(
            !is_superuser(&c, "mallory"),
            "{what} left by mallory's trigger ran as the worker's superuser\n{}",
            diag(&c)
        );
        let n: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM mallory_rep.t WHERE id = {v}"
        ));
        assert_eq!(
            n,
            0,
            "nothing of the refused batch is written\n{}",
            diag(&c)
        );
        // mallory fixes her trigger: the worker's retry writes the row.
        ok_as(
            &c,
            "mallory",
            "CREATE OR REPLACE FUNCTION mallory.leave() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RETURN NEW; END $$",
        );
        wait_for_pipeline(&c, "mt", 30, || diag(&c));
        let n: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM mallory_rep.t WHERE id = {v}"
        ));
        assert_eq!(n, 1, "written once the trigger is fixed\n{}", diag(&c));
        ok_as(&c, "mallory", LEAVE_FN);
    }
    assert!(!is_superuser(&c, "mallory"), "{}", diag(&c));
}

/// A local target's writes are no longer a security-restricted operation (see above), but the
/// owner's identity is still fixed there: a trigger on mallory's target that tries to climb
/// back to the worker's superuser (`RESET ROLE`, `SET ROLE postgres`, `SET SESSION
/// AUTHORIZATION postgres`, each then `ALTER ROLE mallory SUPERUSER`) fails the write, and
/// mallory stays what she is.
#[test]
fn target_trigger_cannot_switch_role() {
    let c = secured("sec_trigger_role");
    mallory_target(
        &c,
        "CREATE FUNCTION mallory.climb() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.v = 1 THEN RESET ROLE;
           ELSIF NEW.v = 2 THEN SET ROLE postgres;
           ELSIF NEW.v = 3 THEN SET SESSION AUTHORIZATION postgres;
           END IF;
           ALTER ROLE mallory SUPERUSER;
           RETURN NEW;
         END $$;
         CREATE TRIGGER climb BEFORE INSERT ON mallory_rep.t
           FOR EACH ROW EXECUTE FUNCTION mallory.climb();",
    );
    for v in 1..=3 {
        ok_as(
            &c,
            "mallory",
            &format!("INSERT INTO mallory.t VALUES ({v}, {v})"),
        );
        let failed = poll_every(Duration::from_secs(30), Duration::from_millis(100), || {
            Ok(c.try_query_scalar::<Option<String>>(
                "SELECT last_error_sqlstate FROM tide.pipelines WHERE name = 'mt'",
            )?
            .as_deref()
                == Some("42501"))
        });
        assert!(failed.is_ok(), "case {v} is refused\n{}", diag(&c));
        assert!(
            !is_superuser(&c, "mallory"),
            "case {v}: mallory's trigger climbed to the worker's superuser\n{}",
            diag(&c)
        );
        // Given up (as a DBA would skip it): the next case starts clean.
        ok_as(
            &c,
            "mallory",
            &format!("DELETE FROM mallory.t WHERE id = {v}"),
        );
        ok_as(
            &c,
            "mallory",
            "CREATE OR REPLACE FUNCTION mallory.climb() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RETURN NEW; END $$",
        );
        wait_for_pipeline(&c, "mt", 30, || diag(&c));
        ok_as(
            &c,
            "mallory",
            "CREATE OR REPLACE FUNCTION mallory.climb() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.v = 1 THEN RESET ROLE;
               ELSIF NEW.v = 2 THEN SET ROLE postgres;
               ELSIF NEW.v = 3 THEN SET SESSION AUTHORIZATION postgres;
               END IF;
               ALTER ROLE mallory SUPERUSER;
               RETURN NEW;
             END $$",
        );
    }
    assert!(!is_superuser(&c, "mallory"), "{}", diag(&c));
}

/// Issue 45: `session_replication_role => 'replica'` writes the target as PostgreSQL's apply
/// worker does, with foreign keys unchecked (their triggers are ordinary ones). Setting it is a
/// superuser's right, and skipping a foreign key is one mallory does not have on a key that
/// links her table with another role's (she can neither drop it nor disable its triggers):
/// alice's `alice.child` references mallory's target, and mallory deletes the referenced row
/// at her source. The write is refused (42501, naming the foreign key), alice's row keeps its
/// parent, and a foreign key between two of mallory's own tables does not stop her.
#[test]
fn replica_role_cannot_skip_another_roles_foreign_key() {
    let c = secured("sec_replica_role");
    ok_as(
        &c,
        "mallory",
        "CREATE SCHEMA mallory_rep;
         CREATE TABLE mallory.t (id int PRIMARY KEY, v int);
         CREATE TABLE mallory_rep.t (id int PRIMARY KEY, v int);
         CREATE TABLE mallory_rep.own (id int PRIMARY KEY, t_id int REFERENCES mallory_rep.t);
         GRANT USAGE ON SCHEMA mallory_rep TO alice;
         GRANT REFERENCES ON mallory_rep.t TO alice;",
    );
    ok_as(
        &c,
        "mallory",
        r#"SELECT tide.create_pipeline('mr', 'table', '{"schema": "mallory_rep", "session_replication_role": "replica"}')"#,
    );
    ok_as(
        &c,
        "mallory",
        "SELECT tide.add_table('mr', 'mallory.t', backfill => false)",
    );
    wait_for_pipeline(&c, "mr", 30, || diag(&c));
    // Her own foreign key (own.t_id -> t) is hers to skip: replica goes on.
    ok_as(&c, "mallory", "INSERT INTO mallory.t VALUES (1, 1), (2, 2)");
    wait_for_pipeline(&c, "mr", 30, || diag(&c));
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM mallory_rep.t"),
        2
    );
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.child (id int PRIMARY KEY, t_id int REFERENCES mallory_rep.t);
         INSERT INTO alice.child VALUES (1, 1);",
    );
    ok_as(&c, "mallory", "DELETE FROM mallory.t WHERE id = 1");
    let refused = poll_every(Duration::from_secs(30), Duration::from_millis(100), || {
        Ok(c.try_query_scalar::<Option<String>>(
            "SELECT last_error FROM tide.pipelines WHERE name = 'mr' AND last_error_sqlstate = '42501'",
        )?
        .is_some_and(|e| e.contains("child_t_id_fkey")))
    });
    assert!(refused.is_ok(), "the write is refused\n{}", diag(&c));
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM alice.child c JOIN mallory_rep.t t ON t.id = c.t_id"
        ),
        1,
        "alice's row keeps its parent\n{}",
        diag(&c)
    );
    // Back to origin: the foreign key is checked, and refuses the delete (23503) as it would
    // refuse mallory by hand.
    ok_as(
        &c,
        "mallory",
        r#"SELECT tide.alter_pipeline('mr', options => '{"session_replication_role": null}')"#,
    );
    let checked = poll_every(Duration::from_secs(30), Duration::from_millis(100), || {
        Ok(c.try_query_scalar::<Option<String>>(
            "SELECT last_error_sqlstate FROM tide.pipelines WHERE name = 'mr'",
        )?
        .as_deref()
            == Some("23503"))
    });
    assert!(checked.is_ok(), "{}", diag(&c));
    // mallory cannot set the server setting herself either.
    settings_refused(&c, &["SET session_replication_role = replica"]);
}

/// The same through a trigger: under `'replica'` mallory's `ENABLE ALWAYS` trigger on her own
/// target still fires, and writes into alice's `alice.refs` (mallory may INSERT there) a row
/// whose parent alice's foreign key would refuse: with the key's triggers silenced, nothing
/// would. Refused (42501, naming alice's key): alice's table never holds the orphan.
#[test]
fn replica_role_cannot_skip_a_foreign_key_through_a_trigger() {
    let c = secured("sec_replica_trigger");
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.parent (id int PRIMARY KEY);
         CREATE TABLE alice.refs (id int PRIMARY KEY, parent int NOT NULL REFERENCES alice.parent);
         GRANT USAGE ON SCHEMA alice TO mallory;
         GRANT INSERT ON alice.refs TO mallory;",
    );
    mallory_target(
        &c,
        "CREATE FUNCTION mallory.orphan() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO alice.refs VALUES (NEW.id, 999); RETURN NEW; END $$;
         CREATE TRIGGER orphan AFTER INSERT ON mallory_rep.t
           FOR EACH ROW EXECUTE FUNCTION mallory.orphan();
         ALTER TABLE mallory_rep.t ENABLE ALWAYS TRIGGER orphan;",
    );
    ok_as(
        &c,
        "mallory",
        r#"SELECT tide.alter_pipeline('mt', options => '{"session_replication_role": "replica"}')"#,
    );
    ok_as(&c, "mallory", "INSERT INTO mallory.t VALUES (1, 1)");
    let refused = poll_every(Duration::from_secs(30), Duration::from_millis(100), || {
        Ok(c.try_query_scalar::<Option<String>>(
            "SELECT last_error FROM tide.pipelines WHERE name = 'mt' AND last_error_sqlstate = '42501'",
        )?
        .is_some_and(|e| e.contains("refs_parent_fkey")))
    });
    assert!(refused.is_ok(), "the write is refused\n{}", diag(&c));
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM alice.refs"),
        0,
        "no orphan in alice's table\n{}",
        diag(&c)
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM mallory_rep.t"),
        0,
        "nothing of the refused batch is written\n{}",
        diag(&c)
    );
}

/// Class 4: a superuser who starts a backfill (or a repair) of a member's pipeline does not lend
/// it superuser rights: the table's owner-controlled code (here a domain CHECK on the key, run
/// by every chunk's key comparison, and a condition function) runs as the pipeline's owner.
#[test]
fn backfill_started_by_a_superuser_runs_as_the_owner() {
    let c = secured("sec_backfill_owner");
    ok_as(
        &c,
        "mallory",
        "CREATE FUNCTION mallory.climb(int) RETURNS bool LANGUAGE plpgsql AS $$
         BEGIN
           BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
           RETURN true;
         END $$;
         CREATE DOMAIN mallory.k AS int CHECK (mallory.climb(VALUE));
         CREATE TABLE mallory.t (id mallory.k PRIMARY KEY, v int);
         INSERT INTO mallory.t SELECT g, g FROM generate_series(1, 30) g;",
    );
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m')");
    ok_as(
        &c,
        "mallory",
        "SELECT tide.add_table('m', 'mallory.t', backfill => false)",
    );
    wait_for_pipeline(&c, "m", 30, || diag(&c));
    assert!(!is_superuser(&c, "mallory"));
    // The superuser helps: a backfill with small chunks (keys compared as mallory.k), and one
    // with a condition calling mallory's function.
    c.execute("SELECT tide.start_backfill('mallory.t', 'm', 5)");
    wait_for_backfill(&c, "mallory.t", Some("m"), 60, || diag(&c));
    c.execute("SELECT tide.start_backfill('mallory.t', 'm', 5, 'mallory.climb(id)')");
    wait_for_backfill(&c, "mallory.t", Some("m"), 60, || diag(&c));
    assert!(
        !is_superuser(&c, "mallory"),
        "a backfill a superuser started ran mallory's code as a superuser\n{}",
        diag(&c)
    );
    let owners: Vec<String> = c
        .query("SELECT DISTINCT owner::text FROM tide.backfill")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(owners, vec!["mallory".to_string()], "stored owner");
    // A rewrite queues another backfill: still mallory's.
    ok_as(
        &c,
        "mallory",
        "ALTER TABLE mallory.t ALTER COLUMN v TYPE bigint",
    );
    // (As mallory: a superuser's own INSERT would run her domain check as a superuser, which
    // is no business of pg_tide's.)
    ok_as(&c, "mallory", "INSERT INTO mallory.t VALUES (1000, 1)");
    wait_for_pipeline(&c, "m", 30, || diag(&c));
    c.wait_until(
        "the rewrite's backfill to finish",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.backfill WHERE state <> 'done'",
            )? == 0)
        },
    );
    assert!(!is_superuser(&c, "mallory"), "{}", diag(&c));
}

/// Class 4, several readers (`tide.max_backfill_readers`): the probe that plans a backfill's key
/// ranges ahead casts the last key to the key's type (a domain whose CHECK is mallory's function)
/// and compares keys, as the chunks do: it runs as the pipeline's owner too, whoever started the
/// backfill. Neither mallory (a `tide_admin` member) nor nobody can change the setting (nor
/// `tide.streaming_chunk_size`, the chunk cap while the stream is busy). The
/// ranges were planned (two chunks of the backfill in memory at once), or the test proves
/// nothing.
#[test]
fn planned_key_ranges_run_as_the_owner() {
    let c = secured_with("sec_ranges_owner", &["tide.max_backfill_readers = 3"]);
    ok_as(
        &c,
        "mallory",
        "CREATE FUNCTION mallory.climb(int) RETURNS bool LANGUAGE plpgsql AS $$
         BEGIN
           BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
           RETURN true;
         END $$;
         CREATE DOMAIN mallory.k AS int CHECK (mallory.climb(VALUE));
         CREATE TABLE mallory.t (id mallory.k PRIMARY KEY, v int);
         INSERT INTO mallory.t SELECT g, g FROM generate_series(1, 200) g;",
    );
    settings_refused(
        &c,
        &[
            "SET tide.max_backfill_readers = 16",
            "ALTER SYSTEM SET tide.max_backfill_readers = 16",
            // The chunk cap while the stream is busy: a server setting too.
            "SET tide.streaming_chunk_size = 1",
            "ALTER SYSTEM SET tide.streaming_chunk_size = 0",
            "ALTER ROLE mallory SET tide.streaming_chunk_size = 1",
        ],
    );
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m')");
    ok_as(
        &c,
        "mallory",
        "SELECT tide.add_table('m', 'mallory.t', backfill => false)",
    );
    wait_for_pipeline(&c, "m", 30, || diag(&c));
    let id: i64 = c.query_scalar("SELECT tide.start_backfill('mallory.t', 'm', 10)");
    wait_for_backfill(&c, "mallory.t", Some("m"), 60, || diag(&c));
    assert!(
        !is_superuser(&c, "mallory"),
        "a backfill planned with several readers ran mallory's code as a superuser\n{}",
        diag(&c)
    );
    let together: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.chunk a JOIN tide.chunk b
             ON b.backfill_id = a.backfill_id AND b.chunk <> a.chunk
            AND b.read_at >= a.read_at AND b.read_at < a.emitted_at
          WHERE a.backfill_id = {id}"
    ));
    assert!(
        together > 0,
        "no two chunks of the backfill were read at once: nothing was planned\n{}",
        diag(&c)
    );
    let n: i64 =
        c.query_scalar("SELECT count(*) FROM tide.outbox WHERE pipeline = 'm' AND op = 'read'");
    assert_eq!(n, 200, "every row backfilled once\n{}", diag(&c));
}

/// Class 4 again, for `tide.verify` and `tide.repair` run by a superuser on a member's table
/// target: their reads cast keys to the key's domain (whose CHECK is mallory's function), and run
/// as the pipeline's owner.
#[test]
fn verify_and_repair_by_a_superuser_run_as_the_owner() {
    let c = secured("sec_verify_owner");
    ok_as(
        &c,
        "mallory",
        "CREATE FUNCTION mallory.climb(int) RETURNS bool LANGUAGE plpgsql AS $$
         BEGIN
           BEGIN EXECUTE 'ALTER ROLE mallory SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
           RETURN true;
         END $$;
         CREATE DOMAIN mallory.k AS int CHECK (mallory.climb(VALUE));
         CREATE SCHEMA mallory_rep;
         CREATE TABLE mallory.t (id mallory.k PRIMARY KEY, v int);
         INSERT INTO mallory.t SELECT g, g FROM generate_series(1, 30) g;",
    );
    ok_as(
        &c,
        "mallory",
        r#"SELECT tide.create_pipeline('mv', 'table', '{"schema": "mallory_rep"}')"#,
    );
    ok_as(&c, "mallory", "SELECT tide.add_table('mv', 'mallory.t')");
    wait_for_backfill(&c, "mallory.t", Some("mv"), 60, || diag(&c));
    // Make the target differ, so repair has work.
    ok_as(&c, "mallory", "DELETE FROM mallory_rep.t WHERE id <= 3");
    assert!(!is_superuser(&c, "mallory"));
    c.execute("SELECT count(*) FROM tide.verify('mallory.t', 'mv', sample => 5)");
    c.execute("SELECT count(*) FROM tide.repair('mallory.t', 'mv')");
    wait_for_backfill(&c, "mallory.t", Some("mv"), 60, || diag(&c));
    assert!(
        !is_superuser(&c, "mallory"),
        "verify or repair by a superuser ran mallory's domain check as a superuser\n{}",
        diag(&c)
    );
    let n: i64 = c.query_scalar("SELECT count(*) FROM mallory_rep.t");
    assert_eq!(n, 30, "the repair re-seeded the deleted rows\n{}", diag(&c));
}

/// `tide.fail_stream_blocks` (fault injection: every pipeline worker of the server refuses its
/// streamed blocks and reads without streaming) is the server's: neither mallory (a `tide_admin`
/// member) nor nobody can set it for a session, the server or a role. Setting it had to work
/// for a superuser, or the refusals prove nothing.
#[test]
fn fault_injection_is_a_superusers_setting() {
    let c = secured_with("sec_fault_injection", &[]);
    settings_refused(
        &c,
        &[
            "SET tide.fail_stream_blocks = on",
            "ALTER SYSTEM SET tide.fail_stream_blocks = on",
            "ALTER ROLE mallory SET tide.fail_stream_blocks = on",
            "SELECT set_config('tide.fail_stream_blocks', 'on', false)",
        ],
    );
    c.execute("ALTER SYSTEM SET tide.fail_stream_blocks = on");
    c.execute("ALTER SYSTEM RESET tide.fail_stream_blocks");
    let on: String = c.query_scalar("SHOW tide.fail_stream_blocks");
    assert_eq!(on, "off");
}
