//! JSON rendering of decoded rows for the outbox.
//!
//! Owns the mapping from a [`Tuple`] (text output of each column) to a JSON
//! object that `jsonb_populate_record` turns back into the same row.
//! Guarantees: the output is valid JSON (RFC 8259) provided `json`/`jsonb`
//! values are the server's output; numbers are copied digit for digit, never
//! through a float; every other value is its exact text in a JSON string;
//! columns whose value was not sent (unchanged TOAST) are left out and
//! reported, never replaced by a placeholder; on error `out` is left as it
//! was on entry.
//!
//! Known limit, inherent to `jsonb`: a `json` column's value is inlined, so
//! once stored as `jsonb` its whitespace, key order and duplicate keys are
//! normalized; its meaning is kept.

use crate::wire::{Column, Tuple, Value, COLUMN_KEY};
use std::fmt;

const BOOL: u32 = 16;
const INT8: u32 = 20;
const INT2: u32 = 21;
const INT4: u32 = 23;
const OID: u32 = 26;
const JSON: u32 = 114;
const FLOAT4: u32 = 700;
const FLOAT8: u32 = 701;
const NUMERIC: u32 = 1700;
const JSONB: u32 = 3802;

/// What the renderer needs to know about a column. Implemented for
/// [`wire::Column`](Column); the worker can implement it for its own cached
/// relation description instead of rebuilding `Column`s per row.
pub trait ColumnDesc {
    /// Column name (the JSON key).
    fn name(&self) -> &str;
    /// Type OID, which selects the JSON representation.
    fn type_oid(&self) -> u32;
    /// Whether the column is part of the replica-identity key.
    fn is_key(&self) -> bool;
}

impl ColumnDesc for Column<'_> {
    fn name(&self) -> &str {
        self.name
    }
    fn type_oid(&self) -> u32 {
        self.type_oid
    }
    fn is_key(&self) -> bool {
        self.flags & COLUMN_KEY != 0
    }
}

/// Why a tuple could not be rendered. Nothing was appended to `out`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RenderError {
    /// The tuple does not have one value per described column (stale or
    /// wrong relation description).
    WidthMismatch {
        /// Described columns.
        columns: usize,
        /// Values in the tuple.
        values: usize,
    },
    /// A key column's value is unchanged TOAST, i.e. was not sent.
    UnchangedKey {
        /// Column index.
        column: usize,
        /// Column name.
        name: String,
    },
    /// A `bool` column's text is neither `t` nor `f`.
    InvalidBool {
        /// Column index.
        column: usize,
        /// Column name.
        name: String,
    },
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RenderError::WidthMismatch { columns, values } => {
                write!(
                    f,
                    "tuple has {values} values but the relation has {columns} columns"
                )
            }
            RenderError::UnchangedKey { column, name } => {
                write!(
                    f,
                    "key column {name:?} (#{column}) has an unsent (unchanged TOAST) value"
                )
            }
            RenderError::InvalidBool { column, name } => {
                write!(f, "bool column {name:?} (#{column}) is neither 't' nor 'f'")
            }
        }
    }
}

impl std::error::Error for RenderError {}

/// Appends a JSON object of every column whose value was sent, in column
/// order, keyed by column name (NULL as `null`). Returns the indexes of the
/// unchanged-TOAST columns, which are left out of the object.
///
/// # Errors
/// [`RenderError::WidthMismatch`] or [`RenderError::InvalidBool`]; `out` is
/// then unchanged.
pub fn render_row<C: ColumnDesc>(
    cols: &[C],
    tuple: &Tuple<'_>,
    out: &mut String,
) -> Result<Vec<usize>, RenderError> {
    let mut unchanged = Vec::new();
    render(cols, tuple, out, false, &mut unchanged)?;
    Ok(unchanged)
}

/// Appends a JSON object of only the key columns ([`ColumnDesc::is_key`]).
/// For an update, pass the old-key tuple when one was sent, else the new one.
///
/// # Errors
/// [`RenderError::UnchangedKey`] if a key column's value was not sent (it
/// cannot happen for a key, so it is reported rather than guessed), or as
/// [`render_row`]; `out` is then unchanged.
pub fn render_key<C: ColumnDesc>(
    cols: &[C],
    tuple: &Tuple<'_>,
    out: &mut String,
) -> Result<(), RenderError> {
    render(cols, tuple, out, true, &mut Vec::new())
}

fn render<C: ColumnDesc>(
    cols: &[C],
    tuple: &Tuple<'_>,
    out: &mut String,
    keys_only: bool,
    unchanged: &mut Vec<usize>,
) -> Result<(), RenderError> {
    if cols.len() != tuple.values.len() {
        return Err(RenderError::WidthMismatch {
            columns: cols.len(),
            values: tuple.values.len(),
        });
    }
    let start = out.len();
    out.push('{');
    for (i, (col, value)) in cols.iter().zip(&tuple.values).enumerate() {
        if keys_only && !col.is_key() {
            continue;
        }
        let text = match *value {
            Value::Unchanged if keys_only => {
                out.truncate(start);
                return Err(RenderError::UnchangedKey {
                    column: i,
                    name: col.name().to_owned(),
                });
            }
            Value::Unchanged => {
                unchanged.push(i);
                continue;
            }
            Value::Null => None,
            Value::Text(s) => Some(s),
        };
        if out.len() > start + 1 {
            out.push(',');
        }
        push_string(out, col.name());
        out.push(':');
        if push_value(out, col.type_oid(), text).is_err() {
            out.truncate(start);
            return Err(RenderError::InvalidBool {
                column: i,
                name: col.name().to_owned(),
            });
        }
    }
    out.push('}');
    Ok(())
}

/// Appends one value; `Err` only for a `bool` that is not `t`/`f`.
fn push_value(out: &mut String, type_oid: u32, text: Option<&str>) -> Result<(), ()> {
    let Some(s) = text else {
        out.push_str("null");
        return Ok(());
    };
    match type_oid {
        BOOL => match s {
            "t" => out.push_str("true"),
            "f" => out.push_str("false"),
            _ => return Err(()),
        },
        INT2 | INT4 | INT8 | OID | NUMERIC if is_json_number(s) => out.push_str(s),
        // Through jsonb a number becomes `numeric`, which has no negative
        // zero; keep float -0 as a string so the sign survives.
        FLOAT4 | FLOAT8 if is_json_number(s) && !is_negative_zero(s) => out.push_str(s),
        JSON | JSONB => out.push_str(s),
        _ => push_string(out, s),
    }
    Ok(())
}

/// RFC 8259 `number`: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
fn is_json_number(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |i: usize| {
        b.get(i..)
            .map_or(0, |t| t.iter().take_while(|c| c.is_ascii_digit()).count())
    };
    let mut i = usize::from(b.first() == Some(&b'-'));
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => i += digits(i),
        _ => return false,
    }
    if b.get(i) == Some(&b'.') {
        let n = digits(i + 1);
        if n == 0 {
            return false;
        }
        i += 1 + n;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let n = digits(i);
        if n == 0 {
            return false;
        }
        i += n;
    }
    i == b.len()
}

/// For a valid JSON number: is it `-0`, `-0.0`, `-0e5`, ...?
fn is_negative_zero(s: &str) -> bool {
    let mantissa = s.split(['e', 'E']).next().unwrap_or(s);
    s.starts_with('-') && mantissa.bytes().all(|c| matches!(c, b'-' | b'0' | b'.'))
}

/// Appends `s` as a JSON string literal.
pub fn push_string(out: &mut String, s: &str) {
    out.push('"');
    let mut plain = 0; // start of the run not yet copied
    for (i, c) in s.char_indices() {
        let esc = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            '\u{8}' => "\\b",
            '\u{c}' => "\\f",
            c if c < '\u{20}' => "",
            _ => continue,
        };
        out.push_str(&s[plain..i]);
        if esc.is_empty() {
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(c as u8 >> 4)]));
            out.push(char::from(HEX[usize::from(c as u8 & 0xF)]));
        } else {
            out.push_str(esc);
        }
        plain = i + 1; // every escaped char is one byte
    }
    out.push_str(&s[plain..]);
    out.push('"');
}

/// Indexed by a nibble (`b >> 4`, `b & 0xF` of a byte), so always in bounds.
const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn col(name: &str, type_oid: u32, key: bool) -> Column<'_> {
        Column {
            name,
            type_oid,
            typmod: -1,
            flags: if key { COLUMN_KEY } else { 0 },
        }
    }

    fn row(cols: &[Column<'_>], values: &[Value<'_>]) -> (String, Vec<usize>) {
        let mut out = String::new();
        let unchanged = render_row(
            cols,
            &Tuple {
                values: values.to_vec(),
            },
            &mut out,
        )
        .unwrap();
        (out, unchanged)
    }

    fn one(type_oid: u32, text: &str) -> String {
        row(&[col("v", type_oid, false)], &[Value::Text(text)]).0
    }

    #[test]
    fn numbers_verbatim_when_valid_json() {
        assert_eq!(
            one(NUMERIC, "123456789012345678901234567890.123456789"),
            r#"{"v":123456789012345678901234567890.123456789}"#
        );
        assert_eq!(
            one(INT8, "-9223372036854775808"),
            r#"{"v":-9223372036854775808}"#
        );
        assert_eq!(one(OID, "4294967295"), r#"{"v":4294967295}"#);
        assert_eq!(one(FLOAT8, "1e+20"), r#"{"v":1e+20}"#);
        assert_eq!(
            one(FLOAT8, "1.7976931348623157e+308"),
            r#"{"v":1.7976931348623157e+308}"#
        );
        assert_eq!(one(FLOAT4, "-1.5E-7"), r#"{"v":-1.5E-7}"#);
        assert_eq!(one(NUMERIC, "0.00"), r#"{"v":0.00}"#);
        assert_eq!(one(NUMERIC, "-0"), r#"{"v":-0}"#);
    }

    #[test]
    fn non_json_numbers_are_strings() {
        assert_eq!(one(NUMERIC, "NaN"), r#"{"v":"NaN"}"#);
        assert_eq!(one(FLOAT8, "Infinity"), r#"{"v":"Infinity"}"#);
        assert_eq!(one(FLOAT4, "-Infinity"), r#"{"v":"-Infinity"}"#);
        assert_eq!(one(FLOAT8, "-0"), r#"{"v":"-0"}"#);
        for bad in [
            "", "-", "+1", "01", "1.", ".5", "1e", "1e+", "0x10", "1_0", " 1", "1 ", "--1",
        ] {
            assert!(!is_json_number(bad), "{bad:?}");
            assert_eq!(one(INT4, bad), format!("{{\"v\":\"{bad}\"}}"));
        }
        for good in ["0", "-0", "10", "0.5", "-0.0e-0", "1E5", "123e+456"] {
            assert!(is_json_number(good), "{good:?}");
        }
    }

    #[test]
    fn bool_json_and_text() {
        assert_eq!(one(BOOL, "t"), r#"{"v":true}"#);
        assert_eq!(one(BOOL, "f"), r#"{"v":false}"#);
        assert_eq!(one(JSONB, r#"{"a": [1, "x"]}"#), r#"{"v":{"a": [1, "x"]}}"#);
        assert_eq!(one(JSON, "null"), r#"{"v":null}"#);
        assert_eq!(one(25, "null"), r#"{"v":"null"}"#);
        assert_eq!(one(17, r"\x00ff"), r#"{"v":"\\x00ff"}"#);
        assert_eq!(
            one(1007, r#"{1,NULL,"a\"b"}"#),
            r#"{"v":"{1,NULL,\"a\\\"b\"}"}"#
        );
    }

    #[test]
    fn string_escaping() {
        assert_eq!(one(25, "a\"b\\c"), r#"{"v":"a\"b\\c"}"#);
        assert_eq!(one(25, "\n\r\t\u{8}\u{c}"), r#"{"v":"\n\r\t\b\f"}"#);
        assert_eq!(
            one(25, "\u{0}\u{1}\u{1f}\u{7f}"),
            "{\"v\":\"\\u0000\\u0001\\u001f\u{7f}\"}"
        );
        assert_eq!(one(25, "é😀\u{2028}/"), "{\"v\":\"é😀\u{2028}/\"}");
        let cols = [col("we\"ird\n", 23, false)];
        assert_eq!(row(&cols, &[Value::Text("1")]).0, r#"{"we\"ird\n":1}"#);
    }

    #[test]
    fn nulls_unchanged_and_order() {
        let cols = [
            col("id", INT4, true),
            col("big", 25, false),
            col("n", NUMERIC, false),
            col("b", BOOL, false),
        ];
        let (out, unchanged) = row(
            &cols,
            &[
                Value::Text("1"),
                Value::Unchanged,
                Value::Null,
                Value::Unchanged,
            ],
        );
        assert_eq!(out, r#"{"id":1,"n":null}"#);
        assert_eq!(unchanged, [1, 3]);
        let (out, unchanged) = row(&cols[1..2], &[Value::Unchanged]);
        assert_eq!((out.as_str(), unchanged), ("{}", vec![0]));
    }

    #[test]
    fn key_only_and_errors() {
        let cols = [
            col("a", 25, true),
            col("b", 25, false),
            col("c", INT4, true),
        ];
        let t = Tuple {
            values: vec![Value::Text("x"), Value::Unchanged, Value::Null],
        };
        let mut out = String::from("prefix");
        render_key(&cols, &t, &mut out).unwrap();
        assert_eq!(out, r#"prefix{"a":"x","c":null}"#);

        let mut out = String::from("keep");
        let t = Tuple {
            values: vec![Value::Unchanged, Value::Null, Value::Text("1")],
        };
        let e = render_key(&cols, &t, &mut out).unwrap_err();
        assert_eq!(
            e,
            RenderError::UnchangedKey {
                column: 0,
                name: "a".into()
            }
        );
        assert_eq!(out, "keep");

        let e = render_row(
            &cols,
            &Tuple {
                values: vec![Value::Null],
            },
            &mut out,
        )
        .unwrap_err();
        assert_eq!(
            e,
            RenderError::WidthMismatch {
                columns: 3,
                values: 1
            }
        );
        let bools = [col("x", INT4, false), col("flag", BOOL, false)];
        let t = Tuple {
            values: vec![Value::Text("1"), Value::Text("true")],
        };
        let e = render_row(&bools, &t, &mut out).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bool column \"flag\" (#1) is neither 't' nor 'f'"
        );
        assert_eq!(out, "keep");
    }

    // --------------------------------------------------------- properties

    const TYPES: [u32; 13] = [
        BOOL, INT2, INT4, INT8, OID, NUMERIC, FLOAT4, FLOAT8, JSON, JSONB, 25, 17, 1184,
    ];

    /// A value of the given type as the server could print it.
    fn text_for(type_oid: u32) -> BoxedStrategy<String> {
        match type_oid {
            BOOL => prop_oneof![Just("t".to_owned()), Just("f".to_owned())].boxed(),
            JSON | JSONB => any::<i64>()
                .prop_flat_map(|n| {
                    prop_oneof![
                        Just(format!("{{\"k\": [{n}, \"s\"]}}")),
                        Just(format!("{n}"))
                    ]
                })
                .boxed(),
            INT2 | INT4 | INT8 | OID | NUMERIC | FLOAT4 | FLOAT8 => prop_oneof![
                "-?(0|[1-9][0-9]{0,40})(\\.[0-9]{1,30})?([eE][-+]?[0-9]{1,2})?",
                any::<f64>().prop_map(|f| f.to_string()),
                Just("NaN".to_owned()),
                Just("-Infinity".to_owned()),
                ".{0,6}",
            ]
            .boxed(),
            _ => any::<String>().boxed(),
        }
    }

    fn case() -> impl Strategy<Value = Vec<(String, u32, bool, Option<Option<String>>)>> {
        prop::collection::vec(
            (
                any::<String>(),
                prop::sample::select(TYPES.to_vec()),
                any::<bool>(),
            ),
            0..8,
        )
        .prop_flat_map(|cols| {
            cols.into_iter()
                .map(|(name, t, key)| {
                    let v = prop_oneof![
                        1 => Just(None),
                        1 => Just(Some(None)),
                        6 => text_for(t).prop_map(|s| Some(Some(s))),
                    ];
                    (Just(name), Just(t), Just(key), v)
                })
                .collect::<Vec<_>>()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Every rendered object parses as JSON; sent columns are present
        /// (with their text intact for strings), unchanged ones absent.
        #[test]
        fn rendered_objects_are_json(spec in case()) {
            // Index-prefixed names are unique, so the parsed object has them all.
            let names: Vec<String> = spec.iter().enumerate().map(|(i, c)| format!("{i}{}", c.0)).collect();
            let cols: Vec<Column<'_>> = spec.iter().zip(&names).map(|((_, t, k, _), n)| col(n, *t, *k)).collect();
            let values: Vec<Value<'_>> = spec.iter().map(|(_, _, _, v)| match v {
                None => Value::Unchanged,
                Some(None) => Value::Null,
                Some(Some(s)) => Value::Text(s),
            }).collect();
            let tuple = Tuple { values };
            let mut out = String::new();
            let unchanged = render_row(&cols, &tuple, &mut out).unwrap();
            let parsed: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&out).unwrap();
            for (i, ((_, t, _, v), name)) in spec.iter().zip(&names).enumerate() {
                match v {
                    None => prop_assert!(unchanged.contains(&i)),
                    Some(None) => prop_assert_eq!(&parsed[name], &serde_json::Value::Null),
                    Some(Some(s)) if ![BOOL, JSON, JSONB].contains(t) => match &parsed[name] {
                        serde_json::Value::String(got) => prop_assert_eq!(got, s),
                        // Numbers are verbatim, which serde may not keep; check the text.
                        serde_json::Value::Number(_) => {
                            let needle = format!(":{s}");
                            prop_assert!(out.contains(&needle));
                        }
                        other => prop_assert!(false, "unexpected {:?}", other),
                    },
                    Some(Some(_)) => {}
                }
            }
            let mut keys = String::new();
            if render_key(&cols, &tuple, &mut keys).is_ok() {
                let _: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&keys).unwrap();
            }
        }
    }
}
