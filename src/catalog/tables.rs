//! `tide.pipeline_table`: the tables each pipeline captures, with their key, their shape and
//! (table targets) their target table; and the add/remove markers (`tide.marker`). Written by
//! the SQL API (add, remove), by the worker (capturing from the add marker on; forgetting at the
//! remove marker) and, for `shape` and the `schema` markers, by the event trigger
//! `tide._schema_marker` (SQL, `src/schema.rs`) in the transaction of an `ALTER TABLE`.

use super::{corrupt, relid};
use crate::error::TideResult;
use crate::tsql;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::spi::SpiClient;
use tide_core::model::{MarkerOp, TargetKind};
use tide_core::plan::TableRef;

/// A captured table of a pipeline.
#[derive(Debug, Clone)]
pub struct TableRow {
    pub relid: u32,
    /// True once the worker has passed the add_table marker in the stream.
    pub capturing: bool,
    /// `tide.remove_table` ran; the worker forgets the table at the remove marker.
    pub removing: bool,
}

/// A captured table's target (`None` for the outbox), as `tide.add_table` records it.
pub struct NewTable<'a> {
    pub pipeline: &'a str,
    pub relid: pg_sys::Oid,
    /// The source, schema-qualified and quoted where needed.
    pub relation: &'a str,
    pub key_columns: &'a [String],
    pub target_schema: Option<&'a str>,
    pub target_name: Option<&'a str>,
}

impl NewTable<'_> {
    /// `$1` to `$6`: pipeline, relid, relation, key_columns, target_schema, target_name.
    fn args(&self) -> [DatumWithOid<'static>; 6] {
        [
            self.pipeline.into(),
            self.relid.into(),
            self.relation.into(),
            self.key_columns.to_vec().into(),
            self.target_schema.into(),
            self.target_name.into(),
        ]
    }
}

/// A target table: schema, name, key columns in key order; a NULL or empty one is [`corrupt`].
fn table_ref(
    schema: Option<String>,
    name: Option<String>,
    key: Option<Vec<String>>,
    pipeline: &str,
) -> TideResult<TableRef> {
    Ok(TableRef {
        schema: schema.ok_or_else(|| corrupt("target_schema", pipeline))?,
        name: name.ok_or_else(|| corrupt("target_name", pipeline))?,
        key: key
            .filter(|k| !k.is_empty())
            .ok_or_else(|| corrupt("key_columns", pipeline))?,
    })
}

/// SQL: the key columns (`text[]`, in key order) of the table `pg_class c` (alias `c` in the
/// statement): its replica identity index, or its primary key. What `tide.add_table` records in
/// `key_columns`, and what it is compared with later.
macro_rules! key_of_pg_class_c {
    () => {
        "ARRAY(SELECT a.attname::text
                 FROM pg_index i
                 JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                WHERE i.indrelid = c.oid
                  AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END
                ORDER BY k.ord)"
    };
}
pub(crate) use key_of_pg_class_c;

// --- the worker --------------------------------------------------------------------------------

/// The tables a pipeline captures, by relid. Called by the worker, in its iteration's
/// transaction.
pub(crate) fn captured(c: &mut SpiClient<'_>, pipeline: &str) -> TideResult<Vec<TableRow>> {
    let rows = c.select(
        "SELECT relid::int8, added_lsn IS NOT NULL, removing FROM tide.pipeline_table WHERE pipeline = $1 ORDER BY relid",
        None,
        &[pipeline.into()],
    )?;
    let mut out = Vec::new();
    for r in rows {
        out.push(TableRow {
            relid: relid(r.get::<i64>(1)?, "relid", pipeline)?,
            capturing: r
                .get::<bool>(2)?
                .ok_or_else(|| corrupt("added_lsn", pipeline))?,
            removing: r
                .get::<bool>(3)?
                .ok_or_else(|| corrupt("removing", pipeline))?,
        });
    }
    Ok(out)
}

/// The target table of each captured table of a table pipeline (`relid` → schema, name, key
/// columns in key order). Called by the worker (table targets), in its iteration's transaction.
pub(crate) fn target_tables(
    c: &mut SpiClient<'_>,
    pipeline: &str,
) -> TideResult<Vec<(u32, TableRef)>> {
    let rows = c.select(
        "SELECT relid::int8, target_schema, target_name, key_columns
           FROM tide.pipeline_table WHERE pipeline = $1 AND target_name IS NOT NULL",
        None,
        &[pipeline.into()],
    )?;
    let mut out = Vec::new();
    for r in rows {
        let relid = relid(r.get::<i64>(1)?, "relid", pipeline)?;
        let t = table_ref(r.get(2)?, r.get(3)?, r.get(4)?, pipeline)?;
        out.push((relid, t));
    }
    Ok(out)
}

/// Record that the worker reached a table's add_table marker at commit LSN `lsn`. Called by the
/// worker, in its iteration's transaction.
pub(crate) fn mark_capturing(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    relid: u32,
    lsn: &str,
) -> TideResult<()> {
    c.update(
        "UPDATE tide.pipeline_table SET added_lsn = $3::pg_lsn WHERE pipeline = $1 AND relid = $2::int8::oid AND added_lsn IS NULL",
        None,
        &[pipeline.into(), (relid as i64).into(), lsn.into()],
    )?;
    Ok(())
}

/// The worker reached a table's remove marker: forget the table (unless it was re-added since).
/// Called by the worker, in its iteration's transaction.
pub(crate) fn forget_removed(c: &mut SpiClient<'_>, pipeline: &str, relid: u32) -> TideResult<()> {
    c.update(
        "DELETE FROM tide.pipeline_table WHERE pipeline = $1 AND relid = $2::int8::oid AND removing",
        None,
        &[pipeline.into(), (relid as i64).into()],
    )?;
    Ok(())
}

// --- the SQL API ---------------------------------------------------------------------------------

/// Whether the pipeline captures the table (a row, removing or not). Called by the SQL API; runs
/// as pg_tide.
pub(crate) fn captures(pipeline: &str, relid: pg_sys::Oid) -> TideResult<bool> {
    Ok(tsql::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM tide.pipeline_table WHERE pipeline = $1 AND relid = $2)",
        &[pipeline.into(), relid.into()],
    )?
    .unwrap_or(false))
}

/// The pipelines that capture the table, by name. Called by the SQL API; runs as pg_tide.
pub(crate) fn pipelines_capturing(relid: pg_sys::Oid) -> TideResult<Vec<String>> {
    tsql::text_rows(
        "SELECT pipeline FROM tide.pipeline_table WHERE relid = $1::oid ORDER BY pipeline",
        &[Some(&relid.to_u32().to_string())],
        0,
        false,
    )?
    .into_iter()
    .map(|r| {
        r.into_iter()
            .next()
            .flatten()
            .ok_or_else(|| corrupt("pipeline", "?"))
    })
    .collect()
}

/// The key recorded when the table was added, and the table's key now (its replica identity
/// index, else its primary key), each in key order; `None` when the pipeline does not capture
/// the table. Called by the SQL API; runs as pg_tide.
pub(crate) fn recorded_and_current_key(
    pipeline: &str,
    relid: pg_sys::Oid,
) -> TideResult<Option<(Vec<String>, Vec<String>)>> {
    let (recorded, now) = tsql::two::<Vec<String>, Vec<String>>(
        concat!(
            "SELECT t.key_columns, ",
            key_of_pg_class_c!(),
            " FROM tide.pipeline_table t JOIN pg_class c ON c.oid = t.relid WHERE t.pipeline = $1 AND t.relid = $2"
        ),
        &[pipeline.into(), relid.into()],
    )?;
    // key_columns is NOT NULL and ARRAY(...) never NULL: no first column means no row.
    Ok(recorded.map(|r| (r, now.unwrap_or_default())))
}

/// The source table (its `relation`) whose target in this pipeline is the table `relid`, if
/// any. Called by the SQL API; runs as pg_tide.
pub(crate) fn source_targeting(pipeline: &str, relid: pg_sys::Oid) -> TideResult<Option<String>> {
    tsql::one::<String>(
        "SELECT relation FROM tide.pipeline_table
          WHERE pipeline = $1 AND target_name IS NOT NULL
            AND to_regclass(format('%I.%I', target_schema, target_name)) = $2",
        &[pipeline.into(), relid.into()],
    )
}

/// A `table` pipeline (of any owner) one of whose target tables is `relid`, if any. Called by
/// the SQL API; runs as pg_tide.
pub(crate) fn table_pipeline_targeting(relid: pg_sys::Oid) -> TideResult<Option<String>> {
    tsql::one::<String>(
        "SELECT pipeline FROM tide.pipeline_table t JOIN tide.pipeline p ON p.name = t.pipeline
          WHERE p.target = $2 AND t.target_name IS NOT NULL
            AND to_regclass(format('%I.%I', t.target_schema, t.target_name)) = $1
          LIMIT 1",
        &[relid.into(), TargetKind::Table.as_str().into()],
    )
}

/// The table the pipeline captures (and is not removing) that is `schema.name`, as its
/// `relation`, if any. Called by the SQL API; runs as pg_tide.
pub(crate) fn captured_named(
    pipeline: &str,
    schema: &str,
    name: &str,
) -> TideResult<Option<String>> {
    tsql::one::<String>(
        "SELECT relation FROM tide.pipeline_table
          WHERE pipeline = $1 AND NOT removing AND relid = to_regclass(format('%I.%I', $2::text, $3::text))",
        &[pipeline.into(), schema.into(), name.into()],
    )
}

/// Whether the pipeline's row for the table is being removed (`Some(true)`: `tide.remove_table`
/// ran and the worker has not reached its marker yet), captured (`Some(false)`), or absent.
/// Called by the SQL API; runs as pg_tide.
pub(crate) fn removing(pipeline: &str, relid: pg_sys::Oid) -> TideResult<Option<bool>> {
    tsql::one::<bool>(
        "SELECT removing FROM tide.pipeline_table WHERE pipeline = $1 AND relid = $2",
        &[pipeline.into(), relid.into()],
    )
}

/// Record a table to capture, with its shape now (the event trigger describes each later schema
/// change against it). Called by `tide.add_table`, which holds a lock on the table so no
/// `ALTER TABLE` can commit in between; runs as pg_tide.
pub(crate) fn insert(t: &NewTable<'_>) -> TideResult<()> {
    tsql::exec(
        "INSERT INTO tide.pipeline_table (pipeline, relid, relation, key_columns, target_schema, target_name, shape)
         VALUES ($1, $2, $3, $4, $5, $6, tide._shape($2))",
        &t.args(),
    )
}

/// Capture again a table whose removal the worker has not reached yet: from the new add marker
/// on, with what `t` says. Called by `tide.add_table`; runs as pg_tide.
pub(crate) fn re_add(t: &NewTable<'_>) -> TideResult<()> {
    tsql::exec(
        "UPDATE tide.pipeline_table SET removing = false, added_lsn = NULL, added_at = now(), relation = $3, key_columns = $4,
                target_schema = $5, target_name = $6, shape = tide._shape($2)
          WHERE pipeline = $1 AND relid = $2",
        &t.args(),
    )
}

/// Mark a captured table as being removed (the worker deletes the row at the remove marker);
/// returns the number of rows marked (0: not captured, or already being removed). Called by
/// `tide.remove_table`; runs as pg_tide.
pub(crate) fn mark_removing(pipeline: &str, relid: pg_sys::Oid) -> TideResult<u64> {
    tsql::exec_count(
        "UPDATE tide.pipeline_table SET removing = true WHERE pipeline = $1 AND relid = $2 AND NOT removing",
        &[pipeline.into(), relid.into()],
    )
}

/// The target table of a captured table of a table pipeline; `None` when the pipeline does not
/// capture it. Called by the SQL API (`tide.verify`); runs as pg_tide.
pub(crate) fn target_table(pipeline: &str, relid: pg_sys::Oid) -> TideResult<Option<TableRef>> {
    let Some(mut row) = super::table_row(
        "SELECT target_schema, target_name, to_json(key_columns)::text FROM tide.pipeline_table WHERE pipeline = $1 AND relid = $2::oid",
        pipeline,
        relid,
        &[],
        false,
    )? else {
        return Ok(None);
    };
    let key = match row[2].take() {
        Some(k) => Some(serde_json::from_str(&k).map_err(|_| corrupt("key_columns", pipeline))?),
        None => None,
    };
    table_ref(row[0].take(), row[1].take(), key, pipeline).map(Some)
}

/// Write a marker into the WAL, transactionally: the worker sees it exactly at this
/// transaction's commit position in the stream. The marker is a row of `tide.marker`, which only
/// pg_tide can write, inserted and deleted at once (two statements: the WAL keeps the insert,
/// the table stays empty), so no other role can forge one. Called by the SQL API (add and remove
/// a table); runs as pg_tide.
pub(crate) fn write_marker(op: MarkerOp, pipeline: &str, relid: pg_sys::Oid) -> TideResult<()> {
    let id = tsql::write_one::<i64>(
        "INSERT INTO tide.marker (pipeline, op, relid) VALUES ($1, $2, $3) RETURNING id",
        &[pipeline.into(), op.as_str().into(), relid.into()],
    )?;
    tsql::exec("DELETE FROM tide.marker WHERE id = $1", &[id.into()])
}
