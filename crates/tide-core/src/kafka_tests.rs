use super::*;

fn src() -> SourceInfo {
    SourceInfo {
        version: "0.2.0".into(),
        name: "shop".into(),
        db: "postgres".into(),
    }
}

fn ev<'a>(op: Op, key: Option<&'a str>, row: Option<&'a str>) -> EnvelopeEvent<'a> {
    EnvelopeEvent {
        op,
        key,
        before: None,
        row,
        unchanged: &[],
        schema: "public",
        table: "Order Lines",
        xid: 571,
        commit_lsn: Lsn(0x16B3748),
        position: 2,
        commit_time: 0,
        backfill: None,
        data_collection_order: 1,
        now_us: 5000,
        schema_change: None,
        resync: None,
    }
}

#[test]
fn resync_envelopes_carry_the_phase() {
    let mut out = String::new();
    let mut e = ev(Op::Resync, None, None);
    e.resync = Some(r#"{"phase":"end","complete":true}"#);
    envelope(&src(), &e, &mut out);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["op"], "resync");
    assert_eq!(v["before"], serde_json::Value::Null);
    assert_eq!(v["after"], serde_json::Value::Null);
    assert_eq!(v["resync"]["phase"], "end");
    assert_eq!(v["resync"]["complete"], true);
    assert!(v.get("schema_change").is_none());
    assert!(broadcast(Op::Resync));
}

#[test]
fn a_keyless_tables_old_row_is_before_of_an_update_and_a_delete() {
    let old = r#"{"a":1,"b":"x"}"#;
    for (op, code) in [(Op::Update, "u"), (Op::Delete, "d")] {
        let mut e = ev(op, None, (op == Op::Update).then_some(r#"{"a":2,"b":"x"}"#));
        e.before = Some(old);
        let mut out = String::new();
        envelope(&src(), &e, &mut out);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["op"], code);
        assert_eq!(v["before"], serde_json::json!({"a": 1, "b": "x"}), "{out}");
    }
    // An insert has no before, whatever it is handed.
    let mut e = ev(Op::Insert, None, Some(old));
    e.before = Some(old);
    let mut out = String::new();
    envelope(&src(), &e, &mut out);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["before"].is_null(), "{out}");
}

#[test]
fn envelopes_are_json_with_the_identity() {
    let mut out = String::new();
    envelope(
        &src(),
        &ev(Op::Update, Some(r#"{"id":1}"#), Some(r#"{"id":1,"v":"x"}"#)),
        &mut out,
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["op"], "u");
    assert_eq!(v["before"], serde_json::Value::Null);
    assert_eq!(v["after"]["v"], "x");
    assert_eq!(v["source"]["commit_lsn"], "0/16B3748");
    assert_eq!(v["source"]["lsn"], 0x16B3748u64);
    assert_eq!(v["source"]["position"], 2);
    assert_eq!(v["source"]["table"], "Order Lines");
    assert_eq!(v["source"]["snapshot"], "false");
    assert_eq!(v["source"]["ts_ms"], 946_684_800_000i64);
    assert_eq!(v["transaction"]["id"], format!("571:{}", 0x16B3748u64));
    assert_eq!(v["transaction"]["total_order"], 2);
    let mut out = String::new();
    envelope(&src(), &ev(Op::Delete, Some(r#"{"id":1}"#), None), &mut out);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["op"].as_str(), v["before"]["id"].as_i64()),
        (Some("d"), Some(1))
    );
    assert!(v["after"].is_null());
    let mut r = ev(Op::Read, Some(r#"{"id":1}"#), Some(r#"{"id":1}"#));
    r.backfill = Some((3, 4));
    let u = vec!["big".to_string()];
    r.unchanged = &u;
    let mut out = String::new();
    envelope(&src(), &r, &mut out);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["source"]["snapshot"], "incremental");
    assert_eq!(v["source"]["chunk"], 4);
    assert_eq!(v["source"]["unchanged"][0], "big");
    let mut s = ev(Op::Schema, None, None);
    s.schema_change = Some(r#"{"added":[]}"#);
    let mut out = String::new();
    envelope(&src(), &s, &mut out);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["op"], "schema");
    assert!(v["schema_change"]["added"].is_array());
}

#[test]
fn transaction_records_count_per_table() {
    let mut c = TxnCounter::default();
    assert_eq!(c.count("public.a"), 1);
    assert_eq!(c.count("public.b"), 1);
    assert_eq!(c.count("public.a"), 2);
    let end: serde_json::Value = serde_json::from_str(&txn_record(7, Lsn(9), 0, Some(&c))).unwrap();
    assert_eq!(end["status"], "END");
    assert_eq!(end["event_count"], 3);
    assert_eq!(end["data_collections"][0]["data_collection"], "public.a");
    assert_eq!(end["data_collections"][0]["event_count"], 2);
    let begin: serde_json::Value = serde_json::from_str(&txn_record(7, Lsn(9), 0, None)).unwrap();
    assert_eq!(begin["status"], "BEGIN");
    assert!(begin["event_count"].is_null());
    assert_eq!(txn_key(7, Lsn(9)), r#"{"id":"7:9"}"#);
}

#[test]
fn topics_are_legal() {
    assert_eq!(
        topic_for("{prefix}.{schema}.{table}", "shop", "public", "Order Lines"),
        "shop.public.Order_Lines"
    );
    assert_eq!(legal_topic("a\"b/é"), "a_b__");
    assert_eq!(legal_topic(""), "_");
    assert_eq!(legal_topic(&"x".repeat(300)).len(), 249);
    assert!(valid_template("{prefix}.{table}").is_ok());
    assert!(valid_template("{prefix}.{tabel}").is_err());
    assert!(valid_template("{prefix").is_err());
    assert!(valid_template(" ").is_err());
}

#[test]
fn splits_quoted_names() {
    assert_eq!(
        split_qualified("public.\"Order Lines\""),
        ("public".into(), "Order Lines".into())
    );
    assert_eq!(
        split_qualified("\"a.b\".\"c\"\"d\""),
        ("a.b".into(), "c\"d".into())
    );
    assert_eq!(split_qualified("t"), ("".into(), "t".into()));
}

#[test]
fn positions_round_trip() {
    let r = position_record("k", Lsn(0x1_0000_0010));
    assert_eq!(
        parse_position_record(r.as_bytes()),
        Some(Lsn(0x1_0000_0010))
    );
    assert_eq!(parse_position_record(b"{}"), None);
    assert_eq!(parse_position_record(b"not json"), None);
}

#[test]
fn guarantees_and_secrets_are_guarded() {
    for p in [
        "enable.idempotence",
        "acks",
        "max.in.flight",
        "partitioner",
        "transactional.id",
    ] {
        assert!(refused_setting(p).is_some(), "{p}");
    }
    assert_eq!(refused_setting("linger.ms"), None);
    assert_eq!(property_name("sasl_username"), "sasl.username");
    assert_eq!(property_name("ssl.ca.location"), "ssl.ca.location");
    assert!(secret_setting("sasl.password"));
    assert!(secret_setting("ssl.key.password"));
    assert!(!secret_setting("sasl.username"));
}

/// Every property of librdkafka 2.12.1's CONFIGURATION.md (the version rdkafka-sys 4.10
/// bundles), so that each is classified knowingly.
const LIBRDKAFKA_PROPERTIES: &str = "\
    acks allow.auto.create.topics api.version.fallback.ms api.version.request \
    api.version.request.timeout.ms auto.commit.enable auto.commit.interval.ms \
    auto.offset.reset background_event_cb batch.num.messages batch.size bootstrap.servers \
    broker.address.family broker.address.ttl broker.version.fallback builtin.features \
    check.crcs client.dns.lookup client.id client.rack closesocket_cb compression.codec \
    compression.level compression.type connect_cb connections.max.idle.ms \
    consume.callback.max.messages consume_cb coordinator.query.interval.ms debug \
    default_topic_conf delivery.report.only.error delivery.timeout.ms dr_cb dr_msg_cb \
    enable.auto.commit enable.auto.offset.store enable.gapless.guarantee enable.idempotence \
    enable.metrics.push enable.partition.eof enable.random.seed \
    enable.sasl.oauthbearer.unsecure.jwt enable.ssl.certificate.verification enabled_events \
    error_cb fetch.error.backoff.ms fetch.max.bytes fetch.message.max.bytes fetch.min.bytes \
    fetch.queue.backoff.ms fetch.wait.max.ms group.id group.instance.id group.protocol \
    group.protocol.type group.remote.assignor heartbeat.interval.ms https.ca.location \
    https.ca.pem interceptors internal.termination.signal isolation.level linger.ms \
    log.connection.close log.queue log.thread.name log_cb log_level max.in.flight \
    max.in.flight.requests.per.connection max.partition.fetch.bytes max.poll.interval.ms \
    message.copy.max.bytes message.max.bytes message.send.max.retries message.timeout.ms \
    metadata.broker.list metadata.max.age.ms metadata.recovery.rebootstrap.trigger.ms \
    metadata.recovery.strategy msg_order_cmp oauthbearer_token_refresh_cb \
    offset.store.method offset.store.path offset.store.sync.interval.ms offset_commit_cb \
    opaque open_cb partition.assignment.strategy partitioner partitioner_cb \
    plugin.library.paths produce.offset.report queue.buffering.backpressure.threshold \
    queue.buffering.max.kbytes queue.buffering.max.messages queue.buffering.max.ms \
    queued.max.messages.kbytes queued.min.messages queuing.strategy rebalance_cb \
    receive.message.max.bytes reconnect.backoff.jitter.ms reconnect.backoff.max.ms \
    reconnect.backoff.ms request.required.acks request.timeout.ms resolve_cb retries \
    retry.backoff.max.ms retry.backoff.ms sasl.kerberos.keytab sasl.kerberos.kinit.cmd \
    sasl.kerberos.min.time.before.relogin sasl.kerberos.principal sasl.kerberos.service.name \
    sasl.mechanism sasl.mechanisms sasl.oauthbearer.assertion.algorithm \
    sasl.oauthbearer.assertion.claim.aud sasl.oauthbearer.assertion.claim.exp.seconds \
    sasl.oauthbearer.assertion.claim.iss sasl.oauthbearer.assertion.claim.jti.include \
    sasl.oauthbearer.assertion.claim.nbf.seconds sasl.oauthbearer.assertion.claim.sub \
    sasl.oauthbearer.assertion.file sasl.oauthbearer.assertion.jwt.template.file \
    sasl.oauthbearer.assertion.private.key.file \
    sasl.oauthbearer.assertion.private.key.passphrase \
    sasl.oauthbearer.assertion.private.key.pem sasl.oauthbearer.client.credentials.client.id \
    sasl.oauthbearer.client.credentials.client.secret sasl.oauthbearer.client.id \
    sasl.oauthbearer.client.secret sasl.oauthbearer.config sasl.oauthbearer.extensions \
    sasl.oauthbearer.grant.type sasl.oauthbearer.metadata.authentication.type \
    sasl.oauthbearer.method sasl.oauthbearer.scope sasl.oauthbearer.token.endpoint.url \
    sasl.password sasl.username security.protocol session.timeout.ms socket.blocking.max.ms \
    socket.connection.setup.timeout.ms socket.keepalive.enable socket.max.fails \
    socket.nagle.disable socket.receive.buffer.bytes socket.send.buffer.bytes \
    socket.timeout.ms socket_cb ssl.ca.certificate.stores ssl.ca.location ssl.ca.pem \
    ssl.certificate.location ssl.certificate.pem ssl.certificate.verify_cb ssl.cipher.suites \
    ssl.crl.location ssl.curves.list ssl.endpoint.identification.algorithm ssl.engine.id \
    ssl.engine.location ssl.key.location ssl.key.password ssl.key.pem ssl.keystore.location \
    ssl.keystore.password ssl.providers ssl.sigalgs.list ssl_ca ssl_certificate \
    ssl_engine_callback_data ssl_key statistics.interval.ms stats_cb \
    sticky.partitioning.linger.ms throttle_cb topic.blacklist \
    topic.metadata.propagation.max.ms topic.metadata.refresh.fast.cnt \
    topic.metadata.refresh.fast.interval.ms topic.metadata.refresh.interval.ms \
    topic.metadata.refresh.sparse transaction.timeout.ms transactional.id";

#[test]
fn the_allow_list_names_real_properties_once() {
    let mut seen = std::collections::HashSet::new();
    let known: Vec<&str> = LIBRDKAFKA_PROPERTIES.split_whitespace().collect();
    assert_eq!(known.len(), 190);
    for p in TUNING
        .iter()
        .chain(CONNECTION)
        .chain(SUPERUSER.iter().map(|(p, _)| p))
    {
        assert!(known.contains(p), "{p} is not a librdkafka property");
        assert!(seen.insert(*p), "{p} is listed twice");
        assert_eq!(
            refused_setting(p),
            None,
            "{p} is both allowed and pg_tide's"
        );
    }
}

/// Every property that names a file, a directory, a program, a library or an engine, sets a
/// callback or changes logging, signals or the process's random seed is never `Anywhere` or
/// `Connection`, whatever its value.
#[test]
fn files_programs_libraries_are_never_open_to_everyone() {
    let dangerous = |p: &str| {
        [
            "location",
            "path",
            "file",
            "cmd",
            "keytab",
            "engine",
            "provider",
            "plugin",
            "kerberos",
            "_cb",
            "interceptor",
            "debug",
            "log",
            "signal",
            "random",
            "opaque",
            "conf",
            "stores",
            "events",
            "statistics",
            "metadata.authentication",
        ]
        .iter()
        .any(|w| p.contains(w))
    };
    for p in LIBRDKAFKA_PROPERTIES.split_whitespace() {
        let a = access(p, "x");
        if dangerous(p) {
            assert!(
                matches!(
                    a,
                    Access::Superuser(_) | Access::PgTide(_) | Access::Unknown
                ),
                "{p} is {a:?}"
            );
        }
    }
    for p in [
        "plugin.library.paths",
        "ssl.engine.location",
        "ssl.engine.id",
        "ssl.providers",
        "ssl.key.location",
        "ssl.certificate.location",
        "ssl.ca.location",
        "ssl.crl.location",
        "ssl.keystore.location",
        "https.ca.location",
        "sasl.kerberos.kinit.cmd",
        "sasl.kerberos.keytab",
        "sasl.oauthbearer.assertion.file",
        "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.assertion.jwt.template.file",
    ] {
        assert!(matches!(access(p, ""), Access::Superuser(_)), "{p}");
    }
    // Kerberos is the host's identity whichever way it is asked for.
    for v in ["GSSAPI", "gssapi", " GSSAPI "] {
        assert!(matches!(access("sasl.mechanism", v), Access::Superuser(_)));
        assert!(matches!(access("sasl.mechanisms", v), Access::Superuser(_)));
    }
    assert_eq!(
        access("sasl.mechanism", "SCRAM-SHA-512"),
        Access::Connection
    );
    // Not on the list: logging, signals, callbacks, consumer settings, unknown names, and
    // names spelled differently from librdkafka's (it compares exactly).
    for p in [
        "debug",
        "log_level",
        "internal.termination.signal",
        "enable.random.seed",
        "statistics.interval.ms",
        "ssl_key",
        "ssl_engine_callback_data",
        "open_cb",
        "fetch.wait.max.ms",
        "offset.store.path",
        "enable.sasl.oauthbearer.unsecure.jwt",
        "sasl.oauthbearer.token.endpoint.url",
        "no.such.property",
        "Plugin.Library.Paths",
        " plugin.library.paths",
        "",
    ] {
        assert_eq!(access(p, ""), Access::Unknown, "{p:?}");
    }
}

#[test]
fn classes_of_common_settings() {
    for p in [
        "linger.ms",
        "batch.size",
        "compression.type",
        "message.timeout.ms",
        "socket.connection.setup.timeout.ms",
        "retry.backoff.ms",
    ] {
        assert_eq!(access(p, "5"), Access::Anywhere, "{p}");
    }
    for p in [
        "security.protocol",
        "sasl.username",
        "sasl.password",
        "ssl.ca.pem",
        "enable.ssl.certificate.verification",
    ] {
        assert_eq!(access(p, "x"), Access::Connection, "{p}");
    }
    for p in [
        "acks",
        "enable.idempotence",
        "client.id",
        "bootstrap.servers",
        "group.id",
    ] {
        assert!(matches!(access(p, "x"), Access::PgTide(_)), "{p}");
    }
    assert_eq!(property_name("delivery.timeout.ms"), "message.timeout.ms");
    assert_eq!(
        property_name("plugin_library_paths"),
        "plugin.library.paths"
    );
    assert!(secret_setting(
        "sasl.oauthbearer.assertion.private.key.passphrase"
    ));
    assert!(secret_setting("sasl.oauthbearer.assertion.private.key.pem"));
    assert!(!secret_setting("ssl.ca.location"));
}
