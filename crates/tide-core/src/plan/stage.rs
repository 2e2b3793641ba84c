//! A backfill chunk sent to a remote target by COPY: straight into the table, or staged.

use super::*;

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
