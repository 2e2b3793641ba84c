//! Security, third round (issue 44), items 4 and 8: server-wide names are unique server-wide, and
//! nothing pg_tide creates outlives the database that owns it.

use super::*;

/// A new connection to database `db` as `role` (trust auth); panics with the error.
fn connect_db_as(c: &Cluster, db: &str, role: &str) -> postgres::Client {
    let mut cfg = c.config(db);
    cfg.user(role);
    cfg.connect(postgres::NoTls)
        .unwrap_or_else(|e| panic!("connect to {db} as {role}: {}", describe_error(&e)))
}

#[track_caller]
fn ok_in_as(c: &Cluster, db: &str, role: &str, sql: &str) {
    if let Err(e) = connect_db_as(c, db, role).batch_execute(sql) {
        panic!(
            "in {db} as {role}: {sql}\nfailed: {}\n{}",
            describe_error(&e),
            diag(c)
        );
    }
}

/// `tide.wait_for_pipeline(name, secs)` in database `db` as `role`: true, or a panic with the
/// pipeline's row and the log.
#[track_caller]
fn wait_in_as(c: &Cluster, db: &str, role: &str, pipeline: &str, secs: i32) {
    let mut cl = connect_db_as(c, db, role);
    let done = cl
        .query_one(
            "SELECT tide.wait_for_pipeline($1::text, $2::int4 * interval '1 second')",
            &[&pipeline, &secs],
        )
        .map(|r| r.get::<_, bool>(0));
    if !matches!(done, Ok(true)) {
        let row = cl
            .query_one(
                "SELECT coalesce((SELECT format('%s %s %s', state, last_error, remedy)
                                    FROM tide.pipelines WHERE name = $1), 'no such pipeline')",
                &[&pipeline],
            )
            .map(|r| r.get::<_, String>(0))
            .unwrap_or_default();
        panic!(
            "pipeline {pipeline} in {db} did not catch up in {secs} s: {done:?}: {row}\n{}",
            c.log_tail(60)
        );
    }
}

/// 4. A lost slot's name cannot be squatted from another database. alice pauses her pipeline
/// `bsq` (database postgres); mallory writes WAL until `tide.max_paused_wal_size` drops alice's
/// slot, then creates a pipeline `bsq` in database app2. On main mallory's pipeline took the
/// slot name `tide_bsq`, and alice's stayed in 'slot lost' ("a replication slot "tide_bsq" that
/// pg_tide did not make exists (... in database app2)") until a DBA stepped in. Here a slot and an
/// origin carry their database's OID: alice's pipeline resyncs when resumed, both pipelines
/// stream, each with its own slot and its own origin.
#[test]
fn a_lost_slots_name_cannot_be_squatted_from_another_database() {
    let c = secured_with("sec_squat", &["tide.max_paused_wal_size = '2MB'"]);
    c.execute("CREATE DATABASE app2");
    c.execute("GRANT CREATE ON DATABASE app2 TO mallory");
    c.execute_in("app2", "CREATE EXTENSION pg_tide");
    ok_as(
        &c,
        "alice",
        "CREATE TABLE alice.t (id int PRIMARY KEY, v int);
         INSERT INTO alice.t SELECT g, g FROM generate_series(1, 10) g;",
    );
    ok_as(&c, "alice", "SELECT tide.create_pipeline('bsq')");
    ok_as(
        &c,
        "alice",
        "SELECT tide.add_table('bsq', 'alice.t', backfill => false)",
    );
    wait_for_pipeline(&c, "bsq", 30, || diag(&c));
    ok_as(&c, "alice", "SELECT tide.pause_pipeline('bsq')");
    ok_as(&c, "mallory", "CREATE TABLE mallory.filler (pad text)");
    c.wait_until(
        "mallory's WAL to make tide.max_paused_wal_size drop alice's slot",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || {
            ok_as(
                &c,
                "mallory",
                "INSERT INTO mallory.filler SELECT repeat(md5(g::text), 32) FROM generate_series(1, 1000) g;
                 TRUNCATE mallory.filler;",
            );
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT resync = 'slot lost' FROM tide.pipelines WHERE name = 'bsq'), false)
                    AND NOT EXISTS (SELECT 1 FROM pg_replication_slots s JOIN tide.pipeline p
                                        ON p.slot_name = s.slot_name WHERE p.name = 'bsq')",
            )?)
        },
    );
    // mallory's pipeline of the same name, in another database.
    ok_in_as(
        &c,
        "app2",
        "mallory",
        "CREATE SCHEMA m; CREATE TABLE m.t (id int PRIMARY KEY)",
    );
    ok_in_as(&c, "app2", "mallory", "SELECT tide.create_pipeline('bsq')");
    ok_in_as(
        &c,
        "app2",
        "mallory",
        "SELECT tide.add_table('bsq', 'm.t', backfill => false); INSERT INTO m.t VALUES (1)",
    );
    wait_in_as(&c, "app2", "mallory", "bsq", 30);
    // alice resumes: her pipeline resyncs under a slot of its own, and streams.
    ok_as(&c, "alice", "SELECT tide.resume_pipeline('bsq')");
    c.wait_until(
        "alice's pipeline to recover its slot",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT resync IS NULL AND last_error IS NULL
                                    FROM tide.pipelines WHERE name = 'bsq'), false)",
            )?)
        },
    );
    ok_as(&c, "alice", "INSERT INTO alice.t VALUES (11, 11)");
    wait_for_pipeline(&c, "bsq", 30, || diag(&c));
    let got: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE pipeline = 'bsq' AND key->>'id' = '11'",
    );
    assert_eq!(got, 1, "alice's change after the resync\n{}", diag(&c));
    ok_in_as(&c, "app2", "mallory", "INSERT INTO m.t VALUES (2)");
    wait_in_as(&c, "app2", "mallory", "bsq", 30);
    // Each pipeline has its own slot, in its own database, and its own origin.
    let alice_slot: String =
        c.query_scalar("SELECT slot_name::text FROM tide.pipeline WHERE name = 'bsq'");
    let mallory_slot: String = connect_db_as(&c, "app2", "postgres")
        .query_one(
            "SELECT slot_name::text FROM tide.pipeline WHERE name = 'bsq'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_ne!(alice_slot, mallory_slot, "one slot name for both pipelines");
    for (slot, db) in [(&alice_slot, "postgres"), (&mallory_slot, "app2")] {
        let n: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM pg_replication_slots
              WHERE slot_name = '{slot}' AND database = '{db}' AND plugin = 'pg_tide'"
        ));
        assert_eq!(n, 1, "slot {slot} of database {db}\n{}", diag(&c));
    }
    let origins: i64 = c.query_scalar(
        "SELECT count(*) FROM pg_replication_origin WHERE roname LIKE 'pg\\_tide\\_%bsq'",
    );
    assert_eq!(origins, 2, "an origin per pipeline named bsq\n{}", diag(&c));
}

/// 8. Origins of a dropped database are released by pg_tide. `creator` (a `tide_admin` member
/// with `CREATEDB`, nothing else) four times creates a database (from a `template1` that has
/// pg_tide), makes three pipelines (named anew each round) that each apply a row, closes the database to connections and
/// drops it. The server has `max_replication_slots = 4`, so origin states are few: on main the
/// three origins of each dropped database stayed, and the second round's pipelines failed
/// (`could not find free replication state slot`). Here the launchers release the origins of a
/// database that no longer exists, with a LOG line naming the origin and the database's OID;
/// every round works, and so does alice's pipeline afterwards. Origins of live databases
/// (alice's) and origins pg_tide did not make are left alone.
#[test]
fn origins_of_a_dropped_database_are_released() {
    let c = secured_with(
        "sec_leaks",
        &[
            "max_replication_slots = 4",
            "tide.max_pipelines_per_role = 3",
        ],
    );
    c.execute("CREATE ROLE creator LOGIN CREATEDB; GRANT tide_admin TO creator");
    c.execute_in("template1", "CREATE EXTENSION pg_tide");
    // A superuser's own origin (names starting with pg_ are reserved to C code).
    c.execute("SELECT pg_replication_origin_create('mine')");
    let mut dropped = Vec::new();
    for round in 1..=4 {
        let db = format!("leak{round}");
        ok_as(&c, "creator", &format!("CREATE DATABASE {db}"));
        let oid: postgres::types::Oid = c.query_scalar(&format!(
            "SELECT oid FROM pg_database WHERE datname = '{db}'"
        ));
        let names: Vec<String> = (1..=3).map(|i| format!("r{round}p{i}")).collect();
        for p in &names {
            ok_in_as(
                &c,
                &db,
                "creator",
                &format!("CREATE TABLE {p}_t (id int PRIMARY KEY)"),
            );
            ok_in_as(
                &c,
                &db,
                "creator",
                &format!("SELECT tide.create_pipeline('{p}')"),
            );
            ok_in_as(
                &c,
                &db,
                "creator",
                &format!("SELECT tide.add_table('{p}', '{p}_t', backfill => false); INSERT INTO {p}_t VALUES (1)"),
            );
        }
        for p in &names {
            wait_in_as(&c, &db, "creator", p, 60);
        }
        ok_as(
            &c,
            "creator",
            &format!("ALTER DATABASE {db} ALLOW_CONNECTIONS false"),
        );
        c.wait_until(
            &format!("no session and no active slot in {db}"),
            Duration::from_secs(30),
            Duration::from_millis(100),
            || {
                Ok(c.try_query_scalar::<i64>(&format!(
                    "SELECT (SELECT count(*) FROM pg_replication_slots WHERE database = '{db}' AND active)
                          + (SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}')"
                ))? == 0)
            },
        );
        ok_as(&c, "creator", &format!("DROP DATABASE {db}"));
        dropped.push((oid, names));
    }
    // alice's pipeline in postgres, after it all.
    alice_pipeline(&c);
    ok_as(&c, "alice", "INSERT INTO alice.t VALUES (101, 101)");
    wait_for_pipeline(&c, "p", 30, || diag(&c));
    c.wait_until(
        "the origins of the dropped databases to be released",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_replication_origin WHERE roname LIKE 'pg\\_tide\\_%'",
            )? == 1)
        },
    );
    let left: Vec<String> = c
        .query("SELECT roname FROM pg_replication_origin ORDER BY roname")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let postgres_oid: postgres::types::Oid =
        c.query_scalar("SELECT oid FROM pg_database WHERE datname = 'postgres'");
    assert_eq!(
        left,
        ["mine".to_string(), format!("pg_tide_{postgres_oid}_p")],
        "the origins left"
    );
    let log = c.log();
    for (oid, names) in dropped {
        for p in names {
            let origin = format!("pg_tide_{oid}_{p}");
            assert!(
                log.lines().any(|l| l.contains(&format!("\"{origin}\""))
                    && l.contains(&format!("database {oid}"))
                    && l.contains("released")),
                "no LOG line releasing {origin} of database {oid}\n{}",
                c.log_tail(80)
            );
        }
    }
}
