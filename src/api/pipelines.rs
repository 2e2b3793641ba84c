//! Pipelines: create, drop, pause, resume, wait for.

use super::*;

/// Create a pipeline: its replication slot, its catalog row, and (after commit) its worker.
#[pg_extern]
pub(super) fn create_pipeline(
    name: Option<&str>,
    target: default!(Option<&str>, "'outbox'"),
    options: default!(Option<JsonbArg>, "'{}'"),
) {
    (|| {
        create_pipeline_impl(
            required(name, "name")?,
            required(target, "target")?,
            JsonB(json_arg(options, "options")?),
        )
    })()
    .or_raise()
}

pub(super) fn create_pipeline_impl(name: &str, target: &str, options: JsonB) -> TideResult<()> {
    check_server()?;
    require_may_create()?;
    validate_name(name)?;
    let Some(kind) = TargetKind::parse(target) else {
        return Err(TideError::invalid(format!("unknown target kind \"{target}\"")).hint(
            "Target kinds: 'outbox' (the table tide.outbox), 'table' (tables in this database, option schema), 'postgres' (tables in another PostgreSQL, option server), 'kafka' (topics of a Kafka cluster, option server: a tide_kafka foreign server).",
        ));
    };
    let parsed = crate::target::options::Options::parse(kind, &options.0)?;
    if let crate::target::options::Options::Kafka(o) = &parsed {
        kafka::check_kafka(name, o, &crate::security::caller_name()?)?;
    } else if let Some(server) = parsed.server() {
        targets::check_remote(
            server,
            &crate::security::caller_name()?,
            parsed.replication_role() == crate::target::options::ReplicationRole::Replica,
        )?;
    }
    let options = JsonB(parsed.to_json()?);
    if catalog::pipelines::exists(name)? {
        return Err(
            TideError::duplicate(format!("pipeline \"{name}\" already exists")).hint(format!(
                "Pick another name, or drop it first with tide.drop_pipeline('{name}')."
            )),
        );
    }
    // A dropped pipeline's outbox events are deleted with it; events an older version left
    // behind must not become readable by a new pipeline of the same name (whoever owns it).
    let leftover = crate::security::as_tide(|| catalog::outbox::has_events(name))?;
    if leftover {
        return Err(TideError::duplicate(format!(
            "tide.outbox still holds events of an earlier pipeline named \"{name}\""
        ))
        .hint(format!("They belong to that pipeline, not to its name: pick another name, or have a superuser read and delete them (DELETE FROM tide.outbox WHERE pipeline = '{name}').")));
    }
    // Unique on the server: it carries this database's OID (catalog::slots).
    let slot = catalog::slots::own_slot_name(name);
    check_room_for(name, &slot)?;
    if sql::one::<bool>("SELECT pg_current_xact_id_if_assigned() IS NOT NULL", &[])?
        .unwrap_or(false)
    {
        return Err(TideError::new(
            pgrx::pg_sys::errcodes::PgSqlErrorCode::ERRCODE_ACTIVE_SQL_TRANSACTION,
            "tide.create_pipeline must run before any write in its transaction",
        )
        .hint("Creating a logical replication slot is impossible in a transaction that has written: call tide.create_pipeline first, or in its own transaction."));
    }
    let owner = crate::security::caller_name()?;
    // The slot is pg_tide's, created as pg_tide: a pipeline owner needs neither REPLICATION nor
    // a say in output_plugin_libraries, since the slot only ever feeds this pipeline's worker.
    crate::security::as_tide(|| {
        catalog::slots::allow_output_plugin()?;
        // Held until this transaction ends, so the launcher does not take the new slot for an
        // orphan.
        crate::locks::lock(
            crate::locks::Lock::Slot(&slot),
            crate::locks::Mode::Exclusive,
        )?;
        catalog::slots::create_logical_slot(&slot)?;
        catalog::pipelines::insert(name, kind, options, &slot, &owner)
    })?;
    // Its launcher, or one for its database: a database has one only while it has pipelines.
    crate::quota::want_launcher_at_end();
    Ok(())
}

/// Room for a new pipeline `name` whose slot is `slot`: the slot name is free, a replication
/// slot is free, the calling role's share of the server has room ([`check_role_share`]),
/// pg_tide's registry has room, and background worker slots are free ([`check_free_workers`]).
fn check_room_for(name: &str, slot: &str) -> TideResult<()> {
    if sql::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1::name)",
        &[slot.into()],
    )?
    .unwrap_or(false)
    {
        return Err(TideError::duplicate(format!("replication slot \"{slot}\" already exists"))
            .hint(format!("A slot of that name is left from elsewhere; drop it with SELECT pg_drop_replication_slot('{slot}') if nothing uses it.")));
    }
    let (used, max) = sql::two::<i64, i64>(
        "SELECT (SELECT count(*) FROM pg_replication_slots), current_setting('max_replication_slots')::int8",
        &[],
    )?;
    let (used, max) = (used.unwrap_or(0), max.unwrap_or(0));
    if used >= max {
        return Err(TideError::limit(format!("all replication slots are in use ({used} of max_replication_slots = {max})"))
            .hint("Drop unused slots (SELECT * FROM pg_replication_slots) or raise max_replication_slots and restart."));
    }
    // One role may not take every slot, origin or worker (superusers are not limited).
    if !crate::security::is_superuser(crate::security::caller()) {
        check_role_share(name, max)?;
    }
    let pipelines = catalog::pipelines::count()?;
    if pipelines as usize >= shmem::MAX_PIPELINES {
        return Err(TideError::limit(format!(
            "pg_tide runs at most {} pipelines",
            shmem::MAX_PIPELINES
        ))
        .hint("Drop a pipeline you no longer need."));
    }
    check_free_workers()
}

/// A background worker slot is free for what the new pipeline really takes: its worker, and
/// this database's launcher when none runs (a database has one only while it has pipelines).
/// Every process that holds a slot now counts, backfill readers included.
fn check_free_workers() -> TideResult<()> {
    // As pg_tide: another role's processes have no backend_type for the caller.
    let (workers, max_workers) = crate::security::as_tide(|| {
        sql::two::<i64, i64>(&format!(
        "SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('{SUPERVISOR_TYPE}', '{LAUNCHER_TYPE}', '{WORKER_TYPE}', 'pg_tide reader', 'logical replication launcher', 'logical replication worker', 'parallel worker')),
                current_setting('max_worker_processes')::int8"
    ), &[])
    })?;
    let (workers, max_workers) = (workers.unwrap_or(0), max_workers.unwrap_or(0));
    let launcher = i64::from(shmem::launcher_pid().is_none());
    if workers + 1 + launcher > max_workers {
        let what = if launcher == 1 {
            "the pipeline's worker and its database's launcher"
        } else {
            "the pipeline's worker"
        };
        return Err(TideError::limit(format!(
            "no background worker slot is free for {what} ({workers} of max_worker_processes = {max_workers} in use)"
        ))
        .hint("Raise max_worker_processes (one per pipeline and per backfill reader, plus one for the supervisor and one per database with pipelines) and restart, or wait for backfills to end (their readers leave with them)."));
    }
    Ok(())
}

/// The calling role (no superuser) may own one more pipeline: counted in every database, its
/// pipelines stay within `tide.max_pipelines_per_role`, and its pipelines' workers with the
/// readers it runs now within `tide.max_workers_per_role`. Under the role's server-wide lock,
/// held until commit, the new pipeline is then counted (`crate::quota::creating`), so two
/// concurrent creates, in any two databases, count each other.
fn check_role_share(name: &str, max_slots: i64) -> TideResult<()> {
    let me_oid = crate::security::caller();
    crate::locks::lock(
        crate::locks::Lock::Role(me_oid),
        crate::locks::Mode::Exclusive,
    )?;
    let me = crate::security::caller_name()?;
    // tide.pipeline is pg_tide's: counted as pg_tide. Other databases: their launchers'.
    let here = catalog::pipelines::count_owned_by(&me)?;
    let owned = here + crate::quota::pipelines_elsewhere(me_oid);
    let limit = crate::gucs::max_pipelines_per_role(max_slots);
    if owned >= limit {
        return Err(TideError::limit(format!(
            "role \"{me}\" already owns {owned} pipelines in all databases, the most tide.max_pipelines_per_role allows ({limit})"
        ))
        .hint("Drop a pipeline you no longer need (in any database), or ask a superuser to raise tide.max_pipelines_per_role (-1: a quarter of max_replication_slots)."));
    }
    let (_, readers) = crate::quota::processes_of(me_oid);
    let workers = crate::gucs::max_workers_per_role();
    if owned + readers + 1 > workers {
        return Err(TideError::limit(format!(
            "role \"{me}\" has {owned} pipelines and {readers} backfill readers in all databases; one more pipeline's worker would pass tide.max_workers_per_role ({workers})"
        ))
        .hint("Wait for backfills to end (their readers leave with them), drop a pipeline, or ask a superuser to raise tide.max_workers_per_role."));
    }
    if !crate::quota::creating(name, me_oid) {
        return Err(TideError::limit(format!(
            "pg_tide counts at most {} pipelines on this server",
            crate::quota::MAX_OWNED
        ))
        .hint("Drop a pipeline you no longer need."));
    }
    Ok(())
}

/// Drop a pipeline: stop its worker, drop its slot, forget its tables and delete its outbox
/// events.
#[pg_extern]
pub(super) fn drop_pipeline(name: Option<&str>) {
    required(name, "name")
        .and_then(drop_pipeline_impl)
        .or_raise()
}

pub(super) fn drop_pipeline_impl(name: &str) -> TideResult<()> {
    // Dropping the slot cannot be rolled back: a transaction block that ends in a rollback would
    // keep the pipeline without its slot (as DROP SUBSCRIPTION, which refuses a block too).
    // SAFETY: reads the transaction state of this backend.
    if unsafe { pg_sys::IsTransactionBlock() || pg_sys::IsSubTransaction() } {
        return Err(TideError::new(
            pg_sys::errcodes::PgSqlErrorCode::ERRCODE_ACTIVE_SQL_TRANSACTION,
            "tide.drop_pipeline cannot run inside a transaction block",
        )
        .hint(format!(
            "Dropping the replication slot cannot be rolled back: call SELECT tide.drop_pipeline('{}') as a statement of its own, outside BEGIN ... COMMIT (and not in a multi-statement query string).",
            name.replace('\'', "''")
        )));
    }
    require_pipeline(name)?;
    let slot =
        catalog::pipelines::slot_name(name)?.unwrap_or_else(|| catalog::slots::own_slot_name(name));
    // The worker and the slot are pg_tide's: stopping and dropping them is done as pg_tide,
    // for the owner who asked (a non-superuser may not signal the worker's superuser process).
    crate::security::as_tide(|| drop_pipeline_as_tide(name, &slot))
}

pub(super) fn drop_pipeline_as_tide(name: &str, slot: &str) -> TideResult<()> {
    let slot = slot.to_string();
    let mut stopped = stop_worker(name, "tide.drop_pipeline")?;
    // The launcher's outbox retention deletes outbox rows, then counts them in
    // tide.outbox_prune (whose row goes with the pipeline's, ON DELETE CASCADE): deleting the
    // pipeline, then its outbox, takes the same rows in the other order, and a prune batch
    // between the two was a deadlock (40P01, seen in benchmark B5). The retention's lock first:
    // a batch running now finishes before the delete; the launcher's next one keeps off until
    // this transaction ends.
    catalog::consumers::lock_retention(name)?;
    catalog::pipelines::delete(name)?;
    // No longer counted against its owner, server-wide, once this commits.
    crate::quota::dropping(name);
    // Its outbox events go with it: they belong to this pipeline, and a later pipeline of the
    // same name (another role's, maybe) must never read them.
    catalog::outbox::delete_events(name)?;
    // Through the worker's shared-memory slot, never pg_terminate_backend: a worker that exited
    // since the slot was read is no error (and no WARNING for the caller), see shmem::terminate.
    if let Some(pid) = shmem::worker_pid(name) {
        shmem::terminate(pid);
        if !stopped.contains(&pid) {
            stopped.push(pid);
        }
    }
    for pid in stopped {
        wait_for_exit(pid, 30, "tide.drop_pipeline")?;
    }
    let mut attempts = 0;
    loop {
        // This database's slot only: slot names are the server's, and a database copied from
        // another (CREATE DATABASE ... TEMPLATE) holds the other's pipeline rows, whose slots
        // are the other database's.
        let state = sql::one::<bool>(
            "SELECT active FROM pg_replication_slots WHERE slot_name = $1::name AND database = current_database()",
            &[slot.clone().into()],
        )?;
        match state {
            None => break,
            Some(false) => {
                sql::exec(
                    "SELECT pg_drop_replication_slot($1::name)",
                    &[slot.clone().into()],
                )?;
                break;
            }
            Some(true) if attempts < 300 => {
                attempts += 1;
                sleep_ms(100);
            }
            Some(true) => {
                return Err(TideError::prerequisite(format!("replication slot \"{slot}\" is still in use"))
                    .hint("Another process uses the slot (see pg_replication_slots.active_pid); stop it and call tide.drop_pipeline again."));
            }
        }
    }
    // The workers stopped above have exited, and a worker started since holds the origin only
    // inside an iteration, which needs the lock held here (worker::origin): the origin is free.
    // A pipeline made before 0.3.0 has the origin of that time (no database in its name): it is
    // dropped only when no slot of that time's name is left on the server (a database copied
    // from this one holds this pipeline's row, and the original's slot, maybe in use).
    let origin = crate::worker::origin::name(name, &slot);
    let legacy = origin == crate::worker::origin::legacy_name(name);
    sql::exec(
        "SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin
          WHERE roname = $1
            AND NOT ($2 AND EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $3::name))",
        &[origin.into(), legacy.into(), slot.clone().into()],
    )?;
    Ok(())
}

/// Stop the pipeline's worker and take the pipeline's lock in exclusive mode (held until this
/// transaction ends): a running iteration of the worker holds it shared, and new iterations
/// stay out until we commit (they then read the pipeline's row as this transaction left it).
/// An iteration may run long (up to the remote sink's timeout while its target does not
/// answer), so the worker is stopped first instead of waited for; one the launcher starts
/// meanwhile is stopped on the next round. Returns every worker stopped (each must have exited
/// before the pipeline's origin can be dropped: a process releases its origin at exit). `what`
/// names the calling function in the hint. Runs as pg_tide.
pub(super) fn stop_worker(name: &str, what: &str) -> TideResult<Vec<i32>> {
    let mut rounds = 0;
    let mut stopped: Vec<i32> = Vec::new();
    loop {
        if let Some(pid) = shmem::worker_pid(name) {
            shmem::terminate(pid);
            if !stopped.contains(&pid) {
                stopped.push(pid);
            }
        }
        if crate::locks::try_lock(
            crate::locks::Lock::Pipeline(name),
            crate::locks::Mode::Exclusive,
        )? {
            return Ok(stopped);
        }
        rounds += 1;
        if rounds >= 300 {
            return Err(TideError::prerequisite(format!(
                "the worker of pipeline \"{name}\" did not stop within 30 s"
            ))
            .hint(format!(
                "See the server log for what it is doing; call {what} again."
            )));
        }
        sleep_ms(100);
    }
}

pub(super) fn wait_for_exit(pid: i32, seconds: u64, what: &str) -> TideResult<()> {
    for _ in 0..seconds * 10 {
        // Not pg_stat_activity: it is a snapshot taken once per transaction.
        if !shmem::alive(pid) {
            return Ok(());
        }
        sleep_ms(100);
    }
    Err(TideError::prerequisite(format!(
        "the worker (pid {pid}) did not stop within {seconds} s"
    ))
    .hint(format!(
        "Look at the server log for the worker; call {what} again once it has stopped."
    )))
}

/// Stop applying changes; the slot keeps them until resume.
#[pg_extern]
pub(super) fn pause_pipeline(name: Option<&str>) {
    required(name, "name")
        .and_then(|n| set_enabled(n, false))
        .or_raise()
}

/// Resume a paused pipeline from where it stopped.
#[pg_extern]
pub(super) fn resume_pipeline(name: Option<&str>) {
    required(name, "name")
        .and_then(|n| set_enabled(n, true))
        .or_raise()
}

/// Pause or resume; pausing a paused pipeline (or resuming a running one) changes nothing and
/// says so with a NOTICE, as for backfills.
pub(super) fn set_enabled(name: &str, enabled: bool) -> TideResult<()> {
    require_pipeline(name)?;
    if !catalog::pipelines::set_enabled(name, enabled)? {
        if enabled {
            pgrx::notice!("pipeline \"{name}\" is not paused: nothing to resume");
        } else {
            pgrx::notice!("pipeline \"{name}\" is already paused: nothing to pause");
        }
    }
    wake_on_commit(shmem::worker_pid(name));
    Ok(())
}

/// Wait until the pipeline has applied every change committed before this call. Returns false
/// on timeout (for example while the pipeline is paused or failing).
#[pg_extern]
pub(super) fn wait_for_pipeline(
    name: Option<&str>,
    timeout: default!(Option<pgrx::datum::Interval>, "'1 minute'"),
) -> bool {
    (|| wait_for_pipeline_impl(required(name, "name")?, required(timeout, "timeout")?))().or_raise()
}

pub(super) fn wait_for_pipeline_impl(
    name: &str,
    timeout: pgrx::datum::Interval,
) -> TideResult<bool> {
    check_server()?;
    require_pipeline(name)?;
    let target = sql::one::<String>("SELECT pg_current_wal_lsn()::text", &[])?
        .and_then(|s| s.parse::<tide_core::lsn::Lsn>().ok())
        .ok_or_else(|| TideError::internal("cannot read the current WAL position"))?;
    let micros = interval_micros(&timeout);
    let deadline = deadline_after(micros);
    // Wake the worker once (it may be sleeping between polls); never in the loop, which would
    // defeat its back-off while it is failing.
    if let Some(pid) = shmem::worker_pid(name) {
        shmem::wake(pid);
    }
    loop {
        if shmem::caught_up_lsn(name).is_some_and(|l| l >= target.0)
            && rewrites_applied(name, target)?
            && !slot_lost(name)?
        {
            return Ok(true);
        }
        if std::time::Instant::now() >= deadline {
            return Ok(false);
        }
        sleep_ms(20);
    }
}

/// Whether the pipeline's slot is lost and its resync not over (`resync` set: `'slot lost'`,
/// then `'resyncing'`): the worker may be caught up with the stream (an earlier one, or the new
/// slot's), but what the slot lost reaches the target only through the resync's backfills,
/// whose required position may be past the one waited for (the loss was found after the call).
fn slot_lost(name: &str) -> TideResult<bool> {
    catalog::pipelines::resync_pending(name)
}

/// Whether the backfills that carry changes of the stream up to `target` (a table rewritten
/// at or before it: its new values reach the target only by reading the table again) are done
/// and applied. Called once the stream has passed `target`, so every such backfill is queued
/// already (in the transaction that applied the rewrite's position). One that failed or was
/// cancelled will never deliver them: an ERROR, not a wait.
fn rewrites_applied(name: &str, target: tide_core::lsn::Lsn) -> TideResult<bool> {
    use tide_core::model::BackfillState as S;
    for r in catalog::backfills::required_by(name, target)? {
        let gone = |what: String| {
            Err(TideError::prerequisite(format!(
                "{} was rewritten (backfill {} was to read it again), and {what}: the rewritten rows are not at the target",
                r.relation, r.required_id
            ))
            .hint(format!(
                "Read the whole table again: SELECT tide.start_backfill('{}', '{}');",
                r.relation.replace('\'', "''"),
                name
            )))
        };
        match r.by {
            None => return gone("no backfill of the whole table followed".to_string()),
            Some((_, S::Done, finished, _)) => {
                let finished = finished.unwrap_or_default();
                if shmem::caught_up_lsn(name).is_none_or(|l| l < finished.0) {
                    return Ok(false);
                }
            }
            Some((id, s @ (S::Failed | S::Cancelled), _, error)) => {
                return gone(format!(
                    "backfill {id}, the latest to read the whole table since, is {}{}",
                    s.as_str(),
                    error.map(|e| format!(" ({e})")).unwrap_or_default()
                ))
            }
            Some(_) => return Ok(false),
        }
    }
    Ok(true)
}

/// Skip one source transaction, by its commit LSN, as `ALTER SUBSCRIPTION ... SKIP (lsn = ...)`
/// does: its changes never reach the target. Recorded with who asked (tide.skipped_transactions).
#[pg_extern]
pub(super) fn skip_transaction(pipeline: Option<&str>, lsn: Option<args::PgLsn>) {
    (|| skip_transaction_impl(required(pipeline, "pipeline")?, required(lsn, "lsn")?))().or_raise()
}

fn skip_transaction_impl(name: &str, lsn: args::PgLsn) -> TideResult<()> {
    require_pipeline(name)?;
    let lsn = tide_core::lsn::Lsn(lsn.0);
    if lsn.0 == 0 {
        return Err(TideError::invalid("lsn 0/0 is no transaction's commit LSN").hint(
            "Pass the commit LSN tide.pipelines.remedy names for the transaction that fails, or an outbox event's commit_lsn.",
        ));
    }
    if let Some(applied) = catalog::skips::applied(name)? {
        // applied_lsn is the end of the last transaction applied: a commit before it is done.
        if lsn < applied {
            return Err(TideError::invalid(format!(
                "the transaction committed at {lsn} is already behind pipeline \"{name}\" (applied up to {applied})"
            ))
            .hint("Only a transaction the pipeline has not applied yet can be skipped: see tide.pipelines.remedy for the one that fails."));
        }
    }
    let me = crate::security::caller_name()?;
    if !catalog::skips::request(name, lsn, &me)? {
        pgrx::notice!("pipeline \"{name}\" already skips the transaction committed at {lsn}");
    }
    wake_on_commit(shmem::worker_pid(name));
    Ok(())
}
