//! What a kafka pipeline refuses, as an ordinary role would meet it: a server it may not use
//! (42501), one of another wrapper, settings pg_tide sets itself and secrets where other roles
//! could read them (22023), brokers that do not answer (08001), a file setting of a server no
//! superuser owns, at worker start (42501); and what another role can read of the owner's
//! credentials: nothing. (The allow-list's refusals need no broker: the security suite.)

use crate::broker::*;
use pg_test::*;
use std::time::Duration;

fn fails(client: &mut Client, sql: &str, code: &str, hint: &str) {
    let e = client
        .batch_execute(sql)
        .expect_err(&format!("must fail: {sql}"));
    assert_db_error(&e, code, (!hint.is_empty()).then_some(hint));
}

#[test]
fn kafka_refusals_and_secrets() {
    let b = Broker::start("refusals");
    let c = setup("kafka_refusals");
    c.execute(&format!(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE ROLE bob LOGIN; GRANT tide_admin TO bob;
         CREATE EXTENSION postgres_fdw;
         CREATE SERVER pgsrv FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1');
         GRANT USAGE ON FOREIGN SERVER pgsrv TO alice;
         CREATE SERVER events FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers '{}');
         CREATE USER MAPPING FOR alice SERVER events OPTIONS (sasl_username 'alice', sasl_password 'alice-secret');
         CREATE USER MAPPING FOR bob SERVER events OPTIONS (sasl_username 'bob', sasl_password 'bob-secret');
         CREATE SERVER down FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers '127.0.0.1:1', \"socket.connection.setup.timeout.ms\" '2000');
         GRANT USAGE ON FOREIGN SERVER down TO alice;",
        b.addr()
    ));
    let mut alice = connect_as(&c, "alice");
    // No USAGE on the server yet.
    fails(
        &mut alice,
        r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "events"}')"#,
        "42501",
        "GRANT USAGE ON FOREIGN SERVER events TO alice",
    );
    fails(
        &mut alice,
        r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "pgsrv"}')"#,
        "22023",
        "tide_kafka server",
    );
    fails(
        &mut alice,
        r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "nope"}')"#,
        "42704",
        "CREATE SERVER nope FOREIGN DATA WRAPPER tide_kafka",
    );
    fails(
        &mut alice,
        r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "events", "producer": {"max.in.flight": 10}}')"#,
        "22023",
        "pg_tide sets it",
    );
    fails(
        &mut alice,
        r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "down"}')"#,
        "08001",
        "brokers option",
    );
    // An ordinary role cannot put a secret where others read it, nor create a server of the
    // wrapper (no USAGE on it).
    fails(
        &mut alice,
        "CREATE SERVER mine FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers 'x:1')",
        "42501",
        "",
    );
    fails(
        &mut c.client(),
        "ALTER SERVER events OPTIONS (ADD \"ssl.key.password\" 'x')",
        "22023",
        "user mapping",
    );
    // With USAGE, the same call works.
    c.execute("GRANT USAGE ON FOREIGN SERVER events TO alice");
    alice
        .batch_execute(r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "events"}')"#)
        .unwrap_or_else(|e| panic!("create_pipeline with USAGE: {}", describe_error(&e)));
    wait_streaming(&c, "k", Duration::from_secs(30));
    // Kafka pipelines have no target table and no consumers of the outbox.
    c.execute("CREATE TABLE t (id int PRIMARY KEY); GRANT SELECT ON t TO alice;");
    fails(
        &mut alice,
        "SELECT tide.add_table('k', 't', target_table => 'x')",
        "22023",
        "Omit target_table",
    );

    // Pause, resume, readiness and the views, as for the other targets.
    c.execute("INSERT INTO t SELECT generate_series(1, 10)");
    alice
        .batch_execute("SELECT tide.add_table('k', 't')")
        .unwrap_or_else(|e| panic!("add_table: {}", describe_error(&e)));
    wait_backfill(&c, "t", "k", 60);
    let ready: String = c.query_scalar(
        "SELECT readiness FROM tide.readiness WHERE pipeline = 'k' AND relation = 'public.t'",
    );
    assert_eq!(ready, "ready");
    let count = |b: &Broker| consume(&b.addr(), &["k.public.t"]).len();
    assert_eq!(count(&b), 10, "the backfilled rows");
    exec(&c, "SELECT tide.pause_pipeline('k')");
    c.wait_until(
        "paused",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT state = 'paused' FROM tide.pipelines WHERE name = 'k'",
            )?)
        },
    );
    c.execute("INSERT INTO t SELECT generate_series(11, 15)");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(count(&b), 10, "nothing is sent while paused");
    exec(&c, "SELECT tide.resume_pipeline('k')");
    wait_pipeline(&c, "k", 60);
    assert_eq!(
        count(&b),
        15,
        "the rows written while paused arrive after resume"
    );

    // Bob (the same grants as alice) reads neither alice's credentials nor the server's secrets.
    let mut bob = connect_as(&c, "bob");
    let umoptions: Option<Vec<String>> = bob
        .query_one(
            "SELECT umoptions FROM pg_user_mappings WHERE srvname = 'events' AND usename = 'alice'",
            &[],
        )
        .expect("pg_user_mappings")
        .get(0);
    assert_eq!(umoptions, None, "bob reads alice's user mapping");
    let leaked: i64 = bob
        .query_one(
            "SELECT (SELECT count(*) FROM information_schema.user_mapping_options WHERE option_value LIKE '%alice-secret%')
                  + (SELECT count(*) FROM pg_foreign_server, unnest(srvoptions) o WHERE o LIKE '%secret%')
                  + (SELECT count(*) FROM tide.pipelines WHERE name = 'k')",
            &[],
        )
        .expect("leak query")
        .get(0);
    assert_eq!(leaked, 0, "bob sees alice's secret or pipeline");
    // Alice sees her own mapping (the one the worker uses), the pipeline runs as hers.
    let own: Option<Vec<String>> = alice
        .query_one(
            "SELECT umoptions FROM pg_user_mappings WHERE srvname = 'events' AND usename = 'alice'",
            &[],
        )
        .expect("own mapping")
        .get(0);
    assert!(own.is_some_and(|o| o.iter().any(|x| x == "sasl_password=alice-secret")));
    // A setting that names a file counts only from a server a superuser owns: handed to bob
    // (ALTER SERVER ... OWNER TO), the server's ssl.ca.location stops the pipeline when its worker
    // starts again (42501); given back to a superuser, the pipeline streams again by itself.
    c.execute(
        "ALTER SERVER events OPTIONS (ADD \"ssl.ca.location\" '/etc/ssl/certs/ca-certificates.crt');
         ALTER SERVER events OWNER TO bob;
         SELECT pg_terminate_backend(worker_pid) FROM tide.pipelines WHERE name = 'k';",
    );
    c.wait_until(
        "the pipeline fails on a file setting of a server bob owns",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT last_error_sqlstate = '42501' AND last_error LIKE '%ssl.ca.location%'
                                    FROM tide.pipelines WHERE name = 'k'), false)",
            )?)
        },
    );
    c.execute("ALTER SERVER events OWNER TO postgres");
    c.execute("INSERT INTO t SELECT generate_series(16, 20)");
    wait_pipeline(&c, "k", 90);
    assert_eq!(
        count(&b),
        20,
        "the rows written while the pipeline was refused"
    );
    // Revoking USAGE stops the running pipeline with the reason.
    c.execute("REVOKE USAGE ON FOREIGN SERVER events FROM alice; SELECT pg_terminate_backend(worker_pid) FROM tide.pipelines WHERE name = 'k';");
    c.wait_until("the revoked pipeline fails", Duration::from_secs(30), Duration::from_millis(100), || {
        Ok(c.try_query_scalar::<bool>(
            "SELECT coalesce((SELECT last_error_sqlstate = '42501' FROM tide.pipelines WHERE name = 'k'), false)",
        )?)
    });
}
