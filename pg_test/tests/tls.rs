//! TLS to a remote (`'postgres'`) target: the postgres_fdw server's `sslmode`, `sslrootcert`,
//! `sslcert` and `sslkey` options, with libpq's meaning.
//!
//! The test makes its own CA, server certificate (CN and subjectAltName `localhost`) and client
//! certificate with the `openssl` CLI, and a second, unrelated CA. The target cluster runs with
//! `ssl = on` and a pg_hba.conf under which the roles pg_tide connects as may only come in over
//! TLS (`hostssl`; no `host` line matches them), so every connection that works is encrypted;
//! `pg_stat_ssl` at the target confirms it for the pipelines' connections.
//!
//! What is checked:
//! 1. `verify-full` + `sslrootcert` with host `localhost`: rows stream, over TLS;
//! 2. `verify-ca` with host `127.0.0.1` (not a name in the certificate) works; `verify-full` with
//!    that host is refused by `tide.create_pipeline` (SQLSTATE 08001) with a hint; `add_table`
//!    checks the server again (HV000 once the server's root certificate is another CA's);
//! 3. a root certificate of another CA fails verification (08001, with a hint);
//! 4. `require` without a root certificate connects encrypted;
//! 5. a client certificate (`sslcert`/`sslkey`) authenticates under pg_hba's `cert` method;
//! 6. a missing `sslrootcert` file and `sslmode=disable` (refused by the target) are errors.
//!
//! Needs pg_tide installed into the PostgreSQL of `TIDE_PG_BIN` and the `openssl` CLI.

use pg_test::*;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Run `sql`, which must fail with `code` ([`expect_fail`]), its message containing each of
/// `message` and its hint each of `hint`.
#[track_caller]
fn expect_refused(c: &Cluster, sql: &str, code: &str, message: &[&str], hint: &[&str]) {
    let db = expect_fail(c, sql, code, None);
    for m in message {
        assert!(
            db.message().contains(m),
            "{sql}: the message does not say {m:?}: {}",
            db.message()
        );
    }
    let got = db.hint().unwrap_or_default();
    for h in hint {
        assert!(
            got.contains(h),
            "{sql}: the hint does not say {h:?}: {got:?}"
        );
    }
}

/// Run a command; panic with its output if it fails.
fn run(cmd: &mut Command) {
    run_ok(cmd);
}

/// The certificates and keys of the test, in a directory the `postgres` OS user can read.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// A self-signed CA: `<name>.crt`, `<name>.key`.
    fn ca(&self, name: &str, cn: &str) {
        run(Command::new("openssl")
            .current_dir(&self.dir)
            .args(["req", "-x509", "-new", "-nodes", "-newkey", "ec"])
            .args(["-pkeyopt", "ec_paramgen_curve:prime256v1", "-days", "2"])
            .args([
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
            ])
            .args(["-subj", &format!("/CN={cn}")])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]));
    }

    /// A certificate `<name>.crt` (key `<name>.key`) for `cn`, signed by the CA `ca`, with the
    /// extensions `ext` (one per line).
    fn leaf(&self, name: &str, cn: &str, ca: &str, serial: u32, ext: &str) {
        std::fs::write(self.dir.join(format!("{name}.ext")), ext).expect("write the extensions");
        run(Command::new("openssl")
            .current_dir(&self.dir)
            .args(["req", "-new", "-nodes", "-newkey", "ec"])
            .args(["-pkeyopt", "ec_paramgen_curve:prime256v1"])
            .args([
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ])
            .args(["-subj", &format!("/CN={cn}")]));
        run(Command::new("openssl")
            .current_dir(&self.dir)
            .args(["x509", "-req", "-days", "2", "-in", &format!("{name}.csr")])
            .args(["-CA", &format!("{ca}.crt"), "-CAkey", &format!("{ca}.key")])
            .args(["-set_serial", &serial.to_string()])
            .args(["-extfile", &format!("{name}.ext")])
            .args(["-out", &format!("{name}.crt")]));
    }

    /// Make the files readable by the `postgres` OS user: keys 0600 and owned by postgres
    /// (as both the server and libpq demand), everything else 0644.
    fn hand_over(&self) {
        for entry in std::fs::read_dir(&self.dir).expect("read the PKI directory") {
            let path = entry.expect("a directory entry").path();
            let name = path.display().to_string();
            if name.ends_with(".key") {
                run(Command::new("chown").args(["postgres:", &name]));
                run(Command::new("chmod").args(["0600", &name]));
            } else {
                run(Command::new("chmod").args(["0644", &name]));
            }
        }
        run(Command::new("chmod").args(["0755", &self.dir.display().to_string()]));
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// The test's PKI: `ca` (signs `server`, CN/SAN localhost, and `client`, CN tide_cert) and an
/// unrelated `other_ca`.
fn make_pki() -> Pki {
    let dir = std::env::temp_dir().join(format!(
        "pg_tide_tls_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the PKI directory");
    let pki = Pki { dir };
    pki.ca("ca", "pg_tide test CA");
    pki.ca("other_ca", "pg_tide other test CA");
    pki.leaf(
        "server",
        "localhost",
        "ca",
        2,
        "subjectAltName=DNS:localhost\nbasicConstraints=critical,CA:FALSE\n\
         keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    );
    pki.leaf(
        "client",
        "tide_cert",
        "ca",
        3,
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n\
         extendedKeyUsage=clientAuth\n",
    );
    // The target's pg_hba.conf: postgres (the test's own sessions) in clear text; tide_tls
    // only over TLS (trust), tide_cert only over TLS with a client certificate.
    std::fs::write(
        pki.dir.join("pg_hba.conf"),
        "local all all trust\n\
         host all postgres 127.0.0.1/32 trust\n\
         hostssl all tide_tls 127.0.0.1/32 trust\n\
         hostssl all tide_cert 127.0.0.1/32 cert\n",
    )
    .expect("write pg_hba.conf");
    pki.hand_over();
    pki
}

/// On `c`: a postgres_fdw server `name` with the given options (host, sslmode, ...) for the
/// target's port, and a user mapping for postgres as `user`.
fn server(c: &Cluster, name: &str, tgt: &Cluster, user: &str, options: &[(&str, &str)]) {
    let mut opts = vec![
        format!("port '{}'", tgt.port()),
        "dbname 'postgres'".to_string(),
    ];
    opts.extend(options.iter().map(|(k, v)| format!("{k} '{v}'")));
    exec(
        c,
        &format!(
            "CREATE SERVER {name} FOREIGN DATA WRAPPER postgres_fdw OPTIONS ({});
             CREATE USER MAPPING FOR postgres SERVER {name} OPTIONS (user '{user}');",
            opts.join(", ")
        ),
    );
}

/// A pipeline `name` to server `srv` (remote schema `name`) capturing `items`, caught up.
fn stream_items(c: &Cluster, name: &str, srv: &str) {
    exec(
        c,
        &format!(
            r#"SELECT tide.create_pipeline('{name}', 'postgres', '{{"server": "{srv}", "schema": "{name}"}}');
               SELECT tide.add_table('{name}', 'items');"#
        ),
    );
    wait_for_backfill(c, "items", Some(name), 60, || diag(c));
    wait_for_pipeline(c, name, 60, || diag(c));
}

/// At the target: the rows of `<schema>.items`, and whether the pipeline's connection (its
/// application_name is "pg_tide <pipeline>") is encrypted, as pg_stat_ssl says.
fn check_target(c: &Cluster, t: &Cluster, pipeline: &str, rows: i64) {
    let n: i64 = t.query_scalar(&format!("SELECT count(*) FROM {pipeline}.items"));
    assert_eq!(n, rows, "rows at the target for {pipeline}\n{}", diag(c));
    let ssl: Vec<(bool, String)> = t
        .query(&format!(
            "SELECT s.ssl, coalesce(s.version, '') FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
              WHERE a.application_name = 'pg_tide {pipeline}'"
        ))
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert!(
        !ssl.is_empty() && ssl.iter().all(|(on, _)| *on),
        "the connection of pipeline {pipeline} is not encrypted: {ssl:?}"
    );
    eprintln!("  {pipeline}: {n} rows at the target, connection over {ssl:?}");
}

#[test]
fn tls_to_remote_targets() {
    let started = Instant::now();
    let pki = make_pki();
    let c = setup("tls_src");
    let t = start_cluster(
        Cluster::builder("tls_tgt")
            .no_preload()
            .conf("ssl = on")
            .conf(&format!("ssl_cert_file = '{}'", pki.path("server.crt")))
            .conf(&format!("ssl_key_file = '{}'", pki.path("server.key")))
            .conf(&format!("ssl_ca_file = '{}'", pki.path("ca.crt")))
            .conf(&format!("hba_file = '{}'", pki.path("pg_hba.conf"))),
    );
    t.execute(
        "CREATE ROLE tide_tls LOGIN SUPERUSER;
         CREATE ROLE tide_cert LOGIN SUPERUSER;",
    );
    c.execute(
        "CREATE EXTENSION postgres_fdw;
         CREATE TABLE items (id int PRIMARY KEY, v text);
         INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 100) g;",
    );
    let ca = pki.path("ca.crt");

    // 0. The target refuses tide_tls in clear text: whatever works below is encrypted.
    server(
        &c,
        "s_clear",
        &t,
        "tide_tls",
        &[("host", "127.0.0.1"), ("sslmode", "disable")],
    );
    let db = expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('p_clear', 'postgres', '{"server": "s_clear"}')"#,
        "08001",
        None,
    );
    assert!(
        db.message().contains("no encryption") || db.message().contains("pg_hba.conf"),
        "{}",
        db.message()
    );

    // 1. verify-full with the name the certificate has.
    server(
        &c,
        "s_full",
        &t,
        "tide_tls",
        &[
            ("host", "localhost"),
            ("sslmode", "verify-full"),
            ("sslrootcert", &ca),
        ],
    );
    stream_items(&c, "p_full", "s_full");

    // 2. verify-ca does not check the host name; verify-full does.
    server(
        &c,
        "s_ca_ip",
        &t,
        "tide_tls",
        &[
            ("host", "127.0.0.1"),
            ("sslmode", "verify-ca"),
            ("sslrootcert", &ca),
        ],
    );
    stream_items(&c, "p_ca", "s_ca_ip");
    server(
        &c,
        "s_full_ip",
        &t,
        "tide_tls",
        &[
            ("host", "127.0.0.1"),
            ("sslmode", "verify-full"),
            ("sslrootcert", &ca),
        ],
    );
    // The error says that the certificate does not match the host.
    expect_refused(
        &c,
        r#"SELECT tide.create_pipeline('p_full_ip', 'postgres', '{"server": "s_full_ip"}')"#,
        "08001",
        &["127.0.0.1", "certificate"],
        &["verify-ca", "subjectAltName"],
    );

    // add_table checks the server again: with another CA's root certificate it fails too.
    exec(
        &c,
        &format!(
            "CREATE TABLE more (id int PRIMARY KEY);
             ALTER SERVER s_ca_ip OPTIONS (SET sslrootcert '{}');",
            pki.path("other_ca.crt")
        ),
    );
    expect_refused(
        &c,
        "SELECT tide.add_table('p_ca', 'more')",
        "HV000",
        &["certificate verify failed"],
        &["other_ca.crt"],
    );
    exec(
        &c,
        &format!("ALTER SERVER s_ca_ip OPTIONS (SET sslrootcert '{ca}')"),
    );

    // 3. A root certificate of another CA.
    server(
        &c,
        "s_wrong_ca",
        &t,
        "tide_tls",
        &[
            ("host", "localhost"),
            ("sslmode", "verify-full"),
            ("sslrootcert", &pki.path("other_ca.crt")),
        ],
    );
    expect_refused(
        &c,
        r#"SELECT tide.create_pipeline('p_wrong_ca', 'postgres', '{"server": "s_wrong_ca"}')"#,
        "08001",
        &["certificate verify failed"],
        &["sslrootcert", "other_ca.crt"],
    );

    // 4. require: encrypted, nothing verified.
    server(
        &c,
        "s_req",
        &t,
        "tide_tls",
        &[("host", "127.0.0.1"), ("sslmode", "require")],
    );
    stream_items(&c, "p_req", "s_req");

    // 5. A client certificate for pg_hba's cert method.
    exec(
        &c,
        &format!(
            "CREATE SERVER s_cert FOREIGN DATA WRAPPER postgres_fdw
                    OPTIONS (host 'localhost', port '{}', dbname 'postgres', sslmode 'verify-full', sslrootcert '{ca}');
             CREATE USER MAPPING FOR postgres SERVER s_cert
                    OPTIONS (user 'tide_cert', sslcert '{}', sslkey '{}');",
            t.port(),
            pki.path("client.crt"),
            pki.path("client.key")
        ),
    );
    stream_items(&c, "p_cert", "s_cert");

    // 6. A root certificate file that does not exist.
    server(
        &c,
        "s_no_file",
        &t,
        "tide_tls",
        &[
            ("host", "localhost"),
            ("sslmode", "verify-ca"),
            ("sslrootcert", "/nonexistent/root.crt"),
        ],
    );
    expect_refused(
        &c,
        r#"SELECT tide.create_pipeline('p_no_file', 'postgres', '{"server": "s_no_file"}')"#,
        "08001",
        &["/nonexistent/root.crt"],
        &["sslrootcert"],
    );

    // Changes after the backfill stream too, over the same encrypted connections.
    c.execute("INSERT INTO items SELECT g, 'v' || g FROM generate_series(101, 150) g");
    for p in ["p_full", "p_ca", "p_req", "p_cert"] {
        wait_for_pipeline(&c, p, 60, || diag(&c));
        check_target(&c, &t, p, 150);
    }
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.pipeline"),
        4,
        "a refused pipeline was created\n{}",
        diag(&c)
    );
    eprintln!("tls_to_remote_targets: {:.1?}", started.elapsed());
}
