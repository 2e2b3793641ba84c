//! Captured tables: add (with its target table and the add marker) and remove.

use super::*;
use tide_core::model::MarkerOp;

/// Information about a table to capture, from the catalogs.
pub(super) struct SourceInfo {
    pub(super) qualified: String,
    relkind: String,
    persistence: String,
    namespace: String,
    replident: String,
    pub(super) key_columns: Vec<String>,
}

pub(super) fn source_info(relid: pg_sys::Oid) -> TideResult<SourceInfo> {
    Spi::connect(|c| {
        let row = c
            .select(
                concat!(
                    "SELECT format('%I.%I', n.nspname, c.relname), c.relkind::text, c.relpersistence::text, n.nspname::text, c.relreplident::text, ",
                    catalog::tables::key_of_pg_class_c!(),
                    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1"
                ),
                None,
                &[relid.into()],
            )?
            .first();
        let qualified = row.get::<String>(1)?.ok_or_else(|| {
            TideError::undefined(format!(
                "relation with OID {} does not exist",
                relid.to_u32()
            ))
        })?;
        Ok(SourceInfo {
            qualified,
            relkind: row.get::<String>(2)?.unwrap_or_default(),
            persistence: row.get::<String>(3)?.unwrap_or_default(),
            namespace: row.get::<String>(4)?.unwrap_or_default(),
            replident: row.get::<String>(5)?.unwrap_or_default(),
            key_columns: row.get::<Vec<String>>(6)?.unwrap_or_default(),
        })
    })
}

/// Check that a relation can be captured by a pipeline owned by `owner`; returns its
/// description.
pub(super) fn validate_source(relid: pg_sys::Oid, owner: &str) -> TideResult<SourceInfo> {
    let s = source_info(relid)?;
    let q = &s.qualified;
    match s.relkind.as_str() {
        // A partitioned table is captured with all its partitions (see below).
        "r" | "p" => {}
        "v" | "m" => {
            return Err(TideError::wrong_object(format!(
                "\"{q}\" is a view, which has no changes to capture"
            ))
            .hint("Capture the tables the view reads from."))
        }
        "f" => {
            return Err(TideError::wrong_object(format!(
                "\"{q}\" is a foreign table, whose changes are not in this server's WAL"
            ))
            .hint("Capture the table on the server that owns it."))
        }
        _ => {
            return Err(TideError::wrong_object(format!("\"{q}\" is not a table"))
                .hint("tide.add_table takes an ordinary table."))
        }
    }
    match s.persistence.as_str() {
        "t" => {
            // Named as the session names it: its schema pg_temp_N is an accident of the backend.
            let name = q.rsplit_once('.').map_or(q.as_str(), |(_, n)| n);
            return Err(TideError::unsupported(format!(
                "\"pg_temp.{name}\" is a temporary table, which is not written to the WAL"
            ))
            .hint("Capture a permanent table."));
        }
        "u" => {
            return Err(TideError::unsupported(format!(
                "\"{q}\" is an unlogged table, which is not written to the WAL"
            ))
            .hint(format!("Make it logged first: ALTER TABLE {q} SET LOGGED.")))
        }
        _ => {}
    }
    if s.namespace == "tide" {
        return Err(TideError::wrong_object(format!(
            "\"{q}\" belongs to pg_tide and cannot be captured"
        ))
        .hint("Capture your own tables."));
    }
    if s.replident == "n" {
        return Err(TideError::prerequisite(format!("\"{q}\" has REPLICA IDENTITY NOTHING, so its updates and deletes carry no key"))
            .hint(format!("ALTER TABLE {q} REPLICA IDENTITY DEFAULT (with a primary key) or REPLICA IDENTITY USING INDEX ...")));
    }
    if s.key_columns.is_empty() && s.replident != "f" {
        return Err(TideError::prerequisite(format!("\"{q}\" has no primary key and its replica identity is not FULL, so its updates and deletes carry neither a key nor the old row"))
            .hint(format!("Capture it without a key: ALTER TABLE {q} REPLICA IDENTITY FULL (its updates and deletes then carry the whole old row; see README, Tables without a key). Or add a key (ALTER TABLE {q} ADD PRIMARY KEY (...)), or name a unique index on NOT NULL columns: ALTER TABLE {q} REPLICA IDENTITY USING INDEX ...")));
    }
    if s.key_columns.is_empty() && s.relkind == "p" {
        return Err(TideError::unsupported(format!(
            "\"{q}\" is a partitioned table without a key, which pg_tide does not capture"
        ))
        .hint(format!("Give it a primary key (ALTER TABLE {q} ADD PRIMARY KEY (...)), or capture its partitions one by one (each with REPLICA IDENTITY FULL).")));
    }
    if s.relkind == "p" {
        if let Some(pr) =
            catalog::tables::partition_problems(relid.to_u32(), &s.key_columns, None)?.first()
        {
            return Err(TideError::prerequisite(format!(
                "partition {} of \"{q}\" {}",
                pr.name, pr.problem
            ))
            .hint(format!("Every partition must be a logged table whose replica identity includes the key ({}): ALTER TABLE {} REPLICA IDENTITY DEFAULT, or detach it.", s.key_columns.join(", "), pr.name)));
        }
    }
    // Both the caller and the pipeline's owner (who receives every change of the table at the
    // target) must be able to read it.
    let can_select = sql::one::<bool>(
        "SELECT has_table_privilege($1, 'SELECT') AND has_table_privilege($2::text::name, $1, 'SELECT')",
        &[relid.into(), owner.into()],
    )?
    .unwrap_or(false);
    if !can_select {
        return Err(
            TideError::privilege(format!("permission denied to capture \"{q}\"")).hint(format!(
                "The caller and the pipeline's owner (\"{owner}\") both need SELECT on {q}."
            )),
        );
    }
    // The owner must read every row (no row-level security applying to it).
    let owner_oid = crate::security::owner_oid(owner, "the pipeline")?;
    if let Some(e) = crate::security::read_problem(owner_oid, relid, q) {
        return Err(e);
    }
    Ok(s)
}

/// What `tide.add_table` delivers of a table: the rows its row filter passes, the columns of its
/// column list (`None`: every row, every column).
#[derive(Default)]
pub(super) struct Shaping<'a> {
    pub row_filter: Option<&'a str>,
    pub columns: Option<&'a [Option<String>]>,
    /// Column masks (`masks => ...`; see `api::masks`).
    pub masks: Option<&'a serde_json::Value>,
}

/// `columns => ...` of `add_table`: (attribute numbers, names) in attribute order. Every name a
/// column of the table (42703), no NULL, repeat or generated column, not empty, and every key
/// column among them (22023). None for a table without a key (0A000): its updates and deletes
/// find the target's row by every column, so it is delivered whole.
pub(super) fn column_list(
    relid: pg_sys::Oid,
    s: &SourceInfo,
    names: &[Option<String>],
) -> TideResult<(Vec<i16>, Vec<String>)> {
    let q = &s.qualified;
    if s.key_columns.is_empty() {
        return Err(TideError::unsupported(format!(
            "\"{q}\" has no key (it is captured by REPLICA IDENTITY FULL), and its updates and deletes find the target's row by every column, so it is delivered whole"
        ))
        .hint("Omit columns (every column is delivered), or give the table a key."));
    }
    let hint_key = || {
        format!(
            "List the columns to deliver, the key ({}) among them, e.g. columns => ARRAY['{}', ...]; omit columns (NULL) for every column.",
            s.key_columns.join(", "),
            s.key_columns.first().map(String::as_str).unwrap_or("id")
        )
    };
    if names.is_empty() {
        return Err(
            TideError::invalid(format!("the column list for {q} is empty")).hint(hint_key()),
        );
    }
    let mut out: Vec<(i16, String)> = Vec::new();
    for n in names {
        let Some(n) = n else {
            return Err(
                TideError::invalid(format!("the column list for {q} holds a NULL"))
                    .hint(hint_key()),
            );
        };
        let row = sql::text_rows(
            "SELECT a.attnum::text, a.attgenerated::text FROM pg_catalog.pg_attribute a
              WHERE a.attrelid = $1::oid AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
            &[Some(&relid.to_u32().to_string()), Some(n)],
            1,
            false,
        )?;
        let Some(r) = row.first() else {
            return Err(TideError::new(
                pg_sys::errcodes::PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
                format!("column \"{}\" of {q} does not exist", shown(n)),
            )
            .hint("Name the columns as pg_attribute spells them (case matters, no quotes)."));
        };
        if r[1].as_deref().is_some_and(|g| !g.is_empty()) {
            return Err(TideError::invalid(format!(
                "column \"{}\" of {q} is generated, and generated columns are not delivered",
                shown(n)
            ))
            .hint("Leave it out of the column list (a target computes its own)."));
        }
        let attnum: i16 = r[0].as_deref().and_then(|a| a.parse().ok()).unwrap_or(0);
        if out.iter().any(|(a, _)| *a == attnum) {
            return Err(TideError::invalid(format!(
                "column \"{}\" is listed twice in the column list for {q}",
                shown(n)
            ))
            .hint("List each column once."));
        }
        out.push((attnum, n.clone()));
    }
    let missing: Vec<&String> = s
        .key_columns
        .iter()
        .filter(|k| !out.iter().any(|(_, n)| n == *k))
        .collect();
    if !missing.is_empty() {
        return Err(TideError::invalid(format!(
            "the column list for {q} leaves out the key column{} {}",
            if missing.len() > 1 { "s" } else { "" },
            missing
                .iter()
                .map(|m| format!("\"{m}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .hint(hint_key()));
    }
    out.sort_by_key(|(a, _)| *a);
    Ok(out.into_iter().unzip())
}

/// Start capturing a table: every change committed after this call commits is delivered, and
/// (unless `backfill => false`) the rows that already exist are backfilled. With `row_filter`,
/// only the rows it passes, by the stream and by every backfill (see `row_filter`); with
/// `columns`, only those columns (the target has only them, every event carries only them);
/// with `masks`, those columns masked (see `api::masks`).
#[allow(
    clippy::too_many_arguments,
    reason = "the arguments are the SQL function's, named and defaulted in SQL"
)]
#[pg_extern]
pub(super) fn add_table(
    pipeline: Option<&str>,
    source: Option<Regclass>,
    backfill: default!(Option<bool>, true),
    target_table: default!(Option<&str>, "NULL"),
    truncate_target: default!(Option<bool>, false),
    row_filter: default!(Option<&str>, "NULL"),
    columns: default!(Option<Vec<Option<String>>>, "NULL"),
    masks: default!(Option<JsonB>, "NULL"),
) {
    (|| {
        add_table_impl(
            required(pipeline, "pipeline")?,
            relation(source, "source")?,
            required(backfill, "backfill")?,
            target_table,
            required(truncate_target, "truncate_target")?,
            &Shaping {
                row_filter,
                columns: columns.as_deref(),
                masks: masks.as_ref().map(|m| &m.0),
            },
        )
    })()
    .or_raise()
}

pub(super) fn add_table_impl(
    pipeline: &str,
    relid: pg_sys::Oid,
    backfill: bool,
    target_table: Option<&str>,
    truncate_target: bool,
    shaping: &Shaping<'_>,
) -> TideResult<()> {
    check_server()?;
    let owner = require_pipeline(pipeline)?;
    // Held until commit: an ALTER TABLE (ACCESS EXCLUSIVE) of the table commits before this
    // call reads the table's shape or after it commits, so the event trigger describes every
    // later schema change against the shape recorded here (catalog::tables::insert).
    // SAFETY: a lock on a relation's OID, released at the end of the transaction.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
    let s = validate_source(relid, &owner)?;
    let existing = check_capturable(pipeline, relid, &s.qualified)?;
    if let Some(f) = shaping.row_filter {
        // Checked as the chunk reader and the output plugin will read it (see row_filter).
        let owner_oid = crate::security::owner_oid(&owner, "the pipeline")?;
        crate::row_filter::check_text(relid, &s.qualified, f, owner_oid)?;
    }
    let listed = match shaping.columns {
        Some(names) => Some(column_list(relid, &s, names)?),
        None => None,
    };
    let masked = match shaping.masks {
        Some(spec) => Some(super::masks::check(
            relid,
            &s.qualified,
            &s.key_columns,
            listed.as_ref().map(|(_, names)| names.as_slice()),
            spec,
        )?),
        None => None,
    };
    let (target_kind, options) = catalog::pipelines::target(pipeline)?;
    if truncate_target {
        check_truncate_target(pipeline, &s.qualified, target_kind, existing, backfill)?;
    }
    let wanted = targets::Wanted {
        options: &options,
        relid,
        source_qualified: &s.qualified,
        key: &s.key_columns,
        target_table,
        owner: &owner,
        truncate: truncate_target,
        only: listed.as_ref().map(|(_, names)| names.as_slice()),
        masked: masked.as_ref(),
    };
    let (target_schema, target_name, held_rows) = target_of_table(pipeline, target_kind, &wanted)?;
    let t = catalog::tables::NewTable {
        pipeline,
        relid,
        relation: &s.qualified,
        key_columns: &s.key_columns,
        target_schema: target_schema.as_deref(),
        target_name: target_name.as_deref(),
        row_filter: shaping.row_filter,
        columns: listed.as_ref().map(|(attnums, _)| attnums.as_slice()),
    };
    match existing {
        Some(false) => {}
        // Removed but the worker has not reached the remove marker yet: capture it again from
        // this add marker on.
        Some(true) => catalog::tables::re_add(&t)?,
        None => catalog::tables::insert(&t)?,
    }
    catalog::masks::set(pipeline, relid, masked.as_ref().map(|m| &m.stored))?;
    catalog::tables::write_marker(MarkerOp::AddTable, pipeline, relid)?;
    catalog::follows::forget(pipeline, relid)?;
    if backfill {
        // Queued now; the worker starts it once it has passed the add_table marker.
        let id = backfill::start_backfill_impl(relid, Some(pipeline), None, None)?;
        if held_rows {
            // The backfill writes the source's rows over what is there; rows the source does not
            // have stay: tide.readiness is not 'ready' until a verification after the backfill
            // finds none (tide.repair deletes them).
            catalog::backfills::mark_target_held_rows(id)?;
            pgrx::notice!(
                "the target of {} already holds rows: rows the source does not have stay there after the backfill, and tide.readiness says 'target not verified' until tide.repair('{}', '{}') has removed them (or pass truncate_target => true to empty the target first)",
                s.qualified,
                s.qualified.replace('\'', "''"),
                pipeline.replace('\'', "''")
            );
        }
    }
    wake_on_commit(shmem::worker_pid(pipeline));
    Ok(())
}

/// `tide.add_tables_in_schema(pipeline, schema, backfill, follow)`: capture every table of a
/// schema the pipeline does not capture yet, in name order, each exactly as `tide.add_table` adds
/// it, all in the caller's transaction (all or nothing). Ordinary and partitioned tables are
/// taken; a partition is captured through its partitioned table, so partitions are not. A table
/// that cannot be captured (no key, unlogged, a pg_tide target, not readable by the caller or the
/// owner, ...) is skipped with a NOTICE naming it and why. With `follow`, the pipeline also
/// follows the schema (`tide.followed_schema`, with the backfill choice and the caller): tables
/// created there later are captured by the event trigger of `follow`, and the skipped ones are
/// recorded. Returns how many tables were added.
#[pg_extern]
pub(super) fn add_tables_in_schema(
    pipeline: Option<&str>,
    schema: Option<&str>,
    backfill: default!(Option<bool>, true),
    follow: default!(Option<bool>, false),
) -> i32 {
    (|| {
        add_tables_in_schema_impl(
            required(pipeline, "pipeline")?,
            required(schema, "schema")?,
            required(backfill, "backfill")?,
            required(follow, "follow")?,
        )
    })()
    .or_raise()
}

/// The OID of a schema of the user's tables, by its exact name: 3F000 when there is none, 42809
/// for pg_tide's, the system's and temporary schemas.
pub(super) fn schema_oid(schema: &str) -> TideResult<pg_sys::Oid> {
    let nsp = sql::one::<pg_sys::Oid>(
        "SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = $1",
        &[schema.into()],
    )?
    .ok_or_else(|| {
        TideError::new(
            pg_sys::errcodes::PgSqlErrorCode::ERRCODE_INVALID_SCHEMA_NAME,
            format!("schema \"{}\" does not exist", shown(schema)),
        )
        .hint("Pass the schema's name as it is spelled in pg_namespace (case matters, no quotes): SELECT nspname FROM pg_namespace.")
    })?;
    let system = schema == "tide"
        || schema == "pg_catalog"
        || schema == "information_schema"
        || schema.starts_with("pg_toast")
        || schema.starts_with("pg_temp");
    if system {
        return Err(TideError::wrong_object(format!(
            "schema \"{}\" holds {} tables, which cannot be captured",
            shown(schema),
            if schema == "tide" {
                "pg_tide's"
            } else {
                "system or temporary"
            }
        ))
        .hint("Pass a schema of your own tables."));
    }
    Ok(nsp)
}

fn add_tables_in_schema_impl(
    pipeline: &str,
    schema: &str,
    backfill: bool,
    follow: bool,
) -> TideResult<i32> {
    check_server()?;
    let owner = require_pipeline(pipeline)?;
    let nsp = schema_oid(schema)?;
    let by = crate::security::caller_name()?;
    if follow {
        // The owner reads nothing in a schema it may not use: following it would only skip.
        let usable = sql::one::<bool>(
            "SELECT has_schema_privilege($1::text::name, $2, 'USAGE')",
            &[owner.as_str().into(), nsp.into()],
        )?
        .unwrap_or(false);
        if !usable {
            return Err(TideError::privilege(format!(
                "the pipeline's owner \"{owner}\" has no USAGE on schema \"{}\", so it cannot follow it",
                shown(schema)
            ))
            .hint(format!(
                "GRANT USAGE ON SCHEMA {} TO {} first.",
                pgrx::spi::quote_identifier(schema),
                pgrx::spi::quote_identifier(&owner)
            )));
        }
        catalog::follows::follow(pipeline, nsp, backfill, &by)?;
    }
    let relids = sql::one::<Vec<i64>>(
        "SELECT coalesce(array_agg(c.oid::bigint ORDER BY c.relname), '{}')
           FROM pg_catalog.pg_class c
          WHERE c.relnamespace = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition",
        &[nsp.into()],
    )?
    .unwrap_or_default();
    let mut added = 0;
    for relid in relids.into_iter().map(|o| pg_sys::Oid::from(o as u32)) {
        if catalog::tables::removing(pipeline, relid)? == Some(false) {
            continue; // captured already
        }
        // SAFETY: a lock on a relation's OID, released at the end of the transaction (as
        // add_table_impl takes it).
        unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
        let checked = validate_source(relid, &owner)
            .and_then(|s| check_capturable(pipeline, relid, &s.qualified).map(|_| ()));
        if let Err(e) = checked {
            if follow {
                let sqlstate = e.sqlstate();
                catalog::follows::record_skip(&catalog::follows::Skip {
                    pipeline,
                    relid,
                    removed: false,
                    reason: &e.message,
                    hint: e.hint.as_deref(),
                    sqlstate: Some(&sqlstate),
                    by: &by,
                })?;
            }
            pgrx::notice!(
                "skipping {}: {}{}",
                super::backfill::relation_name(relid)
                    .unwrap_or_else(|_| format!("the table with OID {}", relid.to_u32())),
                e.message,
                e.hint.map(|h| format!(" ({h})")).unwrap_or_default()
            );
            continue;
        }
        add_table_impl(pipeline, relid, backfill, None, false, &Shaping::default())?;
        if follow {
            // Captured through the follow: it leaves the pipeline when it leaves the schema.
            catalog::follows::mark_followed(pipeline, relid)?;
        }
        added += 1;
    }
    Ok(added)
}

/// Stop capturing a table. Changes committed after this call commits are not delivered. The
/// OID of a captured table that no longer exists (dropped while pg_tide's event trigger could
/// not see it, e.g. under `session_replication_role = replica`, or before 0.2.0) is taken too.
#[pg_extern]
pub(super) fn remove_table(pipeline: Option<&str>, source: Option<Regclass>) {
    (|| {
        let pipeline = required(pipeline, "pipeline")?;
        let oid = required(source, "source")?.0;
        let relid = if catalog::tables::captures(pipeline, oid)? {
            oid
        } else {
            relation(source, "source")?
        };
        remove_table_impl(pipeline, relid)
    })()
    .or_raise()
}

/// `tide.remove_table(pipeline, source text)`: the table by name (as a `regclass` would read
/// it), or, when no table of that name is captured by the pipeline, a captured table that was
/// dropped, by the name it had (`schema.name`, or `name` when one dropped table has it).
#[pg_extern(name = "remove_table")]
pub(super) fn remove_table_by_name(pipeline: Option<&str>, source: Option<&str>) {
    (|| {
        let pipeline = required(pipeline, "pipeline")?;
        let name = required(source, "source")?;
        let oid = sql::one::<pg_sys::Oid>("SELECT pg_catalog.to_regclass($1)::oid", &[name.into()])?;
        if let Some(oid) = oid {
            if catalog::tables::captures(pipeline, oid)? {
                return remove_table_impl(pipeline, oid);
            }
        }
        require_pipeline(pipeline)?;
        let dropped = catalog::tables::dropped_named(pipeline, name)?;
        match (dropped.as_slice(), oid) {
            ([relid], _) => remove_table_impl(pipeline, pg_sys::Oid::from(*relid)),
            ([], Some(oid)) => remove_table_impl(pipeline, oid),
            ([], None) => Err(TideError::new(
                pg_sys::errcodes::PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
                format!("relation \"{}\" does not exist", shown(name)),
            )
            .hint("Pass an existing table, or a dropped table the pipeline still lists by its schema-qualified name or its OID: SELECT relation, source FROM tide.tables.")),
            (many, _) => Err(TideError::new(
                pg_sys::errcodes::PgSqlErrorCode::ERRCODE_AMBIGUOUS_PARAMETER,
                format!(
                    "pipeline \"{}\" lists {} dropped tables named \"{}\"",
                    shown(pipeline),
                    many.len(),
                    shown(name)
                ),
            )
            .hint("Qualify the name with its schema, or pass the OID: SELECT relation, source FROM tide.tables.")),
        }
    })()
    .or_raise()
}

pub(super) fn remove_table_impl(pipeline: &str, relid: pg_sys::Oid) -> TideResult<()> {
    require_pipeline(pipeline)?;
    // The row stays (marked) until the worker reaches the remove marker in the stream, so the
    // table's changes committed before this call are still decoded and delivered; the worker
    // deletes the row at the marker.
    let removed = catalog::tables::mark_removing(pipeline, relid)?;
    if removed == 0 {
        return Err(TideError::undefined(format!(
            "pipeline \"{pipeline}\" does not capture {}",
            super::backfill::relation_name(relid)?
        ))
        .hint("SELECT * FROM tide.tables lists what each pipeline captures."));
    }
    catalog::tables::write_marker(MarkerOp::RemoveTable, pipeline, relid)?;
    catalog::backfills::cancel_for_removed_table(pipeline, relid)?;
    // A table of a schema the pipeline follows stays out of it: a later ALTER TABLE does not
    // capture it again (tide.add_table does).
    catalog::follows::record_skip(&catalog::follows::Skip {
        pipeline,
        relid,
        removed: true,
        reason: "removed with tide.remove_table",
        hint: Some("tide.add_table captures it again."),
        sqlstate: None,
        by: &crate::security::caller_name()?,
    })?;
    wake_on_commit(shmem::worker_pid(pipeline));
    Ok(())
}

/// Whether `relid` may be captured by `pipeline` (not one of its or another pipeline's table
/// targets, not a partition relative of a table it captures, not captured already); whether it
/// is being removed (`Some(true)`: re-added), or not there (`None`).
fn check_capturable(
    pipeline: &str,
    relid: pg_sys::Oid,
    qualified: &str,
) -> TideResult<Option<bool>> {
    // A table this pipeline writes as a target cannot be captured by it: its own writes would
    // come back as changes.
    let target_of = catalog::tables::source_targeting(pipeline, relid)?;
    let target_anywhere = catalog::tables::table_pipeline_targeting(relid)?;
    if let Some(other) = target_anywhere {
        return Err(TideError::invalid(format!(
            "\"{}\" is a table target of pipeline \"{other}\": pg_tide's own writes are never captured",
            qualified
        ))
        .hint("Capture the table the target is a copy of instead."));
    }
    if let Some(src) = target_of {
        return Err(TideError::invalid(format!(
            "\"{}\" is the target of {src} in pipeline \"{}\", which cannot also capture it",
            qualified,
            shown(pipeline)
        ))
        .hint("Capture it with another pipeline, or give the other table another target."));
    }
    // A partitioned table and one of its partitions cannot both be captured by a pipeline: the
    // partition's changes are the table's.
    if let Some(other) = catalog::tables::captured_partition_relative(pipeline, relid)? {
        return Err(TideError::duplicate(format!(
            "pipeline \"{}\" already captures {other}, which is a partition of \"{}\" or has it as a partition",
            shown(pipeline),
            qualified
        ))
        .hint("Capture the partitioned table alone (its partitions come with it): remove the other one with tide.remove_table."));
    }
    let existing = catalog::tables::removing(pipeline, relid)?;
    if existing == Some(false) {
        return Err(TideError::duplicate(format!(
            "pipeline \"{pipeline}\" already captures \"{}\"",
            qualified
        ))
        .hint("SELECT * FROM tide.tables lists what each pipeline captures."));
    }
    Ok(existing)
}

/// `truncate_target => true` is for a table target's backfill of a table not being removed.
fn check_truncate_target(
    pipeline: &str,
    qualified: &str,
    target_kind: TargetKind,
    existing: Option<bool>,
    backfill: bool,
) -> TideResult<()> {
    if let Some(t) = &crate::target::kind(target_kind).tableless {
        return Err(TideError::invalid(format!(
            "pipeline \"{pipeline}\" writes to {}, which has no target table to truncate",
            t.writes_to
        ))
        .hint("truncate_target is for table and postgres pipelines; omit it."));
    }
    if existing == Some(true) {
        // Its changes from before the remove_table may still be on their way to the target.
        return Err(TideError::prerequisite(format!(
            "\"{}\" is still being removed from pipeline \"{pipeline}\"",
            qualified
        ))
        .hint("Wait until tide.tables no longer lists it (the worker reaches the remove_table point), then add it with truncate_target => true."));
    }
    if !backfill {
        return Err(TideError::invalid(
            "truncate_target => true empties the target for a backfill, and backfill is false",
        )
        .hint("Pass backfill => true (the default) with it, or omit truncate_target."));
    }
    Ok(())
}

/// The target table of `relid` for a table or postgres pipeline (made or checked: see
/// `targets::ensure_target`), as (schema, name, it held rows already); none for the outbox and
/// Kafka, which take no `target_table`.
fn target_of_table(
    pipeline: &str,
    target_kind: TargetKind,
    w: &targets::Wanted<'_>,
) -> TideResult<(Option<String>, Option<String>, bool)> {
    let kind = crate::target::kind(target_kind);
    let (schema, name, held_rows) = if let Some(t) = &kind.tableless {
        if w.target_table.is_some() {
            let (refused, hint) = t.target_table;
            return Err(TideError::invalid(format!(
                "pipeline \"{pipeline}\" writes to {}{refused}",
                t.writes_to
            ))
            .hint(hint));
        }
        (None, None, false)
    } else {
        let t = targets::ensure_target(kind, w)?;
        let (s_, n_) = (t.schema, t.name);
        if kind.local_tables {
            // The other direction of the loop: the target must not be a table this pipeline
            // captures.
            if let Some(c) = catalog::tables::captured_named(pipeline, &s_, &n_)? {
                return Err(TideError::invalid(format!(
                    "the target {}.{} is {c}, which pipeline \"{}\" captures",
                    pgrx::spi::quote_identifier(&s_),
                    pgrx::spi::quote_identifier(&n_),
                    shown(pipeline)
                ))
                .hint("A pipeline's targets and the tables it captures must be different tables: pass another target_table."));
            }
        }
        (Some(s_), Some(n_), t.held_rows)
    };
    Ok((schema, name, held_rows))
}
