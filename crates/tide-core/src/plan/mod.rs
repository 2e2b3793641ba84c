//! Planning a table target's writes: events in, SQL statement text out. Pure: no I/O and no
//! PostgreSQL, so the grouping rules and the statement text are tested here with plain tests and
//! proptest, and the targets (`src/target/table/`) only execute what this module plans, through
//! SPI (local targets) or the remote connection (remote targets).
//!
//! Owns: how a batch of events becomes set-based statements ([`Planner`]), the DDL that keeps a
//! target table's shape in step with its source ([`plan_shape`]), which type changes are safe
//! widenings ([`holds`]), and quoting ([`quote_ident`], [`quote_literal`]). The statements are
//! here; quoting is in `quote.rs`, the remote COPY staging in `stage.rs`, the shape DDL in
//! `shape.rs`.
//!
//! Guarantees:
//! - Per-table order: each table's statements come out in the order of its events. A table has
//!   at most one open *run* (upserts with one column set, or deletes); an event that does not
//!   fit the open run (another kind, another column set, a key already in the run) closes it
//!   first. Runs of different tables are independent and may be closed in another order than
//!   the source's events (a target transaction holds them all, so a reader sees the same).
//! - Nothing is merged away: every upsert of a run is applied in its own row of the statement;
//!   a key deleted twice in one run is deleted once (the same effect).
//! - A run holds at most [`RUN_ROWS`] rows; the event that fills it closes it.
//! - Tables without a key (captured with `REPLICA IDENTITY FULL`, [`TableRef::key`] empty) have
//!   multiset semantics, as PostgreSQL's apply worker gives them: an insert is a plain `INSERT`
//!   (runs of them, like upserts; a duplicate row stays a duplicate), an update or a delete
//!   ([`Change::RowMatch`]) changes or removes exactly one row equal to the old row in every
//!   column (`IS NOT DISTINCT FROM`; the text output for types with no equality operator, see
//!   [`no_equality`]), found by `(tableoid, ctid) = (SELECT ... LIMIT 1)`: one statement per
//!   change, which closes the table's open run. Of two identical rows, one is changed. No row
//!   equal to the old row: nothing happens (as PostgreSQL's apply worker, which logs it;
//!   `tide.verify` finds the difference).
//! - Every identifier in planned text is quoted with [`quote_ident`], every literal with
//!   [`quote_literal`]; row data never appears in statement text: each column of a run travels
//!   as one parameter, a `text[]` of the values' text output ([`text_array`]), read with
//!   `unnest` and cast to the target column's type (its input function). So every value arrives
//!   exactly as the source has it: a `json` column's text (whitespace, key order, duplicate
//!   keys), a JSON `null` as JSON `null` and SQL NULL as SQL NULL. (The JSON transport this
//!   replaced turned JSON `null` into SQL NULL and re-escaped a top-level JSON string.) The cast
//!   never shortens a value: a target column always holds its source column's type ([`holds`]).

use std::collections::HashSet;

/// Rows per planned statement at most.
pub const RUN_ROWS: usize = 1000;

mod quote;
mod shape;
mod stage;

#[cfg(test)]
use quote::QUOTED_KEYWORDS;
pub use quote::*;
pub use shape::*;
pub use stage::*;

/// Where one source table goes: the target table and its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRef {
    pub schema: String,
    pub name: String,
    /// The key columns (the source's replica identity), in key order; empty for a table
    /// captured without a key (`REPLICA IDENTITY FULL`, see [`Change::Insert`] and
    /// [`Change::RowMatch`]).
    pub key: Vec<String>,
}

impl TableRef {
    /// `"schema"."name"`.
    pub fn qualified(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
}

/// One planned statement: its text and, for row statements, its parameters `$1`, `$2`, ...:
/// one `text[]` literal per column ([`text_array`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    pub sql: String,
    pub params: Vec<String>,
}

/// A column written by a row statement: its name and the target column's type (`format_type`),
/// which the value's text is cast to.
pub type TypedColumn = (String, String);

/// What an event does to the target, as far as planning goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Insert or update the row; `key` is the JSON object of its key columns (it tells the keys
    /// of a run apart), `values` the text output of each of its sent `cols` (unchanged TOAST
    /// columns are not among them), NULL as `None`.
    Upsert {
        key: String,
        values: Vec<Option<String>>,
        cols: Vec<TypedColumn>,
    },
    /// Delete the row whose key is `key` (JSON), with key column values `values`, in the order of
    /// the table's key ([`TableRef::key`]), typed as `types` says.
    Delete {
        key: String,
        values: Vec<Option<String>>,
        types: Vec<String>,
    },
    /// Insert the row into a table without a key: `values` the text output of each of `cols`.
    Insert {
        values: Vec<Option<String>>,
        cols: Vec<TypedColumn>,
    },
    /// Of a table without a key: find one row equal to `old` (values of `old_cols`, every
    /// column of the row) and delete it (`new` is `None`) or set `new`'s columns in it.
    RowMatch {
        old: Vec<Option<String>>,
        old_cols: Vec<TypedColumn>,
        new: Option<(Vec<Option<String>>, Vec<TypedColumn>)>,
    },
    /// Empty the table.
    Truncate,
    /// Remove the rows `predicate` is true for (a TRUNCATE of one partition of a partitioned
    /// source: its constraint, an SQL boolean expression on the table's columns as PostgreSQL
    /// deparsed it).
    TruncateWhere { predicate: String },
}

#[derive(Debug, PartialEq, Eq)]
enum RunKind {
    Upsert { cols: Vec<TypedColumn> },
    Insert { cols: Vec<TypedColumn> },
    Delete { types: Vec<String> },
}

#[derive(Debug)]
struct Run {
    relid: u32,
    table: TableRef,
    kind: RunKind,
    /// Each row's values, in the run's column order.
    items: Vec<Vec<Option<String>>>,
    /// The keys in `items` (a key appears once per run).
    keys: HashSet<String>,
}

/// The open runs of one target transaction. `push` and `finish` return the statements to run
/// now, in order.
#[derive(Debug, Default)]
pub struct Planner {
    /// At most one open run per source table, in the order they were opened.
    runs: Vec<Run>,
}

impl Planner {
    pub fn new() -> Planner {
        Planner::default()
    }

    /// Whether no run is open.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Forget every open run (after a failed iteration).
    pub fn clear(&mut self) {
        self.runs.clear();
    }

    /// Plan one change of source table `relid`, which goes to `table`. Returns the statements
    /// that must run before anything else is planned (runs this change closed, the change's own
    /// statement for a truncate, a run it filled).
    pub fn push(&mut self, relid: u32, table: &TableRef, change: Change) -> Vec<Statement> {
        let mut out = Vec::new();
        match change {
            Change::Truncate => {
                // Whatever the batch holds for the table is wiped anyway; it runs first so the
                // table's statements stay in stream order.
                out.extend(self.close(relid));
                out.push(Statement {
                    sql: format!("TRUNCATE {}", table.qualified()),
                    params: Vec::new(),
                });
                return out;
            }
            Change::TruncateWhere { predicate } => {
                out.extend(self.close(relid));
                // On lines of its own, like a backfill condition.
                out.push(Statement {
                    sql: format!("DELETE FROM {} WHERE (\n{predicate}\n)", table.qualified()),
                    params: Vec::new(),
                });
                return out;
            }
            Change::RowMatch { old, old_cols, new } => {
                out.extend(self.close(relid));
                out.push(row_match(table, &old, &old_cols, new.as_ref()));
                return out;
            }
            Change::Insert { values, cols } => {
                let kind = RunKind::Insert { cols };
                let fits = self
                    .open(relid)
                    .is_none_or(|r| r.kind == kind && r.table == *table);
                if !fits {
                    out.extend(self.close(relid));
                }
                self.run_for(relid, table, kind).items.push(values);
            }
            Change::Delete { key, values, types } => {
                let kind = RunKind::Delete { types };
                let fits = self
                    .open(relid)
                    .is_none_or(|r| r.kind == kind && r.table == *table);
                if !fits {
                    out.extend(self.close(relid));
                }
                let r = self.run_for(relid, table, kind);
                // Deleting a key twice in a row is deleting it once.
                if r.keys.insert(key) {
                    r.items.push(values);
                }
            }
            Change::Upsert { key, values, cols } => {
                // One statement cannot write a key twice (ON CONFLICT DO UPDATE refuses to).
                let fits = self.open(relid).is_none_or(|r| {
                    matches!(&r.kind, RunKind::Upsert { cols: rc } if *rc == cols)
                        && r.table == *table
                        && !r.keys.contains(&key)
                });
                if !fits {
                    out.extend(self.close(relid));
                }
                let r = self.run_for(relid, table, RunKind::Upsert { cols });
                r.keys.insert(key);
                r.items.push(values);
            }
        }
        if self.open(relid).is_some_and(|r| r.items.len() >= RUN_ROWS) {
            out.extend(self.close(relid));
        }
        out
    }

    /// Plan one `TRUNCATE` of several source tables (one source `TRUNCATE` statement), each
    /// going to its table: the open runs of those tables first (in the order given), then one
    /// `TRUNCATE` of every target table together, so foreign keys between them (at the target)
    /// do not refuse it as they refuse truncating one at a time. `RESTART IDENTITY` when
    /// `restart_identity` (as the source said); never `CASCADE`: a table the source truncated
    /// is in `tables` when it is captured, and a target table pg_tide does not write is not
    /// emptied behind the user's back (PostgreSQL's apply worker replays a TRUNCATE with
    /// `DROP_RESTRICT` too). Nothing when `tables` is empty.
    pub fn truncate(
        &mut self,
        tables: &[(u32, TableRef)],
        restart_identity: bool,
    ) -> Vec<Statement> {
        if tables.is_empty() {
            return Vec::new();
        }
        let mut out: Vec<Statement> = tables
            .iter()
            .filter_map(|(relid, _)| self.close(*relid))
            .collect();
        let mut names: Vec<String> = Vec::with_capacity(tables.len());
        for (_, t) in tables {
            let q = t.qualified();
            if !names.contains(&q) {
                names.push(q);
            }
        }
        out.push(Statement {
            sql: format!(
                "TRUNCATE {}{}",
                names.join(", "),
                if restart_identity {
                    " RESTART IDENTITY"
                } else {
                    ""
                }
            ),
            params: Vec::new(),
        });
        out
    }

    /// Close every open run, in the order they were opened.
    pub fn finish(&mut self) -> Vec<Statement> {
        let runs = std::mem::take(&mut self.runs);
        runs.into_iter().filter_map(statement).collect()
    }

    fn open(&self, relid: u32) -> Option<&Run> {
        self.runs.iter().find(|r| r.relid == relid)
    }

    /// Close the open run of `relid`, if any.
    fn close(&mut self, relid: u32) -> Option<Statement> {
        let i = self.runs.iter().position(|r| r.relid == relid)?;
        statement(self.runs.remove(i))
    }

    /// The open run of `relid`, opened with `kind` if there is none.
    fn run_for(&mut self, relid: u32, table: &TableRef, kind: RunKind) -> &mut Run {
        let i = match self.runs.iter().position(|r| r.relid == relid) {
            Some(i) => i,
            None => {
                self.runs.push(Run {
                    relid,
                    table: table.clone(),
                    kind,
                    items: Vec::new(),
                    keys: HashSet::new(),
                });
                self.runs.len() - 1
            }
        };
        &mut self.runs[i]
    }
}

fn join<'a>(
    items: impl Iterator<Item = &'a String>,
    f: impl Fn(&str) -> String,
    sep: &str,
) -> String {
    items.map(|s| f(s)).collect::<Vec<_>>().join(sep)
}

/// `values` as a PostgreSQL array literal of `text`: each element double-quoted, with `\` and
/// `"` escaped by a backslash, SQL NULL as the bare word `NULL`. `array_in` reads back exactly
/// these values (any character may stand inside double quotes; only those two need escaping).
pub fn text_array<'a>(values: impl IntoIterator<Item = Option<&'a str>>) -> String {
    let mut s = String::from("{");
    for (i, v) in values.into_iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        match v {
            None => s.push_str("NULL"),
            Some(v) => {
                s.reserve(v.len() + 2);
                s.push('"');
                for ch in v.chars() {
                    if ch == '"' || ch == '\\' {
                        s.push('\\');
                    }
                    s.push(ch);
                }
                s.push('"');
            }
        }
    }
    s.push('}');
    s
}

/// The parameters of a run: column `i` of every row, as one [`text_array`] per column.
fn columns_of(items: &[Vec<Option<String>>], n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            text_array(
                items
                    .iter()
                    .map(|row| row.get(i).and_then(|v| v.as_deref())),
            )
        })
        .collect()
}

/// `unnest($1::text[], $2::text[], ...) AS alias(c1, c2, ...)` for `names`.
fn unnest_columns(alias: &str, names: &[&String]) -> String {
    let arrays = (1..=names.len())
        .map(|i| format!("${i}::text[]"))
        .collect::<Vec<_>>()
        .join(", ");
    let list = names
        .iter()
        .map(|n| quote_ident(n))
        .collect::<Vec<_>>()
        .join(", ");
    format!("unnest({arrays}) AS {alias}({list})")
}

/// The statement of a closed run (none for an empty run).
fn statement(run: Run) -> Option<Statement> {
    if run.items.is_empty() {
        return None;
    }
    let t = &run.table;
    let tq = t.qualified();
    match &run.kind {
        RunKind::Delete { types } => {
            let names: Vec<&String> = t.key.iter().collect();
            let on = t
                .key
                .iter()
                .zip(types)
                .map(|(k, ty)| format!("t.{0} = d.{0}::{ty}", quote_ident(k)))
                .collect::<Vec<_>>()
                .join(" AND ");
            Some(Statement {
                sql: format!(
                    "DELETE FROM {tq} t USING {} WHERE {on}",
                    unnest_columns("d", &names)
                ),
                params: columns_of(&run.items, names.len()),
            })
        }
        RunKind::Insert { cols } => {
            let names: Vec<&String> = cols.iter().map(|(n, _)| n).collect();
            let select = cols
                .iter()
                .map(|(n, ty)| format!("r.{}::{ty}", quote_ident(n)))
                .collect::<Vec<_>>()
                .join(", ");
            let list = join(names.iter().copied(), quote_ident, ", ");
            Some(Statement {
                sql: format!(
                    "INSERT INTO {tq} ({list}) SELECT {select} FROM {}",
                    unnest_columns("r", &names)
                ),
                params: columns_of(&run.items, names.len()),
            })
        }
        RunKind::Upsert { cols } => {
            let names: Vec<&String> = cols.iter().map(|(n, _)| n).collect();
            let select = cols
                .iter()
                .map(|(n, ty)| format!("r.{}::{ty}", quote_ident(n)))
                .collect::<Vec<_>>()
                .join(", ");
            let plain: Vec<String> = cols.iter().map(|(n, _)| n.clone()).collect();
            Some(Statement {
                sql: upsert_select(t, &plain, &select, &unnest_columns("r", &names)),
                params: columns_of(&run.items, names.len()),
            })
        }
    }
}

/// Whether values of type `ty` (`format_type`) are compared by their text output in a row match:
/// the types with no default equality operator (`json`, `xml`, the geometric types but `box`'s
/// area equality, which is not equality, and arrays of them). Their text output is what the
/// source sent and what the target's input function kept (`json` keeps its text as it is).
pub fn no_equality(ty: &str) -> bool {
    let base = ty.trim_end_matches("[]");
    matches!(
        base,
        "json" | "xml" | "point" | "line" | "lseg" | "box" | "path" | "polygon" | "circle"
    )
}

/// The statement of a [`Change::RowMatch`]: parameters `$1..` the old row's values, then the new
/// values, each a one-element [`text_array`] (a parameter is never NULL; the element may be).
fn row_match(
    t: &TableRef,
    old: &[Option<String>],
    old_cols: &[TypedColumn],
    new: Option<&(Vec<Option<String>>, Vec<TypedColumn>)>,
) -> Statement {
    let tq = t.qualified();
    let mut params = Vec::new();
    let mut param = |v: &Option<String>| {
        params.push(text_array([v.as_deref()]));
        params.len()
    };
    let mut pred = Vec::with_capacity(old_cols.len());
    for ((name, ty), v) in old_cols.iter().zip(old) {
        let i = param(v);
        let c = quote_ident(name);
        pred.push(if no_equality(ty) {
            format!("s.{c}::text IS NOT DISTINCT FROM (${i}::text[])[1]::{ty}::text")
        } else {
            format!("s.{c} IS NOT DISTINCT FROM (${i}::text[])[1]::{ty}")
        });
    }
    let pred = if pred.is_empty() {
        "true".to_string()
    } else {
        pred.join(" AND ")
    };
    let one = format!(
        "(t.tableoid, t.ctid) = (SELECT s.tableoid, s.ctid FROM {tq} s WHERE {pred} LIMIT 1)"
    );
    let sql = match new {
        None => format!("DELETE FROM {tq} t WHERE {one}"),
        Some((values, cols)) => {
            let mut set = Vec::with_capacity(cols.len());
            for ((name, ty), v) in cols.iter().zip(values) {
                let i = param(v);
                set.push(format!("{} = (${i}::text[])[1]::{ty}", quote_ident(name)));
            }
            if set.is_empty() {
                // Nothing sent changed (every column unchanged TOAST): the row stays as it is.
                return Statement {
                    sql: "SELECT".to_string(),
                    params: Vec::new(),
                };
            }
            format!("UPDATE {tq} t SET {} WHERE {one}", set.join(", "))
        }
    };
    Statement { sql, params }
}

/// `INSERT INTO table (cols) SELECT r.cols FROM <rows> r ON CONFLICT (key) DO UPDATE ...`: every
/// column of `cols` that is not a key column takes the new value.
fn upsert(t: &TableRef, cols: &[String], rows: &str) -> String {
    let select = join(cols.iter(), |c| format!("r.{}", quote_ident(c)), ", ");
    upsert_select(t, cols, &select, &format!("{rows} r"))
}

/// `INSERT INTO table (cols) SELECT <select> FROM <from> ON CONFLICT (key) DO UPDATE ...`.
fn upsert_select(t: &TableRef, cols: &[String], select: &str, from: &str) -> String {
    let tq = t.qualified();
    let list = join(cols.iter(), quote_ident, ", ");
    let keys = join(t.key.iter(), quote_ident, ", ");
    let set: Vec<String> = cols
        .iter()
        .filter(|c| !t.key.contains(c))
        .map(|c| format!("{0} = EXCLUDED.{0}", quote_ident(c)))
        .collect();
    let action = if set.is_empty() {
        "NOTHING".to_string()
    } else {
        format!("UPDATE SET {}", set.join(", "))
    };
    format!("INSERT INTO {tq} AS t ({list}) SELECT {select} FROM {from} ON CONFLICT ({keys}) DO {action}")
}

/// The upsert of a backfill chunk's rows handed over as row values, not JSON: its parameter
/// `$1` is an array of the source table's row type (the rows as the chunk read them, binary),
/// and `cols` the source columns to write, each of which the target has with the same type
/// (the caller checks: no cast or text conversion happens here). Same `ON CONFLICT` rule as a
/// run of upserts.
pub fn upsert_rows(table: &TableRef, cols: &[String]) -> String {
    upsert(table, cols, "unnest($1)")
}

/// Whether `table` holds a row whose key lies between the keys of `$1` and `$2` (inclusive),
/// two rows of the source's row type: the first and last rows of a backfill chunk, in key
/// order. `false` means none of the chunk's keys is at the target, so its rows can be
/// inserted without `ON CONFLICT`. One index range scan of the key (the target's primary key
/// or unique index on it); the caller makes sure the key columns compare in the source's
/// collation.
pub fn range_has_rows(table: &TableRef) -> String {
    let cols = |prefix: &str| {
        join(
            table.key.iter(),
            |k| format!("{prefix}{}", quote_ident(k)),
            ", ",
        )
    };
    format!(
        "SELECT EXISTS (SELECT 1 FROM {} t WHERE ({}) >= ({}) AND ({}) <= ({}))",
        table.qualified(),
        cols("t."),
        cols("($1)."),
        cols("t."),
        cols("($2).")
    )
}

#[cfg(test)]
#[path = "../plan_tests.rs"]
mod tests;
