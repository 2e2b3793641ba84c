//! The remote sink against a real server (`TIDE_REMOTE_TEST_CONNINFO`), and its pure parts.

use super::*;

fn opts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn conninfo_quotes_values() {
    let s = conninfo_from_options(&opts(&[
        ("host", "db.example.com"),
        ("port", "5433"),
        ("password", r"it's a \secret"),
        ("dbname", ""),
        ("user", "a b"),
    ]));
    assert_eq!(
        s,
        r"host='db.example.com' port='5433' password='it\'s a \\secret' dbname='' user='a b'"
    );
    let parsed = parse_conninfo(&s).unwrap();
    assert_eq!(
        parsed,
        opts(&[
            ("host", "db.example.com"),
            ("port", "5433"),
            ("password", r"it's a \secret"),
            ("dbname", ""),
            ("user", "a b"),
        ])
    );
    // The client's own parser reads the same values.
    let config = Config::from_str(&s).unwrap();
    assert_eq!(config.get_password(), Some(r"it's a \secret".as_bytes()));
    assert_eq!(config.get_user(), Some("a b"));
    assert_eq!(config.get_dbname(), Some(""));
}

#[test]
fn conninfo_drops_fdw_only_options_and_dedupes() {
    let s = conninfo_from_options(&opts(&[
        ("host", "h1"),
        ("use_remote_estimate", "true"),
        ("fetch_size", "1000"),
        ("updatable", "false"),
        ("truncatable", "false"),
        ("extensions", "hstore"),
        ("async_capable", "true"),
        ("batch_size", "10"),
        ("keep_connections", "on"),
        ("parallel_commit", "on"),
        ("password_required", "false"),
        ("user", "server_user"),
        ("sslmode", "disable"),
        ("user", "mapped_user"),
        ("password", "pw"),
    ]));
    assert_eq!(
        s,
        "host='h1' user='mapped_user' sslmode='disable' password='pw'"
    );
    assert_eq!(conninfo_from_options(&[]), "");
}

#[test]
fn parse_conninfo_accepts_libpq_syntax() {
    assert_eq!(
        parse_conninfo("  host = h  port=5432 password='a\\'b c' x=\\ y ").unwrap(),
        opts(&[
            ("host", "h"),
            ("port", "5432"),
            ("password", "a'b c"),
            ("x", " y")
        ])
    );
    assert!(parse_conninfo("host").is_err());
    assert!(parse_conninfo("host=").is_err());
    assert!(parse_conninfo("password='abc").is_err());
    assert_eq!(parse_conninfo("").unwrap(), vec![]);
}

#[test]
fn build_config_applies_defaults_and_takes_tls_options() {
    let t = build_config(
        "host=h dbname=d user=u keepalives_count=7 sslmode=prefer",
        "app",
    )
    .unwrap();
    let c = &t.config;
    assert_eq!(c.get_connect_timeout(), Some(&DEFAULT_CONNECT_TIMEOUT));
    assert!(c.get_keepalives());
    assert_eq!(c.get_keepalives_idle(), DEFAULT_KEEPALIVES_IDLE);
    assert_eq!(c.get_keepalives_retries(), Some(7));
    assert_eq!(c.get_tcp_user_timeout(), Some(&DEFAULT_TCP_USER_TIMEOUT));
    assert_eq!(c.get_application_name(), Some("app"));
    assert_eq!(c.get_ssl_mode(), SslMode::Prefer);
    assert_eq!(t.tls.mode, tls::SslMode::Prefer);

    let t = build_config(
        "host=h connect_timeout=9 keepalives_idle=11 application_name=mine sslrootcert=/x \
         client_encoding=UTF8 host=h2",
        "",
    )
    .unwrap();
    let c = &t.config;
    assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(9)));
    assert_eq!(c.get_keepalives_idle(), Duration::from_secs(11));
    assert_eq!(c.get_application_name(), Some("mine"));
    assert_eq!(c.get_hosts().len(), 1, "last host wins");
    assert_eq!(t.tls.mode, tls::SslMode::Prefer, "libpq's default sslmode");

    // Every sslmode, and the client's mode for the first attempt.
    for (conninfo, mode, client) in [
        (
            "host=h sslmode=disable",
            tls::SslMode::Disable,
            SslMode::Disable,
        ),
        (
            "host=h sslmode=allow",
            tls::SslMode::Allow,
            SslMode::Disable,
        ),
        (
            "host=h sslmode=require",
            tls::SslMode::Require,
            SslMode::Require,
        ),
        (
            "host=h sslmode=verify-ca sslrootcert=/ca.crt",
            tls::SslMode::VerifyCa,
            SslMode::Require,
        ),
        (
            "host=h sslmode=verify-full sslcert=/c sslkey=/k",
            tls::SslMode::VerifyFull,
            SslMode::Require,
        ),
        (
            "host=h sslrootcert=system",
            tls::SslMode::VerifyFull,
            SslMode::Require,
        ),
        (
            "postgresql://h/db?sslmode=require",
            tls::SslMode::Require,
            SslMode::Require,
        ),
        // Unix-domain sockets never use TLS.
        (
            "host=/var/run/postgresql sslmode=verify-full",
            tls::SslMode::Disable,
            SslMode::Disable,
        ),
    ] {
        let t = build_config(conninfo, "a").unwrap_or_else(|e| panic!("{conninfo}: {e:?}"));
        assert_eq!(t.tls.mode, mode, "{conninfo}");
        assert_eq!(t.config.get_ssl_mode(), client, "{conninfo}");
    }
    // hostaddr alone: its address is the name for the handshake; verify-full refuses it.
    let t = build_config("hostaddr=127.0.0.1 sslmode=require", "a").unwrap();
    assert_eq!(t.config.get_hosts().len(), 1);
    let e = build_config("hostaddr=127.0.0.1 sslmode=verify-full", "a").unwrap_err();
    assert!(!e.transient && e.hint.is_some(), "{e:?}");

    for bad in [
        "host=h sslmode=bogus",
        "host=h sslmode=require sslrootcert=system",
        "host=h sslcertmode=require",
        "host=h ssl_min_protocol_version=TLSv9",
        "host=h service=foo",
        "host=h no_such_option=1",
        "host=h port=notanumber",
        "postgresql://h/db?sslmode=verify-full",
        "host='unterminated",
    ] {
        let e = build_config(bad, "app").unwrap_err();
        assert!(!e.transient, "{bad}: {e:?}");
    }
    let e = build_config("host=h sslmode=bogus", "a").unwrap_err();
    assert!(e.hint.is_some());
    assert!(build_config("postgresql://u@h:5433/db", "a").is_ok());
}

#[test]
fn password_probe_config() {
    let t = build_config_for(
        "host=127.0.0.1,/tmp port=5432,5433 user=u password='p w' dbname=d options='-c x=1'",
        "app",
        true,
    )
    .unwrap();
    let probe = t.probe.as_ref().expect("a probe");
    assert_eq!(probe.password, "p w");
    assert_eq!(probe.application_name, "app");
    let keys: Vec<&str> = probe.keywords.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["user", "dbname", "options"]);
    // Never the password in Debug output.
    assert!(!format!("{probe:?}").contains("p w"));
    // One endpoint per host, each TCP host resolved, ports paired.
    let eps = endpoints(&t.config).unwrap();
    assert_eq!(eps.len(), 2, "{eps:?}");
    assert_eq!(eps[0].addr, Some("127.0.0.1".parse().unwrap()));
    assert_eq!(eps[0].port, 5432);
    assert!(matches!(&eps[1].host, Host::Unix(_)) && eps[1].addr.is_none());
    assert_eq!(eps[1].port, 5433);
    // Each endpoint's configurations: the probe's without password and options.
    let probe_config = endpoint_config(&t, probe, &eps[0], false).unwrap();
    assert!(probe_config.get_password().is_none());
    assert!(probe_config.get_options().is_none());
    assert_eq!(
        probe_config.get_application_name(),
        Some(PROBE_APPLICATION_NAME)
    );
    assert_eq!(
        probe_config.get_hostaddrs(),
        ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    let config = endpoint_config(&t, probe, &eps[0], true).unwrap();
    assert_eq!(config.get_password(), Some("p w".as_bytes()));
    assert_eq!(config.get_options(), Some("-c x=1"));
    assert_eq!(config.get_user(), Some("u"));
    assert_eq!(config.get_dbname(), Some("d"));
    assert_eq!(config.get_ports(), [5432]);
    // Without a probe, nothing changes; a URI cannot be probed.
    assert!(build_config_for("host=h user=u password=p", "a", false)
        .unwrap()
        .probe
        .is_none());
    assert!(build_config_for("postgresql://u:p@h/db", "a", true).is_err());
    // localhost resolves to at least one address.
    let t = build_config_for("host=localhost user=u password=p", "a", true).unwrap();
    assert!(!endpoints(&t.config).unwrap().is_empty());
}

/// The test server trusts its user: a connection that must use its password is refused,
/// "password is required" (2F003), before anything runs; one that need not works.
#[test]
fn password_the_server_does_not_ask_for_is_refused() {
    let conninfo = format!("{} password='not used'", test_conninfo());
    let sink = RemoteSink::start_with(
        RemoteAccess {
            conninfo: conninfo.clone(),
            probe_password: true,
        },
        "pg_tide test",
    );
    let e = sink
        .query("SELECT 1::text", vec![], T)
        .expect_err("a trusting server is refused");
    let own = e.own.as_deref().expect("an error of the sink's own");
    assert_eq!(own.sqlstate, PASSWORD_REQUIRED, "{e:?}");
    assert_eq!(e.message, "password is required");
    assert!(own.detail.contains("did not ask for the password"), "{e:?}");
    assert!(!e.transient && e.hint.is_some());
    let sink = RemoteSink::start_with(
        RemoteAccess {
            conninfo,
            probe_password: false,
        },
        "pg_tide test",
    );
    assert!(sink.query("SELECT 1::text", vec![], T).is_ok());
}

#[test]
fn transient_classification() {
    for code in [
        None,
        Some("08000"),
        Some("08006"),
        Some("08001"),
        Some("57P01"),
        Some("57P02"),
        Some("57P03"),
        Some("40001"),
        Some("40P01"),
        Some("53300"),
        Some("57014"),
    ] {
        assert!(is_transient(code), "{code:?}");
    }
    for code in [
        "42P01", "23505", "42501", "28P01", "3D000", "22P02", "0A000", "42601",
    ] {
        assert!(!is_transient(Some(code)), "{code}");
    }
    assert!(is_stale_plan(
        "0A000",
        "cached plan must not change result type"
    ));
    assert!(!is_stale_plan("0A000", "something else"));
    assert!(is_client_side_permanent("invalid configuration"));
    assert!(is_client_side_permanent("error serializing parameter 0"));
    assert!(!is_client_side_permanent("error connecting to server"));
    assert!(!is_client_side_permanent("connection closed"));
    assert!(!is_client_side_permanent(
        "error communicating with the server"
    ));
}

#[test]
fn binary_values_render_as_postgres_text() {
    let uuid = [
        0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd,
        0xef,
    ];
    assert_eq!(
        text_of(&Type::UUID, &uuid).unwrap(),
        "12345678-9abc-def0-0123-456789abcdef"
    );
    assert_eq!(
        text_of(&Type::BYTEA, &[0xde, 0xad, 0x01]).unwrap(),
        "\\xdead01"
    );
    assert_eq!(
        text_of(&Type::JSONB, b"\x01{\"a\": 1}").unwrap(),
        "{\"a\": 1}"
    );
    assert_eq!(text_of(&Type::JSON, b"[1]").unwrap(), "[1]");
    assert_eq!(text_of(&Type::BOOL, &[1]).unwrap(), "t");
    assert_eq!(text_of(&Type::BOOL, &[0]).unwrap(), "f");
    assert_eq!(text_of(&Type::INT8, &(-5i64).to_be_bytes()).unwrap(), "-5");
    assert_eq!(text_of(&Type::INT2, &7i16.to_be_bytes()).unwrap(), "7");
    assert_eq!(
        text_of(&Type::PG_LSN, &0x0000_0001_0000_00A0u64.to_be_bytes()).unwrap(),
        "1/A0"
    );
    assert_eq!(text_of(&Type::TEXT, b"hi").unwrap(), "hi");
    assert!(readable(&Type::VARCHAR) && readable(&Type::NAME) && readable(&Type::OID));
    assert!(!readable(&Type::NUMERIC) && !readable(&Type::TIMESTAMPTZ));
}

#[test]
fn closed_port_fails_fast_and_transient() {
    let mut sink = RemoteSink::start(
        "host=127.0.0.1 port=1 user=nobody dbname=nothing connect_timeout=3".into(),
        "tide-test",
    );
    let started = Instant::now();
    let e = sink
        .query("SELECT 1", vec![], Duration::from_secs(10))
        .unwrap_err();
    assert!(e.transient, "{e:?}");
    assert!(e.sqlstate.is_none());
    assert!(e.message.contains("could not connect"), "{}", e.message);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let e = sink
        .transaction(
            vec![RemoteStatement {
                sql: "SELECT 1".into(),
                params: vec![],
            }],
            Duration::from_secs(10),
        )
        .unwrap_err();
    assert!(e.transient);
    assert!(!sink.connected());
    let started = Instant::now();
    assert!(sink.shutdown(STOP_WAIT), "the sink thread did not exit");
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn bad_conninfo_is_reported_by_the_first_request() {
    let sink = RemoteSink::start("host=h sslmode=verify-fully".into(), "tide-test");
    let e = sink
        .query("SELECT 1", vec![], Duration::from_secs(5))
        .unwrap_err();
    assert!(!e.transient);
    assert!(e.message.contains("sslmode"), "{}", e.message);
}

#[test]
fn unreadable_tls_file_is_reported_before_connecting() {
    // Port 1: nothing listens; the root certificate is read first and fails.
    let sink = RemoteSink::start(
        "host=127.0.0.1 port=1 sslmode=verify-ca sslrootcert=/nonexistent/ca.crt".into(),
        "tide-test",
    );
    let e = sink
        .query("SELECT 1", vec![], Duration::from_secs(5))
        .unwrap_err();
    assert!(!e.transient, "{e:?}");
    assert!(e.message.contains("/nonexistent/ca.crt"), "{}", e.message);
    assert!(
        e.hint
            .as_deref()
            .is_some_and(|h| h.contains("operating system user")),
        "{e:?}"
    );
}

#[test]
fn unresponsive_server_times_out_without_blocking_the_caller() {
    // A listener that accepts TCP connections but never speaks the protocol.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sink = RemoteSink::start(
        format!("host=127.0.0.1 port={port} user=u dbname=d sslmode=disable"),
        "tide-test",
    );
    let started = Instant::now();
    let e = sink
        .query("SELECT 1", vec![], Duration::from_millis(300))
        .unwrap_err();
    assert!(e.transient && e.message.contains("did not answer"), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(1));
    // The thread is stuck in the startup handshake: the next request is queued and times
    // out, the one after fails at once as busy; nothing blocks the caller.
    let e = sink
        .query("SELECT 1", vec![], Duration::from_millis(100))
        .unwrap_err();
    assert!(e.transient, "{e:?}");
    let started = Instant::now();
    let e = sink
        .query("SELECT 1", vec![], Duration::from_millis(100))
        .unwrap_err();
    assert!(e.transient && e.message.contains("busy"), "{e:?}");
    assert!(started.elapsed() < Duration::from_millis(50));
    // Closing the listener breaks the hung connection; the thread then exits on drop.
    drop(listener);
    let started = Instant::now();
    drop(sink);
    assert!(started.elapsed() <= STOP_WAIT + Duration::from_millis(500));
}

/// The conninfo of a scratch server for the integration tests (`scripts/test.sh pgrx` starts
/// one and sets it; without it these tests fail, they are not skipped).
fn test_conninfo() -> String {
    match std::env::var("TIDE_REMOTE_TEST_CONNINFO") {
        Ok(s) if !s.is_empty() => s,
        _ => panic!(
            "cannot run: TIDE_REMOTE_TEST_CONNINFO is not set; scripts/test.sh pgrx sets it (e.g. \
             'host=127.0.0.1 port=55999 user=postgres dbname=postgres sslmode=disable') \
             to run the remote sink integration tests"
        ),
    }
}

fn stmt(sql: &str, params: &[Option<&str>]) -> RemoteStatement {
    RemoteStatement {
        sql: sql.to_string(),
        params: params.iter().map(|p| p.map(str::to_string)).collect(),
    }
}

const T: Duration = Duration::from_secs(10);

#[test]
fn remote_transactions_commit_and_roll_back() {
    let ci = test_conninfo();
    let sink = RemoteSink::start(ci, "tide-test-tx");
    sink.query("DROP TABLE IF EXISTS tide_sink_t", vec![], T)
        .unwrap();
    sink.query(
        "CREATE TABLE tide_sink_t (id int PRIMARY KEY, doc jsonb, note text)",
        vec![],
        T,
    )
    .unwrap();
    assert!(sink.connected());
    // Commit, with array parameters and RETURNING.
    let out = sink
        .transaction(
            vec![
                stmt(
                    "INSERT INTO tide_sink_t SELECT * FROM unnest($1::int[], $2::jsonb[], \
                     $3::text[]) RETURNING id::text, doc, note",
                    &[
                        Some("{1,2}"),
                        Some(r#"{"{\"a\": 1}","{\"b\": \"x y\"}"}"#),
                        Some("{NULL,it's}"),
                    ],
                ),
                stmt(
                    "SELECT count(*), bool_and(id > 0), $1 FROM tide_sink_t",
                    &[None],
                ),
            ],
            T,
        )
        .unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(
        out[0],
        vec![
            vec![Some("1".into()), Some(r#"{"a": 1}"#.into()), None],
            vec![
                Some("2".into()),
                Some(r#"{"b": "x y"}"#.into()),
                Some("it's".into())
            ],
        ]
    );
    assert_eq!(out[1], vec![vec![Some("2".into()), Some("t".into()), None]]);
    // Rollback: the second statement fails, the first leaves nothing.
    let e = sink
        .transaction(
            vec![
                stmt("INSERT INTO tide_sink_t VALUES (3, NULL, 'x')", &[]),
                stmt("INSERT INTO tide_sink_t VALUES ($1::int)", &[Some("1")]),
            ],
            T,
        )
        .unwrap_err();
    assert!(!e.transient, "{e:?}");
    assert_eq!(e.sqlstate.as_deref(), Some("23505"));
    assert!(e.message.contains("detail"), "{}", e.message);
    let e = sink
        .transaction(
            vec![
                stmt("INSERT INTO tide_sink_t VALUES (4)", &[]),
                stmt("SELECT * FROM no_such_table", &[]),
            ],
            T,
        )
        .unwrap_err();
    assert_eq!(e.sqlstate.as_deref(), Some("42P01"));
    let rows = sink
        .query(
            "SELECT string_agg(id::text, ',' ORDER BY id) FROM tide_sink_t",
            vec![],
            T,
        )
        .unwrap();
    assert_eq!(rows, vec![vec![Some("1,2".into())]]);
    // Non-text columns are refused before running, without breaking the connection.
    let e = sink.query("SELECT 1.5::numeric", vec![], T).unwrap_err();
    assert!(!e.transient && e.hint.is_some(), "{e:?}");
    let rows = sink
        .query(
            "SELECT 1.5::numeric::text, '0/16B3748'::pg_lsn, 42::oid, NULL::int",
            vec![],
            T,
        )
        .unwrap();
    assert_eq!(
        rows,
        vec![vec![
            Some("1.5".into()),
            Some("0/16B3748".into()),
            Some("42".into()),
            None
        ]]
    );
    // A parameter typed by context must be cast.
    let e = sink
        .query("SELECT 1 WHERE 1 = $1", vec![Some("1".into())], T)
        .unwrap_err();
    assert_eq!(e.sqlstate.as_deref(), Some("42883"));
    sink.query("DROP TABLE tide_sink_t", vec![], T).unwrap();
}

/// Steps with simple-protocol SQL and `COPY ... FROM STDIN`: the copied text reads back exactly
/// (escapes, NULL, empty, the text `\N`); a COPY whose data the server refuses rolls back the
/// whole transaction and leaves the connection usable; so does a statement failing after a COPY.
#[test]
fn remote_copy_steps_commit_and_roll_back() {
    let ci = test_conninfo();
    let sink = RemoteSink::start(ci, "tide-test-copy");
    sink.query("DROP TABLE IF EXISTS tide_sink_c", vec![], T)
        .unwrap();
    sink.query(
        "CREATE TABLE tide_sink_c (id int PRIMARY KEY, s text, j jsonb)",
        vec![],
        T,
    )
    .unwrap();
    let values: Vec<Option<&str>> = vec![
        Some("tab\there"),
        Some("new\nline\r"),
        Some("\\N"),
        Some(""),
        None,
        Some("\\."),
        Some("back\\slash"),
    ];
    let mut data = String::new();
    for (i, v) in values.iter().enumerate() {
        tide_core::copy::push_row(&mut data, [Some(i.to_string().as_str()), *v, Some("null")]);
    }
    let copy = |data: String| RemoteStep::CopyIn {
        sql: "COPY pg_temp.stage (id, s, j) FROM STDIN".into(),
        data: data.into_bytes(),
    };
    let out = sink
        .transaction_steps(
            vec![
                RemoteStep::Simple(
                    "CREATE TEMP TABLE stage (id int, s text, j jsonb) ON COMMIT DROP".into(),
                ),
                copy(data.clone()),
                RemoteStep::Simple(
                    "INSERT INTO tide_sink_c SELECT * FROM pg_temp.stage; DROP TABLE pg_temp.stage"
                        .into(),
                ),
                RemoteStep::Statement(stmt("SELECT count(*) FROM tide_sink_c", &[])),
            ],
            T,
        )
        .unwrap();
    assert_eq!(out.len(), 4);
    assert_eq!(out[3], vec![vec![Some(values.len().to_string())]]);
    let rows = sink
        .query("SELECT s, j::text FROM tide_sink_c ORDER BY id", vec![], T)
        .unwrap();
    let want: Vec<Vec<Option<String>>> = values
        .iter()
        .map(|v| vec![v.map(str::to_string), Some("null".into())])
        .collect();
    assert_eq!(rows, want);
    // Refused data (not an int): the whole transaction rolls back, the connection stays.
    let before = sink
        .query("SELECT count(*) FROM tide_sink_c", vec![], T)
        .unwrap();
    let e = sink
        .transaction_steps(
            vec![
                RemoteStep::Statement(stmt("INSERT INTO tide_sink_c VALUES (100, 'x')", &[])),
                RemoteStep::Simple("CREATE TEMP TABLE stage (id int, s text, j jsonb)".into()),
                copy("x\ty\t\\N\n".into()),
            ],
            T,
        )
        .unwrap_err();
    assert_eq!(e.sqlstate.as_deref(), Some("22P02"), "{e:?}");
    // A statement failing after a successful COPY.
    let e = sink
        .transaction_steps(
            vec![
                RemoteStep::Simple("CREATE TEMP TABLE stage (id int, s text, j jsonb)".into()),
                copy("200\ty\t\\N\n".into()),
                RemoteStep::Simple("INSERT INTO tide_sink_c SELECT * FROM pg_temp.stage".into()),
                RemoteStep::Statement(stmt("SELECT * FROM no_such_table", &[])),
            ],
            T,
        )
        .unwrap_err();
    assert_eq!(e.sqlstate.as_deref(), Some("42P01"), "{e:?}");
    assert!(sink.connected());
    let after = sink
        .query("SELECT count(*) FROM tide_sink_c", vec![], T)
        .unwrap();
    assert_eq!(before, after, "nothing of the failed transactions remains");
    let stage = sink
        .query(
            "SELECT count(*) FROM pg_class WHERE relname = 'stage' AND relpersistence = 't'",
            vec![],
            T,
        )
        .unwrap();
    assert_eq!(
        stage,
        vec![vec![Some("0".into())]],
        "the staging tables went with the rollback"
    );
    sink.query("DROP TABLE tide_sink_c", vec![], T).unwrap();
}

/// A chunk goes straight into its table (COPY) when the probe finds its key range empty, and
/// through the staging table's upsert otherwise: a straight COPY over an existing key would
/// fail with a unique violation.
#[test]
fn remote_load_chunk_chooses_by_its_probe() {
    let sink = RemoteSink::start(test_conninfo(), "tide-test-load");
    sink.query("DROP TABLE IF EXISTS tide_sink_l", vec![], T)
        .unwrap();
    sink.query(
        "CREATE TABLE tide_sink_l (id int PRIMARY KEY, s text, extra text DEFAULT 'dflt')",
        vec![],
        T,
    )
    .unwrap();
    let t = tide_core::plan::TableRef {
        schema: "public".into(),
        name: "tide_sink_l".into(),
        key: vec!["id".into()],
    };
    let cols = vec![
        ("id".to_string(), "integer".to_string()),
        ("s".to_string(), "text".to_string()),
    ];
    let load = |lower: Option<&str>, upper: &str, rows: &[(i32, &str)]| {
        let staged = tide_core::plan::staged_upsert(&t, &cols, lower.is_some());
        let mut data = String::new();
        for (id, v) in rows {
            tide_core::copy::push_row(&mut data, [Some(id.to_string().as_str()), Some(*v)]);
        }
        let params = lower
            .into_iter()
            .chain([upper])
            .map(|v| Some(v.to_string()))
            .collect();
        RemoteStep::LoadChunk {
            probe: RemoteStatement {
                sql: staged.probe,
                params,
            },
            direct: staged.direct,
            staged: vec![
                RemoteStep::Simple(staged.create),
                RemoteStep::CopyIn {
                    sql: staged.copy,
                    data: Vec::new(),
                },
                RemoteStep::Simple(staged.upsert),
            ],
            data: data.into_bytes(),
        }
    };
    let rows = |sink: &RemoteSink| {
        sink.query(
            "SELECT id, s, extra FROM tide_sink_l ORDER BY id",
            vec![],
            T,
        )
        .unwrap()
    };
    // An empty range: straight in (the staging table is never made: nothing to drop).
    sink.transaction_steps(vec![load(None, "2", &[(1, "a"), (2, "b")])], T)
        .unwrap();
    // A range that holds key 2: the upsert updates it and keeps the target-only column.
    sink.query(
        "UPDATE tide_sink_l SET extra = 'kept' WHERE id = 2",
        vec![],
        T,
    )
    .unwrap();
    sink.transaction_steps(vec![load(Some("1"), "3", &[(2, "B"), (3, "c")])], T)
        .unwrap();
    let r = |id: &str, s: &str, extra: &str| {
        vec![
            Some(id.to_string()),
            Some(s.to_string()),
            Some(extra.to_string()),
        ]
    };
    assert_eq!(
        rows(&sink),
        vec![
            r("1", "a", "dflt"),
            r("2", "B", "kept"),
            r("3", "c", "dflt")
        ]
    );
    // A probe that wrongly says "empty" (a range that misses key 3): the straight COPY fails
    // with the unique violation the remote backend falls back on.
    let e = sink
        .transaction_steps(vec![load(Some("3"), "4", &[(3, "x"), (4, "d")])], T)
        .unwrap_err();
    assert_eq!(e.sqlstate.as_deref(), Some("23505"), "{e:?}");
    assert_eq!(rows(&sink).len(), 3, "the failed load left nothing");
    sink.query("DROP TABLE tide_sink_l", vec![], T).unwrap();
}

#[test]
fn remote_reconnects_after_terminate_backend() {
    let ci = test_conninfo();
    let sink = RemoteSink::start(ci.clone(), "tide-test-term");
    let pid = sink
        .query("SELECT pg_backend_pid()::text", vec![], T)
        .unwrap();
    let admin = RemoteSink::start(ci, "tide-test-admin");
    let killed = admin
        .query(
            "SELECT pg_terminate_backend($1::int)",
            vec![pid[0][0].clone()],
            T,
        )
        .unwrap();
    assert_eq!(killed, vec![vec![Some("t".into())]]);
    thread::sleep(Duration::from_millis(200));
    // The dead connection is noticed before use and replaced: no error at all.
    let pid2 = sink
        .query("SELECT pg_backend_pid()::text", vec![], T)
        .unwrap();
    assert_ne!(pid, pid2);
    let out = sink
        .transaction(vec![stmt("SELECT $1", &[Some("ok")])], T)
        .unwrap();
    assert_eq!(out, vec![vec![vec![Some("ok".into())]]]);
    // Terminated in the middle of a transaction: transient error, then success.
    let pid3 = pid2[0][0].clone();
    let killer = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        admin.query("SELECT pg_terminate_backend($1::int)", vec![pid3], T)
    });
    let e = sink
        .transaction(vec![stmt("SELECT pg_sleep(2)::text", &[])], T)
        .unwrap_err();
    assert!(e.transient, "{e:?}");
    killer.join().unwrap().unwrap();
    assert!(!sink.connected());
    assert!(sink.query("SELECT 1::text", vec![], T).is_ok());
}

#[test]
fn remote_timeouts_abandon_and_roll_back() {
    let ci = test_conninfo();
    let sink = RemoteSink::start(ci, "tide-test-timeout");
    sink.query("DROP TABLE IF EXISTS tide_sink_to", vec![], T)
        .unwrap();
    sink.query("CREATE TABLE tide_sink_to (id int)", vec![], T)
        .unwrap();
    // A slow query: the caller gets a transient error on time.
    let started = Instant::now();
    let e = sink
        .query(
            "SELECT pg_sleep(5)::text",
            vec![],
            Duration::from_millis(300),
        )
        .unwrap_err();
    assert!(e.transient, "{e:?}");
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    // The next request gets its own answer, not the stale one.
    let rows = sink.query("SELECT 'fresh'", vec![], T).unwrap();
    assert_eq!(rows, vec![vec![Some("fresh".into())]]);
    // A transaction abandoned after its insert is rolled back.
    let e = sink
        .transaction(
            vec![
                stmt("INSERT INTO tide_sink_to VALUES (1)", &[]),
                stmt("SELECT pg_sleep(5)::text", &[]),
            ],
            Duration::from_millis(300),
        )
        .unwrap_err();
    assert!(e.transient, "{e:?}");
    let rows = sink
        .query("SELECT count(*) FROM tide_sink_to", vec![], T)
        .unwrap();
    assert_eq!(rows, vec![vec![Some("0".into())]]);
    // The statement_timeout is the caller's timeout.
    let rows = sink
        .query(
            "SHOW statement_timeout",
            vec![],
            Duration::from_millis(1500),
        )
        .unwrap();
    assert_eq!(rows, vec![vec![Some("1500ms".into())]]);
    sink.query("DROP TABLE tide_sink_to", vec![], T).unwrap();
}

/// A transaction sent in parts ([`RemoteSink::transaction_part`]): nothing is visible until the
/// part that commits; a part continuing a transaction lost with its connection fails (transient)
/// and nothing of the lost one is committed; a first part finding a transaction a failed caller
/// left open rolls that one back, so its rows never commit with the next.
#[test]
fn remote_transaction_in_parts() {
    let ci = test_conninfo();
    let sink = RemoteSink::start(ci.clone(), "tide-test-parts");
    let admin = RemoteSink::start(ci, "tide-test-parts-admin");
    admin
        .query("DROP TABLE IF EXISTS tide_sink_parts", vec![], T)
        .unwrap();
    admin
        .query(
            "CREATE TABLE tide_sink_parts (id int PRIMARY KEY)",
            vec![],
            T,
        )
        .unwrap();
    let count = || -> String {
        admin
            .query("SELECT count(*) FROM tide_sink_parts", vec![], T)
            .unwrap()[0][0]
            .clone()
            .unwrap()
    };
    let insert = |from: i32, to: i32| {
        vec![RemoteStep::Statement(stmt(
            "INSERT INTO tide_sink_parts SELECT generate_series($1::int, $2::int)",
            &[Some(&from.to_string()), Some(&to.to_string())],
        ))]
    };
    let part = |id, continues, commit| Part {
        id,
        continues,
        commit,
    };
    // Three parts, one transaction: invisible until the last commits.
    sink.transaction_part(insert(1, 10), part(1, false, false), T)
        .unwrap();
    sink.transaction_part(insert(11, 20), part(1, true, false), T)
        .unwrap();
    assert_eq!(count(), "0", "an open part is not visible to others");
    sink.transaction_part(insert(21, 30), part(1, true, true), T)
        .unwrap();
    assert_eq!(count(), "30");

    // The connection is lost between two parts: the continuing part fails, nothing committed.
    sink.transaction_part(insert(31, 40), part(2, false, false), T)
        .unwrap();
    let pid = sink
        .query("SELECT pg_backend_pid()::text", vec![], T)
        .unwrap();
    admin
        .query(
            "SELECT pg_terminate_backend($1::int)::text",
            vec![pid[0][0].clone()],
            T,
        )
        .unwrap();
    thread::sleep(Duration::from_millis(200));
    let e = sink
        .transaction_part(insert(41, 50), part(2, true, true), T)
        .unwrap_err();
    // Either the client noticed the closed connection ("lost with its connection") or the
    // first statement met the server's termination message: transient both ways.
    assert!(e.transient, "{e:?}");
    assert_eq!(count(), "30", "nothing of the lost transaction");

    // A caller that failed after a part (it never sends the rest): the next transaction
    // rolls the stale one back first; only its own rows commit.
    sink.transaction_part(insert(51, 60), part(3, false, false), T)
        .unwrap();
    sink.transaction(
        vec![stmt("INSERT INTO tide_sink_parts VALUES (61)", &[])],
        T,
    )
    .unwrap();
    assert_eq!(count(), "31");
    let ids = admin
        .query(
            "SELECT count(*) FILTER (WHERE id BETWEEN 51 AND 60)::text FROM tide_sink_parts",
            vec![],
            T,
        )
        .unwrap();
    assert_eq!(ids, vec![vec![Some("0".into())]]);
    // And a part naming a transaction that is not the open one is refused.
    sink.transaction_part(insert(71, 72), part(4, false, false), T)
        .unwrap();
    let e = sink
        .transaction_part(insert(73, 74), part(5, true, true), T)
        .unwrap_err();
    assert!(e.transient, "{e:?}");
    assert_eq!(count(), "31");
    admin
        .query("DROP TABLE tide_sink_parts", vec![], T)
        .unwrap();
}
