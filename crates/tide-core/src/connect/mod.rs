//! Kafka Connect schemas for the `kafka` target's `value_format = 'debezium-schema'` and
//! `key_format = 'json-schema'`: the JSON that Kafka Connect's `JsonConverter` writes with
//! `schemas.enable=true` for Debezium's PostgreSQL connector (`{"schema": ..., "payload": ...}`),
//! planned purely.
//!
//! Owns: how a PostgreSQL column type maps to a Connect schema ([`kind`], Debezium's default
//! mappings: `decimal.handling.mode=precise`, `time.precision.mode=adaptive`,
//! `interval.handling.mode=numeric`, `binary.handling.mode=bytes`), how a column's text output
//! becomes that schema's JSON value ([`value`]), and the envelope's and the key's schemas
//! ([`Shape`], in `shape.rs`; the values in `values.rs`). docs/kafka.md, "Types", documents the
//! mapping table.
//!
//! Guarantees:
//! - Values are rendered from the column's text output as the worker's sessions produce it
//!   (`DateStyle` ISO, `TimeZone` UTC, `IntervalStyle` postgres, `bytea_output` hex; see
//!   `worker::tx::output_settings`), so the stream and a backfill render a value identically.
//! - A text [`value`] cannot parse is an error naming the column's type, never a wrong value.
//! - Schema JSON is written in the member order `JsonConverter` uses (`type`, `fields`/`items`,
//!   `optional`, `name`, `version`, `doc`, `parameters`, `default`, `field`), so a schema is the
//!   same bytes for the same table shape.

use crate::json::push_string;
use crate::kafka::{op_code, push_processing_time, push_source_head, txn_id, SourceHead};
use crate::lsn::Lsn;
use crate::model::Op;

/// Microseconds per day.
const DAY_US: i64 = 86_400_000_000;
/// Debezium's average month (365.25 / 12 days) in microseconds (`MicroDuration`).
const MONTH_US: i64 = 2_629_800_000_000;
/// What Debezium writes for a value it does not have (an unchanged TOASTed column): its
/// `unavailable.value.placeholder` default.
pub const UNAVAILABLE: &str = "__debezium_unavailable_value";

/// A column's Connect schema, as Debezium maps its PostgreSQL type by default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Boolean,
    Int16,
    Int32,
    Int64,
    Float,
    Double,
    /// `numeric(p, s)`: `org.apache.kafka.connect.data.Decimal` (bytes: the unscaled value, two's
    /// complement, big-endian), `scale` from the typmod.
    Decimal {
        precision: i32,
        scale: i32,
    },
    /// `numeric` without a typmod: `io.debezium.data.VariableScaleDecimal` (`scale`, `value`).
    VariableDecimal,
    /// `date`: `io.debezium.time.Date`, days since 1970-01-01 (int32).
    Date,
    /// `time(0..3)`: `io.debezium.time.Time`, milliseconds past midnight (int32).
    Time,
    /// `time`, `time(4..6)`: `io.debezium.time.MicroTime`, microseconds past midnight (int64).
    MicroTime,
    /// `timetz`: `io.debezium.time.ZonedTime`, ISO-8601 in UTC (string).
    ZonedTime,
    /// `timestamp(0..3)`: `io.debezium.time.Timestamp`, milliseconds since the epoch (int64).
    Timestamp,
    /// `timestamp`, `timestamp(4..6)`: `io.debezium.time.MicroTimestamp` (int64).
    MicroTimestamp,
    /// `timestamptz(p)`: `io.debezium.time.ZonedTimestamp`, ISO-8601 in UTC (string), the
    /// fraction written with the column's precision `p` (6 without a typmod) as Debezium 3.6
    /// writes it (`.500` for `timestamptz(3)`, none for `timestamptz(0)`).
    ZonedTimestamp(u8),
    /// `interval`: `io.debezium.time.MicroDuration` (int64, a month = 30.4375 days).
    MicroDuration,
    /// `bytea`: bytes (base64 in JSON).
    Bytes,
    /// `bit(n)` (n > 1), `varbit(n)`: `io.debezium.data.Bits` (bytes: the bit string read as a
    /// binary number, little-endian, as Java's `BitSet.toByteArray()`), parameter `length` (n;
    /// 2147483647 for a `varbit` without one). `bit(1)` is [`Kind::Boolean`].
    Bits(i32),
    /// `point`: `io.debezium.data.geometry.Point` (`x`, `y` doubles; `wkb` its well-known binary,
    /// little-endian; `srid` null).
    Point,
    /// A string, with a Debezium semantic name (`io.debezium.data.Uuid`, `Json`, `Xml`) or none.
    Str(Option<&'static str>),
    /// An enum: `io.debezium.data.Enum` with its labels in `allowed`.
    Enum(String),
    /// A one-dimensional array of the element's schema (elements optional).
    Array(Box<Kind>),
}

/// The [`Kind`] of a column: `type_oid` the base type (a domain resolved to its base, with the
/// base's typmod when the attribute has none), `typmod` the attribute's, `elem` the element
/// type of an array type (0 if none), `labels` an enum's labels joined with `,` (of the element
/// for an array of an enum). Types Debezium maps differently by default or not at all (money,
/// bit, geometric, network, range types, ...) are strings: their text output.
pub fn kind(type_oid: u32, typmod: i32, elem: u32, labels: Option<&str>) -> Kind {
    if elem != 0 {
        return Kind::Array(Box::new(kind(elem, typmod, 0, labels)));
    }
    if let Some(l) = labels {
        return Kind::Enum(l.to_string());
    }
    let precision = if typmod >= 0 { typmod } else { 6 };
    match type_oid {
        16 => Kind::Boolean,
        21 => Kind::Int16,
        23 => Kind::Int32,
        20 | 26 => Kind::Int64,
        700 => Kind::Float,
        701 => Kind::Double,
        1700 if typmod >= 4 => {
            let t = typmod - 4;
            Kind::Decimal {
                precision: (t >> 16) & 0xffff,
                // PostgreSQL 15's scale is 11 bits, signed (numeric(2, -3)).
                scale: ((t & 0x7ff) ^ 1024) - 1024,
            }
        }
        1700 => Kind::VariableDecimal,
        1082 => Kind::Date,
        1083 if precision <= 3 => Kind::Time,
        1083 => Kind::MicroTime,
        1266 => Kind::ZonedTime,
        1114 if precision <= 3 => Kind::Timestamp,
        1114 => Kind::MicroTimestamp,
        1184 => Kind::ZonedTimestamp(precision.clamp(0, 6) as u8),
        1560 if typmod == 1 => Kind::Boolean,
        1560 | 1562 => Kind::Bits(if typmod >= 0 { typmod } else { i32::MAX }),
        600 => Kind::Point,
        3614 => Kind::Str(Some("io.debezium.data.Tsvector")),
        1186 => Kind::MicroDuration,
        17 => Kind::Bytes,
        2950 => Kind::Str(Some("io.debezium.data.Uuid")),
        114 | 3802 => Kind::Str(Some("io.debezium.data.Json")),
        142 => Kind::Str(Some("io.debezium.data.Xml")),
        _ => Kind::Str(None),
    }
}

/// A field of a Connect struct: a column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub kind: Kind,
    /// The column may be NULL (Debezium: `optional` is the column's nullability).
    pub optional: bool,
}

/// `{"type":T,` of a primitive; the caller closes it.
fn open(out: &mut String, t: &str) {
    out.push_str("{\"type\":\"");
    out.push_str(t);
    out.push('"');
}

/// `,"optional":..,"name":..,"version":1` (name and version only with a name).
fn close_named(out: &mut String, optional: bool, name: Option<&str>) {
    out.push_str(if optional {
        ",\"optional\":true"
    } else {
        ",\"optional\":false"
    });
    if let Some(n) = name {
        out.push_str(",\"name\":");
        push_string(out, n);
        out.push_str(",\"version\":1");
    }
}

/// The schema of a kind, without `field` and the closing brace (so a caller can add `field`).
fn kind_schema_open(k: &Kind, optional: bool, out: &mut String) {
    let (t, name): (&str, Option<&str>) = match k {
        Kind::Boolean => ("boolean", None),
        Kind::Int16 => ("int16", None),
        Kind::Int32 => ("int32", None),
        Kind::Int64 => ("int64", None),
        Kind::Float => ("float", None),
        Kind::Double => ("double", None),
        Kind::Decimal { precision, scale } => {
            open(out, "bytes");
            close_named(out, optional, Some("org.apache.kafka.connect.data.Decimal"));
            out.push_str(&format!(
                ",\"parameters\":{{\"scale\":\"{scale}\",\"connect.decimal.precision\":\"{precision}\"}}"
            ));
            return;
        }
        Kind::VariableDecimal => {
            out.push_str("{\"type\":\"struct\",\"fields\":[{\"type\":\"int32\",\"optional\":false,\"field\":\"scale\"},{\"type\":\"bytes\",\"optional\":false,\"field\":\"value\"}]");
            close_named(out, optional, Some("io.debezium.data.VariableScaleDecimal"));
            out.push_str(",\"doc\":\"Variable scaled decimal\"");
            return;
        }
        Kind::Date => ("int32", Some("io.debezium.time.Date")),
        Kind::Time => ("int32", Some("io.debezium.time.Time")),
        Kind::MicroTime => ("int64", Some("io.debezium.time.MicroTime")),
        Kind::ZonedTime => ("string", Some("io.debezium.time.ZonedTime")),
        Kind::Timestamp => ("int64", Some("io.debezium.time.Timestamp")),
        Kind::MicroTimestamp => ("int64", Some("io.debezium.time.MicroTimestamp")),
        Kind::ZonedTimestamp(_) => ("string", Some("io.debezium.time.ZonedTimestamp")),
        Kind::MicroDuration => ("int64", Some("io.debezium.time.MicroDuration")),
        Kind::Bytes => ("bytes", None),
        Kind::Bits(length) => {
            open(out, "bytes");
            close_named(out, optional, Some("io.debezium.data.Bits"));
            out.push_str(&format!(",\"parameters\":{{\"length\":\"{length}\"}}"));
            return;
        }
        Kind::Point => {
            out.push_str(concat!(
                "{\"type\":\"struct\",\"fields\":[",
                "{\"type\":\"double\",\"optional\":false,\"field\":\"x\"},",
                "{\"type\":\"double\",\"optional\":false,\"field\":\"y\"},",
                "{\"type\":\"bytes\",\"optional\":true,\"field\":\"wkb\"},",
                "{\"type\":\"int32\",\"optional\":true,\"field\":\"srid\"}]"
            ));
            close_named(out, optional, Some("io.debezium.data.geometry.Point"));
            out.push_str(",\"doc\":\"Geometry (POINT)\"");
            return;
        }
        Kind::Str(n) => ("string", *n),
        Kind::Enum(labels) => {
            open(out, "string");
            close_named(out, optional, Some("io.debezium.data.Enum"));
            out.push_str(",\"parameters\":{\"allowed\":");
            push_string(out, labels);
            out.push('}');
            return;
        }
        Kind::Array(e) => {
            out.push_str("{\"type\":\"array\",\"items\":");
            kind_schema_open(e, true, out);
            out.push('}');
            close_named(out, optional, None);
            return;
        }
    };
    open(out, t);
    close_named(out, optional, name);
}

/// The schema of a field: `{"type":..,"optional":..,...,"field":name}`.
pub fn field_schema(f: &Field, out: &mut String) {
    kind_schema_open(&f.kind, f.optional, out);
    out.push_str(",\"field\":");
    push_string(out, &f.name);
    out.push('}');
}

/// A struct schema named `name` of `fields`, with `,"field":field` when it is a field itself.
pub fn struct_schema(
    name: &str,
    fields: &[Field],
    optional: bool,
    field: Option<&str>,
    out: &mut String,
) {
    out.push_str("{\"type\":\"struct\",\"fields\":[");
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        field_schema(f, out);
    }
    out.push(']');
    close_named(out, optional, None);
    out.push_str(",\"name\":");
    push_string(out, name);
    if let Some(f) = field {
        out.push_str(",\"field\":");
        push_string(out, f);
    }
    out.push('}');
}

mod shape;
mod values;

pub use shape::*;
pub use values::*;

#[cfg(test)]
#[path = "../connect_tests.rs"]
mod tests;
