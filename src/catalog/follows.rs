//! `tide.followed_schema` (the schemas whose later tables a pipeline captures) and
//! `tide.follow_skip` (the tables of those schemas it does not capture, and why). Every function
//! is called by the SQL API or by the event trigger `tide._follow_tables` and runs as pg_tide
//! (`crate::sql_as_tide`).

use crate::error::{TideError, TideResult};
use crate::sql_as_tide;
use pgrx::pg_sys;

/// Follow schema `nspid` for `pipeline` (or update the backfill choice and who asked, when it
/// is followed already), as asked by role `by`.
pub(crate) fn follow(
    pipeline: &str,
    nspid: pg_sys::Oid,
    backfill: bool,
    by: &str,
) -> TideResult<()> {
    // A schema followed anew starts with no skip records (one recorded by a DDL racing an
    // earlier tide.stop_following_schema may be left: tide.follow_skip has no foreign key).
    sql_as_tide::exec(
        "WITH f AS (
           INSERT INTO tide.followed_schema (pipeline, nspid, backfill, requested_by)
           VALUES ($1, $2, $3, $4::text::name)
           ON CONFLICT (pipeline, nspid) DO UPDATE
              SET backfill = EXCLUDED.backfill, requested_by = EXCLUDED.requested_by, requested_at = now()
           RETURNING (xmax = 0) AS fresh)
         DELETE FROM tide.follow_skip s USING f
          WHERE f.fresh AND s.pipeline = $1 AND s.nspid = $2",
        &[pipeline.into(), nspid.into(), backfill.into(), by.into()],
    )
}

/// Stop following schema `nspid` (its skip records go with it); whether it was followed.
pub(crate) fn unfollow(pipeline: &str, nspid: pg_sys::Oid) -> TideResult<bool> {
    sql_as_tide::exec(
        "DELETE FROM tide.follow_skip WHERE pipeline = $1 AND nspid = $2",
        &[pipeline.into(), nspid.into()],
    )?;
    Ok(sql_as_tide::exec_count(
        "DELETE FROM tide.followed_schema WHERE pipeline = $1 AND nspid = $2",
        &[pipeline.into(), nspid.into()],
    )? > 0)
}

/// A table of a followed schema that `pipeline` does not capture, and why.
pub(crate) struct Skip<'a> {
    pub pipeline: &'a str,
    pub relid: pg_sys::Oid,
    pub removed: bool,
    pub reason: &'a str,
    pub hint: Option<&'a str>,
    pub sqlstate: Option<&'a str>,
    pub by: &'a str,
}

/// Record a skip (replacing the table's earlier one) when the table's schema is followed by the
/// pipeline; nothing otherwise (a table that no longer exists included).
pub(crate) fn record_skip(s: &Skip<'_>) -> TideResult<()> {
    sql_as_tide::exec(
        "INSERT INTO tide.follow_skip (pipeline, nspid, relid, relation, kind, reason, hint, sqlstate, by_role)
         SELECT f.pipeline, f.nspid, c.oid, format('%I.%I', n.nspname, c.relname), $3, $4, $5, $6, $7::text::name
           FROM tide.followed_schema f
           JOIN pg_catalog.pg_class c ON c.relnamespace = f.nspid
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          WHERE f.pipeline = $1 AND c.oid = $2
         ON CONFLICT (pipeline, relid) DO UPDATE
            SET nspid = EXCLUDED.nspid, relation = EXCLUDED.relation, kind = EXCLUDED.kind,
                reason = EXCLUDED.reason, hint = EXCLUDED.hint, sqlstate = EXCLUDED.sqlstate,
                by_role = EXCLUDED.by_role, at = now()",
        &[
            s.pipeline.into(),
            s.relid.into(),
            if s.removed { "removed" } else { "skipped" }.into(),
            s.reason.into(),
            s.hint.into(),
            s.sqlstate.into(),
            s.by.into(),
        ],
    )
}

/// Forget the skip record of a table the pipeline now captures.
pub(crate) fn forget(pipeline: &str, relid: pg_sys::Oid) -> TideResult<()> {
    sql_as_tide::exec(
        "DELETE FROM tide.follow_skip WHERE pipeline = $1 AND relid = $2",
        &[pipeline.into(), relid.into()],
    )
}

/// A table the current DDL command created, moved or changed in a schema a pipeline follows,
/// which that pipeline may capture now.
pub(crate) struct Candidate {
    pub pipeline: String,
    pub relid: pg_sys::Oid,
    pub relation: String,
    pub backfill: bool,
    pub owner: String,
}

/// The tables of the DDL command whose `ddl_command_end` event trigger is running (read from
/// `pg_event_trigger_ddl_commands()`) that lie in a schema some pipeline follows: ordinary and
/// partitioned tables, not partitions (captured through their partitioned table), not captured
/// by that pipeline already (one it is removing is: a table moved out of the schema and back
/// before the worker reached the move is captured again, as `tide.add_table` re-adds one), not
/// removed from it with `tide.remove_table`, and
/// not a table target of any pipeline (pg_tide's own writes are never captured). In table OID
/// order, then pipeline name. Empty (and cheap) when no schema is followed.
pub(crate) fn candidates() -> TideResult<Vec<Candidate>> {
    let rows = sql_as_tide::text_rows(
        "SELECT f.pipeline, c.oid::text, format('%I.%I', n.nspname, c.relname), f.backfill::text, p.owner::text
           FROM (SELECT DISTINCT d.objid FROM pg_catalog.pg_event_trigger_ddl_commands() d
                  WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objsubid = 0
                    AND EXISTS (SELECT 1 FROM tide.followed_schema)) d
           JOIN pg_catalog.pg_class c ON c.oid = d.objid
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
           JOIN tide.followed_schema f ON f.nspid = c.relnamespace
           JOIN tide.pipeline p ON p.name = f.pipeline
          WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
            AND NOT EXISTS (SELECT 1 FROM tide.pipeline_table t
                             WHERE t.pipeline = f.pipeline AND t.relid = c.oid AND NOT t.removing)
            AND NOT EXISTS (SELECT 1 FROM tide.follow_skip s
                             WHERE s.pipeline = f.pipeline AND s.relid = c.oid AND s.kind = 'removed')
            AND NOT EXISTS (SELECT 1 FROM tide.pipeline_table t
                             WHERE t.target_schema = n.nspname AND t.target_name = c.relname)
          ORDER BY c.oid, f.pipeline",
        &[],
        0,
        false,
    )?;
    rows.into_iter()
        .map(|r| {
            let get = |i: usize| {
                r.get(i)
                    .cloned()
                    .flatten()
                    .ok_or_else(|| TideError::internal("a followed table's row has a NULL column"))
            };
            Ok(Candidate {
                pipeline: get(0)?,
                relid: pg_sys::Oid::from(
                    get(1)?
                        .parse::<u32>()
                        .map_err(|_| TideError::internal("a table OID that is not a number"))?,
                ),
                relation: get(2)?,
                backfill: get(3)? == "true",
                owner: get(4)?,
            })
        })
        .collect()
}

/// Whether `tide.pipeline_table` has the column `followed_nspid` (0.3.0; not while an upgrade
/// from 0.2.0 has yet to add it).
pub(crate) fn tracked() -> TideResult<bool> {
    Ok(sql_as_tide::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                         WHERE attrelid = pg_catalog.to_regclass('tide.pipeline_table')
                           AND attname = 'followed_nspid' AND NOT attisdropped)",
        &[],
    )?
    .unwrap_or(false))
}

/// Whether pg_tide's followed-schema table exists (not during `DROP EXTENSION` or an upgrade).
pub(crate) fn installed() -> TideResult<bool> {
    Ok(sql_as_tide::one::<bool>(
        "SELECT pg_catalog.to_regclass('tide.followed_schema') IS NOT NULL",
        &[],
    )?
    .unwrap_or(false))
}

/// The owner of table `relid`: its OID and name.
pub(crate) fn table_owner(relid: pg_sys::Oid) -> TideResult<(pg_sys::Oid, String)> {
    let (oid, name) = sql_as_tide::two::<pg_sys::Oid, String>(
        "SELECT c.relowner, pg_catalog.pg_get_userbyid(c.relowner)::text FROM pg_catalog.pg_class c WHERE c.oid = $1",
        &[relid.into()],
    )?;
    Ok((oid.unwrap_or(pg_sys::InvalidOid), name.unwrap_or_default()))
}

/// A type of a column of table `relid`, or one it is built from (a domain's base type, an
/// array's element, a composite's columns, a range's subtype, a multirange's range), owned by a
/// role that is not a superuser and whose privileges role `owner` does not have: its name and
/// its owner's. Catalog reads only.
pub(crate) fn foreign_type(
    relid: pg_sys::Oid,
    owner: pg_sys::Oid,
) -> TideResult<Option<(String, String)>> {
    let relid = relid.to_u32().to_string();
    let owner = owner.to_u32().to_string();
    let rows = sql_as_tide::text_rows(
        "WITH RECURSIVE types(oid) AS (
             SELECT a.atttypid FROM pg_catalog.pg_attribute a
              WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped
           UNION
             SELECT x.oid FROM types t
               JOIN pg_catalog.pg_type y ON y.oid = t.oid
              CROSS JOIN LATERAL (
                    SELECT y.typbasetype UNION ALL SELECT y.typelem
                    UNION ALL SELECT a.atttypid FROM pg_catalog.pg_attribute a
                               WHERE a.attrelid = y.typrelid AND a.attnum > 0 AND NOT a.attisdropped
                    UNION ALL SELECT r.rngsubtype FROM pg_catalog.pg_range r WHERE r.rngtypid = y.oid
                    UNION ALL SELECT r.rngtypid FROM pg_catalog.pg_range r WHERE r.rngmultitypid = y.oid) x(oid)
              WHERE x.oid OPERATOR(pg_catalog.<>) 0::oid)
         SELECT pg_catalog.format_type(y.oid, NULL), r.rolname::text
           FROM types t
           JOIN pg_catalog.pg_type y ON y.oid = t.oid
           JOIN pg_catalog.pg_roles r ON r.oid = y.typowner
          WHERE NOT r.rolsuper AND NOT pg_catalog.pg_has_role($2::oid, y.typowner, 'USAGE')
          ORDER BY y.oid LIMIT 1",
        &[Some(&relid), Some(&owner)],
        1,
        false,
    )?;
    Ok(rows.first().map(|r| {
        (
            r.first().cloned().flatten().unwrap_or_default(),
            r.get(1).cloned().flatten().unwrap_or_default(),
        )
    }))
}

/// Table `relid`, just captured by `pipeline` because it lies in a schema the pipeline follows,
/// is captured through that follow: it leaves the pipeline when it leaves the schema
/// ([`leavers`]). Runs as pg_tide.
pub(crate) fn mark_followed(pipeline: &str, relid: pg_sys::Oid) -> TideResult<()> {
    sql_as_tide::exec(
        "UPDATE tide.pipeline_table t SET followed_nspid = c.relnamespace
           FROM pg_catalog.pg_class c
          WHERE t.pipeline = $1 AND t.relid = $2 AND c.oid = t.relid",
        &[pipeline.into(), relid.into()],
    )
}

/// A table of the current DDL command that a pipeline captures through its follow of a schema
/// the table is no longer in (`ALTER TABLE ... SET SCHEMA`).
pub(crate) struct Leaver {
    pub pipeline: String,
    pub relid: pg_sys::Oid,
    pub relation: String,
    /// The pipeline follows the table's new schema too: it stays, captured through that follow.
    pub still_followed: bool,
}

/// The tables of the DDL command whose `ddl_command_end` event trigger is running that a
/// pipeline captures through a follow it still has (`followed_nspid`, see [`mark_followed`])
/// of a schema they are no longer in, in table OID order, then pipeline name. Tables added with
/// `tide.add_table` (and those captured before 0.3.0) have no such follow: they stay where
/// they are captured, as a publication's `FOR TABLE` does. Empty (and cheap) when no table is
/// captured through a follow.
pub(crate) fn leavers() -> TideResult<Vec<Leaver>> {
    let rows = sql_as_tide::text_rows(
        "SELECT t.pipeline, c.oid::text, format('%I.%I', n.nspname, c.relname),
                EXISTS (SELECT 1 FROM tide.followed_schema f2
                         WHERE f2.pipeline = t.pipeline AND f2.nspid = c.relnamespace)::text
           FROM (SELECT DISTINCT d.objid FROM pg_catalog.pg_event_trigger_ddl_commands() d
                  WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objsubid = 0
                    AND EXISTS (SELECT 1 FROM tide.pipeline_table x WHERE x.followed_nspid IS NOT NULL)) d
           JOIN pg_catalog.pg_class c ON c.oid = d.objid
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
           JOIN tide.pipeline_table t ON t.relid = c.oid
          WHERE NOT t.removing AND t.followed_nspid IS NOT NULL AND t.followed_nspid <> c.relnamespace
            AND EXISTS (SELECT 1 FROM tide.followed_schema f
                         WHERE f.pipeline = t.pipeline AND f.nspid = t.followed_nspid)
          ORDER BY c.oid, t.pipeline",
        &[],
        0,
        false,
    )?;
    rows.into_iter()
        .map(|r| {
            let get = |i: usize| {
                r.get(i)
                    .cloned()
                    .flatten()
                    .ok_or_else(|| TideError::internal("a leaving table's row has a NULL column"))
            };
            Ok(Leaver {
                pipeline: get(0)?,
                relid: pg_sys::Oid::from(
                    get(1)?
                        .parse::<u32>()
                        .map_err(|_| TideError::internal("a table OID that is not a number"))?,
                ),
                relation: get(2)?,
                still_followed: get(3)? == "true",
            })
        })
        .collect()
}

/// `l` left the schema through whose follow its pipeline captured it: when the pipeline follows
/// the new schema too, the table stays, captured through that follow; otherwise it leaves the
/// pipeline here, in the DDL's transaction, as `tide.remove_table` takes a table out (a remove
/// marker: its changes committed after this point are not delivered; its active backfills are
/// cancelled). No skip record: it is in no followed schema, and a move back captures it again.
/// Runs as pg_tide.
pub(crate) fn leave(l: &Leaver) -> TideResult<()> {
    if l.still_followed {
        return mark_followed(&l.pipeline, l.relid);
    }
    if crate::catalog::tables::mark_removing(&l.pipeline, l.relid)? == 0 {
        return Ok(());
    }
    crate::catalog::tables::write_marker(
        tide_core::model::MarkerOp::RemoveTable,
        &l.pipeline,
        l.relid,
    )?;
    crate::catalog::backfills::cancel_for_removed_table(&l.pipeline, l.relid)?;
    forget(&l.pipeline, l.relid)
}
