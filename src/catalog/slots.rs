//! pg_tide's replication slots (`tide_<database oid>_<pipeline>`, plugin `pg_tide`): their names
//! and the lock a transaction creating one holds ([`crate::locks::Lock::Slot`]), orphaned slots,
//! the `output_plugin_libraries` setting creating one may need, and lost slots.
//!
//! ## Names (README, Concepts > Slots and origins)
//!
//! Slot names are the server's, pipeline names a database's: a slot carries its database's OID
//! ([`slot_name`]), so no pipeline of another database can ever take a pipeline's slot name (a
//! lost slot's above all: issue 44). The name is kept in `tide.pipeline.slot_name` when the slot
//! is made. Pipelines made before 0.3.0 keep the slot they have (`tide_<pipeline>`, see
//! [`legacy_slot_name`]) until it is lost: a new slot is always made under this database's name
//! ([`create_new_slot`]).
//!
//! ## Lost slots (README, Concepts > Lost slots)
//!
//! A pipeline's slot is *lost* when it is invalidated (`wal_status = 'lost'`: its WAL was removed
//! past `max_slot_wal_keep_size`), missing (dropped by hand or by `tide.max_paused_wal_size`, or
//! never there on this server: a restore from a base backup, a failover to a standby, a major
//! upgrade), or not pg_tide's (a slot of that name with another plugin, database or type:
//! re-created by someone else), or moved while the pipeline was paused (its confirmed position
//! is past `tide.pipeline.paused_lsn`, kept by [`note_paused`]: consumed, advanced or
//! re-created by someone else). [`crate::catalog::pipelines::lock_pipeline`] reads which
//! ([`super::pipelines::SlotProblem`]) at every iteration. The changes the slot did not deliver
//! are gone, so the only way back is to read every table again; `tide.pipeline.resync`
//! ([`Resync`], written by the worker only) makes that recovery survive a crash at any step:
//!
//! 1. [`mark_lost`] (a transaction of its own): `resync = 'slot lost'`, with when and why. From
//!    here on every iteration recovers first, whatever the slot looks like (a slot created by a
//!    recovery that did not finish is dropped and created again: it costs nothing).
//! 2. With `tide.on_slot_lost = 'error'` the worker stops here, with the error and its remedy.
//! 3. [`create_new_slot`] (a transaction of its own, which has written nothing: PostgreSQL creates
//!    a logical slot only so, and waits for every transaction that is writing to end): drop
//!    what is left of the slot (then once more, in a new transaction), create it again. Only a
//!    logical pg_tide slot of this database is dropped; any other slot of that name (physical,
//!    another plugin, another database: a copy made with `CREATE DATABASE ... TEMPLATE` names
//!    the original's slots) is left to the DBA, with an error and its remedy.
//! 4. [`queue_resync`] (one transaction, only while still `'slot lost'`): every table of the
//!    pipeline is captured from the new slot's start; active backfills are cancelled and each
//!    table gets a whole-table backfill with `resync = true` (`required_lsn` the new slot's
//!    start, so `tide.wait_for_pipeline` waits for it); an outbox gets a `resync` event
//!    `{"phase": "start"}` per table; `resync = 'resyncing'`. A kafka pipeline's start messages
//!    ([`kafka_marks`]) are sent by the worker in this same transaction, and acknowledged by the
//!    broker before it commits: if it does not commit, step 3 and 4 run again and send them
//!    again, still before any row read again.
//! 5. [`finish_resync`] (in an iteration, before its first event, once no resync backfill is
//!    active): an outbox gets a `resync` event `{"phase": "end", "complete": ...}` per table;
//!    `resync = NULL`. A kafka pipeline's end messages are sent first in that iteration (so
//!    acknowledged before it commits; after a crash before the commit they are sent again).
//!
//! Why nothing is missed: the backfills are queued (step 4) after the new slot exists (step 3),
//! so each chunk's low watermark, and its snapshot, come after the slot's start: a row changed
//! between the loss and the new slot is read by its chunk, and every change after the slot's
//! start is in the stream. Deletes: a resync backfill of a table target (local or remote) also
//! deletes, at each chunk's high watermark, the target rows of the chunk's key range whose key
//! the chunk's snapshot does not find at the source (the repair's deletes, `worker::backfill::chunk`: a
//! local target's keys read in the chunk's snapshot, a remote target's read there once the chunk
//! is read and compared with the chunk's rows, `chunk::sweep_deletes`); a key the stream touches
//! inside the chunk's window is left to the stream, so a key inserted after the new slot's start
//! is never deleted, and one deleted in the gap is.

use super::pipelines::Resync;
use crate::error::{TideError, TideResult};
use pgrx::prelude::*;

/// The slot name of pipeline `pipeline` of database `dboid`: unique on the server, since a
/// pipeline name is unique in its database (at most 5 + 10 + 1 + 47 = 63 bytes, `NAMEDATALEN`
/// less one, for the names `tide.create_pipeline` takes).
pub(crate) fn slot_name(dboid: pgrx::pg_sys::Oid, pipeline: &str) -> String {
    format!("tide_{}_{pipeline}", dboid.to_u32())
}

/// [`slot_name`] in this database.
pub(crate) fn own_slot_name(pipeline: &str) -> String {
    // SAFETY: reads a process global set at connection.
    slot_name(unsafe { pgrx::pg_sys::MyDatabaseId }, pipeline)
}

/// The slot name pg_tide gave before 0.3.0 (`tide_<pipeline>`, with no database): kept by the
/// pipelines made then until their slot is lost. A pipeline whose slot has this name also marks
/// its writes with the origin of that time (`worker::origin`).
pub(crate) fn legacy_slot_name(pipeline: &str) -> String {
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
/// `tide.max_paused_wal_size` the slot is dropped, as `max_slot_wal_keep_size` invalidates one:
/// with `tide.on_slot_lost = 'resync'` the slot is marked lost in this transaction ([`mark_lost`];
/// the pipeline resyncs when it is resumed) and `None` is returned; with `'error'`, the error to
/// record is returned (with the remedy that re-creates the pipeline exactly).
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
          WHERE s.slot_name = $1::name AND NOT s.active AND s.restart_lsn IS NOT NULL
            AND s.database = current_database()",
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
    let message = format!(
        "pipeline \"{}\" was paused while its slot retained {} MB of WAL, more than tide.max_paused_wal_size ({limit_mb} MB): its slot \"{}\" was dropped so the disk does not fill, and the changes since the pause are lost to it",
        p.name,
        retained / (1024 * 1024),
        p.slot_name
    );
    if crate::gucs::ON_SLOT_LOST.get() == crate::gucs::OnSlotLost::Resync {
        mark_lost_in(
            c,
            &p.name,
            &format!("{message}; it is read again when the pipeline is resumed"),
        )?;
        return Ok(None);
    }
    Ok(Some(
        TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_DISK_FULL,
            message,
        )
        .hint(recreate_remedy(c, p)?),
    ))
}

/// Keep where the slot stands while the pipeline is paused (`paused_lsn`, once per pause), or
/// forget it once the pipeline runs with its slot intact: a slot found further on at resume is
/// lost ([`super::pipelines::SlotProblem::Moved`]). Called by the worker, in its iteration's
/// transaction.
pub(crate) fn note_paused(
    c: &mut pgrx::spi::SpiClient<'_>,
    p: &crate::catalog::pipelines::PipelineRow,
) -> TideResult<()> {
    if !p.enabled && !p.paused_lsn_set {
        crate::sql::update(
            c,
            "UPDATE tide.pipeline p SET paused_lsn = s.confirmed_flush_lsn
               FROM pg_catalog.pg_replication_slots s
              WHERE p.name = $1 AND s.slot_name = p.slot_name AND s.confirmed_flush_lsn IS NOT NULL
                AND p.paused_lsn IS NULL",
            None,
            &[p.name.clone().into()],
        )?;
    } else if p.enabled && p.paused_lsn_set {
        crate::sql::update(
            c,
            "UPDATE tide.pipeline SET paused_lsn = NULL WHERE name = $1",
            None,
            &[p.name.clone().into()],
        )?;
    }
    Ok(())
}

/// What an iteration found: the pipeline's slot is lost (see the module doc). The worker
/// recovers outside the iteration's transaction.
#[derive(Debug)]
pub struct SlotLost {
    /// Why, for `tide.pipeline.slot_lost_reason` (kept from the first time it was recorded).
    pub reason: String,
    /// What the pipeline stops with under `tide.on_slot_lost = 'error'` ([`lost_error`]).
    pub error: TideError,
}

/// Record that the pipeline's slot is lost (`resync = 'slot lost'`, when, why) unless it is
/// already recorded. Called by the worker, in a transaction of its own (it must commit before
/// a new slot is created).
pub(crate) fn mark_lost(pipeline: &str, reason: &str) -> TideResult<()> {
    Spi::connect_mut(|c| mark_lost_in(c, pipeline, reason))
}

/// [`mark_lost`], in the caller's transaction (the paused worker's iteration).
pub(crate) fn mark_lost_in(
    c: &mut pgrx::spi::SpiClient<'_>,
    pipeline: &str,
    reason: &str,
) -> TideResult<()> {
    crate::sql::update(
        c,
        "UPDATE tide.pipeline SET resync = 'slot lost', slot_lost_at = now(), slot_lost_reason = $2
          WHERE name = $1 AND resync IS DISTINCT FROM 'slot lost'",
        None,
        &[pipeline.into(), reason.into()],
    )?;
    Ok(())
}

/// The error a pipeline whose slot is lost stops with under `tide.on_slot_lost = 'error'`.
pub(crate) fn lost_error(
    c: &mut pgrx::spi::SpiClient<'_>,
    p: &crate::catalog::pipelines::PipelineRow,
    reason: &str,
) -> TideResult<TideError> {
    let remedy = recreate_remedy(c, p)?;
    Ok(TideError::undefined(format!("pipeline \"{}\" lost its slot: {reason}", p.name)).hint(format!(
        "Changes since the loss are gone from the slot, so every table must be read again. To let pg_tide do it (a new slot, a re-read of every table, rows gone at the source deleted at a table target), ALTER SYSTEM SET tide.on_slot_lost = 'resync' and SELECT pg_reload_conf(). Or: {remedy}"
    )))
}

/// What [`create_new_slot`] did.
pub(crate) enum NewSlot {
    /// The pipeline is gone, or no longer `'slot lost'`: nothing.
    NotNeeded,
    /// What was left of the old slot was dropped, or the pipeline's slot name changed to this
    /// database's ([`own_slot_name`]): call again, in a new transaction (a logical slot is
    /// created only in a transaction that has written nothing, and the drop counts).
    Dropped,
    /// The new slot exists, starting at this position (its confirmed position: every change
    /// committed after it is decoded).
    Created(String),
}

/// Drop what is left of the pipeline's slot (only a logical pg_tide slot of this database: any
/// other slot of that name is someone else's, and an error says so), or (when there is none)
/// create it again, under this database's name for it ([`own_slot_name`]; the row takes that
/// name first). Creating
/// waits for every transaction that is writing to end (PostgreSQL's rule for a logical slot).
/// Called by the worker, in a transaction of its own that has written nothing, while
/// `resync = 'slot lost'`; the pipeline's lock (shared) keeps `drop_pipeline` out meanwhile.
pub(crate) fn create_new_slot(pipeline: &str) -> TideResult<NewSlot> {
    Spi::connect_mut(|c| {
        let Some(p) = crate::catalog::pipelines::lock_pipeline(c, pipeline)? else {
            return Ok(NewSlot::NotNeeded);
        };
        if p.resync != Some(Resync::SlotLost) {
            return Ok(NewSlot::NotNeeded);
        }
        allow_output_plugin()?;
        // Held until this transaction ends, so the launcher does not take the new slot for an
        // orphan (it is the pipeline's by name anyway).
        crate::locks::lock(
            crate::locks::Lock::Slot(&p.slot_name),
            crate::locks::Mode::Exclusive,
        )?;
        // Only a slot pg_tide could have made is dropped: a logical pg_tide slot of this
        // database. A slot of that name in another database (a database copied with CREATE
        // DATABASE ... TEMPLATE names the original's slots), a physical slot or another
        // plugin's is someone else's: the DBA decides.
        let found = crate::sql::select(
            c,
            "SELECT coalesce(active_pid, 0),
                    slot_type = 'logical' AND plugin = 'pg_tide' AND NOT temporary
                      AND database IS NOT DISTINCT FROM current_database(),
                    pg_catalog.format('a %s slot with plugin %s in database %s', slot_type,
                                      coalesce(plugin::text, 'none'), coalesce(database::text, 'none'))
               FROM pg_catalog.pg_replication_slots WHERE slot_name = $1::name",
            Some(1),
            &[p.slot_name.clone().into()],
        )?;
        // A slot named otherwise than this database's name for the pipeline (made before 0.3.0,
        // or the original's in a database copied from another) is replaced by one under this
        // database's name, once nothing of that name is left (what is left of ours is dropped
        // below first; the row is renamed in the next call, each in a transaction of its own).
        // A slot of that name that is someone else's stays the DBA's: a copied database's
        // pipeline must not start writing its original's targets on its own.
        let wanted = own_slot_name(pipeline);
        let rename = wanted != p.slot_name && wanted.len() < pgrx::pg_sys::NAMEDATALEN as usize;
        let found = found.into_iter().next();
        let ours = match &found {
            Some(r) => r.get::<bool>(2)?.unwrap_or(false),
            None => false,
        };
        if rename && found.is_none() {
            crate::sql::update(
                c,
                "UPDATE tide.pipeline SET slot_name = $2::name WHERE name = $1",
                None,
                &[pipeline.into(), wanted.clone().into()],
            )?;
            log!(
                "pg_tide worker \"{pipeline}\": its new slot is \"{wanted}\" (was \"{}\")",
                p.slot_name
            );
            return Ok(NewSlot::Dropped);
        }
        if let Some(r) = found {
            let pid = r.get::<i32>(1)?.unwrap_or(0);
            let what = r.get::<String>(3)?.unwrap_or_default();
            if !ours {
                return Err(TideError::new(
                    pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_DUPLICATE_OBJECT,
                    format!("pipeline \"{pipeline}\" lost its slot, and a replication slot \"{}\" that pg_tide did not make exists ({what}): it is not replaced", p.slot_name),
                )
                .hint(format!("If nothing needs that slot, drop it (SELECT pg_drop_replication_slot('{}')); the worker then creates its own and reads every table again. Otherwise drop and re-create the pipeline under another name.", p.slot_name.replace('\'', "''"))));
            }
            if pid != 0 {
                return Err(TideError::new(
                    pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_OBJECT_IN_USE,
                    format!("replication slot \"{}\" of pipeline \"{pipeline}\" is lost and in use by process {pid}: it cannot be replaced", p.slot_name),
                )
                .hint(format!("Stop whatever reads the slot (SELECT pg_terminate_backend({pid})); the worker then creates a new slot and reads every table again.")));
            }
            crate::sql::update(
                c,
                "SELECT pg_catalog.pg_drop_replication_slot($1::name)",
                None,
                &[p.slot_name.clone().into()],
            )?;
            return Ok(NewSlot::Dropped);
        }
        let lsn = create_logical_slot(&p.slot_name)?;
        Ok(NewSlot::Created(lsn))
    })
}

/// Queue the resync once the new slot (starting at `lsn`) exists: the tables, the backfills,
/// an outbox's start events, `resync = 'resyncing'` (see the module doc, step 4). Does nothing
/// unless the pipeline is still `'slot lost'`. Returns a line for the server log. Called by the
/// worker, in a transaction of its own.
pub(crate) fn queue_resync(pipeline: &str, lsn: &str) -> TideResult<Option<String>> {
    Spi::connect_mut(|c| {
        let state = crate::sql::first::<String>(crate::sql::update(
            c,
            "SELECT coalesce(resync, '') FROM tide.pipeline WHERE name = $1 FOR UPDATE",
            None,
            &[pipeline.into()],
        )?)?;
        if state.as_deref() != Some("slot lost") {
            return Ok(None);
        }
        // Tables whose add or remove marker was in the lost WAL: captured, or gone, from here.
        crate::sql::update(
            c,
            "DELETE FROM tide.pipeline_table WHERE pipeline = $1 AND removing",
            None,
            &[pipeline.into()],
        )?;
        crate::sql::update(
            c,
            "UPDATE tide.pipeline_table SET added_lsn = $2::pg_lsn WHERE pipeline = $1 AND added_lsn IS NULL",
            None,
            &[pipeline.into(), lsn.into()],
        )?;
        // A tide.alter_table whose marker was in the lost WAL: in effect from the new slot's
        // start (the tables are read again under it).
        crate::sql::update(
            c,
            "UPDATE tide.pipeline_table SET shaping_before = NULL WHERE pipeline = $1 AND shaping_before IS NOT NULL",
            None,
            &[pipeline.into()],
        )?;
        let active: Vec<&str> = tide_core::model::BackfillState::ALL
            .iter()
            .filter(|s| s.is_active())
            .map(|s| s.as_str())
            .collect();
        crate::sql::update(
            c,
            "UPDATE tide.backfill SET state = $2, finished_at = now(),
                    error = 'cancelled by pg_tide: the pipeline lost its slot, and a resync reads the whole table again'
              WHERE pipeline = $1 AND state = ANY($3)",
            None,
            &[
                pipeline.into(),
                tide_core::model::BackfillState::Cancelled.as_str().into(),
                active.into(),
            ],
        )?;
        let queued = crate::sql::first::<i64>(crate::sql::update(
            c,
            "WITH q AS (
               INSERT INTO tide.backfill (pipeline, relid, relation, key_columns, owner, generation, chunk_size,
                                          rows_per_second, estimated_rows, error, required_lsn, resync)
               SELECT t.pipeline, t.relid, t.relation, t.key_columns, p.owner,
                      coalesce((SELECT max(b.generation) FROM tide.backfill b WHERE b.pipeline = $1 AND b.relid = t.relid), 0) + 1,
                      coalesce((SELECT b.chunk_size FROM tide.backfill b WHERE b.pipeline = $1 AND b.relid = t.relid ORDER BY b.id DESC LIMIT 1), $3),
                      (SELECT b.rows_per_second FROM tide.backfill b WHERE b.pipeline = $1 AND b.relid = t.relid ORDER BY b.id DESC LIMIT 1),
                      -- (the worker refreshes it at the first chunk)
                      (SELECT CASE WHEN c.reltuples >= 0 THEN c.reltuples::int8 END FROM pg_catalog.pg_class c WHERE c.oid = t.relid),
                      'queued by pg_tide: the pipeline lost its slot, the table is read again', $2::pg_lsn, true
                 FROM tide.pipeline_table t JOIN tide.pipeline p ON p.name = t.pipeline
                WHERE t.pipeline = $1
                ORDER BY t.relid
               RETURNING 1)
             SELECT count(*) FROM q",
            None,
            &[pipeline.into(), lsn.into(), tide_core::model::DEFAULT_CHUNK_SIZE.into()],
        )?)?
        .unwrap_or(0);
        // An outbox: tell consumers, before any event of the new slot (ids follow the stream).
        crate::sql::update(
            c,
            "INSERT INTO tide.outbox (pipeline, commit_lsn, xid, commit_time, position, relation, op, key, \"row\")
             SELECT $1, $2::pg_lsn, 0, now(), row_number() OVER (ORDER BY t.relation)::int4, t.relation, 'resync', NULL,
                    pg_catalog.jsonb_build_object('phase', 'start', 'reason', p.slot_lost_reason, 'slot_lost_at', p.slot_lost_at)
               FROM tide.pipeline_table t JOIN tide.pipeline p ON p.name = t.pipeline
              WHERE t.pipeline = $1 AND p.target = 'outbox'
              ORDER BY t.relation",
            None,
            &[pipeline.into(), lsn.into()],
        )?;
        crate::sql::update(
            c,
            "UPDATE tide.pipeline SET resync = 'resyncing', last_error = NULL, last_error_sqlstate = NULL,
                    last_error_at = NULL, remedy = NULL, paused_lsn = NULL
              WHERE name = $1",
            None,
            &[pipeline.into()],
        )?;
        Ok(Some(format!(
            "a new replication slot starts at {lsn}; {queued} table(s) are read again (resync)"
        )))
    })
}

/// End a resync whose backfills are over (none active): an outbox gets a `resync` event
/// `{"phase": "end", "complete": <its resync backfill is done>}` per table, and `resync` is
/// cleared. Returns a line for the server log, `None` while a resync backfill is active.
/// Called by the worker, in its iteration's transaction before anything is written to the
/// target (so the end events precede the iteration's events in id order).
pub(crate) fn finish_resync(
    c: &mut pgrx::spi::SpiClient<'_>,
    p: &crate::catalog::pipelines::PipelineRow,
) -> TideResult<Option<String>> {
    let active: Vec<&str> = tide_core::model::BackfillState::ALL
        .iter()
        .filter(|s| s.is_active())
        .map(|s| s.as_str())
        .collect();
    let busy = crate::sql::first::<bool>(crate::sql::select(
        c,
        "SELECT EXISTS (SELECT 1 FROM tide.backfill WHERE pipeline = $1 AND resync AND state = ANY($2))",
        Some(1),
        &[p.name.clone().into(), active.into()],
    )?)?
    .unwrap_or(true);
    if busy {
        return Ok(None);
    }
    crate::sql::update(
        c,
        "INSERT INTO tide.outbox (pipeline, commit_lsn, xid, commit_time, position, relation, op, key, \"row\")
         SELECT $1, pg_catalog.pg_current_wal_lsn(), 0, now(), row_number() OVER (ORDER BY t.relation)::int4, t.relation, 'resync', NULL,
                pg_catalog.jsonb_build_object('phase', 'end', 'complete',
                    coalesce((SELECT b.state = 'done' FROM tide.backfill b
                               WHERE b.pipeline = t.pipeline AND b.relid = t.relid AND b.resync
                               ORDER BY b.id DESC LIMIT 1), false))
           FROM tide.pipeline_table t JOIN tide.pipeline p ON p.name = t.pipeline
          WHERE t.pipeline = $1 AND p.target = 'outbox'
          ORDER BY t.relation",
        None,
        &[p.name.clone().into()],
    )?;
    crate::sql::update(
        c,
        "UPDATE tide.pipeline SET resync = NULL WHERE name = $1",
        None,
        &[p.name.clone().into()],
    )?;
    Ok(Some(
        "the resync after the lost slot is over: every table was read again".to_string(),
    ))
}

/// A resync's phase, for [`kafka_marks`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Phase {
    Start,
    End,
}

/// The `resync` events of a kafka pipeline, one per table in relation order, as (relid,
/// relation, payload): the same `row` as an outbox's events (`queue_resync`, `finish_resync`).
/// None for another target. The worker sends the start events inside the transaction of
/// [`queue_resync`] (before it commits), the end events in the iteration whose transaction runs
/// [`finish_resync`].
pub(crate) fn kafka_marks(
    c: &mut pgrx::spi::SpiClient<'_>,
    pipeline: &str,
    phase: Phase,
) -> TideResult<Vec<(u32, String, String)>> {
    let payload = match phase {
        Phase::Start => {
            "pg_catalog.jsonb_build_object('phase', 'start', 'reason', p.slot_lost_reason, 'slot_lost_at', p.slot_lost_at)"
        }
        Phase::End => {
            "pg_catalog.jsonb_build_object('phase', 'end', 'complete',
                 coalesce((SELECT b.state = 'done' FROM tide.backfill b
                            WHERE b.pipeline = t.pipeline AND b.relid = t.relid AND b.resync
                            ORDER BY b.id DESC LIMIT 1), false))"
        }
    };
    let rows = crate::sql::select(
        c,
        &format!(
            "SELECT t.relid::pg_catalog.int8, t.relation, ({payload})::pg_catalog.text
               FROM tide.pipeline_table t JOIN tide.pipeline p ON p.name = t.pipeline
              WHERE t.pipeline = $1 AND p.target = 'kafka'
              ORDER BY t.relation"
        ),
        None,
        &[pipeline.into()],
    )?;
    let mut marks = Vec::new();
    for r in rows {
        let relid = r.get::<i64>(1)?.unwrap_or_default();
        let relation = r.get::<String>(2)?.unwrap_or_default();
        let payload = r.get::<String>(3)?.unwrap_or_default();
        marks.push((relid as u32, relation, payload));
    }
    Ok(marks)
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

/// Whether a slot created now is a failover slot: the server has them (17 and later) and
/// `tide.failover_slots` is on.
pub(crate) fn failover_slots() -> bool {
    crate::pgver::HAS_FAILOVER_SLOTS && crate::gucs::FAILOVER_SLOTS.get()
}

/// Create the logical replication slot `name` for pg_tide's output plugin (a failover slot when
/// [`failover_slots`]); its consistent point
/// (the LSN as text). In a transaction that has not written: run through a read-write statement,
/// PostgreSQL refuses ("cannot create logical replication slot in transaction that has performed
/// writes", measured in the worker), so this is a read-only one.
///
/// The call runs with `CurrentResourceOwner` set to the current (sub)transaction's own, and the
/// caller's is put back after (an ERROR included). While it looks for its consistent point, PostgreSQL 15's
/// `pg_create_logical_replication_slot` replays the transactions that begin and commit while it
/// waits; one that changed the catalog (any DDL) is replayed in an internal subtransaction whose
/// end leaves `CurrentResourceOwner` at the (sub)transaction's own, not at the caller's: its
/// `logicalfuncs.c` puts it back after decoding, `slotfuncs.c` does not. Called from a portal
/// (`SELECT tide.create_pipeline(...)`), the statement's snapshot was then released under the
/// wrong owner: "snapshot reference ... is not owned by resource owner TopTransaction" (XX000;
/// forced by `capture::lifecycle::create_pipeline_while_a_worker_commits_during_slot_creation`).
/// Under that owner from the start, nothing is released under another (a plpgsql block with an
/// EXCEPTION clause, as `tide.restore_pipelines` runs it, is a subtransaction: its owner, not the
/// top transaction's).
pub(crate) fn create_logical_slot(name: &str) -> TideResult<String> {
    struct Restore(pg_sys::ResourceOwner);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: puts back the owner that was current when this guard was made, in the
            // same transaction (an ERROR unwinding through here aborts that transaction next,
            // which resets it anyway).
            unsafe { pg_sys::CurrentResourceOwner = self.0 };
        }
    }
    // SAFETY: in a transaction, so CurTransactionResourceOwner is set; the guard restores the
    // caller's owner whichever way this returns.
    let _restore = unsafe {
        let saved = pg_sys::CurrentResourceOwner;
        pg_sys::CurrentResourceOwner = pg_sys::CurTransactionResourceOwner;
        Restore(saved)
    };
    // A failover slot where the server has them (17 and later) and tide.failover_slots is on:
    // a standby with sync_replication_slots keeps it (docs/high-availability.md).
    let sql = if failover_slots() {
        "SELECT lsn::text FROM pg_catalog.pg_create_logical_replication_slot($1::name, 'pg_tide', false, false, true)"
    } else {
        "SELECT lsn::text FROM pg_catalog.pg_create_logical_replication_slot($1::name, 'pg_tide')"
    };
    crate::sql::one::<String>(sql, &[name.into()])?.ok_or_else(|| {
        TideError::internal("pg_create_logical_replication_slot returned no position")
    })
}
