//! Column masks (`tide.add_table(..., masks => '{"email": "hash", ...}')`).
//!
//! Owns: the masks of one captured table (parsed from their stored JSON), and the one function
//! that masks a column's value ([`Mask::apply`]), which the stream (the worker's applier, on
//! every decoded row before any target sees it) and the backfill (the chunk reader, on every row
//! it reads) both call, so a backfilled row and a streamed row are masked alike.
//!
//! Guarantees:
//! - A value is the column's text output (as the output plugin and the chunk reader produce
//!   it). `hash`: the lowercase hex SHA-256 of the pipeline's secret salt followed by the value's
//!   UTF-8 bytes (so a target can join on it, and no one without the salt can test a guess);
//!   `truncate N`: the first N characters; `constant`: the given text; `null`: NULL. NULL stays
//!   NULL under `hash` and `truncate` (and `constant` gives the constant); an unchanged TOAST
//!   value stays unchanged (the target keeps the masked value it has).
//! - [`Mask::sql`] is the same mask as a SQL expression (what `tide.verify` compares with):
//!   `encode(sha256(salt || convert_to(format('%s', col), 'UTF8')), 'hex')`, `left(format('%s',
//!   col), N)` (`format('%s')` is the type's output function, as the stream's text), each NULL
//!   for NULL; the constant as a literal; `NULL`.
//! - `hash` and `truncate` deliver text whatever the column's type ([`Mask::retypes`]): a table
//!   target's column is `text`, a Kafka schema says string.

/// What a masked column delivers instead of its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mask {
    /// The hex SHA-256 of the pipeline's salt and the value.
    Hash,
    /// The first N characters.
    Truncate(usize),
    /// This text.
    Constant(String),
    /// NULL.
    Null,
}

/// The masks of one table: (column name, mask), in the order stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Masks {
    pub columns: Vec<(String, Mask)>,
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

impl Mask {
    /// One mask from its JSON: `"hash"`, `"null"`, `{"hash": true}`, `{"truncate": N}` (N >= 0),
    /// `{"constant": "text"}`, `{"null": true}`; otherwise why not.
    pub fn parse(v: &serde_json::Value) -> Result<Mask, String> {
        use serde_json::Value as J;
        let bad = || {
            format!(
                "{v} is not a mask (\"hash\", \"null\", {{\"truncate\": N}} or {{\"constant\": \"text\"}})"
            )
        };
        match v {
            J::String(s) if s == "hash" => Ok(Mask::Hash),
            J::String(s) if s == "null" => Ok(Mask::Null),
            J::Object(o) if o.len() == 1 => {
                let (k, val) = o.iter().next().ok_or_else(bad)?;
                match (k.as_str(), val) {
                    ("hash", J::Bool(true)) => Ok(Mask::Hash),
                    ("null", J::Bool(true)) => Ok(Mask::Null),
                    ("truncate", J::Number(n)) => n
                        .as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|&n| n <= 10_000_000)
                        .map(Mask::Truncate)
                        .ok_or_else(|| {
                            format!("truncate takes a number of characters (0 or more), not {n}")
                        }),
                    ("constant", J::String(s)) => {
                        if s.contains('\0') {
                            Err("a constant cannot contain a NUL character".into())
                        } else {
                            Ok(Mask::Constant(s.clone()))
                        }
                    }
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }

    /// Its JSON, as stored and as `tide.tables` shows it.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Mask::Hash => json!("hash"),
            Mask::Null => json!("null"),
            Mask::Truncate(n) => json!({ "truncate": n }),
            Mask::Constant(s) => json!({ "constant": s }),
        }
    }

    /// The mask's name (`tide.tables`, messages).
    pub fn kind(&self) -> &'static str {
        match self {
            Mask::Hash => "hash",
            Mask::Null => "null",
            Mask::Truncate(_) => "truncate",
            Mask::Constant(_) => "constant",
        }
    }

    /// Whether the column is delivered as text whatever its type.
    pub fn retypes(&self) -> bool {
        matches!(self, Mask::Hash | Mask::Truncate(_))
    }

    /// The masked value of `value` (a column's text output, `None` for NULL), with the
    /// pipeline's `salt`.
    pub fn apply(&self, salt: &[u8], value: Option<&str>) -> Option<String> {
        match self {
            Mask::Null => None,
            Mask::Constant(s) => Some(s.clone()),
            Mask::Hash => value.map(|v| {
                use sha2::Digest;
                let mut h = sha2::Sha256::new();
                h.update(salt);
                h.update(v.as_bytes());
                hex(&h.finalize())
            }),
            Mask::Truncate(n) => value.map(|v| match v.char_indices().nth(*n) {
                Some((at, _)) => v[..at].to_string(),
                None => v.to_string(),
            }),
        }
    }

    /// The mask as a SQL expression of `column` (quoted, maybe qualified) whose value is text
    /// after `format('%s', ...)`; `salt` is a SQL expression of type bytea. The constant is a
    /// quoted literal (`quote_literal`'s rules: quotes doubled, backslashes with `E''`).
    pub fn sql(&self, column: &str, salt: &str) -> String {
        match self {
            Mask::Null => "NULL::pg_catalog.text".into(),
            Mask::Constant(s) => format!("{}::pg_catalog.text", crate::plan::quote_literal(s)),
            // (`format('%s', NULL)` is '': NULL is tested first, with `num_nulls`, which is
            // exact for a composite value whose fields are all NULL, unlike `IS NULL`.)
            Mask::Hash => format!(
                "CASE WHEN pg_catalog.num_nulls({column}) OPERATOR(pg_catalog.=) 0 THEN pg_catalog.encode(pg_catalog.sha256(({salt}) OPERATOR(pg_catalog.||) pg_catalog.convert_to(pg_catalog.format('%s', {column}), 'UTF8')), 'hex') END"
            ),
            Mask::Truncate(n) => format!(
                "CASE WHEN pg_catalog.num_nulls({column}) OPERATOR(pg_catalog.=) 0 THEN pg_catalog.left(pg_catalog.format('%s', {column}), {n}) END"
            ),
        }
    }
}

impl Masks {
    /// The masks stored for a table: a JSON object of column name → mask.
    pub fn parse(text: &str) -> Result<Masks, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("it is not JSON: {e}"))?;
        Masks::from_json(&v)
    }

    /// From a JSON object of column name → mask (see [`Mask::parse`]).
    pub fn from_json(v: &serde_json::Value) -> Result<Masks, String> {
        let Some(o) = v.as_object() else {
            return Err(format!(
                "{v} is not an object of column names and masks, e.g. {{\"email\": \"hash\"}}"
            ));
        };
        let mut columns = Vec::with_capacity(o.len());
        for (k, m) in o {
            let m = Mask::parse(m).map_err(|e| format!("column \"{k}\": {e}"))?;
            columns.push((k.clone(), m));
        }
        Ok(Masks { columns })
    }

    /// Stored form: a JSON object of column name → mask.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.columns
                .iter()
                .map(|(c, m)| (c.clone(), m.to_json()))
                .collect(),
        )
    }

    /// The mask of column `name`, if it has one.
    pub fn of(&self, name: &str) -> Option<&Mask> {
        self.columns.iter().find(|(c, _)| c == name).map(|(_, m)| m)
    }

    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// Per column of `names` (a row's columns, in order), its mask or none.
    pub fn layout<'m, S: AsRef<str>>(&'m self, names: &[S]) -> Vec<Option<&'m Mask>> {
        names.iter().map(|n| self.of(n.as_ref())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_hex_sha256_of_salt_then_value() {
        // sha256("saltvalue"), as `printf saltvalue | sha256sum` computes it.
        assert_eq!(
            Mask::Hash.apply(b"salt", Some("value")).as_deref(),
            Some("d430a1da30afe1a9d07b3b36042151ebaf53c4882af1609733c04930de318e33")
        );
        let h = Mask::Hash.apply(b"salt", Some("value")).unwrap();
        assert_eq!(h.len(), 64);
        assert!(h
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(Some(h.clone()), Mask::Hash.apply(b"other", Some("value")));
        assert_ne!(Some(h), Mask::Hash.apply(b"salt", Some("value2")));
        assert_eq!(Mask::Hash.apply(b"salt", None), None);
        // The empty string is a value, not NULL.
        assert_eq!(
            Mask::Hash.apply(b"", Some("")).as_deref(),
            Some("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        );
    }

    #[test]
    fn truncate_counts_characters() {
        let t = Mask::Truncate(3);
        assert_eq!(t.apply(b"", Some("abcdef")).as_deref(), Some("abc"));
        assert_eq!(t.apply(b"", Some("ab")).as_deref(), Some("ab"));
        assert_eq!(t.apply(b"", Some("ééééé")).as_deref(), Some("ééé"));
        assert_eq!(t.apply(b"", None), None);
        assert_eq!(Mask::Truncate(0).apply(b"", Some("x")).as_deref(), Some(""));
    }

    #[test]
    fn constant_and_null() {
        let c = Mask::Constant("x'y".into());
        assert_eq!(c.apply(b"", Some("secret")).as_deref(), Some("x'y"));
        assert_eq!(c.apply(b"", None).as_deref(), Some("x'y"));
        assert_eq!(Mask::Null.apply(b"", Some("secret")), None);
    }

    #[test]
    fn parse_forms_and_refusals() {
        let m = Masks::parse(
            r#"{"email": {"hash": true}, "name": {"truncate": 3}, "ssn": "null", "note": {"constant": "x"}, "h": "hash"}"#,
        )
        .unwrap();
        assert_eq!(m.of("email"), Some(&Mask::Hash));
        assert_eq!(m.of("h"), Some(&Mask::Hash));
        assert_eq!(m.of("name"), Some(&Mask::Truncate(3)));
        assert_eq!(m.of("ssn"), Some(&Mask::Null));
        assert_eq!(m.of("note"), Some(&Mask::Constant("x".into())));
        assert_eq!(Masks::from_json(&m.to_json()).unwrap(), m);
        for bad in [
            r#"[1]"#,
            r#"{"a": "md5"}"#,
            r#"{"a": {"truncate": -1}}"#,
            r#"{"a": {"truncate": 1.5}}"#,
            r#"{"a": {"constant": 3}}"#,
            r#"{"a": {"hash": true, "null": true}}"#,
            r#"{"a": {"hash": false}}"#,
            r#"{"a": null}"#,
            "not json",
        ] {
            assert!(Masks::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn sql_quotes_the_constant() {
        assert_eq!(
            Mask::Constant(r"a'b\c".into()).sql("x", "s"),
            r"E'a''b\\c'::pg_catalog.text"
        );
        assert_eq!(
            Mask::Constant("'); DROP TABLE x; --".into()).sql("c", "s"),
            "'''); DROP TABLE x; --'::pg_catalog.text"
        );
        assert!(Mask::Hash.sql("\"c\"", "$1").contains("sha256"));
    }
}
