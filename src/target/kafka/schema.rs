//! The Connect shapes of a kafka pipeline's tables (`value_format = 'debezium-schema'`): each
//! table's columns with their Debezium schemas, read from the catalog, kept per relation and
//! read again when they may have changed.
//!
//! Owns: the catalog query that turns a table's columns into `tide_core::connect::Field`s (a
//! domain as its base type, an array as its element type, an enum with its labels, nullability
//! from `attnotnull`, the key from the replica identity index or the primary key) and when a
//! shape is refreshed.
//!
//! Guarantees: a message is rendered with a shape that has every column the event carries (a
//! shape that lacks one is read again first; a column the catalog no longer has, because the
//! table was altered again before the worker caught up, is written as its text output with an
//! optional `string` schema, never left out). The shape is read again when the stream
//! describes the table anew (a Relation message: after a restart and after a schema change) and
//! at each schema event, so the schema event carries the new schema and later messages use it.
//! The columns are those the stream describes at that point (the Relation message's, the schema
//! event's), not the catalog's now, so a message never has a column added after it; what the
//! catalog adds for each (nullability, typmod, a domain's base type, an array's element type, an
//! enum's labels) is read as it is now.

use crate::error::{TideError, TideResult};
use crate::sql;
use std::collections::HashMap;
use tide_core::connect::{self, Field, Shape};

/// A table's shape and its envelope schema (rendered once).
pub struct Cached {
    pub shape: Shape,
    pub envelope: String,
}

/// A column as the stream last described it (a Relation message, a schema event).
#[derive(Clone, Debug)]
pub struct Described {
    pub name: String,
    /// The column's type (`atttypid`), when the description says it.
    pub type_oid: Option<u32>,
    pub key: bool,
}

/// The shapes of a pipeline's tables, by relation OID.
#[derive(Default)]
pub struct Shapes {
    by_relid: HashMap<u32, Cached>,
    /// The columns of each table as the stream last described them.
    described: HashMap<u32, Vec<Described>>,
}

/// Columns of a table with what their Connect schema needs, in attribute order: name, NOT NULL,
/// base type, typmod (a domain's own when the column has none), array element type (0: not an
/// array), enum labels, part of the key, the column's own type.
const COLUMNS: &str = "
SELECT a.attname::pg_catalog.text,
       a.attnotnull::pg_catalog.text,
       b.oid::pg_catalog.int8::pg_catalog.text,
       (CASE WHEN t.typtype OPERATOR(pg_catalog.=) 'd' AND a.atttypmod OPERATOR(pg_catalog.<) 0
             THEN t.typtypmod ELSE a.atttypmod END)::pg_catalog.text,
       (CASE WHEN b.typcategory OPERATOR(pg_catalog.=) 'A' AND b.typelem OPERATOR(pg_catalog.<>) 0
              AND b.typlen OPERATOR(pg_catalog.=) -1
              AND b.oid OPERATOR(pg_catalog.<>) ALL ('{22,30}'::pg_catalog.oid[])
             THEN b.typelem ELSE 0::pg_catalog.oid END)::pg_catalog.int8::pg_catalog.text,
       (SELECT pg_catalog.string_agg(e.enumlabel::pg_catalog.text, ',' ORDER BY e.enumsortorder)
          FROM pg_catalog.pg_enum e
         WHERE e.enumtypid OPERATOR(pg_catalog.=) (CASE WHEN b.typcategory OPERATOR(pg_catalog.=) 'A'
                                AND b.typelem OPERATOR(pg_catalog.<>) 0 THEN b.typelem ELSE b.oid END)),
       (EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                 WHERE i.indrelid OPERATOR(pg_catalog.=) c.oid
                   AND (CASE WHEN c.relreplident OPERATOR(pg_catalog.=) 'i' THEN i.indisreplident
                             ELSE i.indisprimary END)
                   AND a.attnum OPERATOR(pg_catalog.=) ANY ((i.indkey::pg_catalog.int2[])[0:i.indnkeyatts OPERATOR(pg_catalog.-) 1])))::pg_catalog.text,
       a.atttypid::pg_catalog.int8::pg_catalog.text
  FROM pg_catalog.pg_attribute a
  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) a.attrelid
  JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid
  JOIN pg_catalog.pg_type b ON b.oid OPERATOR(pg_catalog.=)
       (CASE WHEN t.typtype OPERATOR(pg_catalog.=) 'd' THEN t.typbasetype ELSE t.oid END)
 WHERE a.attrelid OPERATOR(pg_catalog.=) $1::pg_catalog.oid
   AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
   AND a.attgenerated OPERATOR(pg_catalog.=) ''
 ORDER BY a.attnum";

/// The shape of table `relid`, its schema names prefixed `<prefix>.<schema>.<table>`: the
/// columns of `described` (as the stream has the table at this point; all the catalog has when
/// `None`), each with what the catalog says of it now. A described column the catalog no
/// longer has, or has with another type, takes its type from the description (without typmod)
/// or, lacking one, is an optional string. `None` if the table no longer exists and nothing
/// describes it.
pub fn lookup(
    relid: u32,
    names: (&str, &str, &str),
    described: Option<&[Described]>,
) -> TideResult<Option<Shape>> {
    let (prefix, schema, table) = names;
    let rows = sql::text_rows(COLUMNS, &[Some(&relid.to_string())], 0, false)?;
    if rows.is_empty() && described.is_none() {
        return Ok(None);
    }
    let mut fields = Vec::with_capacity(rows.len());
    let mut key = Vec::new();
    let mut types = Vec::with_capacity(rows.len());
    for r in rows {
        let get = |i: usize| r.get(i).cloned().flatten();
        let num = |i: usize| get(i).and_then(|s| s.parse::<i64>().ok()).unwrap_or(0);
        let Some(name) = get(0) else {
            return Err(TideError::internal(format!(
                "the columns of table {relid} came back incomplete"
            )));
        };
        let is_key = get(6).as_deref() == Some("true");
        let kind = connect::kind(
            num(2) as u32,
            num(3) as i32,
            num(4) as u32,
            get(5).as_deref(),
        );
        if is_key {
            key.push(name.clone());
        }
        types.push(num(7) as u32);
        fields.push(Field {
            optional: get(1).as_deref() != Some("true") && !is_key,
            name,
            kind,
        });
    }
    if let Some(d) = described {
        let mut catalog: Vec<(Field, u32)> = fields.into_iter().zip(types).collect();
        fields = d
            .iter()
            .map(|c| {
                let found = catalog
                    .iter()
                    .position(|(f, _)| f.name == c.name)
                    .map(|i| catalog.swap_remove(i));
                match (found, c.type_oid) {
                    (Some((f, t)), Some(oid)) if t != oid => Field {
                        kind: connect::kind(oid, -1, 0, None),
                        optional: !c.key,
                        ..f
                    },
                    (Some((f, _)), _) => Field {
                        optional: f.optional && !c.key,
                        ..f
                    },
                    (None, oid) => Field {
                        name: c.name.clone(),
                        kind: oid
                            .map_or(connect::Kind::Str(None), |o| connect::kind(o, -1, 0, None)),
                        optional: !c.key,
                    },
                }
            })
            .collect();
        key = d.iter().filter(|c| c.key).map(|c| c.name.clone()).collect();
    }
    Ok(Some(Shape {
        prefix: format!("{prefix}.{schema}.{table}"),
        fields,
        key,
    }))
}

impl Shapes {
    /// The stream describes the table anew (its columns, `None`: unknown): its shape is read
    /// again at its next message.
    pub fn describe(&mut self, relid: u32, columns: Option<Vec<Described>>) {
        self.by_relid.remove(&relid);
        match columns {
            Some(c) => self.described.insert(relid, c),
            None => self.described.remove(&relid),
        };
    }

    /// Read a table's shape again now; keeps the one it had if the table is gone.
    pub fn refresh(&mut self, relid: u32, names: (&str, &str, &str)) -> TideResult<()> {
        let described = self.described.get(&relid).map(Vec::as_slice);
        if let Some(shape) = lookup(relid, names, described)? {
            let envelope = shape.envelope_schema();
            self.by_relid.insert(relid, Cached { shape, envelope });
        }
        Ok(())
    }

    /// The shape of a table with every column of `columns` (read again if the one kept lacks
    /// one; a column the catalog does not have, or a table it no longer has, as optional
    /// strings).
    pub fn get(
        &mut self,
        relid: u32,
        names: (&str, &str, &str),
        columns: &[String],
    ) -> TideResult<&Cached> {
        let (prefix, schema, table) = names;
        let fresh = self
            .by_relid
            .get(&relid)
            .is_some_and(|c| c.shape.covers(columns));
        if !fresh {
            self.refresh(relid, names)?;
        }
        // A table dropped before the worker caught up: its columns as optional strings.
        let c = self.by_relid.entry(relid).or_insert_with(|| {
            let shape = Shape {
                prefix: format!("{prefix}.{schema}.{table}"),
                fields: Vec::new(),
                key: Vec::new(),
            };
            Cached {
                envelope: shape.envelope_schema(),
                shape,
            }
        });
        if !c.shape.covers(columns) {
            // Altered again since this event: a column the catalog no longer has is written as
            // its text, an optional string.
            for col in columns {
                if !c.shape.fields.iter().any(|f| f.name == *col) {
                    c.shape.fields.push(Field {
                        name: col.clone(),
                        kind: connect::Kind::Str(None),
                        optional: true,
                    });
                }
            }
            c.envelope = c.shape.envelope_schema();
        }
        Ok(c)
    }
}
