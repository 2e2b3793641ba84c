//! Column masks on a Kafka target: a masked table (hash, truncate, null, constant) with a
//! backfill and streamed inserts, updates (REPLICA IDENTITY FULL: old rows in the WAL) and
//! deletes; the topic replayed onto a copy equals the masks computed in SQL from the source and
//! the pipeline's salt, both ways; no message (key, value, headers) holds a clear value (marker
//! `SECRET`, built by concatenation so that no statement's text holds it) or the salt; the
//! `debezium-schema` form describes a hashed int column as a string.

use crate::broker::*;
use crate::replay::*;
use pg_test::*;
use std::time::Duration;

const TOPIC: &str = "k.public.people";

#[test]
fn masked_columns_in_the_topic() {
    let b = Broker::start("masks");
    let c = start_cluster(Cluster::builder("kafka_masks"));
    init_extension(&c);
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE TABLE people (id int PRIMARY KEY, email text, name text NOT NULL, ssn text, note text, age int);
         ALTER TABLE people REPLICA IDENTITY FULL;
         INSERT INTO people SELECT g, 'p' || g || '@' || 'SEC' || 'RET', 'Nam' || 'SEC' || 'RET' || g,
                'S' || 'ECRET' || g, 'n' || 'SEC' || 'RET', 20 + g % 40
           FROM generate_series(1, 300) g;
         GRANT SELECT ON people TO alice;",
    );
    create_kafka_server(&c, "events", &b, "alice");
    let mut alice = connect_as(&c, "alice");
    let run = |alice: &mut postgres::Client, sql: &str| {
        alice
            .batch_execute(sql)
            .unwrap_or_else(|e| panic!("as alice: {sql}\n{}", describe_error(&e)))
    };
    run(
        &mut alice,
        r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "events", "partitions": 2, "value_format": "debezium-schema"}')"#,
    );
    wait_streaming(&c, "k", Duration::from_secs(30));
    run(
        &mut alice,
        r#"SELECT tide.add_table('k', 'people', masks => '{"email": "hash", "name": {"truncate": 3}, "ssn": "null", "note": {"constant": "x''y"}, "age": "hash"}');
           SELECT tide.alter_backfill('people', 'k', chunk_size => 50);"#,
    );
    c.execute(
        "UPDATE people SET email = 'u' || 'SEC' || 'RET' || id, age = age + 1 WHERE id % 3 = 0;
         UPDATE people SET name = 'Bob' || 'SEC' || 'RET' WHERE id % 5 = 0;
         DELETE FROM people WHERE id % 7 = 0;
         INSERT INTO people SELECT g, NULL, 'New' || 'SEC' || 'RET', 'S' || 'ECRET', NULL, g FROM generate_series(1001, 1040) g;",
    );
    wait_backfill(&c, "people", "k", 120);
    c.execute("UPDATE people SET ssn = 'x' || 'SEC' || 'RET', note = 'SEC' || 'RET' WHERE id % 4 = 0; DELETE FROM people WHERE id % 11 = 0;");
    wait_pipeline(&c, "k", 120);
    c.execute(
        "CREATE VIEW expected AS
         SELECT id,
                encode(sha256((SELECT salt FROM tide.mask_salt WHERE pipeline = 'k') || convert_to(email, 'UTF8')), 'hex') AS email,
                left(name, 3) AS name, NULL::text AS ssn, 'x''y'::text AS note,
                encode(sha256((SELECT salt FROM tide.mask_salt WHERE pipeline = 'k') || convert_to(age::text, 'UTF8')), 'hex') AS age
           FROM people",
    );
    let recs = consume(&b.addr(), &[TOPIC]);
    let salt: String =
        c.query_scalar("SELECT encode(salt, 'hex') FROM tide.mask_salt WHERE pipeline = 'k'");
    let marker = format!("{}{}", "SEC", "RET");
    let mut leaks = Vec::new();
    for r in &recs {
        let all = format!("{:?} {:?} {:?}", r.key, r.value, r.headers);
        if all.contains(&marker) || all.contains(&salt) {
            leaks.push(format!("{}/{}@{}", r.topic, r.partition, r.offset));
        }
    }
    assert!(
        leaks.is_empty(),
        "{} messages hold a clear value or the salt: {:?}",
        leaks.len(),
        &leaks[..leaks.len().min(10)]
    );
    // The schema of the after image: a hashed int column is a string.
    let age_type = recs
        .iter()
        .filter_map(|r| r.value.as_ref())
        .find_map(|v| {
            v["schema"]["fields"]
                .as_array()?
                .iter()
                .find(|f| f["field"] == "after")?["fields"]
                .as_array()?
                .iter()
                .find(|f| f["field"] == "age")
                .map(|f| f["type"].as_str().unwrap_or("").to_string())
        })
        .expect("a message with a schema of age");
    assert_eq!(age_type, "string", "a hashed int column's Connect type");
    let payloads: Vec<Rec> = recs
        .iter()
        .cloned()
        .map(|mut r| {
            if let Some(v) = r.value.take() {
                r.value = Some(if v.get("payload").is_some() {
                    v["payload"].clone()
                } else {
                    v
                });
            }
            r
        })
        .collect();
    let replayed = replay(&payloads);
    assert!(
        replayed.rows.len() > 200,
        "the topic replays to {} rows",
        replayed.rows.len()
    );
    let (only_src, only_copy) = compare_with_copy(&c, "expected", "people_copy", &replayed.rows);
    assert_eq!(
        (only_src, only_copy),
        (0, 0),
        "the replayed topic equals the masked source, both ways"
    );
}

/// A row filter and a column list on a Kafka target (the other targets: `shape.rs`): a backfill
/// in small chunks while updates move rows into and out of the filter, inserts and deletes on
/// both sides of it; the topic replayed onto a copy equals `SELECT <listed columns> FROM source
/// WHERE <filter>`, both ways, and no message holds the unlisted column's value.
#[test]
fn filtered_listed_table_in_the_topic() {
    const TOPIC: &str = "f.public.orders";
    let b = Broker::start("shape");
    let c = start_cluster(Cluster::builder("kafka_shape"));
    init_extension(&c);
    c.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, region text NOT NULL, amount int, secret text);
         ALTER TABLE orders REPLICA IDENTITY FULL;
         INSERT INTO orders SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g, 'SEC' || 'RET'
           FROM generate_series(1, 400) g;",
    );
    create_kafka_server(&c, "events", &b, "postgres");
    c.execute(
        r#"SELECT tide.create_pipeline('f', 'kafka', '{"server": "events", "partitions": 2}')"#,
    );
    wait_streaming(&c, "f", Duration::from_secs(30));
    c.execute(
        "SELECT tide.add_table('f', 'orders', row_filter => $$region = 'eu'$$, columns => ARRAY['id', 'region', 'amount']);
         SELECT tide.alter_backfill('orders', 'f', chunk_size => 40);",
    );
    // Rows move out of the filter, into it, and change inside and outside it, while chunks are
    // read; then more of the same after the backfill.
    for round in 0..3 {
        c.execute(&format!(
            "UPDATE orders SET region = CASE region WHEN 'eu' THEN 'us' ELSE 'eu' END WHERE id % 7 = {round};
             UPDATE orders SET amount = amount + 1000 WHERE id % 5 = {round};
             DELETE FROM orders WHERE id % 29 = {round};
             INSERT INTO orders VALUES ({a}, 'eu', 1, 'SEC' || 'RET'), ({b}, 'us', 2, 'SEC' || 'RET');",
            a = 1000 + 2 * round,
            b = 1001 + 2 * round,
        ));
    }
    wait_backfill(&c, "orders", "f", 120);
    c.execute(
        "UPDATE orders SET region = 'eu' WHERE id % 11 = 0;
         UPDATE orders SET region = 'us', amount = -amount WHERE id % 13 = 0;
         DELETE FROM orders WHERE id % 17 = 0;",
    );
    wait_pipeline(&c, "f", 120);
    c.execute("CREATE VIEW expected AS SELECT id, region, amount FROM orders WHERE region = 'eu'");
    let recs = consume(&b.addr(), &[TOPIC]);
    let marker = format!("{}{}", "SEC", "RET");
    let leaks = recs
        .iter()
        .filter(|r| format!("{:?} {:?} {:?}", r.key, r.value, r.headers).contains(&marker))
        .count();
    assert_eq!(leaks, 0, "messages holding the unlisted column's value");
    let replayed = replay(&recs);
    let expected: i64 = c.query_scalar("SELECT count(*) FROM expected");
    assert!(expected > 150, "the filter keeps {expected} rows");
    let (only_src, only_copy) = compare_with_copy(&c, "expected", "orders_copy", &replayed.rows);
    assert_eq!(
        (only_src, only_copy),
        (0, 0),
        "the replayed topic equals the filtered, listed source, both ways"
    );
}
