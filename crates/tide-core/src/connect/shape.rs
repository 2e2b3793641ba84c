//! The Connect shape of one table ([`Shape`]): the envelope's and the key's schemas, a row's
//! struct, and the whole message ([`message`]).

use super::*;

/// The Connect shape of one table: its fields (columns, in attribute order) and key columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// `<topic prefix>.<schema>.<table>`: the prefix of the schema names.
    pub prefix: String,
    pub fields: Vec<Field>,
    /// The key's columns, in key order.
    pub key: Vec<String>,
}

/// How one row's values reach [`Shape::row`]: the columns present with their text output.
pub struct RowText<'a> {
    pub columns: &'a [String],
    pub values: &'a [Option<String>],
    /// Columns not sent (unchanged TOAST): Debezium's placeholder where the type is a string or
    /// bytes, else null.
    pub unchanged: &'a [String],
}

impl Shape {
    /// The name of the `before`/`after` struct: `<prefix>.<schema>.<table>.Value`.
    pub fn value_name(&self) -> String {
        format!("{}.Value", self.prefix)
    }

    fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// The `after` (or a delete's `before`) struct of a row: every field, from `row` where it
    /// has the column, else the unavailable placeholder (an unchanged column), else null
    /// (optional) or the type's zero ([`fallback`]).
    pub fn row(&self, row: &RowText<'_>, out: &mut String) -> Result<(), String> {
        out.push('{');
        for (i, f) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_string(out, &f.name);
            out.push(':');
            if let Some(j) = row.columns.iter().position(|c| *c == f.name) {
                let v = row.values.get(j).and_then(|v| v.as_deref());
                value(&f.kind, v, out).map_err(|e| format!("column \"{}\": {e}", f.name))?;
            } else if row.unchanged.contains(&f.name) {
                match &f.kind {
                    Kind::Str(_) => push_string(out, UNAVAILABLE),
                    Kind::Bytes => push_string(out, &base64(UNAVAILABLE.as_bytes())),
                    // Debezium's placeholders for arrays: a text array holds the placeholder; an
                    // integer array the placeholder's bytes, one element each.
                    Kind::Array(e) if matches!(**e, Kind::Str(None)) => {
                        out.push('[');
                        push_string(out, UNAVAILABLE);
                        out.push(']');
                    }
                    Kind::Array(e) if matches!(**e, Kind::Int32 | Kind::Int64) => {
                        let items: Vec<String> =
                            UNAVAILABLE.bytes().map(|b| b.to_string()).collect();
                        out.push('[');
                        out.push_str(&items.join(","));
                        out.push(']');
                    }
                    _ if f.optional => out.push_str("null"),
                    _ => fallback(&f.kind, out),
                }
            } else if f.optional {
                out.push_str("null");
            } else {
                fallback(&f.kind, out);
            }
        }
        out.push('}');
        Ok(())
    }

    /// Whether every column of `columns` is a field (else the shape is stale).
    pub fn covers(&self, columns: &[String]) -> bool {
        columns.iter().all(|c| self.field(c).is_some())
    }

    /// The key's fields (never optional).
    fn key_fields(&self) -> Vec<Field> {
        self.key
            .iter()
            .filter_map(|k| self.field(k))
            .map(|f| Field {
                optional: false,
                ..f.clone()
            })
            .collect()
    }

    /// The key message, `{"schema": <prefix>.Key struct, "payload": {...}}`, of the key
    /// columns' text values by name.
    pub fn key_message(&self, key: &[(String, Option<String>)]) -> Result<String, String> {
        let fields = self.key_fields();
        let mut out = String::from("{\"schema\":");
        struct_schema(
            &format!("{}.Key", self.prefix),
            &fields,
            false,
            None,
            &mut out,
        );
        out.push_str(",\"payload\":{");
        for (i, f) in fields.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_string(&mut out, &f.name);
            out.push(':');
            let v = key
                .iter()
                .find(|(n, _)| *n == f.name)
                .and_then(|(_, v)| v.as_deref());
            value(&f.kind, v, &mut out).map_err(|e| format!("key column \"{}\": {e}", f.name))?;
        }
        out.push_str("}}");
        Ok(out)
    }

    /// The envelope's schema (`<prefix>.Envelope`): `before`, `after` (the Value struct),
    /// `source` (`io.debezium.connector.postgresql.Source`, with pg_tide's identity fields),
    /// `op`, `ts_ms`, `transaction` (`event.block`), and pg_tide's `schema_change` and
    /// `truncated` (JSON text, null on other events).
    pub fn envelope_schema(&self) -> String {
        let mut out = String::with_capacity(2048);
        let vn = self.value_name();
        out.push_str("{\"type\":\"struct\",\"fields\":[");
        struct_schema(&vn, &self.fields, true, Some("before"), &mut out);
        out.push(',');
        struct_schema(&vn, &self.fields, true, Some("after"), &mut out);
        out.push_str(concat!(
            ",{\"type\":\"struct\",\"fields\":[",
            "{\"type\":\"string\",\"optional\":false,\"field\":\"version\"},",
            "{\"type\":\"string\",\"optional\":false,\"field\":\"connector\"},",
            "{\"type\":\"string\",\"optional\":false,\"field\":\"name\"},",
            "{\"type\":\"int64\",\"optional\":false,\"field\":\"ts_ms\"},",
            "{\"type\":\"string\",\"optional\":true,\"name\":\"io.debezium.data.Enum\",\"version\":1,",
            "\"parameters\":{\"allowed\":\"true,first,first_in_data_collection,last_in_data_collection,last,false,incremental\"},\"default\":\"false\",\"field\":\"snapshot\"},",
            "{\"type\":\"string\",\"optional\":false,\"field\":\"db\"},",
            "{\"type\":\"int64\",\"optional\":true,\"field\":\"ts_us\"},",
            "{\"type\":\"int64\",\"optional\":true,\"field\":\"ts_ns\"},",
            "{\"type\":\"string\",\"optional\":false,\"field\":\"schema\"},",
            "{\"type\":\"string\",\"optional\":false,\"field\":\"table\"},",
            "{\"type\":\"int64\",\"optional\":true,\"field\":\"txId\"},",
            "{\"type\":\"int64\",\"optional\":true,\"field\":\"lsn\"},",
            "{\"type\":\"string\",\"optional\":false,\"field\":\"commit_lsn\"},",
            "{\"type\":\"int32\",\"optional\":false,\"field\":\"position\"},",
            "{\"type\":\"int64\",\"optional\":true,\"field\":\"backfill_id\"},",
            "{\"type\":\"int64\",\"optional\":true,\"field\":\"chunk\"},",
            "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"optional\":false},\"optional\":true,\"field\":\"unchanged\"}",
            "],\"optional\":false,\"name\":\"io.debezium.connector.postgresql.Source\",\"version\":1,\"field\":\"source\"},",
            "{\"type\":\"struct\",\"fields\":[",
            "{\"type\":\"string\",\"optional\":false,\"field\":\"id\"},",
            "{\"type\":\"int64\",\"optional\":false,\"field\":\"total_order\"},",
            "{\"type\":\"int64\",\"optional\":false,\"field\":\"data_collection_order\"}",
            "],\"optional\":true,\"name\":\"event.block\",\"version\":1,\"field\":\"transaction\"},",
            "{\"type\":\"string\",\"optional\":false,\"field\":\"op\"},",
            "{\"type\":\"int64\",\"optional\":true,\"field\":\"ts_ms\"},",
            "{\"type\":\"int64\",\"optional\":true,\"field\":\"ts_us\"},",
            "{\"type\":\"int64\",\"optional\":true,\"field\":\"ts_ns\"},",
            "{\"type\":\"string\",\"optional\":true,\"name\":\"io.debezium.data.Json\",\"version\":1,\"field\":\"schema_change\"},",
            "{\"type\":\"string\",\"optional\":true,\"name\":\"io.debezium.data.Json\",\"version\":1,\"field\":\"truncated\"}",
            "],\"optional\":false,\"name\":"
        ));
        push_string(&mut out, &format!("{}.Envelope", self.prefix));
        // Version 2: Debezium 3's envelope (with `ts_us`, `ts_ns`).
        out.push_str(",\"version\":2}");
        out
    }
}

/// One event's payload parts beyond the rows (as `kafka::EnvelopeEvent` has them).
#[derive(Debug, Clone)]
pub struct Payload<'a> {
    pub op: Op,
    /// The rendered `before` / `after` structs (JSON), or `None` for null.
    pub before: Option<&'a str>,
    pub after: Option<&'a str>,
    pub schema: &'a str,
    pub table: &'a str,
    pub xid: u32,
    pub commit_lsn: Lsn,
    pub position: i32,
    pub commit_time: i64,
    pub backfill: Option<(i64, i64)>,
    pub unchanged: &'a [String],
    pub data_collection_order: u64,
    /// Processing time, Unix microseconds.
    pub now_us: i64,
    /// For op `schema`: the change (JSON), written as JSON text.
    pub schema_change: Option<&'a str>,
    /// For a truncate of some partitions: what was emptied (JSON), written as JSON text.
    pub truncated: Option<&'a str>,
}

fn push_opt_string(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => push_string(out, s),
        None => out.push_str("null"),
    }
}

/// The whole message value: `{"schema": <envelope_schema>, "payload": {...}}`, every field of
/// the schema present in the payload (null where it has no value), as `JsonConverter` writes.
pub fn message(
    envelope_schema: &str,
    src: &crate::kafka::SourceInfo,
    p: &Payload<'_>,
    out: &mut String,
) {
    out.push_str("{\"schema\":");
    out.push_str(envelope_schema);
    out.push_str(",\"payload\":{\"before\":");
    out.push_str(p.before.unwrap_or("null"));
    out.push_str(",\"after\":");
    out.push_str(p.after.unwrap_or("null"));
    push_source_head(
        out,
        src,
        &SourceHead {
            commit_time: p.commit_time,
            op: p.op,
            schema: p.schema,
            table: p.table,
            xid: p.xid,
            commit_lsn: p.commit_lsn,
            position: p.position,
        },
    );
    match p.backfill {
        Some((b, c)) => out.push_str(&format!(",\"backfill_id\":{b},\"chunk\":{c}")),
        None => out.push_str(",\"backfill_id\":null,\"chunk\":null"),
    }
    out.push_str(",\"unchanged\":");
    if p.unchanged.is_empty() {
        out.push_str("null");
    } else {
        out.push('[');
        for (i, c) in p.unchanged.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_string(out, c);
        }
        out.push(']');
    }
    out.push_str("},\"transaction\":{\"id\":");
    push_string(out, &txn_id(p.xid, p.commit_lsn));
    out.push_str(&format!(
        ",\"total_order\":{},\"data_collection_order\":{}}},\"op\":",
        p.position, p.data_collection_order
    ));
    push_string(out, op_code(p.op));
    push_processing_time(out, p.now_us);
    out.push_str(",\"schema_change\":");
    push_opt_string(out, p.schema_change);
    out.push_str(",\"truncated\":");
    push_opt_string(out, p.truncated);
    out.push_str("}}");
}
