//! Remote (`postgres`) targets: connections follow postgres_fdw's rules for non-superusers.
//!
//! The attack: a pg_tide user with USAGE on a foreign server maps herself to a superuser
//! without a password. The scratch clusters trust 127.0.0.1, so the connection succeeds, and a
//! pipeline writing through it writes as that superuser. A server pointing back at the same
//! cluster (`loopback`) is the simplest case: local superuser. postgres_fdw's answer, which
//! pg_tide now follows:
//! - a non-superuser owner's connection needs a password in the user mapping, and the remote
//!   must have asked for it (else 2F003 "password is required"), unless a superuser set
//!   `password_required 'false'` on the mapping;
//! - options naming files of the server (`sslcert`, `sslkey`, `sslrootcert`, `sslcrl`,
//!   `sslcrldir`, `passfile`, `service`, ...) are a superuser's: accepted from a server a
//!   superuser owns (or, `sslcert`/`sslkey`, a user mapping, which PostgreSQL only lets
//!   superusers give them), else refused (42501).
//!
//! Checked by `tide.create_pipeline` and again whenever the worker connects: a mapping changed
//! later stops the pipeline with the reason, and nothing is written.

use super::*;

const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

/// postgres_fdw and `loopback`, a server owned by the superuser that points back at `c`,
/// usable by alice and mallory (the DBA's grant the attack needs).
fn loopback(c: &Cluster) {
    c.execute(&format!(
        "CREATE EXTENSION IF NOT EXISTS postgres_fdw;
         CREATE SERVER loopback FOREIGN DATA WRAPPER postgres_fdw
                OPTIONS (host '127.0.0.1', port '{}', dbname 'postgres');
         GRANT USAGE ON FOREIGN SERVER loopback TO alice, mallory;",
        c.port()
    ));
}

/// The role `remote_pw` (password `pw1`), which logs in over TCP only with its password
/// (`scram-sha-256` in pg_hba.conf); every other role keeps trust auth. It may create schemas.
fn password_role(c: &Cluster) {
    c.execute(
        "CREATE ROLE remote_pw LOGIN PASSWORD 'pw1';
         GRANT CREATE ON DATABASE postgres TO remote_pw;",
    );
    let hba: String = c.query_scalar("SHOW hba_file");
    c.execute(&format!(
        "COPY (SELECT unnest(ARRAY['local all all trust',
                                   'host all remote_pw 127.0.0.1/32 scram-sha-256',
                                   'host all all 127.0.0.1/32 trust'])) TO '{hba}';
         SELECT pg_reload_conf();"
    ));
    c.wait_until(
        "pg_hba.conf to ask remote_pw for its password",
        WAIT,
        POLL,
        || {
            let mut cfg = c.config("postgres");
            cfg.user("remote_pw");
            let without = cfg.connect(NoTls).is_err();
            cfg.password("pw1");
            Ok(without && cfg.connect(NoTls).is_ok())
        },
    );
}

/// `role` runs `sql`, which must fail with SQLSTATE `code`, its message containing `message`
/// and its hint each of `hint`. Returns the error.
#[track_caller]
fn refused_as(
    c: &Cluster,
    role: &str,
    sql: &str,
    code: &str,
    message: &str,
    hint: &[&str],
) -> DbError {
    let db = expect_fail_with(sql, exec_as(c, role, sql), code, None);
    assert!(
        db.message().contains(message),
        "{sql}: the message should contain {message:?}: {}",
        db.message()
    );
    for h in hint {
        assert!(
            db.hint().unwrap_or_default().contains(h),
            "{sql}: the hint should contain {h:?}: {:?}",
            db.hint()
        );
    }
    db
}

fn create_pipeline_sql(name: &str, server: &str, schema: &str) -> String {
    format!(
        r#"SELECT tide.create_pipeline('{name}', 'postgres', '{{"server": "{server}", "schema": "{schema}"}}')"#
    )
}

/// mallory is no superuser and stays none; victim.secret keeps its value.
#[track_caller]
fn mallory_got_nothing(c: &Cluster) {
    let secret: String = c.query_scalar("SELECT v FROM victim.secret WHERE id = 1");
    assert_eq!(
        secret,
        "the secret",
        "a pipeline of mallory wrote victim.secret (as the remote superuser)\n{}",
        diag(c)
    );
    let superuser: bool = c.query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = 'mallory'");
    assert!(!superuser, "mallory became a superuser\n{}", diag(c));
}

/// (a) The attack, end to end: mallory maps herself to `postgres` without a password on the
/// loopback server and points a pipeline at victim.secret. create_pipeline refuses (2F003,
/// with the remedy), and nothing is written as postgres.
#[test]
fn mapping_without_password_is_refused() {
    let c = secured("sec_remote_nopw");
    loopback(&c);
    ok_as(
        &c,
        "mallory",
        "CREATE USER MAPPING FOR mallory SERVER loopback OPTIONS (user 'postgres');
         CREATE TABLE mallory.secret (id int PRIMARY KEY, v text);
         INSERT INTO mallory.secret VALUES (1, 'pwned');",
    );
    let sql = create_pipeline_sql("m", "loopback", "mallory_remote");
    let created = exec_as(&c, "mallory", &sql);
    if created.is_ok() {
        // The attack proceeds: a backfill into victim.secret through the loopback.
        let added = exec_as(
            &c,
            "mallory",
            "SELECT tide.add_table('m', 'mallory.secret', true, 'victim.secret')",
        );
        eprintln!("add_table: {:?}", added.as_ref().map_err(describe_error));
        let _ = poll_every(WAIT, POLL, || {
            Ok(
                c.try_query_scalar::<String>("SELECT v FROM victim.secret WHERE id = 1")?
                    != "the secret",
            )
        });
    }
    mallory_got_nothing(&c);
    let db = expect_fail_with(&sql, created, "2F003", Some("ALTER USER MAPPING"));
    assert!(
        db.message().contains("password is required"),
        "{}",
        db.message()
    );
    assert!(
        db.hint().unwrap_or_default().contains("password_required"),
        "the hint names the superuser's waiver too: {:?}",
        db.hint()
    );
    // The same through a PUBLIC mapping (a DBA's mapping for everyone).
    c.execute(
        "DROP USER MAPPING FOR mallory SERVER loopback;
         CREATE USER MAPPING FOR PUBLIC SERVER loopback OPTIONS (user 'postgres');",
    );
    refused_as(
        &c,
        "mallory",
        &sql,
        "2F003",
        "password is required",
        &["ALTER USER MAPPING"],
    );
    let n: i64 = c.query_scalar("SELECT count(*) FROM tide.pipeline");
    assert_eq!(n, 0, "no pipeline was created\n{}", diag(&c));
    mallory_got_nothing(&c);
}

/// (b) A password in the mapping is not enough: the remote must ask for it. Here it trusts
/// 127.0.0.1, so the password is never used: refused (2F003), mallory's own mapping and a
/// PUBLIC one alike.
#[test]
fn password_the_server_does_not_ask_for_is_refused() {
    let c = secured("sec_remote_unused_pw");
    loopback(&c);
    ok_as(
        &c,
        "mallory",
        "CREATE USER MAPPING FOR mallory SERVER loopback OPTIONS (user 'postgres', password 'anything');",
    );
    let sql = create_pipeline_sql("m", "loopback", "mallory_remote");
    let db = refused_as(
        &c,
        "mallory",
        &sql,
        "2F003",
        "password is required",
        &["password_required"],
    );
    assert!(
        db.detail().unwrap_or_default().contains("did not ask for"),
        "the detail says the server did not ask for the password: {:?}",
        db.detail()
    );
    c.execute(
        "DROP USER MAPPING FOR mallory SERVER loopback;
         CREATE USER MAPPING FOR PUBLIC SERVER loopback OPTIONS (user 'postgres', password 'anything');",
    );
    refused_as(&c, "mallory", &sql, "2F003", "password is required", &[]);
    let n: i64 = c.query_scalar("SELECT count(*) FROM tide.pipeline");
    assert_eq!(n, 0, "no pipeline was created\n{}", diag(&c));
    mallory_got_nothing(&c);
}

/// (f) alice, with a mapping to a role that must give its password (scram), streams to the
/// remote as that role; (c) when her mapping is changed to `postgres` without a password, the
/// worker's next connection is refused: the pipeline shows "password is required" and nothing
/// more is written; with the password mapping back, it catches up by itself.
#[test]
fn password_mapping_works_until_it_changes() {
    let c = secured("sec_remote_pw");
    password_role(&c);
    loopback(&c);
    // (The remote schema exists beforehand: the worker's and add_table's CREATE SCHEMA IF NOT
    // EXISTS could otherwise race on the loopback.)
    c.execute("CREATE SCHEMA alice_copy AUTHORIZATION remote_pw");
    ok_as(
        &c,
        "alice",
        "CREATE USER MAPPING FOR alice SERVER loopback OPTIONS (user 'remote_pw', password 'pw1');
         CREATE TABLE alice.t (id int PRIMARY KEY, v int);
         INSERT INTO alice.t SELECT g, g FROM generate_series(1, 100) g;",
    );
    ok_as(
        &c,
        "alice",
        &create_pipeline_sql("pa", "loopback", "alice_copy"),
    );
    ok_as(&c, "alice", "SELECT tide.add_table('pa', 'alice.t')");
    wait_for_backfill(&c, "alice.t", Some("pa"), 60, || diag(&c));
    wait_for_pipeline(&c, "pa", 60, || diag(&c));
    let n: i64 = c.query_scalar("SELECT count(*) FROM alice_copy.t");
    assert_eq!(n, 100, "rows at the remote\n{}", diag(&c));
    let owner: String =
        c.query_scalar("SELECT tableowner::text FROM pg_tables WHERE schemaname = 'alice_copy' AND tablename = 't'");
    assert_eq!(
        owner, "remote_pw",
        "the remote table was created as the mapped role"
    );

    // The change: alice's mapping now says postgres, without a password. The worker's next
    // iteration connects again and is refused. (A batch already being written when the
    // mapping changes finishes over the connection it has, made with the old password.)
    ok_as(
        &c,
        "alice",
        "ALTER USER MAPPING FOR alice SERVER loopback OPTIONS (SET user 'postgres', DROP password)",
    );
    if let Err(e) = poll_every(WAIT, POLL, || {
        Ok(c.try_query_scalar::<bool>(
            "SELECT state = 'error' AND last_error LIKE '%password is required%' FROM tide.pipelines WHERE name = 'pa'",
        )?)
    }) {
        ok_as(
            &c,
            "alice",
            "INSERT INTO alice.t SELECT g, g FROM generate_series(101, 110) g",
        );
        std::thread::sleep(Duration::from_secs(3));
        let n: i64 = c.query_scalar("SELECT count(*) FROM alice_copy.t");
        panic!(
            "the pipeline did not stop with \"password is required\" ({e}); {n} rows at the remote\n{}",
            diag(&c)
        );
    }
    ok_as(
        &c,
        "alice",
        "INSERT INTO alice.t SELECT g, g FROM generate_series(101, 110) g",
    );
    let (code, remedy): (String, String) = {
        let r =
            c.query_one("SELECT last_error_sqlstate, remedy FROM tide.pipelines WHERE name = 'pa'");
        (r.get(0), r.get(1))
    };
    eprintln!("pipeline pa: SQLSTATE {code}, remedy {remedy:?}");
    assert_eq!(code, "2F003");
    assert!(remedy.contains("ALTER USER MAPPING"), "remedy: {remedy}");
    std::thread::sleep(Duration::from_secs(2));
    let n: i64 = c.query_scalar("SELECT count(*) FROM alice_copy.t");
    assert_eq!(n, 100, "rows were written without a password\n{}", diag(&c));
    let as_postgres: i64 = c.query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_tide pa' AND usename = 'postgres'",
    );
    assert_eq!(
        as_postgres, 0,
        "the pipeline holds a connection as postgres"
    );

    // Fixed: the pipeline catches up by itself.
    ok_as(
        &c,
        "alice",
        "ALTER USER MAPPING FOR alice SERVER loopback OPTIONS (SET user 'remote_pw', ADD password 'pw1');",
    );
    c.wait_until(
        "the pipeline to catch up",
        Duration::from_secs(60),
        POLL,
        || Ok(c.try_query_scalar::<i64>("SELECT count(*) FROM alice_copy.t")? == 110),
    );
    wait_for_pipeline(&c, "pa", 60, || diag(&c));

    // Changed again, to postgres with the password, which the remote does not ask postgres
    // for: the worker's connection is refused just the same, when it connects.
    ok_as(
        &c,
        "alice",
        "ALTER USER MAPPING FOR alice SERVER loopback OPTIONS (SET user 'postgres')",
    );
    c.wait_until("the pipeline to stop again", WAIT, POLL, || {
        Ok(c.try_query_scalar::<bool>(
            "SELECT state = 'error' AND last_error LIKE '%did not ask for the password of user \"postgres\"%'
               FROM tide.pipelines WHERE name = 'pa'",
        )?)
    });
    ok_as(
        &c,
        "alice",
        "INSERT INTO alice.t SELECT g, g FROM generate_series(111, 120) g",
    );
    std::thread::sleep(Duration::from_secs(2));
    let n: i64 = c.query_scalar("SELECT count(*) FROM alice_copy.t");
    assert_eq!(n, 110, "rows were written without a password\n{}", diag(&c));
    let code: String =
        c.query_scalar("SELECT last_error_sqlstate FROM tide.pipelines WHERE name = 'pa'");
    assert_eq!(code, "2F003");
    ok_as(
        &c,
        "alice",
        "ALTER USER MAPPING FOR alice SERVER loopback OPTIONS (SET user 'remote_pw')",
    );
    c.wait_until(
        "the pipeline to catch up again",
        Duration::from_secs(60),
        POLL,
        || Ok(c.try_query_scalar::<i64>("SELECT count(*) FROM alice_copy.t")? == 120),
    );
    wait_for_pipeline(&c, "pa", 60, || diag(&c));
    mallory_got_nothing(&c);
}

/// (d) Options naming the server's files are a superuser's decision. PostgreSQL's own
/// validator already keeps non-superusers from putting `sslcert`/`sslkey` (and
/// `password_required 'false'`) in a user mapping; a server mallory owns may name files, but
/// pg_tide refuses to connect through it (42501). The same option on a server the superuser
/// owns is accepted.
#[test]
fn file_options_are_superuser_decisions() {
    let c = secured("sec_remote_files");
    password_role(&c);
    loopback(&c);
    for opt in [
        "sslcert 'server.crt'",
        "sslkey 'server.key'",
        "password_required 'false'",
    ] {
        let sql = format!(
            "CREATE USER MAPPING FOR mallory SERVER loopback OPTIONS (user 'remote_pw', password 'pw1', {opt})"
        );
        expect_fail_with(
            &sql,
            exec_as(&c, "mallory", &sql),
            "42501",
            Some("superuser"),
        );
    }
    // mallory may create servers (the DBA let her), with any option postgres_fdw takes.
    c.execute("GRANT USAGE ON FOREIGN DATA WRAPPER postgres_fdw TO mallory");
    let options = [
        ("sslrootcert", "root.crt"),
        ("sslcrl", "root.crl"),
        ("sslcrldir", "crls"),
        ("sslcert", "server.crt"),
        ("sslkey", "server.key"),
        ("passfile", "pgpass"),
        ("service", "svc"),
    ];
    for (i, (opt, value)) in options.iter().enumerate() {
        let server = format!("m{i}");
        ok_as(
            &c,
            "mallory",
            &format!(
                "CREATE SERVER {server} FOREIGN DATA WRAPPER postgres_fdw
                        OPTIONS (host '127.0.0.1', port '{}', dbname 'postgres', sslmode 'disable', {opt} '{value}');
                 CREATE USER MAPPING FOR mallory SERVER {server} OPTIONS (user 'remote_pw', password 'pw1');",
                c.port()
            ),
        );
        let db = refused_as(
            &c,
            "mallory",
            &create_pipeline_sql(&format!("f{i}"), &server, "mallory_remote"),
            "42501",
            opt,
            &["superuser"],
        );
        eprintln!("  {opt}: {}", db.message());
    }
    // sslkeylogfile (a file libpq writes) exists only where postgres_fdw's libpq knows it.
    let keylog = format!(
        "CREATE SERVER mk FOREIGN DATA WRAPPER postgres_fdw
                OPTIONS (host '127.0.0.1', port '{}', dbname 'postgres', sslkeylogfile 'keys.log')",
        c.port()
    );
    if exec_as(&c, "mallory", &keylog).is_ok() {
        ok_as(
            &c,
            "mallory",
            "CREATE USER MAPPING FOR mallory SERVER mk OPTIONS (user 'remote_pw', password 'pw1');",
        );
        refused_as(
            &c,
            "mallory",
            &create_pipeline_sql("fk", "mk", "mallory_remote"),
            "42501",
            "sslkeylogfile",
            &["superuser"],
        );
    } else {
        eprintln!("  sslkeylogfile: postgres_fdw here does not know it");
    }
    let n: i64 = c.query_scalar("SELECT count(*) FROM tide.pipeline");
    assert_eq!(n, 0, "no pipeline was created\n{}", diag(&c));

    // The superuser's server may name files: passfile (which pg_tide does not read) on
    // loopback, and a pipeline of a member with a password mapping works.
    c.execute("ALTER SERVER loopback OPTIONS (ADD passfile 'pgpass')");
    ok_as(
        &c,
        "mallory",
        "CREATE USER MAPPING FOR mallory SERVER loopback OPTIONS (user 'remote_pw', password 'pw1');",
    );
    ok_as(
        &c,
        "mallory",
        &create_pipeline_sql("ok", "loopback", "mallory_remote"),
    );
    mallory_got_nothing(&c);
}

/// (e) A superuser may waive the password for a mapping (`password_required 'false'`, which
/// PostgreSQL lets only superusers set, and a mapping holding it only superusers change):
/// without it, a mapping to a role the remote trusts is refused; with it, the pipeline works.
#[test]
fn superuser_may_waive_the_password() {
    let c = secured("sec_remote_waive");
    loopback(&c);
    // (The remote schema exists beforehand: the worker's and add_table's CREATE SCHEMA IF NOT
    // EXISTS could otherwise race on the loopback.)
    c.execute(
        "CREATE ROLE remote_trust LOGIN;
         GRANT CREATE ON DATABASE postgres TO remote_trust;
         CREATE SCHEMA alice_copy AUTHORIZATION remote_trust;",
    );
    ok_as(
        &c,
        "alice",
        "CREATE USER MAPPING FOR alice SERVER loopback OPTIONS (user 'remote_trust');
         CREATE TABLE alice.t (id int PRIMARY KEY, v int);
         INSERT INTO alice.t SELECT g, g FROM generate_series(1, 50) g;",
    );
    let sql = create_pipeline_sql("pw", "loopback", "alice_copy");
    refused_as(
        &c,
        "alice",
        &sql,
        "2F003",
        "password is required",
        &["password_required"],
    );
    let waive =
        "ALTER USER MAPPING FOR alice SERVER loopback OPTIONS (ADD password_required 'false')";
    expect_fail_with(
        waive,
        exec_as(&c, "alice", waive),
        "42501",
        Some("superuser"),
    );
    c.execute(waive);
    // The waiver cannot be carried to another user: PostgreSQL refuses alice's change.
    let retarget = "ALTER USER MAPPING FOR alice SERVER loopback OPTIONS (SET user 'postgres')";
    expect_fail_with(
        retarget,
        exec_as(&c, "alice", retarget),
        "42501",
        Some("superuser"),
    );
    ok_as(&c, "alice", &sql);
    ok_as(&c, "alice", "SELECT tide.add_table('pw', 'alice.t')");
    wait_for_backfill(&c, "alice.t", Some("pw"), 60, || diag(&c));
    wait_for_pipeline(&c, "pw", 60, || diag(&c));
    let n: i64 = c.query_scalar("SELECT count(*) FROM alice_copy.t");
    assert_eq!(n, 50, "rows at the remote\n{}", diag(&c));
    let owner: String =
        c.query_scalar("SELECT tableowner::text FROM pg_tables WHERE schemaname = 'alice_copy' AND tablename = 't'");
    assert_eq!(owner, "remote_trust");
}
