//! A real Kafka Connect sink reads pg_tide's topics as they are: Debezium's JDBC sink connector
//! (`io.debezium.connector.jdbc.JdbcSinkConnector`, 3.6.0.Final: Maven Central serves no
//! 3.6.1.Final of it) in a Kafka Connect 4.4.0 standalone worker (`JsonConverter` with schemas,
//! `insert.mode=upsert`, `delete.enabled=true`, `primary.key.mode=record_key`) reads a pg_tide
//! pipeline's topic (`value_format = 'debezium-schema'`, no transform) and writes it into a table
//! of another database. After a backfill, inserts, updates, deletes and primary-key changes in
//! multi-row transactions, the copy equals the source: no row of either is missing from the
//! other (set difference both ways, over every column's text).
//!
//! No float is NaN or infinite here: `JsonConverter` writes them as the strings `"NaN"`,
//! `"Infinity"` (Jackson's default, and Debezium's messages carry the same) and reads a string
//! as a float64 of 0.0, so a JSON Connect pipeline turns them into 0 whoever wrote the topic
//! (docs/kafka.md, "Compared with Debezium").

use crate::broker::*;
use crate::connect::Connect;
use pg_test::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const TABLE: &str = "(id int PRIMARY KEY, name text NOT NULL, amount numeric(12,2), at timestamptz,
    d date, flag boolean, data bytea, n bigint, note varchar(40), t time, ts timestamp, u uuid,
    j jsonb, f float8)";

fn rows(c: &Cluster, db: &str, table: &str) -> BTreeSet<String> {
    let mut cl = c.connect_db(db);
    cl.query(format!("SELECT x::text FROM {table} x").as_str(), &[])
        .unwrap_or_else(|e| panic!("read {db}.{table}: {}", describe_error(&e)))
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect()
}

#[test]
fn debeziums_jdbc_sink_copies_a_pg_tide_topic_exactly() {
    let b = Broker::start("jdbc_sink");
    let c = start_cluster(Cluster::builder("kafka_jdbc_sink"));
    init_extension(&c);
    c.execute("CREATE DATABASE sinkdb");
    c.execute_in("sinkdb", &format!("CREATE TABLE acct_copy {TABLE}"));
    c.execute(&format!("CREATE TABLE acct {TABLE}"));
    let fill = |from: i32, to: i32| {
        format!(
            "INSERT INTO acct SELECT g, 'name ' || g || ' é \"q\"', (g * 12.34 - 500)::numeric(12,2),
                    timestamptz '2024-01-01 00:00:00.123456+00' + g * interval '1 hour 1.5 second',
                    date '1999-12-31' + g, g % 3 = 0, decode(md5(g::text), 'hex'), g::bigint * 1000000007,
                    'n' || g, time '00:00:00.5' + g * interval '1 minute', timestamp '1969-07-20 20:17:40' + g * interval '1 day',
                    md5(g::text)::uuid, jsonb_build_object('g', g, 'a', jsonb_build_array(1, 'x', null)), g / 7.0
               FROM generate_series({from}, {to}) g"
        )
    };
    c.execute(&fill(1, 200));
    c.execute("UPDATE acct SET amount = NULL, at = NULL, data = NULL, j = NULL WHERE id % 17 = 0");
    create_kafka_server(&c, "events", &b, "postgres");
    exec(
        &c,
        r#"SELECT tide.create_pipeline('sk', 'kafka', '{"server": "events", "value_format": "debezium-schema", "topic_prefix": "shop"}')"#,
    );
    wait_streaming(&c, "sk", Duration::from_secs(30));
    exec(&c, "SELECT tide.add_table('sk', 'acct')");
    let connect = Connect::start(
        "jdbc_sink",
        &b.addr(),
        &[(
            "dbz-jdbc-sink",
            format!(
                "connector.class=io.debezium.connector.jdbc.JdbcSinkConnector
tasks.max=1
topics=shop.public.acct
connection.url=jdbc:postgresql://127.0.0.1:{}/sinkdb
connection.username=postgres
connection.password=unused
insert.mode=upsert
delete.enabled=true
primary.key.mode=record_key
schema.evolution=none
collection.name.format=acct_copy
",
                c.port()
            ),
        )],
    );
    wait_backfill(&c, "acct", "sk", 120);
    // The stream, in multi-row transactions: inserts, updates, deletes, key changes.
    c.execute(&format!(
        "BEGIN; {}; UPDATE acct SET name = 'changed', amount = -0.01 WHERE id % 5 = 0; COMMIT",
        fill(201, 300)
    ));
    c.execute("BEGIN; DELETE FROM acct WHERE id % 7 = 0; UPDATE acct SET note = NULL, f = -0.5 WHERE id % 11 = 0; COMMIT");
    c.execute("UPDATE acct SET id = id + 1000 WHERE id % 10 = 3");
    c.execute("BEGIN; DELETE FROM acct WHERE id BETWEEN 1000 AND 1100; INSERT INTO acct (id, name) VALUES (7, 'back'), (1013, 'again'); COMMIT");
    c.execute("UPDATE acct SET id = -id WHERE id IN (1, 2)");
    wait_pipeline(&c, "sk", 120);
    let source = rows(&c, "postgres", "acct");
    assert!(source.len() > 200, "the source has {} rows", source.len());
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let copy = rows(&c, "sinkdb", "acct_copy");
        let missing: Vec<&String> = source.difference(&copy).collect();
        let extra: Vec<&String> = copy.difference(&source).collect();
        if missing.is_empty() && extra.is_empty() {
            break;
        }
        assert!(
            connect.alive(),
            "the Connect worker died:\n{}",
            connect.log()
        );
        assert!(
            Instant::now() < deadline,
            "after 300 s the JDBC sink's copy differs from the source: {} source rows not in the copy \
             (first: {:?}), {} copy rows not in the source (first: {:?})\n{}",
            missing.len(),
            missing.first(),
            extra.len(),
            extra.first(),
            connect.log()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}
