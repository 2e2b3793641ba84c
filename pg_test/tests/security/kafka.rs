//! Kafka targets: librdkafka properties are taken by allow-list. A property that names a file, a
//! program or a library (librdkafka loads, runs or reads it inside PostgreSQL's processes) is a
//! superuser's decision: accepted only in a foreign server's or user mapping's options written
//! by a superuser, used only from a server a superuser owns or from a user mapping, never from a
//! pipeline's `producer` option. Anything not on the allow-list is refused.
//!
//! None of these tests needs a broker: every refusal happens before a connection, and the
//! accepted settings are shown to reach librdkafka by a broker that does not answer (08001) or a
//! file librdkafka cannot read (22023).

#[allow(unused_imports)]
use super::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory every role of the cluster's OS user may write (the marker files land here).
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pg_tide_sec_kafka_{name}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    run_ok(Command::new("chmod").arg("0777").arg(&dir));
    dir
}

/// A librdkafka plugin (a shared library with `conf_init`) whose constructor appends a line to
/// `marker` the moment anything loads it.
fn marker_library(dir: &Path, marker: &Path) -> PathBuf {
    let src = dir.join("marker.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <stddef.h>
static void mark(void) __attribute__((constructor));
static void mark(void) {
    FILE *f = fopen(MARKER, "a");
    if (f) { fputs("loaded\n", f); fclose(f); }
}
int conf_init(void *conf, void **opaque, char *errstr, size_t errstr_size) {
    (void)conf; (void)opaque; (void)errstr; (void)errstr_size;
    return 0;
}
"#,
    )
    .expect("write marker.c");
    let lib = dir.join("marker.so");
    run_ok(
        Command::new("cc")
            .arg("-shared")
            .arg("-fPIC")
            .arg(format!("-DMARKER=\"{}\"", marker.display()))
            .arg("-o")
            .arg(&lib)
            .arg(&src),
    );
    run_ok(Command::new("chmod").arg("0755").arg(&lib));
    lib
}

fn marker_lines(marker: &Path) -> usize {
    std::fs::read_to_string(marker).map_or(0, |s| s.lines().count())
}

/// What a statement did: `Ok` or its SQLSTATE and message.
fn outcome(r: Result<(), postgres::Error>) -> Result<(), (String, String, String)> {
    r.map_err(|e| match e.as_db_error() {
        Some(db) => (
            db.code().code().to_string(),
            db.message().to_string(),
            db.hint().unwrap_or_default().to_string(),
        ),
        None => ("?????".to_string(), e.to_string(), String::new()),
    })
}

/// Run each `(role, what, sql)`; each must fail with `code` (and a hint containing `hint` when
/// given) and leave `marker` untouched. Every outcome is reported before anything is asserted,
/// so a failure shows every path that accepted the setting.
#[track_caller]
fn all_refused(c: &Cluster, marker: &Path, cases: &[(&str, &str, String, &str, &str)]) {
    let mut report = Vec::new();
    let mut bad = 0;
    for (role, what, sql, code, hint) in cases {
        let before = marker_lines(marker);
        let r = outcome(exec_as(c, role, sql));
        let loaded = marker_lines(marker) > before;
        let ok = !loaded
            && match &r {
                Ok(()) => false,
                Err((got, _, h)) => got == code && (hint.is_empty() || h.contains(hint)),
            };
        if !ok {
            bad += 1;
        }
        report.push(format!(
            "{} as {role}: {what}: {}{}",
            if ok { "ok  " } else { "FAIL" },
            match &r {
                Ok(()) => "ACCEPTED".to_string(),
                Err((code, msg, hint)) => format!("{code} {msg} (hint: {hint})"),
            },
            if loaded {
                " -- AND THE LIBRARY/COMMAND RAN (marker written)"
            } else {
                ""
            },
        ));
    }
    let report = report.join("\n");
    eprintln!("{report}");
    assert_eq!(bad, 0, "paths that did not refuse as expected:\n{report}");
    assert_eq!(marker_lines(marker), 0, "the marker exists:\n{report}");
}

/// The roles' setup: the superuser's server `events` (brokers that never answer), USAGE on the
/// wrapper for mallory (a DBA letting a pg_tide user create servers), USAGE on `events` for
/// mallory; `nobody` gets nothing.
fn kafka_roles(c: &Cluster) {
    c.execute(
        "CREATE SERVER events FOREIGN DATA WRAPPER tide_kafka
           OPTIONS (brokers '127.0.0.1:1', \"socket.connection.setup.timeout.ms\" '2000');
         GRANT USAGE ON FOREIGN DATA WRAPPER tide_kafka TO mallory;
         GRANT USAGE ON FOREIGN SERVER events TO mallory;",
    );
    ok_as(
        c,
        "mallory",
        "CREATE SERVER mine FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers '127.0.0.1:1')",
    );
}

/// Every way a role can hand a property to the wrapper's validator or to a pipeline: its own
/// server (created or altered), a user mapping, the pipeline's `producer` option, and a direct
/// call of the validator (EXECUTE is granted to tide_admin).
fn paths(property: &str, value: &str) -> Vec<(&'static str, String)> {
    let q = value.replace('\'', "''");
    let json = serde_json::json!({"server": "events", "producer": {property: value}}).to_string();
    vec![
        (
            "CREATE SERVER",
            format!("CREATE SERVER evil FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers '127.0.0.1:1', \"{property}\" '{q}')"),
        ),
        (
            "ALTER SERVER (its own)",
            format!("ALTER SERVER mine OPTIONS (ADD \"{property}\" '{q}')"),
        ),
        (
            "CREATE USER MAPPING",
            format!("CREATE USER MAPPING FOR CURRENT_USER SERVER events OPTIONS (\"{property}\" '{q}')"),
        ),
        (
            "producer option",
            format!("SELECT tide.create_pipeline('k', 'kafka', '{}')", json.replace('\'', "''")),
        ),
        (
            "the validator, called directly",
            format!("SELECT tide._kafka_fdw_validator(ARRAY['{property}={q}'], 1417)"),
        ),
        (
            "the validator, called directly (user mapping)",
            format!("SELECT tide._kafka_fdw_validator(ARRAY['{property}={q}'], 1418)"),
        ),
    ]
}

fn cases_for(
    property: &str,
    value: &str,
) -> Vec<(
    &'static str,
    &'static str,
    String,
    &'static str,
    &'static str,
)> {
    let mut cases = Vec::new();
    for (what, sql) in paths(property, value) {
        cases.push(("mallory", what, sql.clone(), "42501", "superuser"));
        // nobody is stopped by PostgreSQL's own privileges (no USAGE, no EXECUTE) before
        // pg_tide sees the value; the marker shows nothing ran either way.
        cases.push(("nobody", what, sql, "42501", ""));
    }
    cases
}

/// 1. `plugin.library.paths` (librdkafka dlopen()s each library when the property is *set*, so
/// even checking the value loads it): refused from a pg_tide user on every path, and the library
/// never loads.
#[test]
fn kafka_plugin_library_is_never_loaded_for_a_non_superuser() {
    let c = secured("sec_kafka_plugin");
    kafka_roles(&c);
    let dir = scratch("plugin");
    let marker = dir.join("loaded");
    let lib = marker_library(&dir, &marker);
    assert!(lib.exists());
    all_refused(
        &c,
        &marker,
        &cases_for("plugin.library.paths", &lib.display().to_string()),
    );
    // Underscores name the same property.
    all_refused(
        &c,
        &marker,
        &[(
            "mallory",
            "CREATE SERVER, plugin_library_paths",
            format!(
                "CREATE SERVER evil2 FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers 'x:1', plugin_library_paths '{}')",
                lib.display()
            ),
            "42501",
            "superuser",
        )],
    );
    let servers: i64 =
        c.query_scalar("SELECT count(*) FROM pg_foreign_server WHERE srvname LIKE 'evil%'");
    assert_eq!(servers, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 2. `sasl.kerberos.kinit.cmd` (a shell command librdkafka runs) and the other properties that
/// name a program or a file: refused from a pg_tide user on every path; the command never runs.
#[test]
fn kafka_commands_and_files_are_a_superusers() {
    let c = secured("sec_kafka_kinit");
    kafka_roles(&c);
    let dir = scratch("kinit");
    let marker = dir.join("ran");
    let cmd = format!("touch {}", marker.display());
    all_refused(&c, &marker, &cases_for("sasl.kerberos.kinit.cmd", &cmd));
    // Files and libraries librdkafka (or OpenSSL) opens: one path each is enough, the rule is
    // the property's class.
    let mut cases = Vec::new();
    for (p, v) in [
        ("ssl.engine.location", "/tmp/engine.so"),
        ("ssl.providers", "/tmp/provider.so"),
        ("ssl.ca.location", "/etc/ssl/certs"),
        ("ssl.key.location", "/etc/ssl/private/ssl-cert-snakeoil.key"),
        ("sasl.kerberos.keytab", "/etc/krb5.keytab"),
        ("sasl.oauthbearer.assertion.file", "/etc/passwd"),
    ] {
        cases.push((
            "mallory",
            "CREATE USER MAPPING",
            format!("CREATE USER MAPPING FOR mallory SERVER events OPTIONS (\"{p}\" '{v}')"),
            "42501",
            "superuser",
        ));
    }
    all_refused(&c, &marker, &cases);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 3. Properties not on the allow-list are refused (22023, the hint says where the list is),
/// for superusers too: librdkafka settings that only change logging or signals, and names
/// librdkafka does not know.
#[test]
fn kafka_unknown_properties_are_refused() {
    let c = secured("sec_kafka_unknown");
    kafka_roles(&c);
    let dir = scratch("unknown");
    let marker = dir.join("never");
    let mut cases = Vec::new();
    for (p, v) in [
        ("debug", "all"),
        ("internal.termination.signal", "10"),
        ("enable.random.seed", "false"),
        ("no.such.property", "1"),
    ] {
        let json = serde_json::json!({"server": "events", "producer": {p: v}}).to_string();
        for (role, what, sql) in [
            (
                "postgres",
                "CREATE SERVER",
                format!("CREATE SERVER u FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers 'x:1', \"{p}\" '{v}')"),
            ),
            (
                "mallory",
                "CREATE USER MAPPING",
                format!("CREATE USER MAPPING FOR mallory SERVER events OPTIONS (\"{p}\" '{v}')"),
            ),
            (
                "mallory",
                "producer option",
                format!("SELECT tide.create_pipeline('k', 'kafka', '{json}')"),
            ),
        ] {
            cases.push((role, what, sql, "22023", "allow-list"));
        }
    }
    all_refused(&c, &marker, &cases);
    let _ = std::fs::remove_dir_all(&dir);
}

/// 4. A superuser's server naming a file (a CA bundle) is accepted and usable by a member with
/// USAGE: librdkafka gets the file (a broker that does not answer: 08001; a file it cannot read:
/// 22023). The same server given to a non-superuser (ALTER SERVER ... OWNER TO) no longer lends
/// its file settings (42501: its owner could not have written them); a superuser's user mapping
/// may name files on anyone's server; `producer` never may.
#[test]
fn kafka_a_superusers_file_settings_are_usable() {
    let c = secured("sec_kafka_files");
    kafka_roles(&c);
    c.execute(
        "CREATE SERVER tls FOREIGN DATA WRAPPER tide_kafka
           OPTIONS (brokers '127.0.0.1:1', security_protocol 'ssl',
                    \"ssl.ca.location\" '/etc/ssl/certs/ca-certificates.crt',
                    \"socket.connection.setup.timeout.ms\" '2000');
         CREATE SERVER tlsbad FOREIGN DATA WRAPPER tide_kafka
           OPTIONS (brokers '127.0.0.1:1', security_protocol 'ssl',
                    \"ssl.ca.location\" '/nonexistent/ca.pem');
         GRANT USAGE ON FOREIGN SERVER tls, tlsbad TO alice;",
    );
    let mut alice = connect_as(&c, "alice");
    let create = |server: &str| {
        format!("SELECT tide.create_pipeline('k', 'kafka', '{{\"server\": \"{server}\"}}')")
    };
    // The settings pass, librdkafka loads the CA bundle and finds no broker.
    let e = expect_fail_with(
        &create("tls"),
        alice.batch_execute(&create("tls")),
        "08001",
        None,
    );
    assert!(e.message().contains("cannot reach"), "{}", e.message());
    // librdkafka really reads the file: one it cannot read is its configuration error.
    expect_fail_with(
        &create("tlsbad"),
        alice.batch_execute(&create("tlsbad")),
        "22023",
        None,
    );
    // The same file from a member: refused before librdkafka sees it.
    let e = expect_fail_with(
        "mallory's server with ssl.ca.location",
        exec_as(
            &c,
            "mallory",
            "CREATE SERVER m2 FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers 'x:1', \"ssl.ca.location\" '/etc/ssl/certs')",
        ),
        "42501",
        Some("superuser"),
    );
    assert!(e.message().contains("ssl.ca.location"), "{}", e.message());
    // The superuser's server handed to mallory: its file settings are no longer used.
    c.execute("ALTER SERVER tls OWNER TO mallory");
    let e = expect_fail_with(
        &create("tls"),
        alice.batch_execute(&create("tls")),
        "42501",
        Some("OWNER TO"),
    );
    assert!(e.message().contains("ssl.ca.location"), "{}", e.message());
    // ... and mallory cannot change its options any more (the validator sees them all).
    expect_fail_with(
        "mallory alters the server she was given",
        exec_as(
            &c,
            "mallory",
            "ALTER SERVER tls OPTIONS (ADD \"linger.ms\" '5')",
        ),
        "42501",
        Some("superuser"),
    );
    // A superuser's user mapping may name a file on mallory's server: it is the superuser's.
    c.execute(
        "CREATE USER MAPPING FOR alice SERVER mine
           OPTIONS (security_protocol 'ssl', \"ssl.ca.location\" '/etc/ssl/certs/ca-certificates.crt',
                    \"socket.connection.setup.timeout.ms\" '2000');
         GRANT USAGE ON FOREIGN SERVER mine TO alice;",
    );
    expect_fail_with(
        &create("mine"),
        alice.batch_execute(&create("mine")),
        "08001",
        None,
    );
    // The producer option never names a file, whoever writes it.
    let json = r#"{"server": "events", "producer": {"ssl.ca.location": "/etc/ssl/certs"}}"#;
    let sql = format!("SELECT tide.create_pipeline('k2', 'kafka', '{json}')");
    expect_fail_with(&sql, c.try_execute(&sql), "42501", Some("server"));
    let n: i64 = c.query_scalar("SELECT count(*) FROM tide.pipeline");
    assert_eq!(n, 0);
}

/// 5. The message formats are a closed list: `value_format` and `key_format` are compared with
/// their values and used nowhere else (never in a name, a statement or a path), so anything else
/// is refused before a pipeline exists (22023, the hint lists the formats) for a tide_admin
/// member, and a role with nothing cannot get as far as the check (42501).
#[test]
fn kafka_formats_are_a_closed_list() {
    let c = secured("sec_kafka_formats");
    kafka_roles(&c);
    let dir = scratch("formats");
    let marker = dir.join("never");
    let mut cases = Vec::new();
    for (option, v, hint) in [
        (
            "value_format",
            "debezium-schema'); DROP TABLE pg_class; --",
            "debezium-schema",
        ),
        ("value_format", "../../../../etc/passwd", "debezium-schema"),
        ("value_format", "Debezium-Schema", "debezium-schema"),
        ("value_format", "debezium-schema ", "debezium-schema"),
        ("key_format", "json-schema\"}", "json-schema"),
        ("key_format", "avro", "json-schema"),
    ] {
        let json =
            serde_json::json!({"server": "events", "value_format": "debezium-schema", option: v})
                .to_string()
                .replace('\'', "''");
        let sql = format!("SELECT tide.create_pipeline('k', 'kafka', '{json}')");
        cases.push(("mallory", option, sql.clone(), "22023", hint));
        cases.push(("nobody", option, sql, "42501", ""));
    }
    all_refused(&c, &marker, &cases);
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.pipelines"),
        0,
        "no pipeline was created"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// 5. Exactly-once delivery (issue 47): a pipeline's `transactional.id` is pg_tide's
/// (`pg_tide-<system identifier>-<database OID>-<pipeline>`). A role that could set it could
/// initialise another role's pipeline's transactional id and so fence that pipeline (it pauses)
/// and abort its open transaction: the property is refused everywhere, under both spellings, for
/// every role, superusers included (22023, the hint says why). `delivery` takes its two values
/// only (22023, the hint names them); `transaction.timeout.ms` is tuning (it reaches librdkafka:
/// 08001 from the broker that never answers).
#[test]
fn kafka_transactional_id_is_pg_tides() {
    let c = secured("sec_kafka_txn");
    kafka_roles(&c);
    let dir = scratch("txn");
    let marker = dir.join("never");
    // The id alice's pipeline `shop` would have: exactly what an attacker would aim at.
    let victim: String = c.query_scalar(
        "SELECT 'pg_tide-' || system_identifier || '-' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '-shop' FROM pg_control_system()",
    );
    let mut cases = Vec::new();
    for name in ["transactional.id", "transactional_id"] {
        for (what, sql) in paths(name, &victim) {
            for role in ["mallory", "postgres"] {
                if role == "postgres" && what.contains("ALTER SERVER") {
                    continue; // mallory's own server
                }
                cases.push((
                    role,
                    what,
                    sql.clone(),
                    "22023",
                    "fence another role's pipeline",
                ));
            }
        }
    }
    for bad in [
        r#""exactly_once""#,
        r#""none""#,
        r#""""#,
        r#""EXACTLY-ONCE""#,
    ] {
        cases.push((
            "mallory",
            "delivery option",
            format!("SELECT tide.create_pipeline('k', 'kafka', '{{\"server\": \"events\", \"delivery\": {bad}}}')"),
            "22023",
            "at-least-once",
        ));
    }
    cases.push((
        "mallory",
        "delivery option (not a string)",
        "SELECT tide.create_pipeline('k', 'kafka', '{\"server\": \"events\", \"delivery\": 1}')"
            .to_string(),
        "22023",
        "delivery",
    ));
    all_refused(&c, &marker, &cases);
    // Tuning passes the allow-list and reaches librdkafka (which then finds no broker).
    for delivery in ["exactly-once", "at-least-once"] {
        let sql = format!(
            "SELECT tide.create_pipeline('k', 'kafka', '{{\"server\": \"events\", \"delivery\": \"{delivery}\", \"producer\": {{\"transaction.timeout.ms\": 60000}}}}')"
        );
        let e = expect_fail_with(&sql, exec_as(&c, "mallory", &sql), "08001", None);
        assert!(
            e.message().contains("cannot reach"),
            "{sql}: {}",
            e.message()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
