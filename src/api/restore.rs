//! Pipeline definitions across `pg_dump`/`pg_restore` (README, Upgrading > Dump and restore).
//!
//! Owns `tide.restore_pipeline`: re-creating a pipeline from the definition a dump carried in
//! `tide.pipeline_definition` (an extension configuration table, so `pg_dump` dumps its rows;
//! triggers on pg_tide's tables and an event trigger keep it equal to the pipelines, by name,
//! see `schema/objects.sql`). Runtime state is never dumped: a restored pipeline starts as a new one (a
//! new slot, every table backfilled), and a remote target stays production's while production
//! renews its lease (`target::table::fence`: a restore is a new writer, even into another database
//! of the same server).
//!
//! Guarantees: a definition is re-created as its recorded owner (or the `owner` a superuser
//! names), through the same checks as `tide.create_pipeline`, `tide.add_table` and
//! `tide.add_tables_in_schema` made for it, so a dump cannot make a pipeline its owner could not
//! make; a caller who is neither a superuser nor a member of that owner learns nothing about the
//! definition (the same error as for none); a definition whose pipeline exists is refused.

use super::tables::{add_table_impl, schema_oid, Shaping};
use super::*;
use serde_json::Value;

/// Re-create pipeline `name` from its restored definition.
#[pg_extern]
pub(super) fn restore_pipeline(name: Option<&str>, owner: default!(Option<&str>, "NULL")) {
    (|| restore_pipeline_impl(required(name, "name")?, owner))().or_raise()
}

/// The definition of `name` and its owner, if a row holds it.
fn definition(name: &str) -> TideResult<Option<(String, Value)>> {
    let (owner, def) = security::as_tide(|| crate::catalog::definitions::get(name))?;
    Ok(owner.zip(def.map(|d| d.0)))
}

fn not_yours(name: &str) -> TideError {
    TideError::undefined(format!(
        "no restored definition of pipeline \"{}\" is yours to restore",
        shown(name)
    ))
    .hint("A superuser sees them all: SELECT name, owner FROM tide.pipeline_definition WHERE name NOT IN (SELECT name FROM tide.pipeline); a member of the owning role may restore its own.")
}

fn restore_pipeline_impl(name: &str, as_owner: Option<&str>) -> TideResult<()> {
    check_server()?;
    let me = security::caller();
    let Some((recorded, def)) = definition(name)? else {
        return Err(not_yours(name));
    };
    let may = match security::role_oid(&recorded) {
        Some(o) => security::has_privs_of(me, o),
        None => security::is_superuser(me),
    };
    if !may {
        return Err(not_yours(name));
    }
    if let Some(o) = as_owner {
        if !security::is_superuser(me) {
            return Err(TideError::privilege(
                "only a superuser may restore a pipeline for another owner",
            )
            .hint("Omit owner: the pipeline is restored for the role that owned it."));
        }
        if security::role_oid(o).is_none() {
            return Err(TideError::undefined(format!(
                "role \"{}\" does not exist",
                shown(o)
            )));
        }
    }
    let owner = as_owner.unwrap_or(&recorded);
    let owner_oid = security::role_oid(owner).ok_or_else(|| {
        TideError::undefined(format!(
            "role \"{}\", which owned pipeline \"{}\", does not exist in this server",
            shown(owner),
            shown(name)
        ))
        .hint(format!("Create it first (pg_dumpall --globals-only dumps roles), or, as a superuser, restore it for another role: SELECT tide.restore_pipeline('{}', owner => '<role>').", name.replace('\'', "''")))
    })?;
    if catalog::pipelines::exists(name)? {
        return Err(
            TideError::duplicate(format!("pipeline \"{}\" exists already", shown(name)))
                .hint("Its definition is restored only where no pipeline of that name exists."),
        );
    }
    // As the owner, pinned: every check tide.create_pipeline and tide.add_table make for a
    // caller is made for that role, and no name in pg_tide's statements resolves to an object
    // the restoring session's role made.
    security::as_owner_pinned(owner_oid, || recreate(name, &def))
}

fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn bad(name: &str, what: &str) -> TideError {
    TideError::new(
        pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("the restored definition of pipeline \"{}\" has no valid {what}", shown(name)),
    )
    .hint("tide.pipeline_definition holds what pg_tide wrote there: restore it from the dump again, or create the pipeline by hand.")
}

/// Create the pipeline, add its tables (each backfilled; a local table target emptied first:
/// it holds the dump's copy, which the backfill replaces), follow its schemas, pause it if it
/// was paused. In the caller's transaction, as the owner.
fn recreate(name: &str, def: &Value) -> TideResult<()> {
    let target = text(def, "target").ok_or_else(|| bad(name, "target"))?;
    let options = def
        .get("options")
        .cloned()
        .ok_or_else(|| bad(name, "options"))?;
    super::pipelines::create_pipeline_impl(name, target, JsonB(options))?;
    let local = target == "table";
    for t in def
        .get("tables")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let relation = text(t, "relation").ok_or_else(|| bad(name, "table"))?;
        let relid = sql::one::<pg_sys::Oid>(
            "SELECT pg_catalog.to_regclass($1)::oid",
            &[relation.into()],
        )?
        .ok_or_else(|| {
            TideError::undefined(format!(
                "table {relation}, which pipeline \"{}\" captured, does not exist in this database",
                shown(name)
            ))
            .hint("Restore it first (pg_restore restores tables before this call can run), or remove it from tide.pipeline_definition's definition.")
        })?;
        let columns: Option<Vec<Option<String>>> = t
            .get("columns")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|c| c.as_str().map(str::to_string)).collect());
        let masks = t.get("masks").filter(|m| !m.is_null());
        add_table_impl(
            name,
            relid,
            true,
            text(t, "target_table"),
            local,
            &Shaping {
                row_filter: text(t, "row_filter"),
                columns: columns.as_deref(),
                masks,
            },
        )?;
        if t.get("followed").and_then(Value::as_bool) == Some(true) {
            // Captured through a follow: it leaves the pipeline when it leaves the schema.
            catalog::follows::mark_followed(name, relid)?;
        }
    }
    for f in def
        .get("follows")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let schema = text(f, "schema").ok_or_else(|| bad(name, "followed schema"))?;
        let backfill = f.get("backfill").and_then(Value::as_bool).unwrap_or(true);
        let nsp = schema_oid(schema)?;
        catalog::follows::follow(name, nsp, backfill, &security::caller_name()?)?;
    }
    for r in def
        .get("not_followed")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(relation) = r.as_str() else { continue };
        if let Some(relid) =
            sql::one::<pg_sys::Oid>("SELECT pg_catalog.to_regclass($1)::oid", &[relation.into()])?
        {
            catalog::follows::record_skip(&catalog::follows::Skip {
                pipeline: name,
                relid,
                removed: true,
                reason: "removed with tide.remove_table (before the dump this pipeline was restored from)",
                hint: Some("tide.add_table captures it again."),
                sqlstate: None,
                by: &security::caller_name()?,
            })?;
        }
    }
    if def.get("enabled").and_then(Value::as_bool) == Some(false) {
        catalog::pipelines::set_enabled(name, false)?;
    }
    Ok(())
}

/// The restored definitions without a pipeline that the caller may restore (a superuser: all;
/// another role: those of roles whose privileges it has), by name.
#[pg_extern]
pub(super) fn restorable_pipelines() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(owner, String),
        name!(saved_at, Option<pgrx::datum::TimestampWithTimeZone>),
    ),
> {
    let rows = (|| {
        let me = security::caller();
        let all = security::as_tide(crate::catalog::definitions::unrestored)?;
        Ok::<_, TideError>(
            all.into_iter()
                .filter(|(_, o, _)| match security::role_oid(o) {
                    Some(oid) => security::has_privs_of(me, oid),
                    None => security::is_superuser(me),
                })
                .collect::<Vec<_>>(),
        )
    })()
    .or_raise();
    TableIterator::new(rows)
}
