use super::*;
use serde_json::{json, Value};

/// numeric(p, s)'s typmod, as PostgreSQL stores it.
fn numeric_typmod(p: i32, s: i32) -> i32 {
    ((p << 16) | (s & 0x7ff)) + 4
}

fn schema_of(k: Kind, optional: bool) -> Value {
    let mut out = String::new();
    field_schema(
        &Field {
            name: "c".into(),
            kind: k,
            optional,
        },
        &mut out,
    );
    serde_json::from_str(&out).unwrap()
}

fn val(k: &Kind, t: Option<&str>) -> Value {
    let mut out = String::new();
    value(k, t, &mut out).unwrap();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"))
}

/// Java's `new BigInteger(bytes)`: two's complement, big-endian.
fn java_bigint(b: &[u8]) -> i128 {
    let mut v: i128 = if b[0] & 0x80 != 0 { -1 } else { 0 };
    for x in b {
        v = (v << 8) | i128::from(*x);
    }
    v
}

fn unbase64(s: &str) -> Vec<u8> {
    const A: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in s.chars().filter(|c| *c != '=') {
        bits = (bits << 6) | A.find(c).unwrap() as u32;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    out
}

#[test]
fn integers_floats_booleans() {
    assert_eq!(kind(21, -1, 0, None), Kind::Int16);
    assert_eq!(kind(23, -1, 0, None), Kind::Int32);
    assert_eq!(kind(20, -1, 0, None), Kind::Int64);
    assert_eq!(kind(700, -1, 0, None), Kind::Float);
    assert_eq!(kind(701, -1, 0, None), Kind::Double);
    assert_eq!(kind(16, -1, 0, None), Kind::Boolean);
    assert_eq!(
        schema_of(Kind::Int16, false),
        json!({"type": "int16", "optional": false, "field": "c"})
    );
    assert_eq!(
        schema_of(Kind::Double, true),
        json!({"type": "double", "optional": true, "field": "c"})
    );
    assert_eq!(val(&Kind::Int16, Some("-32768")), json!(-32768));
    assert_eq!(
        val(&Kind::Int64, Some("-9223372036854775808")),
        json!(i64::MIN)
    );
    assert_eq!(val(&Kind::Int32, None), Value::Null);
    assert_eq!(val(&Kind::Double, Some("-1.5e-07")), json!(-1.5e-07));
    assert_eq!(val(&Kind::Float, Some("NaN")), json!("NaN"));
    assert_eq!(val(&Kind::Double, Some("-Infinity")), json!("-Infinity"));
    assert_eq!(val(&Kind::Boolean, Some("t")), json!(true));
    assert_eq!(val(&Kind::Boolean, Some("f")), json!(false));
    let mut out = String::new();
    assert!(value(&Kind::Int32, Some("12x"), &mut out).is_err());
    assert!(value(&Kind::Boolean, Some("yes"), &mut String::new()).is_err());
}

#[test]
fn numeric_is_a_decimal_with_the_typmods_scale() {
    let k = kind(1700, numeric_typmod(10, 2), 0, None);
    assert_eq!(
        k,
        Kind::Decimal {
            precision: 10,
            scale: 2
        }
    );
    assert_eq!(
        schema_of(k.clone(), true),
        json!({"type": "bytes", "optional": true, "name": "org.apache.kafka.connect.data.Decimal",
               "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "10"},
               "field": "c"})
    );
    for (text, unscaled) in [
        ("123.45", 12345i128),
        ("-123.45", -12345),
        ("0.00", 0),
        ("-0.01", -1),
        ("1.28", 128),
        ("-1.28", -128),
        ("-1.29", -129),
        ("99999999.99", 9_999_999_999),
    ] {
        let v = val(&k, Some(text));
        let b = unbase64(v.as_str().unwrap());
        assert_eq!(java_bigint(&b), unscaled, "{text}");
        // Minimal, as BigInteger.toByteArray().
        assert!(b.len() == 1 || !(b[0] == 0 && b[1] & 0x80 == 0), "{text}");
        assert!(
            b.len() == 1 || !(b[0] == 0xff && b[1] & 0x80 != 0),
            "{text}"
        );
    }
    assert_eq!(val(&k, Some("128.00")), json!("MgA="));
    assert_eq!(val(&k, Some("-1.00")), json!("nA==")); // -100: one byte, 0x9c
    assert_eq!(val(&k, None), Value::Null);
    assert_eq!(val(&k, Some("NaN")), Value::Null);
    // A negative scale (PostgreSQL 15): numeric(2, -3) holds 12000 as 12 × 10³.
    let k = kind(1700, numeric_typmod(2, -3), 0, None);
    assert_eq!(
        k,
        Kind::Decimal {
            precision: 2,
            scale: -3
        }
    );
    assert_eq!(
        java_bigint(&unbase64(val(&k, Some("-12000")).as_str().unwrap())),
        -12
    );
    // Scale 0, and a value too long for 64 bits.
    let k = kind(1700, numeric_typmod(38, 0), 0, None);
    let big = "-123456789012345678901234567890";
    assert_eq!(
        java_bigint(&unbase64(val(&k, Some(big)).as_str().unwrap())),
        big.parse::<i128>().unwrap()
    );
    assert!(unscaled_bytes("1.234", 2).is_none());
    assert!(unscaled_bytes("1e5", 2).is_none());
}

#[test]
fn numeric_without_typmod_is_variable_scale() {
    let k = kind(1700, -1, 0, None);
    assert_eq!(k, Kind::VariableDecimal);
    let s = schema_of(k.clone(), false);
    assert_eq!(s["name"], "io.debezium.data.VariableScaleDecimal");
    assert_eq!(s["type"], "struct");
    assert_eq!(
        s["fields"][0],
        json!({"type": "int32", "optional": false, "field": "scale"})
    );
    assert_eq!(
        s["fields"][1],
        json!({"type": "bytes", "optional": false, "field": "value"})
    );
    let v = val(&k, Some("-3.14159"));
    assert_eq!(v["scale"], 5);
    assert_eq!(
        java_bigint(&unbase64(v["value"].as_str().unwrap())),
        -314_159
    );
    let v = val(&k, Some("42"));
    assert_eq!(v["scale"], 0);
    assert_eq!(java_bigint(&unbase64(v["value"].as_str().unwrap())), 42);
}

#[test]
fn dates_and_times_before_and_after_1970() {
    assert_eq!(kind(1082, -1, 0, None), Kind::Date);
    assert_eq!(
        schema_of(Kind::Date, false),
        json!({"type": "int32", "optional": false, "name": "io.debezium.time.Date", "version": 1, "field": "c"})
    );
    assert_eq!(val(&Kind::Date, Some("1970-01-01")), json!(0));
    assert_eq!(val(&Kind::Date, Some("2024-02-29")), json!(19782));
    assert_eq!(val(&Kind::Date, Some("1969-12-31")), json!(-1));
    assert_eq!(val(&Kind::Date, Some("1900-01-01")), json!(-25567));
    // 1 BC is year 0; 0001-01-01 is -719162 days.
    assert_eq!(val(&Kind::Date, Some("0001-01-01")), json!(-719_162));
    assert_eq!(val(&Kind::Date, Some("0001-12-31 BC")), json!(-719_163));
    assert_eq!(val(&Kind::Date, Some("infinity")), json!(i32::MAX));

    assert_eq!(kind(1114, -1, 0, None), Kind::MicroTimestamp);
    assert_eq!(kind(1114, 6, 0, None), Kind::MicroTimestamp);
    assert_eq!(kind(1114, 3, 0, None), Kind::Timestamp);
    assert_eq!(kind(1114, 0, 0, None), Kind::Timestamp);
    assert_eq!(
        schema_of(Kind::MicroTimestamp, true)["name"],
        "io.debezium.time.MicroTimestamp"
    );
    assert_eq!(schema_of(Kind::MicroTimestamp, true)["type"], "int64");
    assert_eq!(
        val(&Kind::MicroTimestamp, Some("2024-01-15 10:20:30.123456")),
        json!(1_705_314_030_123_456i64)
    );
    assert_eq!(
        val(&Kind::MicroTimestamp, Some("1969-12-31 23:59:59.5")),
        json!(-500_000)
    );
    assert_eq!(
        val(&Kind::Timestamp, Some("1969-12-31 23:59:59.9995")),
        json!(-1)
    );
    assert_eq!(
        val(&Kind::MicroTimestamp, Some("1900-01-01 00:00:00")),
        json!(-2_208_988_800_000_000i64)
    );
    assert_eq!(
        val(&Kind::MicroTimestamp, Some("-infinity")),
        json!(i64::MIN)
    );

    assert_eq!(kind(1083, -1, 0, None), Kind::MicroTime);
    assert_eq!(kind(1083, 2, 0, None), Kind::Time);
    assert_eq!(schema_of(Kind::Time, false)["type"], "int32");
    assert_eq!(
        val(&Kind::MicroTime, Some("13:45:01.25")),
        json!(49_501_250_000i64)
    );
    assert_eq!(val(&Kind::Time, Some("13:45:01.25")), json!(49_501_250));
    assert_eq!(
        val(&Kind::MicroTime, Some("24:00:00")),
        json!(86_400_000_000i64)
    );
}

#[test]
fn zoned_values_are_iso_in_utc() {
    assert_eq!(kind(1184, -1, 0, None), Kind::ZonedTimestamp(6));
    assert_eq!(
        schema_of(Kind::ZonedTimestamp(6), true),
        json!({"type": "string", "optional": true, "name": "io.debezium.time.ZonedTimestamp", "version": 1, "field": "c"})
    );
    // Debezium 3.6.1 writes the fraction with the column's precision (checked against it in
    // pg_test/tests/kafka/debezium.rs): 6 digits for timestamptz, 3 for timestamptz(3), none for (0).
    let z = |t| val(&Kind::ZonedTimestamp(6), Some(t));
    assert_eq!(
        z("2024-01-15 10:20:30.123456+00"),
        json!("2024-01-15T10:20:30.123456Z")
    );
    assert_eq!(
        z("2024-01-15 10:20:30+02"),
        json!("2024-01-15T08:20:30.000000Z")
    );
    assert_eq!(
        z("2024-01-01 01:00:00.5+05:30"),
        json!("2023-12-31T19:30:00.500000Z")
    );
    assert_eq!(
        val(&Kind::ZonedTimestamp(3), Some("2024-01-01 10:00:00.5+00")),
        json!("2024-01-01T10:00:00.500Z")
    );
    assert_eq!(
        val(&Kind::ZonedTimestamp(0), Some("2024-01-01 10:00:01+00")),
        json!("2024-01-01T10:00:01Z")
    );
    assert_eq!(kind(1184, 3, 0, None), Kind::ZonedTimestamp(3));
    assert_eq!(kind(1184, 0, 0, None), Kind::ZonedTimestamp(0));
    assert_eq!(
        z("1969-12-31 23:00:00-08"),
        json!("1970-01-01T07:00:00.000000Z")
    );
    assert_eq!(
        z("1900-06-01 00:00:00+00:19:32"),
        json!("1900-05-31T23:40:28.000000Z")
    );
    assert_eq!(
        z("0044-03-15 12:00:00+00 BC"),
        json!("-0043-03-15T12:00:00.000000Z")
    );
    assert_eq!(z("infinity"), json!("infinity"));
    assert_eq!(kind(1266, -1, 0, None), Kind::ZonedTime);
    assert_eq!(
        val(&Kind::ZonedTime, Some("10:00:00+02")),
        json!("08:00:00Z")
    );
    assert_eq!(
        val(&Kind::ZonedTime, Some("01:00:00.25+05:30")),
        json!("19:30:00.25Z")
    );
}

#[test]
fn intervals_are_micro_durations() {
    assert_eq!(kind(1186, -1, 0, None), Kind::MicroDuration);
    let d = |t| val(&Kind::MicroDuration, Some(t));
    assert_eq!(d("00:00:01"), json!(1_000_000));
    assert_eq!(d("-00:00:01.5"), json!(-1_500_000));
    assert_eq!(d("1 day"), json!(86_400_000_000i64));
    assert_eq!(d("-1 days +02:00:00"), json!(-79_200_000_000i64));
    // A month is 30.4375 days in Debezium's MicroDuration.
    assert_eq!(d("1 mon"), json!(2_629_800_000_000i64));
    assert_eq!(
        d("1 year 2 mons 3 days 04:05:06.789"),
        json!(
            12 * 2_629_800_000_000i64 + 2 * 2_629_800_000_000 + 3 * 86_400_000_000 + 14_706_789_000
        )
    );
}

#[test]
fn strings_with_semantic_names_and_bytes() {
    assert_eq!(kind(25, -1, 0, None), Kind::Str(None));
    assert_eq!(kind(1043, 14, 0, None), Kind::Str(None));
    assert_eq!(kind(1042, 9, 0, None), Kind::Str(None));
    assert_eq!(
        schema_of(kind(2950, -1, 0, None), false),
        json!({"type": "string", "optional": false, "name": "io.debezium.data.Uuid", "version": 1, "field": "c"})
    );
    assert_eq!(
        schema_of(kind(3802, -1, 0, None), true)["name"],
        "io.debezium.data.Json"
    );
    assert_eq!(
        schema_of(kind(114, -1, 0, None), true)["name"],
        "io.debezium.data.Json"
    );
    assert_eq!(
        schema_of(kind(142, -1, 0, None), true)["name"],
        "io.debezium.data.Xml"
    );
    assert_eq!(
        schema_of(Kind::Str(None), true),
        json!({"type": "string", "optional": true, "field": "c"})
    );
    assert_eq!(val(&Kind::Str(None), Some("a \"q\"\n")), json!("a \"q\"\n"));
    assert_eq!(val(&Kind::Str(None), Some("")), json!(""));
    assert_eq!(
        val(
            &Kind::Str(Some("io.debezium.data.Json")),
            Some("{\"a\": [1]}")
        ),
        json!("{\"a\": [1]}")
    );
    assert_eq!(kind(17, -1, 0, None), Kind::Bytes);
    assert_eq!(
        schema_of(Kind::Bytes, true),
        json!({"type": "bytes", "optional": true, "field": "c"})
    );
    assert_eq!(val(&Kind::Bytes, Some("\\x00ff10")), json!("AP8Q"));
    assert_eq!(val(&Kind::Bytes, Some("\\x")), json!(""));
    assert_eq!(base64(b"hello"), "aGVsbG8=");
    assert!(value(&Kind::Bytes, Some("\\x0"), &mut String::new()).is_err());
    let e = kind(12345, -1, 0, Some("new,paid,shipped"));
    assert_eq!(
        schema_of(e.clone(), false),
        json!({"type": "string", "optional": false, "name": "io.debezium.data.Enum", "version": 1,
               "parameters": {"allowed": "new,paid,shipped"}, "field": "c"})
    );
    assert_eq!(val(&e, Some("paid")), json!("paid"));
    // Anything else: its text output as a plain string.
    assert_eq!(kind(869, -1, 0, None), Kind::Str(None));
}

#[test]
fn arrays_of_the_element_schema() {
    let k = kind(1007, -1, 23, None);
    assert_eq!(k, Kind::Array(Box::new(Kind::Int32)));
    assert_eq!(
        schema_of(k.clone(), true),
        json!({"type": "array", "items": {"type": "int32", "optional": true}, "optional": true, "field": "c"})
    );
    assert_eq!(val(&k, Some("{1,-2,NULL}")), json!([1, -2, null]));
    assert_eq!(val(&k, Some("{}")), json!([]));
    assert_eq!(val(&k, Some("[0:1]={5,6}")), json!([5, 6]));
    assert_eq!(val(&k, Some("{{1,2},{3,4}}")), json!([1, 2, 3, 4]));
    let t = kind(1009, -1, 25, None);
    assert_eq!(
        val(&t, Some(r#"{a,"b c","NULL",NULL,"q\"x","back\\slash"}"#)),
        json!(["a", "b c", "NULL", null, "q\"x", "back\\slash"])
    );
    let n = kind(1231, numeric_typmod(5, 1), 1700, None);
    assert_eq!(
        n,
        Kind::Array(Box::new(Kind::Decimal {
            precision: 5,
            scale: 1
        }))
    );
    let v = val(&n, Some("{-1.5,2.0}"));
    assert_eq!(java_bigint(&unbase64(v[0].as_str().unwrap())), -15);
    assert_eq!(schema_of(n, false)["items"]["parameters"]["scale"], "1");
    let e = kind(99, -1, 98, Some("x,y"));
    assert_eq!(e, Kind::Array(Box::new(Kind::Enum("x,y".into()))));
    assert!(value(&k, Some("{1,2"), &mut String::new()).is_err());
}

fn shape() -> Shape {
    Shape {
        prefix: "shop.public.t".into(),
        fields: vec![
            Field {
                name: "id".into(),
                kind: Kind::Int32,
                optional: false,
            },
            Field {
                name: "name".into(),
                kind: Kind::Str(None),
                optional: false,
            },
            Field {
                name: "note".into(),
                kind: Kind::Str(None),
                optional: true,
            },
            Field {
                name: "at".into(),
                kind: Kind::MicroTimestamp,
                optional: true,
            },
        ],
        key: vec!["id".into()],
    }
}

#[test]
fn rows_fill_every_field() {
    let s = shape();
    let mut out = String::new();
    let cols: Vec<String> = vec!["id".into(), "name".into(), "at".into()];
    let vals = vec![Some("7".to_string()), Some("x".to_string()), None];
    let unchanged = vec!["note".to_string()];
    s.row(
        &RowText {
            columns: &cols,
            values: &vals,
            unchanged: &unchanged,
        },
        &mut out,
    )
    .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v,
        json!({"id": 7, "name": "x", "note": UNAVAILABLE, "at": null})
    );
    // A delete's before under the default replica identity: the key, nulls, zeros where required.
    let mut out = String::new();
    let cols: Vec<String> = vec!["id".into()];
    s.row(
        &RowText {
            columns: &cols,
            values: &[Some("7".into())],
            unchanged: &[],
        },
        &mut out,
    )
    .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v, json!({"id": 7, "name": "", "note": null, "at": null}));
    assert!(s.covers(&["id".into(), "at".into()]));
    assert!(!s.covers(&["id".into(), "new".into()]));
    let mut out = String::new();
    let err = s
        .row(
            &RowText {
                columns: &["id".into()],
                values: &[Some("x".into())],
                unchanged: &[],
            },
            &mut out,
        )
        .unwrap_err();
    assert!(err.contains("column \"id\""), "{err}");
}

#[test]
fn key_and_envelope_schemas() {
    let s = shape();
    let k: Value =
        serde_json::from_str(&s.key_message(&[("id".into(), Some("7".into()))]).unwrap()).unwrap();
    assert_eq!(
        k,
        json!({"schema": {"type": "struct", "fields": [{"type": "int32", "optional": false, "field": "id"}],
                          "optional": false, "name": "shop.public.t.Key"},
               "payload": {"id": 7}})
    );
    let e: Value = serde_json::from_str(&s.envelope_schema()).unwrap();
    assert_eq!(e["name"], "shop.public.t.Envelope");
    assert_eq!(e["optional"], false);
    let names: Vec<&str> = e["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "before",
            "after",
            "source",
            "transaction",
            "op",
            "ts_ms",
            "ts_us",
            "ts_ns",
            "schema_change",
            "truncated"
        ]
    );
    for i in 0..2 {
        assert_eq!(e["fields"][i]["name"], "shop.public.t.Value");
        assert_eq!(e["fields"][i]["optional"], true);
        assert_eq!(
            e["fields"][i]["fields"][0],
            json!({"type": "int32", "optional": false, "field": "id"})
        );
        assert_eq!(
            e["fields"][i]["fields"][3]["name"],
            "io.debezium.time.MicroTimestamp"
        );
    }
    assert_eq!(
        e["fields"][2]["name"],
        "io.debezium.connector.postgresql.Source"
    );
    assert_eq!(e["fields"][3]["name"], "event.block");
    // Member order as JsonConverter writes it.
    let raw = s.envelope_schema();
    assert!(raw.starts_with("{\"type\":\"struct\",\"fields\":[{\"type\":\"struct\",\"fields\":[{\"type\":\"int32\",\"optional\":false,\"field\":\"id\"}"));
    assert!(raw.ends_with("\"optional\":false,\"name\":\"shop.public.t.Envelope\",\"version\":2}"));
}

#[test]
fn messages_carry_every_schema_field() {
    let s = shape();
    let schema = s.envelope_schema();
    let src = crate::kafka::SourceInfo {
        version: "0.1.0".into(),
        name: "shop".into(),
        db: "d".into(),
    };
    let mut out = String::new();
    message(
        &schema,
        &src,
        &Payload {
            op: Op::Insert,
            before: None,
            after: Some(r#"{"id":1,"name":"a","note":null,"at":0}"#),
            schema: "public",
            table: "t",
            xid: 5,
            commit_lsn: Lsn(16),
            position: 1,
            commit_time: 0,
            backfill: None,
            unchanged: &[],
            data_collection_order: 1,
            now_us: 9000,
            schema_change: None,
            truncated: None,
        },
        &mut out,
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["schema"]["name"], "shop.public.t.Envelope");
    let p = &v["payload"];
    assert_eq!(p["op"], "c");
    assert_eq!(p["after"]["id"], 1);
    assert!(p["before"].is_null());
    // Every field of each struct schema is in the payload, and nothing else.
    let fields = v["schema"]["fields"].as_array().unwrap();
    let keys: Vec<&String> = p.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), fields.len());
    for f in fields {
        let name = f["field"].as_str().unwrap();
        assert!(p.get(name).is_some(), "{name}");
        if name == "source" || name == "transaction" {
            let sub = f["fields"].as_array().unwrap();
            assert_eq!(p[name].as_object().unwrap().len(), sub.len(), "{name}");
            for g in sub {
                assert!(p[name].get(g["field"].as_str().unwrap()).is_some());
            }
        }
    }
    assert_eq!(p["source"]["snapshot"], "false");
    assert!(p["source"]["backfill_id"].is_null());
    let mut out = String::new();
    message(
        &schema,
        &src,
        &Payload {
            op: Op::Schema,
            before: None,
            after: None,
            schema: "public",
            table: "t",
            xid: 5,
            commit_lsn: Lsn(16),
            position: 2,
            commit_time: 0,
            backfill: Some((3, 4)),
            unchanged: &["note".to_string()],
            data_collection_order: 2,
            now_us: 9000,
            schema_change: Some(r#"{"added":[]}"#),
            truncated: None,
        },
        &mut out,
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["payload"]["op"], "schema");
    assert_eq!(v["payload"]["schema_change"], r#"{"added":[]}"#);
    assert_eq!(v["payload"]["source"]["chunk"], 4);
    assert_eq!(v["payload"]["source"]["unchanged"][0], "note");
}

#[test]
fn dates_round_trip_through_the_civil_calendar() {
    for d in [-800_000i64, -719_163, -1, 0, 1, 19_782, 2_932_896] {
        let (y, m, dd) = civil_from_days(d);
        assert_eq!(days_from_civil(y, m, dd), d);
    }
    assert_eq!(iso_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(iso_utc(-1), "1969-12-31T23:59:59.999999Z");
}

/// The mappings added after comparing with Debezium 3.6.1's PostgreSQL connector (the values are
/// what it wrote for the same source rows; pg_test/tests/kafka/debezium.rs compares whole topics).
#[test]
fn bits_points_tsvectors_as_debezium_writes_them() {
    assert_eq!(kind(1560, 1, 0, None), Kind::Boolean);
    assert_eq!(val(&Kind::Boolean, Some("1")), json!(true));
    assert_eq!(val(&Kind::Boolean, Some("0")), json!(false));
    assert_eq!(kind(1560, 4, 0, None), Kind::Bits(4));
    assert_eq!(kind(1562, 5, 0, None), Kind::Bits(5));
    assert_eq!(kind(1562, -1, 0, None), Kind::Bits(i32::MAX));
    assert_eq!(
        schema_of(Kind::Bits(4), true),
        json!({"type": "bytes", "optional": true, "name": "io.debezium.data.Bits", "version": 1,
               "parameters": {"length": "4"}, "field": "c"})
    );
    for (bits, b64) in [
        ("1111", "Dw=="),
        ("0101", "BQ=="),
        ("1010", "Cg=="),
        ("10101010101", "VQU="),
        ("1", "AQ=="),
        ("0000", ""),
        ("", ""),
    ] {
        assert_eq!(val(&Kind::Bits(4), Some(bits)), json!(b64), "{bits}");
    }
    assert!(value(&Kind::Bits(4), Some("012"), &mut String::new()).is_err());
    assert_eq!(kind(600, -1, 0, None), Kind::Point);
    assert_eq!(
        schema_of(Kind::Point, true),
        json!({"type": "struct", "fields": [
                 {"type": "double", "optional": false, "field": "x"},
                 {"type": "double", "optional": false, "field": "y"},
                 {"type": "bytes", "optional": true, "field": "wkb"},
                 {"type": "int32", "optional": true, "field": "srid"}],
               "optional": true, "name": "io.debezium.data.geometry.Point", "version": 1,
               "doc": "Geometry (POINT)", "field": "c"})
    );
    assert_eq!(
        val(&Kind::Point, Some("(1.5,-2.25)")),
        json!({"x": 1.5, "y": -2.25, "wkb": "AQEAAAAAAAAAAAD4PwAAAAAAAALA", "srid": null})
    );
    assert_eq!(
        val(&Kind::Point, Some("(NaN,0)")),
        json!({"x": "NaN", "y": 0, "wkb": "AQEAAAAAAAAAAAD4fwAAAAAAAAAA", "srid": null})
    );
    assert_eq!(
        val(&Kind::Point, Some("(-1e-300,1e+300)")),
        json!({"x": -1e-300, "y": 1e300, "wkb": "AQEAAABZ8/jCH26lgZx1AIg85Dd+", "srid": null})
    );
    assert_eq!(
        kind(3614, -1, 0, None),
        Kind::Str(Some("io.debezium.data.Tsvector"))
    );
}

#[test]
fn intervals_beyond_int64_saturate() {
    assert_eq!(
        val(&Kind::MicroDuration, Some("-178000000 years")),
        json!(i64::MIN)
    );
    assert_eq!(
        val(&Kind::MicroDuration, Some("178000000 years")),
        json!(i64::MAX)
    );
}

#[test]
fn unchanged_toast_arrays_carry_debeziums_placeholders() {
    let s = Shape {
        prefix: "p.s.t".into(),
        fields: ["ta", "ia", "la", "na"]
            .iter()
            .zip([
                Kind::Str(None),
                Kind::Int32,
                Kind::Int64,
                Kind::VariableDecimal,
            ])
            .map(|(n, k)| Field {
                name: (*n).into(),
                kind: Kind::Array(Box::new(k)),
                optional: true,
            })
            .collect(),
        key: vec![],
    };
    let unchanged: Vec<String> = ["ta", "ia", "la", "na"].map(String::from).to_vec();
    let mut out = String::new();
    s.row(
        &RowText {
            columns: &[],
            values: &[],
            unchanged: &unchanged,
        },
        &mut out,
    )
    .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let bytes: Vec<u8> = UNAVAILABLE.bytes().collect();
    assert_eq!(v["ta"], json!([UNAVAILABLE]));
    assert_eq!(v["ia"], json!(bytes));
    assert_eq!(v["la"], json!(bytes));
    assert_eq!(v["na"], Value::Null);
}
