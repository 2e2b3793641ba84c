//! pg_tide's replication slots (`tide_<pipeline>`, plugin `pg_tide`): their names and the
//! lock a transaction creating one holds ([`crate::locks::Lock::Slot`]), orphaned slots, and the
//! `output_plugin_libraries` setting creating one may need.

use crate::error::{TideError, TideResult};
use pgrx::prelude::*;

/// The slot name of a pipeline.
pub(crate) fn slot_name(pipeline: &str) -> String {
    format!("tide_{pipeline}")
}

/// Drop `tide_*` slots of this database that no pipeline owns and whose creating transaction
/// is not in progress (it holds the slot's lock until it ends). Called by the launcher,
/// in its transaction.
pub(crate) fn drop_orphan_slots() -> TideResult<()> {
    Spi::connect_mut(|c| -> TideResult<()> {
        let rows = c.select(
            "SELECT s.slot_name::text FROM pg_catalog.pg_replication_slots s
              WHERE s.plugin = 'pg_tide' AND s.database = current_database() AND NOT s.active
                AND s.slot_name LIKE 'tide\\_%'
                AND NOT EXISTS (SELECT 1 FROM tide.pipeline p WHERE p.slot_name = s.slot_name)",
            None,
            &[],
        )?;
        let mut orphans = Vec::new();
        for r in rows {
            if let Some(s) = r.get::<String>(1)? {
                orphans.push(s);
            }
        }
        for slot in orphans {
            let locked = crate::locks::try_lock(
                crate::locks::Lock::Slot(&slot),
                crate::locks::Mode::Exclusive,
            )?;
            if !locked {
                continue;
            }
            // Re-check with a snapshot taken after the lock: the creator may have just committed.
            let still_orphan = c
                .update(
                    "SELECT NOT EXISTS (SELECT 1 FROM tide.pipeline WHERE slot_name = $1::name)
                        AND EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1::name AND NOT active)",
                    None,
                    &[slot.clone().into()],
                )?
                .first()
                .get_one::<bool>()?
                .unwrap_or(false);
            if still_orphan {
                c.update(
                    "SELECT pg_catalog.pg_drop_replication_slot($1::name)",
                    None,
                    &[slot.clone().into()],
                )?;
                log!(
                    "pg_tide launcher: dropped replication slot \"{slot}\", which no pipeline owns"
                );
            }
        }
        Ok(())
    })
}

/// Newer PostgreSQL minor releases only let slots use output plugins listed in
/// `output_plugin_libraries` (a superuser-settable list). A superuser creating a pipeline has
/// evidently chosen pg_tide, so the list is extended for this transaction only; anyone else gets
/// the exact setting to ask for. Called by the worker, and by `tide.create_pipeline` inside its
/// `as_tide` block.
pub(crate) fn allow_output_plugin() -> TideResult<()> {
    // Read the setting directly (the worker calls this every iteration: a query of pg_settings
    // builds every setting's row, measured at ~6 % of a backfilling worker's CPU). NULL: this
    // server has no such setting.
    // SAFETY: a lookup by a static name; with missing_ok it returns NULL for an unknown
    // setting instead of raising an error, and the string it returns is copied at once.
    let current = unsafe {
        let v = pgrx::pg_sys::GetConfigOption(c"output_plugin_libraries".as_ptr(), true, false);
        if v.is_null() {
            return Ok(());
        }
        std::ffi::CStr::from_ptr(v).to_string_lossy().into_owned()
    };
    if current
        .split(',')
        .any(|l| l.trim().trim_matches('"') == "pg_tide")
    {
        return Ok(());
    }
    let superuser = crate::sql::one::<bool>(
        "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
        &[],
    )?
    .unwrap_or(false);
    if !superuser {
        return Err(TideError::prerequisite("pg_tide is not in output_plugin_libraries")
            .hint(format!("Ask a superuser to run ALTER SYSTEM SET output_plugin_libraries = '{}pg_tide' and SELECT pg_reload_conf().", if current.trim().is_empty() { String::new() } else { format!("{current}, ") })));
    }
    let list = if current.trim().is_empty() {
        "pg_tide".to_string()
    } else {
        format!("{current}, pg_tide")
    };
    crate::sql::one::<String>(
        "SELECT set_config('output_plugin_libraries', $1, true)",
        &[list.into()],
    )?;
    Ok(())
}

/// While a pipeline is paused its slot retains every change since the pause. Past
/// `tide.max_paused_wal_size` the slot is dropped, as `max_slot_wal_keep_size` invalidates one,
/// and the error to record is returned (with the remedy that re-creates the pipeline exactly).
/// Only a slot nobody holds is measured (the worker closes its decoder once paused). Called by
/// the worker, in its iteration's transaction (the drop itself is not transactional).
pub(crate) fn bound_paused_wal(
    c: &mut pgrx::spi::SpiClient<'_>,
    p: &crate::catalog::pipelines::PipelineRow,
) -> TideResult<Option<TideError>> {
    let limit_mb = crate::gucs::MAX_PAUSED_WAL_MB.get();
    if limit_mb < 0 {
        return Ok(None);
    }
    let retained = crate::sql::first::<i64>(crate::sql::select(
        c,
        "SELECT pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), s.restart_lsn)::int8
           FROM pg_catalog.pg_replication_slots s
          WHERE s.slot_name = $1::name AND NOT s.active AND s.restart_lsn IS NOT NULL",
        Some(1),
        &[p.slot_name.clone().into()],
    )?)?;
    let Some(retained) = retained else {
        return Ok(None);
    };
    if retained <= i64::from(limit_mb) * 1024 * 1024 {
        return Ok(None);
    }
    // A resume may have committed since this iteration read the pipeline row: look again under
    // the row's lock (a resume now waits for this transaction), and drop only a paused one.
    let still_paused = crate::sql::first::<bool>(crate::sql::update(
        c,
        "SELECT NOT enabled FROM tide.pipeline WHERE name = $1 FOR UPDATE",
        None,
        &[p.name.clone().into()],
    )?)?
    .unwrap_or(false);
    if !still_paused {
        return Ok(None);
    }
    crate::sql::update(
        c,
        "SELECT pg_catalog.pg_drop_replication_slot($1::name)",
        None,
        &[p.slot_name.clone().into()],
    )?;
    Ok(Some(
        TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_DISK_FULL,
            format!(
                "pipeline \"{}\" was paused while its slot retained {} MB of WAL, more than tide.max_paused_wal_size ({limit_mb} MB): its slot \"{}\" was dropped so the disk does not fill, and the changes since the pause are lost to it",
                p.name,
                retained / (1024 * 1024),
                p.slot_name
            ),
        )
        .hint(recreate_remedy(c, p)?),
    ))
}

/// The statements that re-create `p` exactly after its slot is gone: as its owner, with its
/// target and options, and every table it captures with its target table (each backfilled
/// again). Each runs on its own: `tide.drop_pipeline` refuses a transaction block. Called by the
/// worker, in its iteration's transaction.
pub(crate) fn recreate_remedy(
    c: &mut pgrx::spi::SpiClient<'_>,
    p: &crate::catalog::pipelines::PipelineRow,
) -> TideResult<String> {
    let lit = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let name = lit(&p.name);
    // The tables that still exist, under their current names (a table renamed since add_table).
    let rows = crate::sql::select(
        c,
        "SELECT format('%I.%I', n.nspname, r.relname),
                CASE WHEN t.target_name IS NOT NULL THEN format('%I.%I', t.target_schema, t.target_name) END
           FROM tide.pipeline_table t
           JOIN pg_catalog.pg_class r ON r.oid = t.relid
           JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace
          WHERE t.pipeline = $1 AND NOT t.removing
          ORDER BY 1",
        None,
        &[p.name.clone().into()],
    )?;
    let mut stmts = vec![
        format!("SET ROLE {}", pgrx::spi::quote_identifier(&p.owner)),
        format!("SELECT tide.drop_pipeline({name})"),
        format!(
            "SELECT tide.create_pipeline({name}, {}, {}::jsonb)",
            lit(p.target.as_str()),
            lit(&p.options.to_string())
        ),
    ];
    for r in rows {
        let source: Option<String> = r.get(1)?;
        let target: Option<String> = r.get(2)?;
        let Some(source) = source else { continue };
        stmts.push(match target {
            Some(t) => format!(
                "SELECT tide.add_table({name}, {}, target_table => {})",
                lit(&source),
                lit(&t)
            ),
            None => format!("SELECT tide.add_table({name}, {})", lit(&source)),
        });
    }
    stmts.push("RESET ROLE".to_string());
    Ok(format!(
        "Re-create the pipeline as it was (its owner, target, options and tables; each table is backfilled again), each statement on its own (tide.drop_pipeline refuses a transaction block): {}. To pause for longer, raise tide.max_paused_wal_size.",
        stmts.join("; ")
    ))
}
