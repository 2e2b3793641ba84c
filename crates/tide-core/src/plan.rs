//! Planning a table target's writes: events in, SQL statement text out. Pure: no I/O and no
//! PostgreSQL, so the grouping rules and the statement text are tested here with plain tests and
//! proptest, and the targets (`src/target/table/`) only execute what this module plans, through
//! SPI (local targets) or the remote connection (remote targets).
//!
//! Owns: how a batch of events becomes set-based statements ([`Planner`]), the DDL that keeps a
//! target table's shape in step with its source ([`plan_shape`]), which type changes are safe
//! widenings ([`holds`]), and quoting ([`quote_ident`], [`quote_literal`]).
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

/// Keywords that PostgreSQL's `quote_identifier` quotes (every category but unreserved): those
/// of PostgreSQL 15's `kwlist.h`, and those later versions added (a remote target may run
/// one). Sorted, for a binary search.
const QUOTED_KEYWORDS: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "authorization",
    "between",
    "bigint",
    "binary",
    "bit",
    "boolean",
    "both",
    "case",
    "cast",
    "char",
    "character",
    "check",
    "coalesce",
    "collate",
    "collation",
    "column",
    "concurrently",
    "constraint",
    "create",
    "cross",
    "current_catalog",
    "current_date",
    "current_role",
    "current_schema",
    "current_time",
    "current_timestamp",
    "current_user",
    "dec",
    "decimal",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "exists",
    "extract",
    "false",
    "fetch",
    "float",
    "for",
    "foreign",
    "freeze",
    "from",
    "full",
    "grant",
    "greatest",
    "group",
    "grouping",
    "having",
    "ilike",
    "in",
    "initially",
    "inner",
    "inout",
    "int",
    "integer",
    "intersect",
    "interval",
    "into",
    "is",
    "isnull",
    "join",
    "json",
    "json_array",
    "json_arrayagg",
    "json_exists",
    "json_object",
    "json_objectagg",
    "json_query",
    "json_scalar",
    "json_serialize",
    "json_table",
    "json_value",
    "lateral",
    "leading",
    "least",
    "left",
    "like",
    "limit",
    "localtime",
    "localtimestamp",
    "merge_action",
    "national",
    "natural",
    "nchar",
    "none",
    "normalize",
    "not",
    "notnull",
    "null",
    "nullif",
    "numeric",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "out",
    "outer",
    "overlaps",
    "overlay",
    "placing",
    "position",
    "precision",
    "primary",
    "real",
    "references",
    "returning",
    "right",
    "row",
    "select",
    "session_user",
    "setof",
    "similar",
    "smallint",
    "some",
    "substring",
    "symmetric",
    "system_user",
    "table",
    "tablesample",
    "then",
    "time",
    "timestamp",
    "to",
    "trailing",
    "treat",
    "trim",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "values",
    "varchar",
    "variadic",
    "verbose",
    "when",
    "where",
    "window",
    "with",
    "xmlattributes",
    "xmlconcat",
    "xmlelement",
    "xmlexists",
    "xmlforest",
    "xmlnamespaces",
    "xmlparse",
    "xmlpi",
    "xmlroot",
    "xmlserialize",
    "xmltable",
];

/// `ident` as a SQL identifier, written as PostgreSQL's `quote_identifier` writes it: bare when
/// it is lower case letters, digits and underscores (not starting with a digit) and no keyword
/// that needs quoting; else in double quotes, embedded quotes doubled.
pub fn quote_ident(ident: &str) -> String {
    let safe = ident
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && ident
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && QUOTED_KEYWORDS.binary_search(&ident).is_err();
    if safe {
        return ident.to_string();
    }
    let mut s = String::with_capacity(ident.len() + 2);
    s.push('"');
    for ch in ident.chars() {
        if ch == '"' {
            s.push('"');
        }
        s.push(ch);
    }
    s.push('"');
    s
}

/// `v` as a SQL string literal, as PostgreSQL's `quote_literal` writes it: quotes and
/// backslashes doubled, and an `E` prefix when there is a backslash.
pub fn quote_literal(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 3);
    if v.contains('\\') {
        s.push('E');
    }
    s.push('\'');
    for ch in v.chars() {
        if ch == '\'' || ch == '\\' {
            s.push(ch);
        }
        s.push(ch);
    }
    s.push('\'');
    s
}

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

/// The staging table of a backfill chunk sent to a remote target by COPY: a temporary table
/// (in `pg_temp`, whatever the search path; dropped at commit at the latest) that rows may be
/// loaded into without conflicts, then upserted from in one statement ([`Staged`]).
pub const STAGE: &str = "pg_temp.tide_stage";

/// How a chunk's rows reach `table` at a remote target, sent as COPY text: straight into the
/// table by `COPY` when none of the chunk's keys is there yet ([`Staged::probe`] says), as
/// PostgreSQL's initial sync loads a table; otherwise through [`STAGE`]: create it with `cols`
/// (name, `format_type` of the source, which the caller checked the target has: the types go
/// into the DDL as PostgreSQL wrote them, identifiers already quoted), `COPY` the rows into it
/// (text format, [`crate::copy`]), then one upsert from it (same `ON CONFLICT` rule as a run of
/// upserts) and drop it, so another chunk in the same transaction can stage again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staged {
    /// Whether `table` holds a key of the chunk's key range: its parameters are the key values
    /// (text) of the range's lower bound (exclusive; none for a table's first chunk), then of
    /// its upper bound (inclusive), cast to the key columns' types. One row, one boolean.
    pub probe: String,
    /// `COPY table (cols) FROM STDIN`: the rows straight into the table.
    pub direct: String,
    /// `CREATE TEMP TABLE ... ON COMMIT DROP`.
    pub create: String,
    /// `COPY ... FROM STDIN` into the staging table.
    pub copy: String,
    /// The upsert from the staging table, then its `DROP`.
    pub upsert: String,
}

/// The statements of [`Staged`] for `table`, the source columns `cols`, and a key range with a
/// lower bound or not (`lower`).
pub fn staged_upsert(table: &TableRef, cols: &[(String, String)], lower: bool) -> Staged {
    let defs = cols
        .iter()
        .map(|(n, ty)| format!("{} {ty}", quote_ident(n)))
        .collect::<Vec<_>>()
        .join(", ");
    let names: Vec<String> = cols.iter().map(|(n, _)| n.clone()).collect();
    let list = join(names.iter(), quote_ident, ", ");
    let key = join(table.key.iter(), |k| format!("t.{}", quote_ident(k)), ", ");
    let key_type = |k: &str| {
        cols.iter()
            .find(|(n, _)| n == k)
            .map(|(_, ty)| ty.clone())
            .unwrap_or_else(|| "text".into())
    };
    let mut n = 0;
    let mut bound = || {
        table
            .key
            .iter()
            .map(|k| {
                n += 1;
                format!("${n}::{}", key_type(k))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut range = Vec::new();
    if lower {
        range.push(format!("({key}) > ({})", bound()));
    }
    range.push(format!("({key}) <= ({})", bound()));
    Staged {
        probe: format!(
            "SELECT EXISTS (SELECT 1 FROM {} t WHERE {})",
            table.qualified(),
            range.join(" AND ")
        ),
        direct: format!("COPY {} ({list}) FROM STDIN", table.qualified()),
        create: format!("CREATE TEMP TABLE tide_stage ({defs}) ON COMMIT DROP"),
        copy: format!("COPY {STAGE} ({list}) FROM STDIN"),
        upsert: format!("{}; DROP TABLE {STAGE}", upsert(table, &names, STAGE)),
    }
}

/// A source column as the shape check sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceColumn {
    pub name: String,
    /// `format_type` of the column.
    pub ty: String,
    /// The value rows that existed before the column was added have (`attmissingval`), when it
    /// was added with a non-volatile default.
    pub missing: Option<String>,
}

/// What keeps a target table's shape in step with its source.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ShapePlan {
    /// DDL to apply, each with what it does in words.
    pub ddl: Vec<(String, String)>,
    /// Changes that are not safe to apply (a type change that is not a widening), in words.
    pub refused: Vec<String>,
    /// The target's columns once `ddl` is applied.
    pub shape: Vec<(String, String)>,
    /// The source's key changed ([`plan_schema_change`]), which pg_tide cannot follow.
    pub key_changed: bool,
    /// A column `ddl` adds has a value for the rows that existed before it (its `missing`):
    /// those rows carry it only at the source, never in the stream. Whoever adds the column
    /// instead of this plan (a user following a paused pipeline's remedy) may leave them
    /// without it, so the table is read again after such a pause.
    pub adds_existing_values: bool,
}

/// Compare the source's columns with the target's (`(name, format_type)` each) and plan the
/// DDL for the target table `table` (quoted, qualified): add the columns it lacks (with the
/// source's missing value as default, so rows and decoded events from before the column
/// existed get it), widen columns whose type the source widened, and refuse the rest. Columns
/// only the target has are left alone.
/// Types are the source's `format_type` text, which PostgreSQL writes with its identifiers
/// already quoted (`"My Type"`, `public."e"`), so they go into the DDL as they are; names are
/// quoted here and default values are literals ([`quote_literal`]).
pub fn plan_shape(table: &str, source: &[SourceColumn], target: &[(String, String)]) -> ShapePlan {
    let mut plan = ShapePlan {
        shape: target.to_vec(),
        ..ShapePlan::default()
    };
    for col in source {
        let (name, ty) = (&col.name, &col.ty);
        match target.iter().find(|(n, _)| n == name) {
            None => {
                plan.adds_existing_values |= col.missing.is_some();
                let ddl = match &col.missing {
                    Some(v) => format!(
                        "ALTER TABLE {table} ADD COLUMN {} {ty} DEFAULT {}::{ty}",
                        quote_ident(name),
                        quote_literal(v)
                    ),
                    None => format!("ALTER TABLE {table} ADD COLUMN {} {ty}", quote_ident(name)),
                };
                plan.ddl.push((ddl, format!("add column {name} {ty}")));
                plan.shape.push((name.clone(), ty.clone()));
            }
            Some((_, tty)) if holds(tty, ty) => {} // the target is already at least as wide
            Some((_, tty)) if holds(ty, tty) => {
                plan.ddl.push((
                    format!(
                        "ALTER TABLE {table} ALTER COLUMN {} TYPE {ty}",
                        quote_ident(name)
                    ),
                    format!("widen column {name} from {tty} to {ty}"),
                ));
                if let Some(c) = plan.shape.iter_mut().find(|(n, _)| n == name) {
                    c.1 = ty.clone();
                }
            }
            Some((_, tty)) => plan.refused.push(format!(
                "column {name} changed from {tty} to {ty}, which is not a safe widening"
            )),
        }
    }
    plan
}

/// Plan what a schema event (`change`, see [`crate::model::SchemaChange`]) does to the target
/// table `table` (quoted, qualified) whose columns are `target` and whose key is `target_key`,
/// at the event's position: columns renamed at the source are renamed (when the target has the
/// old name and not the new one), then each dropped column the target has is dropped (also
/// when a column of that name was added again: its rows have the new column's values) —
/// unless it is part of the target's key, which is refused — then [`plan_shape`] against the
/// new columns (added columns with the value existing rows got, safe widenings; the rest
/// refused).
/// A changed key is refused (`key_changed`): pg_tide keys the target, its backfill and its
/// reconciliation by the key it recorded.
pub fn plan_schema_change(
    table: &str,
    change: &crate::model::SchemaChange,
    target: &[(String, String)],
    target_key: &[String],
) -> ShapePlan {
    let mut renamed_target = target.to_vec();
    let mut ddl = Vec::new();
    for (from, to) in &change.renamed {
        let has = |n: &str| renamed_target.iter().any(|(c, _)| c == n);
        if has(from) && !has(to) && !target_key.contains(from) {
            ddl.push((
                format!(
                    "ALTER TABLE {table} RENAME COLUMN {} TO {}",
                    quote_ident(from),
                    quote_ident(to)
                ),
                format!("rename column {from} to {to}"),
            ));
            if let Some(c) = renamed_target.iter_mut().find(|(c, _)| c == from) {
                c.0 = to.clone();
            }
        }
    }
    let mut refused = Vec::new();
    for name in &change.dropped {
        if !renamed_target.iter().any(|(n, _)| n == name) {
            continue; // never at the target
        }
        if target_key.contains(name) {
            refused.push(format!(
                "column {name} was dropped at the source, and it is part of the target's key"
            ));
            continue;
        }
        // Also when a column of that name was added again: its rows have new values.
        ddl.push((
            format!("ALTER TABLE {table} DROP COLUMN {}", quote_ident(name)),
            format!("drop column {name}"),
        ));
        renamed_target.retain(|(n, _)| n != name);
    }
    let source: Vec<SourceColumn> = change
        .columns
        .iter()
        .map(|(name, ty)| SourceColumn {
            name: name.clone(),
            ty: ty.clone(),
            missing: change
                .added
                .iter()
                .find(|(n, _, _)| n == name)
                .and_then(|(_, _, v)| v.clone()),
        })
        .collect();
    let mut plan = plan_shape(table, &source, &renamed_target);
    ddl.append(&mut plan.ddl);
    plan.ddl = ddl;
    refused.append(&mut plan.refused);
    plan.refused = refused;
    if change.key_changed() {
        plan.key_changed = true;
        plan.refused.push(format!(
            "the key changed from ({}) to ({})",
            change.previous_key.join(", "),
            change.key.join(", ")
        ));
    }
    plan
}

/// Whether type `wide` can hold every value of type `narrow` (so `narrow → wide` is a safe
/// widening). Types are `format_type` strings.
pub fn holds(wide: &str, narrow: &str) -> bool {
    if wide == narrow {
        return true;
    }
    let int_digits = |t: &str| match t {
        "smallint" => Some(5),
        "integer" => Some(10),
        "bigint" => Some(19),
        _ => None,
    };
    let numeric = |t: &str| -> Option<Option<(u32, u32)>> {
        if t == "numeric" {
            return Some(None);
        }
        let inner = t.strip_prefix("numeric(")?.strip_suffix(')')?;
        let mut it = inner.split(',');
        let p = it.next()?.trim().parse().ok()?;
        let s = it
            .next()
            .map(|s| s.trim().parse().ok())
            .unwrap_or(Some(0))?;
        Some(Some((p, s)))
    };
    let varchar = |t: &str| -> Option<Option<u32>> {
        if t == "character varying" {
            return Some(None);
        }
        t.strip_prefix("character varying(")?
            .strip_suffix(')')?
            .parse()
            .ok()
            .map(Some)
    };
    match (wide, narrow) {
        ("text", n) if n == "text" || varchar(n).is_some() || n.starts_with("character(") => true,
        ("double precision", "real") => true,
        ("double precision", n) if n == "smallint" || n == "integer" => true,
        (w, n) if int_digits(w).is_some() && int_digits(n).is_some() => {
            int_digits(w) >= int_digits(n)
        }
        (w, n) if numeric(w).is_some() => match (numeric(w), int_digits(n), numeric(n)) {
            (Some(None), Some(_), _) | (Some(None), _, Some(_)) => true,
            (Some(Some((p, s))), Some(d), _) => p.saturating_sub(s) >= d,
            (Some(Some((wp, ws))), _, Some(Some((np, ns)))) => {
                ws >= ns && wp.saturating_sub(ws) >= np.saturating_sub(ns)
            }
            _ => false,
        },
        (w, n) if varchar(w).is_some() && varchar(n).is_some() => match (varchar(w), varchar(n)) {
            (Some(None), _) => true,
            (Some(Some(a)), Some(Some(b))) => a >= b,
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
