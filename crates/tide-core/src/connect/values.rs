//! A column's text output as the JSON value of its Connect schema ([`value`]), and the
//! conversions it needs (dates, times, intervals, decimals, bytes, arrays).

use super::*;

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
