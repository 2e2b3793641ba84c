//! `value_format = 'debezium-schema'`: every message is `{"schema", "payload"}` as Kafka
//! Connect's JsonConverter writes it with `schemas.enable=true`, and every field of every
//! message, decoded by its schema alone (type, semantic name, parameters), equals the source's
//! value: for a backfill (op r), streamed insert/update/delete, and after an `ALTER TABLE ...
//! ADD COLUMN` (the schema event carries the new schema, the messages after it use it).
//!
//! On a build without the format, `create_pipeline` refuses the option (22023) and the test
//! fails there.

use crate::broker::*;
use pg_test::*;
use serde_json::Value;
use std::time::Duration;

const TOPIC: &str = "k.public.typed";

/// Every column type the mapping covers, nullable and not, with values that test the edges:
/// negative numerics, a numeric's scale from its typmod, instants before 1970, offsets.
const SETUP: &str = r#"
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN price AS numeric(8, 3);
CREATE TABLE typed (
    id int PRIMARY KEY,
    i2 int2, i8 int8 NOT NULL, f4 real, f8 float8 NOT NULL, b bool,
    t text NOT NULL, vc varchar(20), n numeric(10, 2), nneg numeric(5, -2), nv numeric,
    p price, d date, ts timestamp, ts3 timestamp(3), tstz timestamptz, tm time, iv interval,
    u uuid, j jsonb, js json, by bytea, arr int[], tarr text[], m mood);
INSERT INTO typed VALUES
  (1, -32768, -9223372036854775808, -1.5, 2.5e-300, true,
   'tab	"quote" \ backslash é', 'vc', -12345678.99, -123400, -3.14159265358979,
   -1.5, '1969-07-20', '1969-07-20 20:17:40.123456', '1900-01-01 00:00:00.5',
   '1969-07-20 20:17:40.5-04', '23:59:59.999999', '-1 days +02:00:03.5',
   'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"k": [1, null, "x"]}', '{"a":1}', '\x00ff10',
   '{1,-2,NULL}', '{"a b",NULL,"q\"x"}', 'happy'),
  (2, NULL, 0, NULL, 0, NULL, '', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
CREATE TABLE snap_r AS SELECT * FROM typed;
CREATE FUNCTION dbz_us(iv interval) RETURNS int8 LANGUAGE sql AS $$
  SELECT ((extract(year FROM iv) * 12 + extract(month FROM iv)) * 2629800000000
          + extract(day FROM iv) * 86400000000
          + ((extract(hour FROM iv) * 60 + extract(minute FROM iv)) * 60 + extract(second FROM iv)) * 1000000)::int8 $$;
"#;

/// (column, Connect type, semantic name, optional) as Debezium maps them by default.
const EXPECTED: &[(&str, &str, Option<&str>, bool)] = &[
    ("id", "int32", None, false),
    ("i2", "int16", None, true),
    ("i8", "int64", None, false),
    ("f4", "float", None, true),
    ("f8", "double", None, false),
    ("b", "boolean", None, true),
    ("t", "string", None, false),
    ("vc", "string", None, true),
    (
        "n",
        "bytes",
        Some("org.apache.kafka.connect.data.Decimal"),
        true,
    ),
    (
        "nneg",
        "bytes",
        Some("org.apache.kafka.connect.data.Decimal"),
        true,
    ),
    (
        "nv",
        "struct",
        Some("io.debezium.data.VariableScaleDecimal"),
        true,
    ),
    (
        "p",
        "bytes",
        Some("org.apache.kafka.connect.data.Decimal"),
        true,
    ),
    ("d", "int32", Some("io.debezium.time.Date"), true),
    ("ts", "int64", Some("io.debezium.time.MicroTimestamp"), true),
    ("ts3", "int64", Some("io.debezium.time.Timestamp"), true),
    (
        "tstz",
        "string",
        Some("io.debezium.time.ZonedTimestamp"),
        true,
    ),
    ("tm", "int64", Some("io.debezium.time.MicroTime"), true),
    ("iv", "int64", Some("io.debezium.time.MicroDuration"), true),
    ("u", "string", Some("io.debezium.data.Uuid"), true),
    ("j", "string", Some("io.debezium.data.Json"), true),
    ("js", "string", Some("io.debezium.data.Json"), true),
    ("by", "bytes", None, true),
    ("arr", "array", None, true),
    ("tarr", "array", None, true),
    ("m", "string", Some("io.debezium.data.Enum"), true),
    (
        "extra",
        "bytes",
        Some("org.apache.kafka.connect.data.Decimal"),
        true,
    ),
];

fn unbase64(s: &str) -> Vec<u8> {
    const A: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (mut bits, mut n, mut out) = (0u32, 0, Vec::new());
    for c in s.chars().filter(|c| *c != '=') {
        bits = (bits << 6) | A.find(c).expect("base64") as u32;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    out
}

/// A Connect decimal (unscaled two's complement bytes, scale) as decimal text.
fn decimal_text(b64: &str, scale: i64) -> String {
    let b = unbase64(b64);
    let mut v: i128 = if b.first().is_some_and(|x| x & 0x80 != 0) {
        -1
    } else {
        0
    };
    for x in &b {
        v = (v << 8) | i128::from(*x);
    }
    if scale <= 0 {
        return format!("{}", v * 10i128.pow((-scale) as u32));
    }
    let neg = v < 0;
    let digits = format!("{:0>width$}", v.abs(), width = scale as usize + 1);
    let (i, f) = digits.split_at(digits.len() - scale as usize);
    format!("{}{i}.{f}", if neg { "-" } else { "" })
}

/// A payload value decoded by its field schema alone into (SQL expression of `$n`, the text
/// bound to `$n`, SQL expression of the source column to compare with).
fn decode(f: &Value, v: &Value, n: usize, col: &str) -> (String, Option<String>, String) {
    let q = format!("\"{col}\"");
    // Every parameter is bound as text, then cast.
    let a = format!("(${n}::text)");
    if v.is_null() {
        return (a, None, format!("{q}::text"));
    }
    let name = f["name"].as_str().unwrap_or("");
    let num = || {
        v.as_i64()
            .map(|x| x.to_string())
            .or_else(|| v.as_f64().map(|x| x.to_string()))
    };
    let text = v.as_str().map(str::to_string);
    match (f["type"].as_str().unwrap_or(""), name) {
        ("int16", _) => (format!("{a}::int2"), num(), q),
        ("int32", "io.debezium.time.Date") => (format!("date '1970-01-01' + {a}::int4"), num(), q),
        ("int32", _) => (format!("{a}::int4"), num(), q),
        ("int64", "io.debezium.time.MicroTimestamp") => (
            format!("timestamp '1970-01-01' + {a}::int8 * interval '1 microsecond'"),
            num(),
            q,
        ),
        ("int64", "io.debezium.time.Timestamp") => (
            format!("timestamp '1970-01-01' + {a}::int8 * interval '1 millisecond'"),
            num(),
            q,
        ),
        ("int64", "io.debezium.time.MicroTime") => (
            format!("time '00:00' + {a}::int8 * interval '1 microsecond'"),
            num(),
            q,
        ),
        ("int64", "io.debezium.time.MicroDuration") => {
            (format!("{a}::int8"), num(), format!("dbz_us({q})"))
        }
        ("int64", _) => (format!("{a}::int8"), num(), q),
        ("float", _) => (format!("{a}::float4"), num().or(text), q),
        ("double", _) => (format!("{a}::float8"), num().or(text), q),
        ("boolean", _) => (format!("{a}::bool"), v.as_bool().map(|b| b.to_string()), q),
        ("bytes", "org.apache.kafka.connect.data.Decimal") => {
            let scale: i64 = f["parameters"]["scale"].as_str().unwrap().parse().unwrap();
            (
                format!("{a}::numeric"),
                Some(decimal_text(v.as_str().unwrap(), scale)),
                format!("{q}::numeric"),
            )
        }
        ("struct", "io.debezium.data.VariableScaleDecimal") => (
            format!("{a}::numeric"),
            Some(decimal_text(
                v["value"].as_str().unwrap(),
                v["scale"].as_i64().unwrap(),
            )),
            q,
        ),
        ("bytes", _) => (
            format!("decode({a}, 'hex')"),
            Some(hex(&unbase64(v.as_str().unwrap()))),
            q,
        ),
        ("string", "io.debezium.time.ZonedTimestamp") => (format!("{a}::timestamptz"), text, q),
        ("string", "io.debezium.data.Json") => (format!("{a}::jsonb"), text, format!("{q}::jsonb")),
        ("string", _) => (a, text, format!("{q}::text")),
        ("array", _) => {
            // Elements by the items schema, as a text[] literal.
            let items: Vec<String> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|e| match e {
                    Value::Null => "NULL".to_string(),
                    Value::String(s) => {
                        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
                    }
                    other => {
                        assert_eq!(f["items"]["type"], "int32", "{f}");
                        other.to_string()
                    }
                })
                .collect();
            (
                format!("{a}::text[]"),
                Some(format!("{{{}}}", items.join(","))),
                format!("{q}::text[]"),
            )
        }
        (t, name) => panic!("field {col}: unexpected schema type {t} {name}"),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The struct schema of `after` in a message's schema.
fn value_schema(m: &Value) -> &Value {
    let fields = m["schema"]["fields"].as_array().expect("envelope fields");
    let after = fields
        .iter()
        .find(|f| f["field"] == "after")
        .expect("after");
    assert_eq!(after["name"], "k.public.typed.Value", "{after}");
    after
}

/// Check the struct `row` of message `m` field by field against `table`'s row of the same id:
/// each field's schema as Debezium maps the column, and its value decoded by that schema equal
/// to the source's. Returns the field names.
fn check_row(c: &Cluster, m: &Value, row: &Value, table: &str) -> Vec<String> {
    let schema = value_schema(m);
    let fields = schema["fields"].as_array().unwrap();
    let id = row["id"].as_i64().expect("id");
    let mut exprs = Vec::new();
    let mut params: Vec<Option<String>> = Vec::new();
    let mut names = Vec::new();
    for (i, f) in fields.iter().enumerate() {
        let col = f["field"].as_str().unwrap();
        let want = EXPECTED
            .iter()
            .find(|e| e.0 == col)
            .unwrap_or_else(|| panic!("unexpected field {col}"));
        assert_eq!(f["type"], want.1, "type of {col}: {f}");
        assert_eq!(f["name"].as_str(), want.2, "name of {col}: {f}");
        assert_eq!(f["optional"], want.3, "optional of {col}: {f}");
        let v = row
            .get(col)
            .unwrap_or_else(|| panic!("payload lacks {col}: {row}"));
        let (lhs, p, rhs) = decode(f, v, i + 1, col);
        exprs.push(format!("({lhs}) IS NOT DISTINCT FROM ({rhs}) AS \"{col}\""));
        params.push(p);
        names.push(col.to_string());
    }
    assert_eq!(
        row.as_object().unwrap().len(),
        fields.len(),
        "payload has exactly the schema's fields: {row}"
    );
    let sql = format!("SELECT {} FROM {table} WHERE id = {id}", exprs.join(", "));
    let mut client = c.client();
    let refs: Vec<&(dyn postgres::types::ToSql + Sync)> = params
        .iter()
        .map(|p| p as &(dyn postgres::types::ToSql + Sync))
        .collect();
    let r = client
        .query_one(sql.as_str(), &refs)
        .unwrap_or_else(|e| panic!("{sql}\n{params:?}\n{}", describe_error(&e)));
    for (i, n) in names.iter().enumerate() {
        let same: bool = r.get(i);
        assert!(
            same,
            "field {n} of id {id} differs from {table}: payload {} (bound {:?})",
            row[n], params[i]
        );
    }
    names
}

#[test]
fn kafka_connect_schemas_match_the_source_field_by_field() {
    let b = Broker::start("schemas");
    let c = start_cluster(Cluster::builder("kafka_schemas"));
    init_extension(&c);
    exec(&c, SETUP);
    create_kafka_server(&c, "events", &b, "postgres");
    exec(
        &c,
        r#"SELECT tide.create_pipeline('k', 'kafka', '{"server": "events", "value_format": "debezium-schema"}')"#,
    );
    wait_streaming(&c, "k", Duration::from_secs(30));
    exec(&c, "SELECT tide.add_table('k', 'typed')");
    wait_backfill(&c, "typed", "k", 60);
    // Streamed: an insert, an update, a delete; then a new column and a row that has it.
    exec(
        &c,
        r#"INSERT INTO typed VALUES (3, 7, 42, 'NaN', '-Infinity', false, 'three', 'v3', 0.01, 0, 1e-20,
              '99999.999', '0001-01-01 BC', '2038-01-19 03:14:07.999999', '2024-02-29 12:00:00.123',
              '2024-03-10 02:30:00+05:30', '00:00:00', '1 year 2 mons 3 days 04:05:06.789',
              '00000000-0000-0000-0000-000000000000', '[]', '"s"', '\x', '{}', '{}', 'sad');
           UPDATE typed SET n = -0.01, tstz = '1900-06-01 00:00:00+00:19:32', t = 'upd', i8 = 1 WHERE id = 1;
           DELETE FROM typed WHERE id = 2;"#,
    );
    exec(
        &c,
        "ALTER TABLE typed ADD COLUMN extra numeric(6, 3) DEFAULT 1.5;
         INSERT INTO typed (id, i8, f8, t, extra) VALUES (4, 4, 4, 'four', -2.125);",
    );
    wait_pipeline(&c, "k", 60);
    let recs = consume(&b.addr(), &[TOPIC]);
    let msgs: Vec<(&Rec, &Value)> = recs
        .iter()
        .filter_map(|r| r.value.as_ref().map(|v| (r, v)))
        .collect();
    let ops: Vec<(String, i64)> = msgs
        .iter()
        .map(|(_, v)| {
            let p = &v["payload"];
            let row = if p["after"].is_null() {
                &p["before"]
            } else {
                &p["after"]
            };
            (
                p["op"].as_str().unwrap().to_string(),
                row["id"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        ops,
        [
            ("r", 1),
            ("r", 2),
            ("c", 3),
            ("u", 1),
            ("d", 2),
            ("schema", 0),
            ("c", 4)
        ]
        .map(|(o, i)| (o.to_string(), i)),
        "the topic's messages"
    );
    if std::env::var("TIDE_SHOW_MESSAGES").is_ok() {
        for (rec, m) in &msgs {
            eprintln!("key {}\nvalue {m}\n", rec.key.as_deref().unwrap_or("null"));
        }
    }
    let mut seen_schema = false;
    for (rec, m) in &msgs {
        assert_eq!(m["schema"]["name"], "k.public.typed.Envelope", "{m}");
        assert_eq!(m["schema"]["type"], "struct");
        let p = &m["payload"];
        let op = p["op"].as_str().unwrap();
        let fields: Vec<&str> = value_schema(m)["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["field"].as_str().unwrap())
            .collect();
        // The new column is in the schema from the schema event on, not before.
        assert_eq!(
            fields.contains(&"extra"),
            seen_schema || op == "schema",
            "{op}: {fields:?}"
        );
        // Key with its schema (key_format json-schema, the default with debezium-schema).
        if op != "schema" {
            let k: Value =
                serde_json::from_str(rec.key.as_deref().expect("a key")).expect("key JSON");
            assert_eq!(k["schema"]["name"], "k.public.typed.Key", "{k}");
            assert_eq!(
                k["schema"]["fields"],
                serde_json::json!([{"type": "int32", "optional": false, "field": "id"}])
            );
            let row = if p["after"].is_null() {
                &p["before"]
            } else {
                &p["after"]
            };
            assert_eq!(k["payload"]["id"], row["id"]);
        }
        match op {
            "r" => {
                assert_eq!(p["source"]["snapshot"], "incremental");
                check_row(&c, m, &p["after"], "snap_r");
            }
            "c" | "u" => {
                let names = check_row(&c, m, &p["after"], "typed");
                assert_eq!(names.len(), if seen_schema { 26 } else { 25 });
            }
            "d" => {
                assert!(p["after"].is_null());
                assert_eq!(p["before"]["id"], 2);
                // The default replica identity: only the key; required columns get their zero.
                assert_eq!(p["before"]["i8"], 0);
                assert_eq!(p["before"]["t"], "");
                assert!(p["before"]["ts"].is_null());
            }
            "schema" => {
                seen_schema = true;
                let change: Value = serde_json::from_str(
                    p["schema_change"]
                        .as_str()
                        .expect("schema_change JSON text"),
                )
                .unwrap();
                assert_eq!(change["added"][0]["name"], "extra", "{change}");
                let extra = value_schema(m)["fields"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|f| f["field"] == "extra")
                    .unwrap()
                    .clone();
                assert_eq!(extra["parameters"]["scale"], "3", "{extra}");
                assert_eq!(
                    extra["parameters"]["connect.decimal.precision"], "6",
                    "{extra}"
                );
            }
            other => panic!("unexpected op {other}"),
        }
    }
    assert!(seen_schema, "a schema event");
    // One tombstone after the delete.
    assert_eq!(recs.iter().filter(|r| r.value.is_none()).count(), 1);
}
