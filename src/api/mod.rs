//! The SQL surface: validate arguments, call into `catalog`, map failures to ERRORs with a
//! specific SQLSTATE and a hint. Nothing here runs in a worker.

use crate::catalog;
use crate::error::{OrRaise, TideError, TideResult};
use crate::shmem;
use crate::sql;
use crate::tsql;
use crate::worker::launcher::{LAUNCHER_TYPE, WORKER_TYPE};
use args::{relation, required, Regclass};
use pgrx::prelude::*;
use pgrx::JsonB;
use tide_core::model::TargetKind;

pub mod args;
pub mod backfill;
pub mod targets;
pub mod verify;

/// Target kinds this version can write.
/// Longest pipeline name (the slot name `tide_<name>` must fit in 63 bytes).
const MAX_NAME: usize = 48;

/// pg_tide's version.
#[pg_extern(immutable, parallel_safe)]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Check that the server can run pipelines; ERROR with the fix in the hint otherwise.
#[pg_extern]
fn check() -> String {
    check_server().or_raise()
}

/// The pipelines whose owner's privileges the current user has (its own, those of roles it is
/// a member of, all for a superuser): what the outbox's row security lets it read and trim.
#[pg_extern(stable)]
fn _owned_pipelines() -> SetOfIterator<'static, String> {
    SetOfIterator::new(owned_pipelines().or_raise())
}

fn owned_pipelines() -> TideResult<Vec<String>> {
    let me = crate::security::caller();
    let rows = tsql::text_rows("SELECT name, owner::text FROM tide.pipeline", &[], 0, false)?;
    let names: Vec<String> = rows
        .into_iter()
        .filter_map(|r| {
            let name = r.first().cloned().flatten()?;
            let owner = r.get(1).cloned().flatten()?;
            let ok = match crate::security::role_oid(&owner) {
                Some(o) => crate::security::has_privs_of(me, o),
                None => crate::security::is_superuser(me),
            };
            ok.then_some(name)
        })
        .collect();
    Ok(names)
}

fn setting(name: &str) -> TideResult<String> {
    Ok(sql::one::<String>("SELECT current_setting($1)", &[name.into()])?.unwrap_or_default())
}

/// The prerequisites of every function that needs the worker.
pub fn check_server() -> TideResult<String> {
    if !shmem::preloaded() {
        return Err(TideError::not_preloaded());
    }
    crate::catalog::version_gate()?;
    let wal_level = setting("wal_level")?;
    if wal_level != "logical" {
        return Err(TideError::prerequisite(format!("wal_level is \"{wal_level}\"; pg_tide needs \"logical\""))
            .detail("pg_tide reads changes through logical decoding, which needs wal_level = logical.")
            .hint("Set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart the server."));
    }
    let db = crate::gucs::database();
    let here = sql::one::<String>("SELECT current_database()::text", &[])?.unwrap_or_default();
    if here != db {
        return Err(TideError::prerequisite(format!("pg_tide runs in database \"{db}\", not in \"{here}\""))
            .hint(format!("Connect to database \"{db}\", or set tide.database = '{here}' and reload the configuration.")));
    }
    let encoding = sql::one::<String>("SELECT pg_encoding_to_char(encoding)::text FROM pg_database WHERE datname = current_database()", &[])?
        .unwrap_or_default();
    if encoding != "UTF8" {
        return Err(TideError::unsupported(format!(
            "database encoding is {encoding}; pg_tide needs UTF8"
        ))
        .hint("Create the database with ENCODING 'UTF8'."));
    }
    let launcher = match shmem::launcher_pid() {
        Some(pid) => format!("launcher running (pid {pid})"),
        None => "launcher not running yet".to_string(),
    };
    Ok(format!(
        "pg_tide {} ready: preloaded, wal_level = logical, database \"{db}\", {launcher}",
        env!("CARGO_PKG_VERSION")
    ))
}

/// Live state of the pipeline workers (used by the `tide.pipelines` view).
#[pg_extern]
#[allow(clippy::type_complexity)]
fn _worker_status() -> TableIterator<
    'static,
    (
        name!(pipeline, String),
        name!(pid, i32),
        name!(state, String),
        name!(started_at, Option<pgrx::datum::TimestampWithTimeZone>),
        name!(events, i64),
        name!(txns, i64),
        name!(drained, bool),
        name!(last_poll, Option<pgrx::datum::TimestampWithTimeZone>),
        name!(caught_up_lsn, String),
    ),
> {
    let ts = |us: i64| -> Option<pgrx::datum::TimestampWithTimeZone> {
        if us == 0 {
            None
        } else {
            // SAFETY of the conversion: a TimestampTz is an i64 of microseconds; any value is valid.
            unsafe {
                pgrx::datum::TimestampWithTimeZone::from_datum(pg_sys::Datum::from(us), false)
            }
        }
    };
    // Only the workers of pipelines the caller may see (as in every view).
    let visible: std::collections::HashSet<String> =
        owned_pipelines().or_raise().into_iter().collect();
    let rows: Vec<_> = shmem::snapshot()
        .into_iter()
        .filter(|w| visible.contains(w.name()))
        .map(|w| {
            (
                w.name().to_string(),
                w.pid,
                w.state.as_str().to_string(),
                ts(w.started_at),
                w.events as i64,
                w.txns as i64,
                w.drained,
                ts(w.last_poll),
                tide_core::lsn::Lsn(w.caught_up_lsn).to_string(),
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// Who may create pipelines: superusers, roles with the REPLICATION attribute, and members of
/// the predefined role `tide_admin` (see README "Security").
fn require_may_create() -> TideResult<()> {
    let ok = sql::one::<bool>(
        // (CASE fixes the order: pg_has_role errors if tide_admin was dropped.)
        "SELECT CASE WHEN rolsuper OR rolreplication THEN true
                     WHEN EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tide_admin')
                          THEN pg_has_role(current_user, 'tide_admin', 'USAGE')
                     ELSE false END
           FROM pg_roles WHERE rolname = current_user",
        &[],
    )?
    .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(
            TideError::privilege("permission denied to create a pg_tide pipeline")
                .hint("A superuser grants it with: GRANT tide_admin TO <role>;"),
        )
    }
}

/// A name as shown back in a message: at most 64 characters.
pub(crate) fn shown(name: &str) -> String {
    const MAX: usize = 64;
    match name.char_indices().nth(MAX) {
        None => name.to_string(),
        Some((i, _)) => format!("{}...", &name[..i]),
    }
}

fn validate_name(name: &str) -> TideResult<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(())
    } else {
        Err(TideError::invalid(format!("invalid pipeline name \"{}\"", shown(name)))
            .hint(format!("Use 1 to {MAX_NAME} lower-case letters, digits and underscores, starting with a letter or underscore (the slot is named tide_<name>).")))
    }
}

fn pipeline_exists(name: &str) -> TideResult<bool> {
    Ok(tsql::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM tide.pipeline WHERE name = $1)",
        &[name.into()],
    )?
    .unwrap_or(false))
}

/// The pipeline must exist (42704) and the caller must own it (42501): see
/// `security::require_owner`. Returns the owner's name.
pub(crate) fn require_pipeline(name: &str) -> TideResult<String> {
    crate::security::require_owner(name)
}

/// Wake a process once the calling transaction commits (never before: it must see the change).
pub(crate) fn wake_on_commit(pid: Option<i32>) {
    if let Some(pid) = pid {
        pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, move || shmem::wake(pid));
    }
}

/// Create a pipeline: its replication slot, its catalog row, and (after commit) its worker.
#[pg_extern]
fn create_pipeline(
    name: Option<&str>,
    target: default!(Option<&str>, "'outbox'"),
    options: default!(Option<JsonB>, "'{}'"),
) {
    (|| {
        create_pipeline_impl(
            required(name, "name")?,
            required(target, "target")?,
            required(options, "options")?,
        )
    })()
    .or_raise()
}

fn create_pipeline_impl(name: &str, target: &str, options: JsonB) -> TideResult<()> {
    check_server()?;
    require_may_create()?;
    validate_name(name)?;
    if TargetKind::parse(target).is_none() {
        return Err(TideError::invalid(format!("unknown target kind \"{target}\"")).hint(
            "Target kinds: 'outbox' (the table tide.outbox), 'table' (tables in this database, option schema), 'postgres' (tables in another PostgreSQL, option server).",
        ));
    }
    let options = JsonB(targets::validate_options(target, &options.0)?);
    if target == "postgres" {
        let server = options
            .0
            .get("server")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        targets::check_remote(&server)?;
    }
    if pipeline_exists(name)? {
        return Err(
            TideError::duplicate(format!("pipeline \"{name}\" already exists")).hint(format!(
                "Pick another name, or drop it first with tide.drop_pipeline('{name}')."
            )),
        );
    }
    let slot = catalog::slot_name(name);
    if sql::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1::name)",
        &[slot.clone().into()],
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
    let pipelines = tsql::one::<i64>("SELECT count(*) FROM tide.pipeline", &[])?.unwrap_or(0);
    if pipelines as usize >= shmem::MAX_PIPELINES {
        return Err(TideError::limit(format!(
            "pg_tide runs at most {} pipelines",
            shmem::MAX_PIPELINES
        ))
        .hint("Drop a pipeline you no longer need."));
    }
    let (workers, max_workers) = sql::two::<i64, i64>(&format!(
        "SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('{LAUNCHER_TYPE}', '{WORKER_TYPE}', 'logical replication launcher', 'logical replication worker', 'parallel worker')),
                current_setting('max_worker_processes')::int8"
    ), &[])?;
    if workers.unwrap_or(0) + 1 > max_workers.unwrap_or(0) {
        return Err(TideError::limit(format!(
            "no background worker slot is free for the pipeline's worker (max_worker_processes = {})",
            max_workers.unwrap_or(0)
        ))
        .hint("Raise max_worker_processes (one per pipeline, plus one for the launcher) and restart."));
    }
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
        catalog::allow_output_plugin()?;
        // Held until this transaction ends, so the launcher does not take the new slot for an
        // orphan.
        sql::one::<bool>(
            "SELECT true FROM pg_advisory_xact_lock(hashtext($1))",
            &[catalog::slot_lock_key(&slot).into()],
        )?;
        sql::one::<bool>(
            "SELECT true FROM pg_create_logical_replication_slot($1::name, 'pg_tide')",
            &[slot.clone().into()],
        )?;
        sql::exec(
            "INSERT INTO tide.pipeline (name, target, options, slot_name, owner) VALUES ($1, $2, $3, $4::name, $5::name)",
            &[name.into(), target.into(), options.into(), slot.into(), owner.into()],
        )
    })?;
    wake_on_commit(shmem::launcher_pid());
    Ok(())
}

/// Drop a pipeline: stop its worker, drop its slot and forget its tables. Its outbox rows stay.
#[pg_extern]
fn drop_pipeline(name: Option<&str>) {
    required(name, "name")
        .and_then(drop_pipeline_impl)
        .or_raise()
}

fn drop_pipeline_impl(name: &str) -> TideResult<()> {
    require_pipeline(name)?;
    let slot = catalog::slot_name(name);
    // The worker and the slot are pg_tide's: stopping and dropping them is done as pg_tide,
    // for the owner who asked (a non-superuser may not signal the worker's superuser process).
    crate::security::as_tide(|| drop_pipeline_as_tide(name, &slot))
}

fn drop_pipeline_as_tide(name: &str, slot: &str) -> TideResult<()> {
    let slot = slot.to_string();
    // The pipeline's lock, exclusive: a running iteration of the worker holds it shared, and new
    // iterations stay out until we commit (they then find the pipeline gone and exit). An
    // iteration may run long (up to the remote sink's timeout while its target does not answer),
    // so the worker is stopped first instead of waited for; one the launcher starts meanwhile is
    // stopped on the next round.
    let key = catalog::pipeline_lock_key(name);
    let mut rounds = 0;
    loop {
        if let Some(pid) = shmem::worker_pid(name) {
            sql::exec("SELECT pg_terminate_backend($1)", &[pid.into()])?;
        }
        if sql::one::<bool>(
            "SELECT pg_try_advisory_xact_lock(hashtext($1))",
            &[key.clone().into()],
        )?
        .unwrap_or(false)
        {
            break;
        }
        rounds += 1;
        if rounds >= 300 {
            return Err(TideError::prerequisite(format!(
                "the worker of pipeline \"{name}\" did not stop within 30 s"
            ))
            .hint("See the server log for what it is doing; call tide.drop_pipeline again."));
        }
        sleep_ms(100);
    }
    tsql::exec("DELETE FROM tide.pipeline WHERE name = $1", &[name.into()])?;
    tsql::exec(
        "DELETE FROM tide.signal WHERE pipeline = $1",
        &[name.into()],
    )?;
    if let Some(pid) = shmem::worker_pid(name) {
        sql::exec("SELECT pg_terminate_backend($1)", &[pid.into()])?;
        wait_for_exit(pid, 30)?;
    }
    let mut attempts = 0;
    loop {
        let state = sql::one::<bool>(
            "SELECT active FROM pg_replication_slots WHERE slot_name = $1::name",
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
    // The worker has exited (above), so its replication origin is free to drop.
    sql::exec(
        "SELECT pg_replication_origin_drop(roname) FROM pg_replication_origin WHERE roname = $1",
        &[crate::worker::origin::name(name).into()],
    )?;
    Ok(())
}

pub(crate) fn sleep_ms(ms: u64) {
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as i32,
            ms as _,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
        pg_sys::check_for_interrupts!();
    }
}

fn wait_for_exit(pid: i32, seconds: u64) -> TideResult<()> {
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
    .hint(
        "Look at the server log for the worker; call tide.drop_pipeline again once it has stopped.",
    ))
}

/// Stop applying changes; the slot keeps them until resume.
#[pg_extern]
fn pause_pipeline(name: Option<&str>) {
    required(name, "name")
        .and_then(|n| set_enabled(n, false))
        .or_raise()
}

/// Resume a paused pipeline from where it stopped.
#[pg_extern]
fn resume_pipeline(name: Option<&str>) {
    required(name, "name")
        .and_then(|n| set_enabled(n, true))
        .or_raise()
}

fn set_enabled(name: &str, enabled: bool) -> TideResult<()> {
    require_pipeline(name)?;
    tsql::exec(
        "UPDATE tide.pipeline SET enabled = $2 WHERE name = $1",
        &[name.into(), enabled.into()],
    )?;
    wake_on_commit(shmem::worker_pid(name));
    Ok(())
}

/// Wait until the pipeline has applied every change committed before this call. Returns false
/// on timeout (for example while the pipeline is paused or failing).
#[pg_extern]
fn wait_for_pipeline(
    name: Option<&str>,
    timeout: default!(Option<pgrx::datum::Interval>, "'1 minute'"),
) -> bool {
    (|| wait_for_pipeline_impl(required(name, "name")?, required(timeout, "timeout")?))().or_raise()
}

fn wait_for_pipeline_impl(name: &str, timeout: pgrx::datum::Interval) -> TideResult<bool> {
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
        if shmem::caught_up_lsn(name).is_some_and(|l| l >= target.0) {
            return Ok(true);
        }
        if std::time::Instant::now() >= deadline {
            return Ok(false);
        }
        sleep_ms(20);
    }
}

/// The instant `micros` from now, clamped to a century (an `Instant` cannot hold more).
pub(crate) fn deadline_after(micros: i64) -> std::time::Instant {
    const CENTURY_US: u64 = 100 * 365 * 86_400_000_000;
    let now = std::time::Instant::now();
    let d = std::time::Duration::from_micros((micros.max(0) as u64).min(CENTURY_US));
    now.checked_add(d).unwrap_or(now)
}

/// An interval in microseconds, saturating (a timeout of '300000 years' waits "forever", it does
/// not overflow into the past); never negative.
pub(crate) fn interval_micros(i: &pgrx::datum::Interval) -> i64 {
    i.micros()
        .saturating_add((i.days() as i64).saturating_mul(86_400_000_000))
        .saturating_add((i.months() as i64).saturating_mul(30 * 86_400_000_000))
        .max(0)
}

/// Information about a table to capture, from the catalogs.
struct SourceInfo {
    qualified: String,
    relkind: String,
    persistence: String,
    namespace: String,
    replident: String,
    key_columns: Vec<String>,
}

fn source_info(relid: pg_sys::Oid) -> TideResult<SourceInfo> {
    Spi::connect(|c| {
        let row = c
            .select(
                "SELECT format('%I.%I', n.nspname, c.relname), c.relkind::text, c.relpersistence::text, n.nspname::text, c.relreplident::text,
                        ARRAY(SELECT a.attname::text
                                FROM pg_index i
                                JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
                                JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                               WHERE i.indrelid = c.oid
                                 AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END
                               ORDER BY k.ord)
                   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
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
fn validate_source(relid: pg_sys::Oid, owner: &str) -> TideResult<SourceInfo> {
    let s = source_info(relid)?;
    let q = &s.qualified;
    match s.relkind.as_str() {
        "r" => {}
        "p" => {
            return Err(TideError::unsupported(format!("\"{q}\" is a partitioned table"))
                .hint("Capture its partitions instead: call tide.add_table for each partition (SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = '...'::regclass)."))
        }
        "v" | "m" => {
            return Err(TideError::wrong_object(format!("\"{q}\" is a view, which has no changes to capture"))
                .hint("Capture the tables the view reads from."))
        }
        "f" => return Err(TideError::wrong_object(format!("\"{q}\" is a foreign table, whose changes are not in this server's WAL")).hint("Capture the table on the server that owns it.")),
        _ => return Err(TideError::wrong_object(format!("\"{q}\" is not a table")).hint("tide.add_table takes an ordinary table.")),
    }
    match s.persistence.as_str() {
        "t" => {
            return Err(TideError::unsupported(format!(
                "\"{q}\" is a temporary table, which is not written to the WAL"
            ))
            .hint("Capture a permanent table."))
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
    if s.key_columns.is_empty() {
        return Err(TideError::prerequisite(format!("\"{q}\" has no primary key"))
            .hint(format!("Add one (ALTER TABLE {q} ADD PRIMARY KEY (...)) or name a unique index on NOT NULL columns: ALTER TABLE {q} REPLICA IDENTITY USING INDEX ...")));
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
    Ok(s)
}

/// Start capturing a table: every change committed after this call commits is delivered, and
/// (unless `backfill => false`) the rows that already exist are backfilled.
#[pg_extern]
fn add_table(
    pipeline: Option<&str>,
    source: Option<Regclass>,
    backfill: default!(Option<bool>, true),
    target_table: default!(Option<&str>, "NULL"),
) {
    (|| {
        add_table_impl(
            required(pipeline, "pipeline")?,
            relation(source, "source")?,
            required(backfill, "backfill")?,
            target_table,
        )
    })()
    .or_raise()
}

fn add_table_impl(
    pipeline: &str,
    relid: pg_sys::Oid,
    backfill: bool,
    target_table: Option<&str>,
) -> TideResult<()> {
    check_server()?;
    let owner = require_pipeline(pipeline)?;
    let s = validate_source(relid, &owner)?;
    // A table this pipeline writes as a target cannot be captured by it: its own writes would
    // come back as changes.
    let target_of = tsql::one::<String>(
        "SELECT relation FROM tide.pipeline_table
          WHERE pipeline = $1 AND target_name IS NOT NULL
            AND to_regclass(format('%I.%I', target_schema, target_name)) = $2",
        &[pipeline.into(), relid.into()],
    )?;
    let target_anywhere = tsql::one::<String>(
        "SELECT pipeline FROM tide.pipeline_table t JOIN tide.pipeline p ON p.name = t.pipeline
          WHERE p.target = 'table' AND t.target_name IS NOT NULL
            AND to_regclass(format('%I.%I', t.target_schema, t.target_name)) = $1
          LIMIT 1",
        &[relid.into()],
    )?;
    if let Some(other) = target_anywhere {
        return Err(TideError::invalid(format!(
            "\"{}\" is a table target of pipeline \"{other}\": pg_tide's own writes are never captured",
            s.qualified
        ))
        .hint("Capture the table the target is a copy of instead."));
    }
    if let Some(src) = target_of {
        return Err(TideError::invalid(format!(
            "\"{}\" is the target of {src} in pipeline \"{}\", which cannot also capture it",
            s.qualified,
            shown(pipeline)
        ))
        .hint("Capture it with another pipeline, or give the other table another target."));
    }
    let existing = tsql::one::<bool>(
        "SELECT removing FROM tide.pipeline_table WHERE pipeline = $1 AND relid = $2",
        &[pipeline.into(), relid.into()],
    )?;
    if existing == Some(false) {
        return Err(TideError::duplicate(format!(
            "pipeline \"{pipeline}\" already captures \"{}\"",
            s.qualified
        ))
        .hint("SELECT * FROM tide.tables lists what each pipeline captures."));
    }
    let (target_kind, options) = tsql::two::<String, String>(
        "SELECT target, options::text FROM tide.pipeline WHERE name = $1",
        &[pipeline.into()],
    )?;
    let target_kind = catalog::target_kind(target_kind, pipeline)?;
    let options: serde_json::Value =
        serde_json::from_str(&options.unwrap_or_default()).unwrap_or_default();
    let (target_schema, target_name) = if target_kind == TargetKind::Outbox {
        if target_table.is_some() {
            return Err(TideError::invalid(format!(
                "pipeline \"{pipeline}\" writes to the outbox, which has no target tables"
            ))
            .hint("Omit target_table for outbox pipelines."));
        }
        (None, None)
    } else {
        let (s_, n_) = targets::ensure_target(
            target_kind.as_str(),
            &options,
            relid,
            &s.qualified,
            &s.key_columns,
            target_table,
            &owner,
        )?;
        if target_kind == TargetKind::Table {
            // The other direction of the loop: the target must not be a table this pipeline
            // captures.
            let captured = tsql::one::<String>(
                "SELECT relation FROM tide.pipeline_table
                  WHERE pipeline = $1 AND NOT removing AND relid = to_regclass(format('%I.%I', $2::text, $3::text))",
                &[pipeline.into(), s_.clone().into(), n_.clone().into()],
            )?;
            if let Some(c) = captured {
                return Err(TideError::invalid(format!(
                    "the target {}.{} is {c}, which pipeline \"{}\" captures",
                    pgrx::spi::quote_identifier(&s_),
                    pgrx::spi::quote_identifier(&n_),
                    shown(pipeline)
                ))
                .hint("A pipeline's targets and the tables it captures must be different tables: pass another target_table."));
            }
        }
        (Some(s_), Some(n_))
    };
    match existing {
        Some(false) => {}
        Some(true) => {
            // Removed but the worker has not reached the remove marker yet: capture it again
            // from this add marker on.
            tsql::exec(
                "UPDATE tide.pipeline_table SET removing = false, added_lsn = NULL, added_at = now(), relation = $3, key_columns = $4,
                        target_schema = $5, target_name = $6
                  WHERE pipeline = $1 AND relid = $2",
                &[
                    pipeline.into(),
                    relid.into(),
                    s.qualified.clone().into(),
                    s.key_columns.clone().into(),
                    target_schema.clone().into(),
                    target_name.clone().into(),
                ],
            )?;
        }
        None => {
            tsql::exec(
                "INSERT INTO tide.pipeline_table (pipeline, relid, relation, key_columns, target_schema, target_name)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    pipeline.into(),
                    relid.into(),
                    s.qualified.clone().into(),
                    s.key_columns.clone().into(),
                    target_schema.into(),
                    target_name.into(),
                ],
            )?;
        }
    }
    emit_signal("add_table", pipeline, relid)?;
    if backfill {
        // Queued now; the worker starts it once it has passed the add_table marker.
        backfill::start_backfill_impl(relid, Some(pipeline), None, None)?;
    }
    wake_on_commit(shmem::worker_pid(pipeline));
    Ok(())
}

/// Stop capturing a table. Changes committed after this call commits are not delivered.
#[pg_extern]
fn remove_table(pipeline: Option<&str>, source: Option<Regclass>) {
    (|| remove_table_impl(required(pipeline, "pipeline")?, relation(source, "source")?))()
        .or_raise()
}

fn remove_table_impl(pipeline: &str, relid: pg_sys::Oid) -> TideResult<()> {
    require_pipeline(pipeline)?;
    // The row stays (marked) until the worker reaches the remove marker in the stream, so the
    // table's changes committed before this call are still decoded and delivered; the worker
    // deletes the row at the marker.
    let removed = tsql::exec_count(
        "UPDATE tide.pipeline_table SET removing = true WHERE pipeline = $1 AND relid = $2 AND NOT removing",
        &[pipeline.into(), relid.into()],
    )?;
    if removed == 0 {
        return Err(TideError::undefined(format!(
            "pipeline \"{pipeline}\" does not capture relation {}",
            relid.to_u32()
        ))
        .hint("SELECT * FROM tide.tables lists what each pipeline captures."));
    }
    emit_signal("remove_table", pipeline, relid)?;
    tsql::exec(
        "UPDATE tide.backfill SET state = 'cancelled', finished_at = now(), error = 'the table was removed from the pipeline'
          WHERE pipeline = $1 AND relid = $2 AND state IN ('queued', 'running', 'paused')",
        &[pipeline.into(), relid.into()],
    )?;
    wake_on_commit(shmem::worker_pid(pipeline));
    Ok(())
}

/// Write a pg_tide marker into the WAL, transactionally: the worker sees it exactly at this
/// transaction's commit position in the stream. The marker is a row of `tide.marker`, which only
/// pg_tide can write (inserted and deleted at once: the WAL keeps the insert, the table stays
/// empty), so no other role can forge one.
fn emit_signal(op: &str, pipeline: &str, relid: pg_sys::Oid) -> TideResult<()> {
    let id = tsql::write_one::<i64>(
        "INSERT INTO tide.marker (pipeline, op, relid) VALUES ($1, $2, $3) RETURNING id",
        &[pipeline.into(), op.into(), relid.into()],
    )?;
    tsql::exec("DELETE FROM tide.marker WHERE id = $1", &[id.into()])?;
    Ok(())
}
