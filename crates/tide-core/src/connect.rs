//! Kafka Connect schemas for the `kafka` target's `value_format = 'debezium-schema'` and
//! `key_format = 'json-schema'`: the JSON that Kafka Connect's `JsonConverter` writes with
//! `schemas.enable=true` for Debezium's PostgreSQL connector (`{"schema": ..., "payload": ...}`),
//! planned purely.
//!
//! Owns: how a PostgreSQL column type maps to a Connect schema ([`kind`], Debezium's default
//! mappings: `decimal.handling.mode=precise`, `time.precision.mode=adaptive`,
//! `interval.handling.mode=numeric`, `binary.handling.mode=bytes`), how a column's text output
//! becomes that schema's JSON value ([`value`]), and the envelope's and the key's schemas
//! ([`Shape`]). README "Kafka target" documents the mapping table.
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

/// Standard base64 with padding (what `JsonConverter` writes for bytes).
pub fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                s.push(char::from(A[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// The unscaled value of a decimal text at `scale` (digits after the point, negative: before),
/// as Java's `BigInteger.toByteArray()`: two's complement, big-endian, minimal. `None` for text
/// that is not a plain decimal, or that has non-zero digits below the scale.
pub fn unscaled_bytes(text: &str, scale: i32) -> Option<Vec<u8>> {
    let (neg, t) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().chain(frac.bytes()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    let mut digits: Vec<u8> = int.bytes().chain(frac.bytes()).map(|c| c - b'0').collect();
    let have = frac.len() as i64;
    let want = i64::from(scale);
    if want >= have {
        digits.extend(std::iter::repeat_n(0, (want - have) as usize));
    } else {
        let drop = (have - want) as usize;
        if drop > digits.len() {
            if digits.iter().any(|d| *d != 0) {
                return None;
            }
            digits.clear();
        } else {
            let cut = digits.len() - drop;
            if digits[cut..].iter().any(|d| *d != 0) {
                return None;
            }
            digits.truncate(cut);
        }
    }
    // Magnitude, big-endian base 256.
    let mut mag: Vec<u8> = Vec::new();
    for d in digits {
        let mut carry = u32::from(d);
        for b in mag.iter_mut().rev() {
            let v = u32::from(*b) * 10 + carry;
            *b = (v & 0xff) as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            mag.insert(0, (carry & 0xff) as u8);
            carry >>= 8;
        }
    }
    while mag.first() == Some(&0) {
        mag.remove(0);
    }
    let zero = mag.is_empty();
    mag.insert(0, 0);
    if neg && !zero {
        // Two's complement: invert, add one.
        for b in mag.iter_mut() {
            *b = !*b;
        }
        for b in mag.iter_mut().rev() {
            let (v, o) = b.overflowing_add(1);
            *b = v;
            if !o {
                break;
            }
        }
        while mag.len() > 1 && mag[0] == 0xff && mag[1] & 0x80 != 0 {
            mag.remove(0);
        }
    } else {
        while mag.len() > 1 && mag[0] == 0 && mag[1] & 0x80 == 0 {
            mag.remove(0);
        }
    }
    Some(mag)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (astronomical year: 1 BC is 0).
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01: (astronomical year, month, day).
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `YYYY-MM-DD` (ISO output; the year may have more digits) and whether ` BC` followed, as days
/// since the epoch.
fn parse_date(s: &str, bc: bool) -> Option<i64> {
    let mut p = s.rsplitn(3, '-');
    let d: i64 = p.next()?.parse().ok()?;
    let m: i64 = p.next()?.parse().ok()?;
    let y: i64 = p.next()?.parse().ok()?;
    let y = if bc { 1 - y } else { y };
    Some(days_from_civil(y, m, d))
}

/// `HH:MM:SS[.ffffff]` as microseconds (hours may exceed 24 for an interval).
fn parse_clock(s: &str) -> Option<i64> {
    let mut p = s.splitn(3, ':');
    let h: i64 = p.next()?.parse().ok()?;
    let m: i64 = p.next()?.parse().ok()?;
    let sec = p.next().unwrap_or("0");
    let (whole, frac) = sec.split_once('.').unwrap_or((sec, ""));
    let s: i64 = whole.parse().ok()?;
    if frac.len() > 6 || !frac.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let us: i64 = format!("{frac:0<6}").parse().ok()?;
    Some(((h * 60 + m) * 60 + s) * 1_000_000 + us)
}

/// A time of day with an offset (`12:00:00+05:30`, `-08`, `+05:30:15`): (local µs, offset s).
fn split_offset(s: &str) -> Option<(&str, i64)> {
    let i = s.rfind(['+', '-'])?;
    let (t, off) = s.split_at(i);
    let sign = if off.starts_with('-') { -1 } else { 1 };
    let mut secs = 0;
    for (k, part) in off[1..].split(':').enumerate() {
        let v: i64 = part.parse().ok()?;
        secs += v * [3600, 60, 1].get(k)?;
    }
    Some((t, sign * secs))
}

/// `YYYY-MM-DD HH:MM:SS[.f][offset][ BC]` as (µs since the epoch in UTC, had an offset).
fn parse_timestamp(s: &str, zoned: bool) -> Option<i64> {
    let (s, bc) = match s.strip_suffix(" BC") {
        Some(r) => (r, true),
        None => (s, false),
    };
    let (date, time) = s.split_once(' ')?;
    let (time, offset) = if zoned {
        split_offset(time)?
    } else {
        (time, 0)
    };
    let days = parse_date(date, bc)?;
    Some(days * DAY_US + parse_clock(time)? - offset * 1_000_000)
}

/// Seconds and fraction of a µs-of-day, as ISO-8601 prints them (`HH:MM:SS[.f]`, trailing
/// zeros of the fraction dropped).
fn push_clock(out: &mut String, us: i64) {
    push_clock_width(out, us, None);
}

/// [`push_clock`], with the fraction written in exactly `width` digits when given (none for 0).
fn push_clock_width(out: &mut String, us: i64, width: Option<u8>) {
    let s = us / 1_000_000;
    out.push_str(&format!(
        "{:02}:{:02}:{:02}",
        s / 3600,
        (s / 60) % 60,
        s % 60
    ));
    let f = us % 1_000_000;
    let t = format!("{f:06}");
    match width {
        Some(0) => {}
        Some(w) => {
            out.push('.');
            out.push_str(&t[..usize::from(w.min(6))]);
        }
        None if f != 0 => {
            out.push('.');
            out.push_str(t.trim_end_matches('0'));
        }
        None => {}
    }
}

/// An instant (µs since the epoch) as Java's `ISO_OFFSET_DATE_TIME` in UTC.
pub fn iso_utc(us: i64) -> String {
    iso_utc_width(us, None)
}

/// [`iso_utc`] with the fraction in exactly `width` digits when given (Debezium's
/// `ZonedTimestamp` of a column of that precision).
pub fn iso_utc_width(us: i64, width: Option<u8>) -> String {
    let (y, m, d) = civil_from_days(us.div_euclid(DAY_US));
    let mut out = if (0..=9999).contains(&y) {
        format!("{y:04}-{m:02}-{d:02}T")
    } else {
        format!(
            "{}{:04}-{m:02}-{d:02}T",
            if y < 0 { "-" } else { "+" },
            y.abs()
        )
    };
    push_clock_width(&mut out, us.rem_euclid(DAY_US), width);
    out.push('Z');
    out
}

/// An interval's output in `IntervalStyle` postgres (`1 year 2 mons -3 days +04:05:06.5`) as
/// Debezium's `MicroDuration`.
fn parse_interval(s: &str) -> Option<i64> {
    // In i128, then clamped: Debezium saturates at the int64 range (`-178000000 years`).
    let mut total: i128 = 0;
    let mut words = s.split_whitespace();
    while let Some(w) = words.next() {
        if w.contains(':') {
            let (neg, t) = match w.strip_prefix('-') {
                Some(r) => (true, r),
                None => (false, w.strip_prefix('+').unwrap_or(w)),
            };
            let us = i128::from(parse_clock(t)?);
            total += if neg { -us } else { us };
            continue;
        }
        let n: i128 = w.parse().ok()?;
        let unit = words.next()?;
        total += n * i128::from(match unit.trim_end_matches('s') {
            "year" => 12 * MONTH_US,
            "mon" => MONTH_US,
            "day" => DAY_US,
            _ => return None,
        });
    }
    Some(total.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64)
}

/// A bit string's text (`0101`) as Debezium's `Bits`: the binary number it spells,
/// little-endian, without trailing zero bytes (empty for zero), as `BitSet.toByteArray()`.
fn bits_bytes(s: &str) -> Option<Vec<u8>> {
    let mut out = vec![0u8; s.len().div_ceil(8)];
    for (i, c) in s.bytes().rev().enumerate() {
        match c {
            b'1' => out[i / 8] |= 1 << (i % 8),
            b'0' => {}
            _ => return None,
        }
    }
    while out.last() == Some(&0) {
        out.pop();
    }
    Some(out)
}

/// A point's text (`(1.5,-2.25)`) as Debezium's `Point` struct: `x`, `y` as JSON numbers (NaN
/// and infinities as strings, as Jackson writes them), `wkb` the well-known binary of the point
/// (little-endian), `srid` null.
fn push_point(s: &str, out: &mut String) -> Option<()> {
    let (x, y) = s.strip_prefix('(')?.strip_suffix(')')?.split_once(',')?;
    let (fx, fy): (f64, f64) = (parse_float(x)?, parse_float(y)?);
    let mut wkb = vec![1u8, 1, 0, 0, 0];
    wkb.extend_from_slice(&fx.to_le_bytes());
    wkb.extend_from_slice(&fy.to_le_bytes());
    out.push_str("{\"x\":");
    push_float(out, x)?;
    out.push_str(",\"y\":");
    push_float(out, y)?;
    out.push_str(",\"wkb\":");
    push_string(out, &base64(&wkb));
    out.push_str(",\"srid\":null}");
    Some(())
}

/// A float's text output (`NaN`, `Infinity`, `-Infinity` included) as an `f64`.
fn parse_float(t: &str) -> Option<f64> {
    match t {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => t.parse().ok(),
    }
}

/// Bytes of `bytea`'s hex output (`\x0a0b`).
fn parse_bytea(s: &str) -> Option<Vec<u8>> {
    let h = s.strip_prefix("\\x")?;
    if h.len() % 2 != 0 {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The elements of an array's text output (`{1,NULL,"a b"}`, `[0:1]={..}`), flattened in
/// row-major order when it has more than one dimension; NULL as `None`.
pub fn parse_array(s: &str) -> Option<Vec<Option<String>>> {
    let s = match s.find('=') {
        Some(i) if s.starts_with('[') => &s[i + 1..],
        _ => s,
    };
    let mut out = Vec::new();
    let mut cur = String::new();
    let (mut quoted, mut was_quoted, mut in_item) = (false, false, false);
    let mut chars = s.chars();
    let mut depth = 0;
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '\\' => cur.push(chars.next()?),
                '"' => quoted = false,
                _ => cur.push(c),
            }
            continue;
        }
        match c {
            '{' => depth += 1,
            '"' => {
                quoted = true;
                was_quoted = true;
                in_item = true;
            }
            ',' | '}' => {
                if in_item {
                    let item = std::mem::take(&mut cur);
                    let item = if was_quoted {
                        item
                    } else {
                        item.trim().to_string()
                    };
                    out.push((was_quoted || !item.eq_ignore_ascii_case("NULL")).then_some(item));
                }
                (in_item, was_quoted) = (false, false);
                if c == '}' {
                    depth -= 1;
                }
            }
            '\\' => {
                cur.push(chars.next()?);
                in_item = true;
            }
            c if c.is_whitespace() && !in_item => {}
            _ => {
                cur.push(c);
                in_item = true;
            }
        }
    }
    (depth == 0 && !quoted).then_some(out)
}

/// A float's text output as JSON: a number, or `"NaN"`, `"Infinity"`, `"-Infinity"` as strings
/// (what Jackson writes for them).
fn push_float(out: &mut String, t: &str) -> Option<()> {
    match t {
        "NaN" | "Infinity" | "-Infinity" => push_string(out, t),
        _ => {
            t.parse::<f64>().ok()?;
            out.push_str(t);
        }
    }
    Some(())
}

/// A non-infinite value or `None`; infinities map to `pos`, `neg`.
fn finite<T>(t: &str, pos: T, neg: T, f: impl FnOnce(&str) -> Option<T>) -> Option<T> {
    match t {
        "infinity" => Some(pos),
        "-infinity" => Some(neg),
        _ => f(t),
    }
}

/// Render a column's text output (`None`: NULL) as the JSON value of its schema. NaN and
/// infinite `numeric`s are `null` (a Connect decimal cannot hold them, as in Debezium's precise
/// mode); infinite dates and timestamps are the type's extreme (`int32`/`int64` max and min) and
/// the strings `infinity` / `-infinity` for `timestamptz`. `Err` names what did not parse.
pub fn value(k: &Kind, text: Option<&str>, out: &mut String) -> Result<(), String> {
    let Some(t) = text else {
        out.push_str("null");
        return Ok(());
    };
    let bad = || format!("cannot render {t:?} as a {k:?} value");
    let ok = match k {
        Kind::Boolean => {
            // `1` / `0`: a bit(1), which Debezium maps to a boolean.
            out.push_str(if matches!(t, "t" | "true" | "1") {
                "true"
            } else {
                "false"
            });
            matches!(t, "t" | "f" | "true" | "false" | "1" | "0").then_some(())
        }
        Kind::Int16 | Kind::Int32 | Kind::Int64 => t.parse::<i64>().ok().map(|n| {
            out.push_str(&n.to_string());
        }),
        Kind::Float | Kind::Double => push_float(out, t),
        Kind::Decimal { scale, .. } => {
            if matches!(t, "NaN" | "Infinity" | "-Infinity") {
                out.push_str("null");
                Some(())
            } else {
                unscaled_bytes(t, *scale).map(|b| push_string(out, &base64(&b)))
            }
        }
        Kind::VariableDecimal => {
            if matches!(t, "NaN" | "Infinity" | "-Infinity") {
                out.push_str("null");
                Some(())
            } else {
                let scale = t.split_once('.').map_or(0, |(_, f)| f.len() as i32);
                unscaled_bytes(t, scale).map(|b| {
                    out.push_str(&format!("{{\"scale\":{scale},\"value\":"));
                    push_string(out, &base64(&b));
                    out.push('}');
                })
            }
        }
        Kind::Date => finite(t, i64::from(i32::MAX), i64::from(i32::MIN), |t| {
            match t.strip_suffix(" BC") {
                Some(d) => parse_date(d, true),
                None => parse_date(t, false),
            }
        })
        .map(|d| out.push_str(&d.to_string())),
        Kind::Time => parse_clock(t).map(|us| out.push_str(&(us / 1000).to_string())),
        Kind::MicroTime => parse_clock(t).map(|us| out.push_str(&us.to_string())),
        Kind::ZonedTime => split_offset(t).and_then(|(c, off)| {
            let us = (parse_clock(c)? - off * 1_000_000).rem_euclid(DAY_US);
            let mut s = String::new();
            push_clock(&mut s, us);
            s.push('Z');
            push_string(out, &s);
            Some(())
        }),
        Kind::Timestamp => finite(t, i64::MAX, i64::MIN, |t| {
            parse_timestamp(t, false).map(|us| us.div_euclid(1000))
        })
        .map(|v| out.push_str(&v.to_string())),
        Kind::MicroTimestamp => finite(t, i64::MAX, i64::MIN, |t| parse_timestamp(t, false))
            .map(|v| out.push_str(&v.to_string())),
        Kind::ZonedTimestamp(p) => match t {
            "infinity" | "-infinity" => {
                push_string(out, t);
                Some(())
            }
            _ => parse_timestamp(t, true).map(|us| push_string(out, &iso_utc_width(us, Some(*p)))),
        },
        Kind::MicroDuration => parse_interval(t).map(|v| out.push_str(&v.to_string())),
        Kind::Bytes => parse_bytea(t).map(|b| push_string(out, &base64(&b))),
        Kind::Bits(_) => bits_bytes(t).map(|b| push_string(out, &base64(&b))),
        Kind::Point => push_point(t, out),
        Kind::Str(_) | Kind::Enum(_) => {
            push_string(out, t);
            Some(())
        }
        Kind::Array(e) => {
            let items = parse_array(t).ok_or_else(bad)?;
            out.push('[');
            for (i, it) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                value(e, it.as_deref(), out)?;
            }
            out.push(']');
            Some(())
        }
    };
    ok.ok_or_else(bad)
}

/// The value Debezium writes for a required (NOT NULL) field it has no value for (a delete's
/// non-key columns under the default replica identity): the type's zero.
pub fn fallback(k: &Kind, out: &mut String) {
    out.push_str(match k {
        Kind::Boolean => "false",
        Kind::Int16
        | Kind::Int32
        | Kind::Int64
        | Kind::Date
        | Kind::Time
        | Kind::MicroTime
        | Kind::Timestamp
        | Kind::MicroTimestamp
        | Kind::MicroDuration => "0",
        Kind::Float | Kind::Double => "0.0",
        Kind::Decimal { .. } => "\"AA==\"",
        Kind::VariableDecimal => "{\"scale\":0,\"value\":\"AA==\"}",
        Kind::ZonedTime => "\"00:00:00Z\"",
        Kind::ZonedTimestamp(_) => "\"1970-01-01T00:00:00Z\"",
        Kind::Bytes | Kind::Bits(_) => "\"\"",
        Kind::Point => "{\"x\":0.0,\"y\":0.0,\"wkb\":null,\"srid\":null}",
        Kind::Str(_) | Kind::Enum(_) => "\"\"",
        Kind::Array(_) => "[]",
    });
}

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

#[cfg(test)]
#[path = "connect_tests.rs"]
mod tests;
