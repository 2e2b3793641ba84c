//! `tide.pipeline_table`: the tables each pipeline captures, with their key, their shape, their
//! row filter and column list and (table targets) their target table; and the
//! add/remove/alter_table markers (`tide.marker`). Written by the SQL API (add, remove, alter),
//! by the worker (capturing from the add marker on; forgetting at the remove marker; the new
//! shaping (filter, column list, masks) in effect from the alter_table marker on: until then
//! `shaping_before` holds the one the decoder and the backfills use, [`captured`], [`shaping`]) and, for `shape` and the `schema` markers, by the event trigger
//! `tide._schema_marker` (SQL, `src/schema/objects.sql`) in the transaction of an `ALTER TABLE`.

use super::{corrupt, relid};
use crate::error::TideResult;
use crate::sql;
use crate::sql_as_tide;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::spi::{Spi, SpiClient};
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
    /// A partitioned table (captured with its partitions).
    pub partitioned: bool,
    /// The row filter in effect in the stream (`tide.add_table`'s, or `tide.alter_table`'s once
    /// the worker has passed its marker).
    pub row_filter: Option<String>,
    /// The column list in effect in the stream (attribute numbers), likewise.
    pub columns: Option<Vec<i16>>,
    /// Captured without a key (`REPLICA IDENTITY FULL`): its backfills are copies
    /// (`worker::backfill::keyless`).
    pub keyless: bool,
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
    /// Only the rows it passes are delivered (`None`: every row).
    pub row_filter: Option<&'a str>,
    /// Only these columns (attribute numbers) are delivered (`None`: every column).
    pub columns: Option<&'a [i16]>,
}

impl NewTable<'_> {
    /// `$1` to `$8`: pipeline, relid, relation, key_columns, target_schema, target_name,
    /// row_filter, columns.
    fn args(&self) -> [DatumWithOid<'static>; 8] {
        [
            self.pipeline.into(),
            self.relid.into(),
            self.relation.into(),
            self.key_columns.to_vec().into(),
            self.target_schema.into(),
            self.target_name.into(),
            self.row_filter.into(),
            self.columns.map(|c| c.to_vec()).into(),
        ]
    }
}

/// A target table: schema, name, key columns in key order (empty for a table captured without a
/// key, `REPLICA IDENTITY FULL`); a NULL one is [`corrupt`].
fn table_ref(
    schema: Option<String>,
    name: Option<String>,
    key: Option<Vec<String>>,
    pipeline: &str,
) -> TideResult<TableRef> {
    Ok(TableRef {
        schema: schema.ok_or_else(|| corrupt("target_schema", pipeline))?,
        name: name.ok_or_else(|| corrupt("target_name", pipeline))?,
        key: key.ok_or_else(|| corrupt("key_columns", pipeline))?,
    })
}

/// SQL: the key columns (`text[]`, in key order) of the table `pg_class c` (alias `c` in the
/// statement): its replica identity index, or its primary key. What `tide.add_table` records in
/// `key_columns`, and what it is compared with later.
macro_rules! key_of_pg_class_c {
    () => {
        "ARRAY(SELECT a.attname::text
                 FROM pg_index i
                 JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON k.ord <= i.indnkeyatts
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                WHERE i.indrelid = c.oid
                  AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END
                ORDER BY k.ord)"
    };
}
pub(crate) use key_of_pg_class_c;

/// SQL: the row filter (`text`) and the column list (`int2[]`) in effect in the stream for the
/// row `t` of `tide.pipeline_table` (alias `t`): the ones before a `tide.alter_table` whose marker
/// the worker has not reached yet (`shaping_before`), else the stored ones.
macro_rules! effective_shaping_t {
    () => {
        "CASE WHEN t.shaping_before IS NULL THEN t.row_filter ELSE t.shaping_before->>'row_filter' END,
         CASE WHEN t.shaping_before IS NULL THEN t.columns
              WHEN pg_catalog.jsonb_typeof(t.shaping_before->'columns') = 'array'
              THEN ARRAY(SELECT c::int2 FROM pg_catalog.jsonb_array_elements_text(t.shaping_before->'columns') c) END"
    };
}

/// SQL: a table's masks (`$m`, jsonb by attribute number, relation `$2`) by column name, each
/// mask by its kind only (`hash`, `truncate`, `null`, `constant`: never a constant's value);
/// NULL when there are none. For the schema event of `tide.alter_table`.
macro_rules! mask_kinds {
    ($m:literal) => {
        concat!(
            "(SELECT pg_catalog.jsonb_object_agg(a.attname,
                     CASE pg_catalog.jsonb_typeof(m.value) WHEN 'string' THEN m.value #>> '{}'
                          ELSE (SELECT k FROM pg_catalog.jsonb_object_keys(m.value) k LIMIT 1) END
                     ORDER BY a.attnum)
               FROM pg_catalog.jsonb_each(",
            $m,
            ") m JOIN pg_catalog.pg_attribute a
                 ON a.attrelid = $2 AND a.attnum = m.key::int2 AND NOT a.attisdropped)"
        )
    };
}

/// SQL: the masks (jsonb by attribute number) in effect in the stream for the row `t` of
/// `tide.pipeline_table`: the ones before a `tide.alter_table` whose marker the worker has not
/// reached yet (`shaping_before`, when it holds them), else the stored ones.
macro_rules! effective_masks_t {
    () => {
        "CASE WHEN t.shaping_before IS NULL OR NOT t.shaping_before ? 'masks' THEN t.masks
              ELSE NULLIF(t.shaping_before->'masks', 'null'::jsonb) END"
    };
}
pub(crate) use effective_masks_t;

// --- the worker --------------------------------------------------------------------------------

/// The tables a pipeline captures, by relid. Called by the worker, in its iteration's
/// transaction.
pub(crate) fn captured(c: &mut SpiClient<'_>, pipeline: &str) -> TideResult<Vec<TableRow>> {
    let rows = crate::sql::select(
        c,
        concat!(
            "SELECT t.relid::int8, t.added_lsn IS NOT NULL, t.removing, t.partitions IS NOT NULL, ",
            effective_shaping_t!(),
            ", pg_catalog.cardinality(t.key_columns) = 0",
            " FROM tide.pipeline_table t WHERE t.pipeline = $1 ORDER BY t.relid"
        ),
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
            partitioned: r.get::<bool>(4)?.unwrap_or(false),
            row_filter: r.get::<String>(5)?,
            columns: r.get::<Vec<i16>>(6)?,
            keyless: r.get::<bool>(7)?.unwrap_or(false),
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
    let rows = crate::sql::select(
        c,
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

/// A table captured by `pipeline` that is an ancestor or a descendant of `relid` in a partition
/// tree (quoted and qualified), if any. Called by `tide.add_table`; runs as pg_tide.
pub(crate) fn captured_partition_relative(
    pipeline: &str,
    relid: pg_sys::Oid,
) -> TideResult<Option<String>> {
    sql_as_tide::one::<String>(
        "SELECT t.relation FROM tide.pipeline_table t
          WHERE t.pipeline = $1 AND NOT t.removing AND t.relid <> $2
            AND (t.relid IN (SELECT relid FROM pg_partition_ancestors($2))
                 OR t.relid IN (SELECT relid FROM pg_partition_tree($2)))
          LIMIT 1",
        &[pipeline.into(), relid.into()],
    )
}

/// A captured partitioned table whose partitions (those holding rows) are not the recorded ones.
pub(crate) struct PartitionChange {
    pub relid: u32,
    pub relation: String,
    pub key_columns: Vec<String>,
    /// The partitions now.
    pub current: Vec<u32>,
    /// Those not recorded: attached (or created) since.
    pub attached: Vec<u32>,
}

/// The captured partitioned tables of a pipeline whose partitions changed since they were
/// recorded (by `tide.add_table` or [`record_partitions`]). Called by the worker, in its
/// iteration's transaction.
pub(crate) fn partition_changes(
    c: &mut SpiClient<'_>,
    pipeline: &str,
) -> TideResult<Vec<PartitionChange>> {
    let rows = crate::sql::select(
        c,
        "SELECT t.relid::int8, t.relation, t.key_columns,
                ARRAY(SELECT pt.relid::int8 FROM pg_partition_tree(t.relid) pt JOIN pg_class pc ON pc.oid = pt.relid
                       WHERE pt.isleaf AND pc.relkind = 'r' ORDER BY 1),
                t.partitions::int8[]
           FROM tide.pipeline_table t
          WHERE t.pipeline = $1 AND t.partitions IS NOT NULL AND NOT t.removing AND t.added_lsn IS NOT NULL
          ORDER BY t.relid",
        None,
        &[pipeline.into()],
    )?;
    let mut out = Vec::new();
    for r in rows {
        let oids = |v: Option<Vec<i64>>| -> Vec<u32> {
            v.unwrap_or_default()
                .into_iter()
                .map(|o| o as u32)
                .collect()
        };
        let current = oids(r.get::<Vec<i64>>(4)?);
        let recorded = oids(r.get::<Vec<i64>>(5)?);
        if current == recorded {
            continue;
        }
        let attached = current
            .iter()
            .copied()
            .filter(|o| !recorded.contains(o))
            .collect();
        out.push(PartitionChange {
            relid: relid(r.get::<i64>(1)?, "relid", pipeline)?,
            relation: r
                .get::<String>(2)?
                .ok_or_else(|| corrupt("relation", pipeline))?,
            key_columns: r
                .get::<Vec<String>>(3)?
                .filter(|k| !k.is_empty())
                .ok_or_else(|| corrupt("key_columns", pipeline))?,
            current,
            attached,
        });
    }
    Ok(out)
}

/// Record the partitions of a captured partitioned table whose rows were read or queued to be.
/// Called by the worker, in its iteration's transaction.
pub(crate) fn record_partitions(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    relid: u32,
    partitions: &[u32],
) -> TideResult<()> {
    let list: Vec<i64> = partitions.iter().map(|&o| o as i64).collect();
    crate::sql::update(
        c,
        "UPDATE tide.pipeline_table SET partitions = $3::int8[]::oid[] WHERE pipeline = $1 AND relid = $2::int8::oid",
        None,
        &[pipeline.into(), (relid as i64).into(), list.into()],
    )?;
    Ok(())
}

/// A partition of a partitioned table that a capture through the table cannot follow.
pub(crate) struct PartitionProblem {
    /// The partition, quoted and qualified.
    pub name: String,
    /// What is wrong and what to do, as (message, hint) for a partition of `table`.
    pub problem: &'static str,
}

/// The partitions (holding rows; all, or those in `only`) of partitioned table `relid` whose
/// changes a capture of the table with key `key` cannot follow: a foreign or unlogged one
/// (not in this server's WAL), one whose replica identity does not include every key column (its
/// deletes would carry no key). Catalog-only; called by `tide.add_table` and the worker.
pub(crate) fn partition_problems(
    relid: u32,
    key: &[String],
    only: Option<&[u32]>,
) -> TideResult<Vec<PartitionProblem>> {
    let only: Option<Vec<i64>> = only.map(|o| o.iter().map(|&x| x as i64).collect());
    let rows = Spi::connect(|c| -> TideResult<Vec<(Option<String>, Option<String>)>> {
        let rows = crate::sql::select(
        c,
            "SELECT format('%I.%I', n.nspname, c.relname),
                    CASE WHEN c.relkind = 'f' THEN 'foreign'
                         WHEN c.relpersistence <> 'p' THEN 'unlogged'
                         WHEN NOT (CASE c.relreplident
                                   WHEN 'f' THEN ARRAY(SELECT a.attname::text FROM pg_attribute a
                                                        WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)
                                   WHEN 'n' THEN '{}'::text[]
                                   ELSE ARRAY(SELECT a.attname::text
                                                FROM pg_index i
                                                JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON k.ord <= i.indnkeyatts
                                                JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                                               WHERE i.indrelid = c.oid
                                                 AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END)
                                   END) @> $2::text[] THEN 'identity' END
               FROM pg_partition_tree($1::int8::oid) pt
               JOIN pg_class c ON c.oid = pt.relid
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE pt.isleaf AND pt.relid <> $1::int8::oid
                AND ($3::int8[] IS NULL OR pt.relid::int8 = ANY($3::int8[]))
              ORDER BY 1",
            None,
            &[(relid as i64).into(), key.to_vec().into(), only.into()],
        )?;
        let mut out = Vec::new();
        for r in rows {
            out.push((r.get::<String>(1)?, r.get::<String>(2)?));
        }
        Ok(out)
    })?;
    Ok(rows
        .into_iter()
        .filter_map(|(name, problem)| {
            let problem = match problem.as_deref() {
                Some("foreign") => "is a foreign table, whose changes are not in this server's WAL",
                Some("unlogged") => "is unlogged or temporary, so its changes are not in the WAL",
                Some("identity") => "has a replica identity that does not include every key column, so its deletes would carry no key",
                _ => return None,
            };
            Some(PartitionProblem {
                name: name.unwrap_or_default(),
                problem,
            })
        })
        .collect())
}

/// Record that the worker reached a table's add_table marker at commit LSN `lsn`. Called by the
/// worker, in its iteration's transaction.
pub(crate) fn mark_capturing(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    relid: u32,
    lsn: &str,
) -> TideResult<()> {
    crate::sql::update(
        c,
        "UPDATE tide.pipeline_table SET added_lsn = $3::pg_lsn WHERE pipeline = $1 AND relid = $2::int8::oid AND added_lsn IS NULL",
        None,
        &[pipeline.into(), (relid as i64).into(), lsn.into()],
    )?;
    Ok(())
}

/// Whether the `tide.alter_table` whose marker payload carries `xid` (its transaction's id) is
/// still to take effect for `relid` in `pipeline` (its `shaping_before` is set by that call, not
/// cleared yet). Called by the worker at an `alter_table` marker, in its iteration's transaction.
pub(crate) fn alter_pending(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    relid: u32,
    xid: &str,
) -> TideResult<bool> {
    // Run as a statement that may write (it does not): SPI then takes a new snapshot for it,
    // where a read-only statement of a transaction without an xid would use the iteration's
    // first one, taken before the alter_table whose marker is being applied may have committed.
    Ok(crate::sql::first::<bool>(crate::sql::update(
        c,
        "SELECT EXISTS (SELECT 1 FROM tide.pipeline_table
                         WHERE pipeline = $1 AND relid = $2::int8::oid AND shaping_before->>'xid' = $3)",
        Some(1),
        &[pipeline.into(), (relid as i64).into(), xid.into()],
    )?)?
    .unwrap_or(false))
}

/// The worker passed the `alter_table` marker of the call whose transaction id is `xid`: from
/// here the stream and the backfills shape the table as `row_filter` and `columns` say. Called by
/// the worker, in its iteration's transaction.
pub(crate) fn end_alter(
    c: &mut SpiClient<'_>,
    pipeline: &str,
    relid: u32,
    xid: &str,
) -> TideResult<()> {
    crate::sql::update(
        c,
        "UPDATE tide.pipeline_table SET shaping_before = NULL
          WHERE pipeline = $1 AND relid = $2::int8::oid AND shaping_before->>'xid' = $3",
        None,
        &[pipeline.into(), (relid as i64).into(), xid.into()],
    )?;
    Ok(())
}

/// A new row filter, column list and masks for a captured table (`tide.alter_table`): stored now
/// (with the shape the column list gives, which the event trigger describes later `ALTER TABLE`s
/// against), the ones in effect kept in `shaping_before` until the worker reaches the marker.
/// Returns the marker's payload: the schema event that announces the change (as
/// `tide._schema_change` describes the shape's change, with the row filter, the column list and
/// the masks (`masks`, `previous_masks`: column → kind, never a constant or the salt) before and
/// after, `"altered": true`, and the transaction's id in `xid`). Called by
/// `tide.alter_table`, which holds a lock on the table; runs as pg_tide.
pub(crate) fn alter(
    pipeline: &str,
    relid: pg_sys::Oid,
    row_filter: Option<&str>,
    columns: Option<&[i16]>,
    masks: Option<&serde_json::Value>,
) -> TideResult<String> {
    sql_as_tide::write_one::<String>(
        concat!("WITH o AS (SELECT t.shape, t.row_filter, t.columns, t.masks FROM tide.pipeline_table t
                     WHERE t.pipeline = $1 AND t.relid = $2 FOR UPDATE),
              x AS (SELECT pg_catalog.txid_current()::text AS xid),
              u AS (UPDATE tide.pipeline_table t
                       SET row_filter = $3, columns = $4, shape = tide._listed_shape($2, $4),
                           masks = $5::text::jsonb,
                           shaping_before = pg_catalog.jsonb_build_object('row_filter', o.row_filter,
                                                'columns', pg_catalog.to_jsonb(o.columns),
                                                'masks', o.masks, 'xid', x.xid)
                      FROM o, x
                     WHERE t.pipeline = $1 AND t.relid = $2
                 RETURNING t.shape)
         SELECT (tide._schema_change(o.shape, u.shape, $2)
                 || pg_catalog.jsonb_build_object(
                        'altered', true,
                        'row_filter', $3, 'previous_row_filter', o.row_filter,
                        'listed_columns', (SELECT pg_catalog.jsonb_agg(a.attname ORDER BY a.attnum) FROM pg_catalog.pg_attribute a WHERE $4 IS NOT NULL AND a.attrelid = $2 AND a.attnum = ANY ($4) AND NOT a.attisdropped),
                        'previous_listed_columns', (SELECT pg_catalog.jsonb_agg(a.attname ORDER BY a.attnum) FROM pg_catalog.pg_attribute a WHERE o.columns IS NOT NULL AND a.attrelid = $2 AND a.attnum = ANY (o.columns) AND NOT a.attisdropped),
                        'masks', ", mask_kinds!("$5::text::jsonb"), ",
                        'previous_masks', ", mask_kinds!("o.masks"), ",
                        'xid', x.xid))::text
           FROM o, u, x"),
        &[
            pipeline.into(),
            relid.into(),
            row_filter.into(),
            columns.map(|c| c.to_vec()).into(),
            masks.map(|m| m.to_string()).into(),
        ],
    )?
    .ok_or_else(|| corrupt("pipeline_table", pipeline))
}

/// A captured table's row as `tide.alter_table` checks it ([`lock_for_alter`]).
pub(crate) struct AlterRow {
    pub row_filter: Option<String>,
    pub columns: Option<Vec<i16>>,
    /// Its masks, as stored (attribute number → mask).
    pub masks: Option<serde_json::Value>,
    /// The worker has passed its add marker.
    pub capturing: bool,
    pub removing: bool,
    /// A `tide.alter_table` of it has not taken effect yet (its marker lies ahead).
    pub altering: bool,
}

/// The row of a captured table (`None`: the pipeline does not capture it), locked until the
/// end of the transaction, so two `tide.alter_table`s of it run one after the other (the second
/// sees the first's). Called by `tide.alter_table`; runs as pg_tide.
pub(crate) fn lock_for_alter(pipeline: &str, relid: pg_sys::Oid) -> TideResult<Option<AlterRow>> {
    let rows = sql_as_tide::text_rows(
        "SELECT row_filter, pg_catalog.to_json(columns)::text, (added_lsn IS NOT NULL)::text,
                removing::text, (shaping_before IS NOT NULL)::text, masks::text
           FROM tide.pipeline_table WHERE pipeline = $1 AND relid = $2::oid FOR UPDATE",
        &[Some(pipeline), Some(&relid.to_u32().to_string())],
        1,
        true,
    )?;
    let Some(mut r) = rows.into_iter().next() else {
        return Ok(None);
    };
    let columns = match r[1].as_deref() {
        Some(j) => Some(serde_json::from_str(j).map_err(|_| corrupt("columns", pipeline))?),
        None => None,
    };
    let masks = match r[5].as_deref() {
        Some(j) => Some(serde_json::from_str(j).map_err(|_| corrupt("masks", pipeline))?),
        None => None,
    };
    let yes = |v: &Option<String>| v.as_deref() == Some("true");
    Ok(Some(AlterRow {
        row_filter: r[0].take(),
        columns,
        masks,
        capturing: yes(&r[2]),
        removing: yes(&r[3]),
        altering: yes(&r[4]),
    }))
}

/// The worker reached a table's remove marker: forget the table (unless it was re-added since).
/// Called by the worker, in its iteration's transaction.
pub(crate) fn forget_removed(c: &mut SpiClient<'_>, pipeline: &str, relid: u32) -> TideResult<()> {
    crate::sql::update(
        c,
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
    Ok(sql_as_tide::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM tide.pipeline_table WHERE pipeline = $1 AND relid = $2)",
        &[pipeline.into(), relid.into()],
    )?
    .unwrap_or(false))
}

/// The OIDs of the tables a pipeline captures that no longer exist and were named `name`
/// (`schema.name` as `format('%I.%I')` or the parts `parse_ident` reads; or a bare name, matched
/// against the name part). Called by `tide.remove_table`; runs as pg_tide.
pub(crate) fn dropped_named(pipeline: &str, name: &str) -> TideResult<Vec<u32>> {
    let rows = sql_as_tide::text_rows(
        "WITH n AS (SELECT pg_catalog.parse_ident($2, false) AS a)
         SELECT t.relid::int8::text FROM tide.pipeline_table t, n
          WHERE t.pipeline = $1
            AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = t.relid)
            AND (t.relation = $2
                 OR (cardinality(n.a) = 2 AND t.relation = format('%I.%I', n.a[1], n.a[2]))
                 OR (cardinality(n.a) = 1 AND right(t.relation, length(quote_ident(n.a[1])) + 1) = '.' || quote_ident(n.a[1])))
          ORDER BY t.relid",
        &[Some(pipeline), Some(name)],
        0,
        false,
    )?;
    Ok(rows
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten()?.parse().ok())
        .collect())
}

/// The pipelines that capture the table, by name. Called by the SQL API; runs as pg_tide.
pub(crate) fn pipelines_capturing(relid: pg_sys::Oid) -> TideResult<Vec<String>> {
    sql_as_tide::text_rows(
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
    let (recorded, now) = sql_as_tide::two::<Vec<String>, Vec<String>>(
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
    sql_as_tide::one::<String>(
        "SELECT relation FROM tide.pipeline_table
          WHERE pipeline = $1 AND target_name IS NOT NULL
            AND to_regclass(format('%I.%I', target_schema, target_name)) = $2",
        &[pipeline.into(), relid.into()],
    )
}

/// A `table` pipeline (of any owner) one of whose target tables is `relid`, if any. Called by
/// the SQL API; runs as pg_tide.
pub(crate) fn table_pipeline_targeting(relid: pg_sys::Oid) -> TideResult<Option<String>> {
    sql_as_tide::one::<String>(
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
    sql_as_tide::one::<String>(
        "SELECT relation FROM tide.pipeline_table
          WHERE pipeline = $1 AND NOT removing AND relid = to_regclass(format('%I.%I', $2::text, $3::text))",
        &[pipeline.into(), schema.into(), name.into()],
    )
}

/// Whether the pipeline's row for the table is being removed (`Some(true)`: `tide.remove_table`
/// ran and the worker has not reached its marker yet), captured (`Some(false)`), or absent.
/// Called by the SQL API; runs as pg_tide.
pub(crate) fn removing(pipeline: &str, relid: pg_sys::Oid) -> TideResult<Option<bool>> {
    sql_as_tide::one::<bool>(
        "SELECT removing FROM tide.pipeline_table WHERE pipeline = $1 AND relid = $2",
        &[pipeline.into(), relid.into()],
    )
}

/// Record a table to capture, with its shape now (the event trigger describes each later schema
/// change against it). Called by `tide.add_table`, which holds a lock on the table so no
/// `ALTER TABLE` can commit in between; runs as pg_tide.
pub(crate) fn insert(t: &NewTable<'_>) -> TideResult<()> {
    sql_as_tide::exec(
        "INSERT INTO tide.pipeline_table (pipeline, relid, relation, key_columns, target_schema, target_name, row_filter, columns, shape, partitions)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, tide._listed_shape($2, $8),
                 CASE WHEN (SELECT relkind FROM pg_class WHERE oid = $2) = 'p'
                     THEN ARRAY(SELECT pt.relid FROM pg_partition_tree($2) pt JOIN pg_class pc ON pc.oid = pt.relid
                                 WHERE pt.isleaf AND pc.relkind = 'r' ORDER BY 1) END)",
        &t.args(),
    )
}

/// The row filter and column list of `relid` in `pipeline` in effect in the stream (`None`:
/// none, or not captured): until the worker reaches a `tide.alter_table`'s marker, the ones
/// before it.
/// Called by the chunk reader and `tide.verify`; runs as pg_tide.
pub(crate) fn shaping(
    pipeline: &str,
    relid: u32,
) -> TideResult<(Option<String>, Option<Vec<i16>>)> {
    crate::security::as_tide(|| shaping_row(pipeline, relid))
}

fn shaping_row(pipeline: &str, relid: u32) -> TideResult<(Option<String>, Option<Vec<i16>>)> {
    Spi::connect(|c| {
        let row = c
            .select(
                concat!(
                    "SELECT ",
                    effective_shaping_t!(),
                    " FROM tide.pipeline_table t WHERE t.pipeline = $1 AND t.relid = $2::int8::oid"
                ),
                None,
                &[pipeline.into(), (relid as i64).into()],
            )?
            .first();
        if row.is_empty() {
            return Ok((None, None));
        }
        Ok((row.get::<String>(1)?, row.get::<Vec<i16>>(2)?))
    })
}

/// Capture again a table whose removal the worker has not reached yet: from the new add marker
/// on, with what `t` says. Called by `tide.add_table`; runs as pg_tide.
pub(crate) fn re_add(t: &NewTable<'_>) -> TideResult<()> {
    sql_as_tide::exec(
        "UPDATE tide.pipeline_table SET removing = false, added_lsn = NULL, added_at = now(), relation = $3, key_columns = $4,
                target_schema = $5, target_name = $6, row_filter = $7, columns = $8, shape = tide._listed_shape($2, $8),
                shaping_before = NULL,
                partitions = CASE WHEN (SELECT relkind FROM pg_class WHERE oid = $2) = 'p'
                     THEN ARRAY(SELECT pt.relid FROM pg_partition_tree($2) pt JOIN pg_class pc ON pc.oid = pt.relid
                                 WHERE pt.isleaf AND pc.relkind = 'r' ORDER BY 1) END
          WHERE pipeline = $1 AND relid = $2",
        &t.args(),
    )
}

/// Mark a captured table as being removed (the worker deletes the row at the remove marker);
/// returns the number of rows marked (0: not captured, or already being removed). Called by
/// `tide.remove_table`; runs as pg_tide.
pub(crate) fn mark_removing(pipeline: &str, relid: pg_sys::Oid) -> TideResult<u64> {
    sql_as_tide::exec_count(
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
    write_marker_with(op, pipeline, relid, None)
}

/// [`write_marker`] with a payload (JSON text).
pub(crate) fn write_marker_with(
    op: MarkerOp,
    pipeline: &str,
    relid: pg_sys::Oid,
    payload: Option<&str>,
) -> TideResult<()> {
    let id = sql_as_tide::write_one::<i64>(
        "INSERT INTO tide.marker (pipeline, op, relid, payload) VALUES ($1, $2, $3, $4::text::jsonb) RETURNING id",
        &[pipeline.into(), op.as_str().into(), relid.into(), payload.into()],
    )?;
    sql_as_tide::exec("DELETE FROM tide.marker WHERE id = $1", &[id.into()])
}

/// How a query reads the rows of source table `relid` (named `qualified`): `ONLY` the table
/// itself (not tables that inherit from it), or a partitioned table with all its partitions.
/// Catalog-only; called by the worker and the SQL API.
pub(crate) fn scan(relid: pg_sys::Oid, qualified: &str) -> TideResult<String> {
    let partitioned = sql::one::<bool>(
        "SELECT relkind = 'p' FROM pg_class WHERE oid = $1",
        &[relid.into()],
    )?
    .unwrap_or(false);
    Ok(if partitioned {
        qualified.to_string()
    } else {
        format!("ONLY {qualified}")
    })
}

/// The columns of source table `relid` a table target of `pipeline` receives, in order: (name,
/// type as `format_type` writes it in this session, the value `ADD COLUMN ... DEFAULT` left for
/// rows written before it, if any). A column a hash or truncate mask covers is `text`; a
/// column list (`tide.add_table`'s columns) keeps its columns only. In a snapshot taken now.
/// Called by the table target, in the worker's iteration (the caller sets the session's type
/// names).
pub(crate) fn source_columns(pipeline: &str, relid: u32) -> TideResult<Vec<Vec<Option<String>>>> {
    sql::text_rows(
        "SELECT a.attname::pg_catalog.text,
                -- a hash or truncate mask (tide.add_table's masks) delivers text
                CASE WHEN m.v OPERATOR(pg_catalog.=) '\"hash\"'::pg_catalog.jsonb
                       OR m.v OPERATOR(pg_catalog.?) 'truncate'
                     THEN 'text' ELSE pg_catalog.format_type(a.atttypid, a.atttypmod) END,
                CASE WHEN a.atthasmissing
                     THEN (a.attmissingval::pg_catalog.text::pg_catalog.text[])[1] END
           FROM pg_catalog.pg_attribute a
           LEFT JOIN LATERAL (SELECT t.masks OPERATOR(pg_catalog.->) a.attnum::pg_catalog.text AS v
                                FROM tide.pipeline_table t
                               WHERE t.pipeline OPERATOR(pg_catalog.=) $2
                                 AND t.relid OPERATOR(pg_catalog.=) $1::pg_catalog.oid) m ON true
          WHERE a.attrelid OPERATOR(pg_catalog.=) $1::pg_catalog.oid
            AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
            AND a.attgenerated OPERATOR(pg_catalog.=) ''
            -- the table's column list (tide.add_table's columns), if it has one
            AND a.attnum OPERATOR(pg_catalog.=) ANY (COALESCE(
                  (SELECT t.columns FROM tide.pipeline_table t
                    WHERE t.pipeline OPERATOR(pg_catalog.=) $2
                      AND t.relid OPERATOR(pg_catalog.=) $1::pg_catalog.oid),
                  ARRAY[a.attnum]))
          ORDER BY a.attnum",
        &[Some(&relid.to_string()), Some(pipeline)],
        0,
        true,
    )
}
