//! pg_tide: change data capture with watermark backfill, inside PostgreSQL.
//!
//! Modules:
//! - [`gucs`]: every `tide.*` setting;
//! - [`shmem`]: supervisor and launcher identities and live worker statistics;
//! - [`api`]: the SQL functions (validate, call, map errors);
//! - [`catalog`]: all SQL on pg_tide's own `tide.*` tables, the slots' names, locks and orphans;
//! - [`plugin`]: the logical decoding output plugin `pg_tide`;
//! - [`row_filter`]: row filters (rules, checks, evaluation in the plugin);
//! - [`worker`]: the launcher, the pipeline worker and the transaction helper;
//! - [`schema`]: catalog tables, the outbox, views and privileges.
//!
//! Server-independent logic (wire codec, JSON rendering, reconciler, and the stream model that
//! `worker` and `sink` share, so neither imports the other) is in the `tide-core` crate.
//!
//! Every `unsafe` block says why it is sound in a `// SAFETY:` comment above it (the invariant
//! it relies on: PostgreSQL's callback contract, a memory context's lifetime, the main thread);
//! `cargo clippy` (the core stage of scripts/test.sh) fails on one without.

#![deny(clippy::undocumented_unsafe_blocks)]

use pgrx::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

::pgrx::pg_module_magic!(name, version);

pub mod api;
pub mod bulk;
pub mod catalog;
pub mod error;
pub mod gucs;
pub mod locks;
pub mod pgver;
pub mod plugin;
pub mod quota;
pub mod row_filter;
pub mod schema;
pub mod security;
pub mod shmem;
pub mod sql;
pub mod sql_as_tide;
pub mod target;
pub mod worker;

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    // pgrx puts a Rust backtrace into the DETAIL of an ERROR raised from a panic whenever
    // std's backtraces are on, which a server started from a shell with RUST_BACKTRACE=1 has:
    // users would see pages of frames instead of the message's detail. Library backtraces stay
    // off unless RUST_LIB_BACKTRACE asks for them explicitly. (Set while the process is still
    // single-threaded: the postmaster or a backend loading the library.)
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    gucs::init();
    // Waits for a remote sink's reply look at interrupts and the postmaster every 100 ms.
    target::wait::set_check(worker::wait_check);
    // SAFETY: a process global PostgreSQL sets around the preloading of shared libraries;
    // _PG_init runs on the process's only thread.
    if unsafe { !pg_sys::process_shared_preload_libraries_in_progress } {
        // Loaded by CREATE EXTENSION, a function call or as an output plugin: no worker.
        return;
    }
    shmem::set_preloaded();
    use shmem::{REGISTRY, WAKEUPS};
    pgrx::pg_shmem_init!(REGISTRY);
    pgrx::pg_shmem_init!(WAKEUPS);
    use quota::QUOTA;
    pgrx::pg_shmem_init!(QUOTA);
    // Every backend forks from here with this callback: a commit that wrote WAL wakes the
    // pipeline workers that wait for WAL (no polling delay).
    // SAFETY: the postmaster, single-threaded, while it preloads libraries; the callback has
    // XactCallback's signature (#[pg_guard]ed) and never reads its NULL argument.
    unsafe { pg_sys::RegisterXactCallback(Some(wake_after_commit), std::ptr::null_mut()) };
    // Every backend forks from here with this hook too: a DROP EXTENSION pg_tide is refused
    // while pipelines exist.
    // SAFETY: the postmaster, single-threaded, while it preloads libraries: where PostgreSQL
    // expects a hook to be chained. The hook installed before ours is kept first, so ours calls it.
    unsafe {
        let _ = PREV_PROCESS_UTILITY.set(pg_sys::ProcessUtility_hook);
        pg_sys::ProcessUtility_hook = Some(tide_process_utility);
    }
    // pg_upgrade starts both the old and the new server in binary-upgrade mode (`-b`) to read
    // and restore the schema: no pipeline may run there (it would decode, write to targets and
    // move its slot while the upgrade reads the catalogs and checks the slots).
    // SAFETY: a bool of the postmaster, set from its command line before shared libraries are
    // preloaded, and never written after.
    if unsafe { pg_sys::IsBinaryUpgrade } {
        pgrx::log!("pg_tide: the server runs in binary-upgrade mode (pg_upgrade): no pg_tide worker starts");
        return;
    }
    worker::launcher::register();
}

/// The `ProcessUtility_hook` installed before pg_tide's, called in its place. Set once, by
/// `_PG_init` in the postmaster (backends inherit it by fork); unset when pg_tide's hook is not
/// installed either.
static PREV_PROCESS_UTILITY: std::sync::OnceLock<pg_sys::ProcessUtility_hook_type> =
    std::sync::OnceLock::new();

/// `ProcessUtility_hook`: run the statement as usual, but refuse a `DROP EXTENSION pg_tide`
/// while pipelines exist. (`CREATE EXTENSION pg_tide` starts no launcher: a database has one
/// only while it has pipelines, see `worker::launcher`.) Costs one tag comparison for any
/// other statement.
#[pg_guard]
#[allow(
    clippy::too_many_arguments,
    reason = "PostgreSQL's ProcessUtility_hook_type fixes the arguments"
)]
unsafe extern "C-unwind" fn tide_process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: as below; a DropStmt's objects are a List of String nodes for an extension.
    if unsafe { drops_pg_tide((*pstmt).utilityStmt) } {
        // Before anything is dropped: pg_tide's tables still say which pipelines exist.
        if let Err(e) = catalog::pipelines::refuse_drop_extension() {
            e.raise();
        }
    }
    // SAFETY: as below; a DropdbStmt names its database (NUL-terminated).
    let dropped_db = unsafe { dropped_database((*pstmt).utilityStmt) };
    // SAFETY: the executor passes a valid PlannedStmt and the arguments it was called with.
    unsafe {
        match PREV_PROCESS_UTILITY.get().copied().flatten() {
            Some(prev) => prev(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
            None => pg_sys::standard_ProcessUtility(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
        }
    }
    // DROP DATABASE returned: the database is gone (it cannot run in a transaction block), and
    // its pipelines with it.
    if let Some(oid) = dropped_db {
        quota::forget_database(oid);
    }
}

/// The OID of the database a `DROP DATABASE` names, when it exists.
///
/// # Safety
/// `stmt` is null or a valid parse node (a utility statement of a PlannedStmt).
unsafe fn dropped_database(stmt: *mut pg_sys::Node) -> Option<u32> {
    // SAFETY: the caller's; a DropdbStmt's dbname is a NUL-terminated string; get_database_oid
    // reads the shared catalog pg_database (missing_ok: no ERROR for an unknown name).
    unsafe {
        if stmt.is_null() || (*stmt).type_ != pg_sys::NodeTag::T_DropdbStmt {
            return None;
        }
        let d = stmt as *mut pg_sys::DropdbStmt;
        if (*d).dbname.is_null() {
            return None;
        }
        let oid = pg_sys::get_database_oid((*d).dbname, true);
        (oid != pg_sys::InvalidOid).then(|| oid.to_u32())
    }
}

/// Whether `stmt` is a `DROP EXTENSION` naming pg_tide.
///
/// # Safety
/// `stmt` is null or a valid parse node (a utility statement of a PlannedStmt).
unsafe fn drops_pg_tide(stmt: *mut pg_sys::Node) -> bool {
    // SAFETY: the caller's; a DropStmt of OBJECT_EXTENSION has a List of String nodes (one per
    // extension name, NUL-terminated).
    unsafe {
        if stmt.is_null() || (*stmt).type_ != pg_sys::NodeTag::T_DropStmt {
            return false;
        }
        let d = stmt as *mut pg_sys::DropStmt;
        if (*d).removeType != pg_sys::ObjectType::OBJECT_EXTENSION {
            return false;
        }
        let names = pgrx::PgList::<pg_sys::String>::from_pg((*d).objects);
        let found = names.iter_ptr().any(|n| {
            !n.is_null()
                && !(*n).sval.is_null()
                && std::ffi::CStr::from_ptr((*n).sval).to_bytes() == b"pg_tide"
        });
        found
    }
}

/// Whether this backend's transaction changed the system catalogs and said so at pre-commit.
/// Read and written only by the transaction callback, on the backend's main thread (an atomic
/// only so that it needs no `static mut`; relaxed order suffices for one thread).
static CATALOG_COMMIT: AtomicBool = AtomicBool::new(false);

/// Whether the current transaction has invalidation messages to send at commit, i.e. changed
/// the system catalogs.
fn changes_catalogs() -> bool {
    let mut msgs: *mut pg_sys::SharedInvalidationMessage = std::ptr::null_mut();
    let mut init_file = false;
    // SAFETY: called from a top-level transaction's commit callbacks, before AtEOXact_Inval
    // (as RecordTransactionCommit calls it); it only counts and copies the pending messages.
    unsafe { pg_sys::xactGetCommittedInvalidationMessages(&mut msgs, &mut init_file) > 0 }
}

/// Commit callback of every backend:
/// - after a commit that wrote WAL (it had a transaction id), wake the waiting pipeline workers.
///   With synchronous commit the commit record is flushed by now, so the woken worker finds it;
///   otherwise it finds it at its next poll, as before;
/// - report transactions that changed the system catalogs (see `shmem::catalog_changed_after`):
///   at pre-commit (before the commit becomes visible) and at commit, with the commit record's
///   end; an abort after pre-commit withdraws the report.
#[pg_guard]
unsafe extern "C-unwind" fn wake_after_commit(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_COMMIT if changes_catalogs() => {
            CATALOG_COMMIT.store(true, Ordering::Relaxed);
            shmem::catalog_commit_begins();
        }
        XACT_EVENT_COMMIT => {
            // SAFETY: this backend's global, set by RecordTransactionCommit before the commit
            // callbacks run; main thread.
            let end = unsafe { pg_sys::XactLastCommitEnd };
            if CATALOG_COMMIT.swap(false, Ordering::Relaxed) {
                shmem::catalog_commit_ends(Some(end));
            } else if changes_catalogs() {
                shmem::catalog_committed(end);
            }
            // SAFETY: reads this backend's transaction state, still set in its commit callback;
            // main thread.
            if unsafe { pg_sys::GetTopTransactionIdIfAny() } != pg_sys::InvalidTransactionId {
                shmem::wake_sleepers();
            }
        }
        XACT_EVENT_ABORT if CATALOG_COMMIT.load(Ordering::Relaxed) => {
            CATALOG_COMMIT.store(false, Ordering::Relaxed);
            shmem::catalog_commit_ends(None);
        }
        _ => {}
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn version_is_the_crate_version() {
        assert_eq!(
            Spi::get_one::<String>("SELECT tide.version()")
                .unwrap()
                .unwrap(),
            env!("CARGO_PKG_VERSION")
        );
    }

    #[pg_test]
    fn version_gate_names_the_missing_step() {
        // The test database was made by CREATE EXTENSION of this build: the versions match.
        assert!(crate::catalog::version_gate().is_ok());
        let hint = |v: &str| crate::catalog::version_mismatch(v).hint.unwrap_or_default();
        // SQL objects older than the library: the update is missing.
        assert!(
            hint("0.0.9").contains("ALTER EXTENSION pg_tide UPDATE"),
            "{}",
            hint("0.0.9")
        );
        assert!(hint("0.1.0").contains("ALTER EXTENSION pg_tide UPDATE"));
        // Newer (ALTER EXTENSION ran, the server still has the old library): the restart is.
        assert!(
            hint("99.0.0").contains("restart the server"),
            "{}",
            hint("99.0.0")
        );
        assert!(hint("0.10.0").contains("restart the server"));
        assert_eq!(
            crate::catalog::version_mismatch("0.1.0").sqlstate(),
            "55000"
        );
    }

    #[pg_test]
    fn estimate_rows_without_and_with_statistics() {
        Spi::run("CREATE TABLE public.est (id int PRIMARY KEY, v int, note varchar(20))").unwrap();
        let est = || {
            Spi::get_one::<i64>("SELECT tide._estimate_rows('public.est'::regclass)")
                .unwrap()
                .unwrap()
        };
        assert_eq!(est(), 0, "an empty table");
        Spi::run("INSERT INTO public.est SELECT g, g, 'row number ' || g FROM generate_series(1, 10000) g")
            .unwrap();
        // Never analyzed: from the row width, within a factor of two.
        let e = est();
        assert!((5_000..20_000).contains(&e), "no statistics: {e}");
        Spi::run("ANALYZE public.est").unwrap();
        let e = est();
        assert!((9_000..11_000).contains(&e), "analyzed: {e}");
        // Statistics from when the table was smaller scale with its size now, as the planner does.
        Spi::run("INSERT INTO public.est SELECT g, g, 'row number ' || g FROM generate_series(10001, 20000) g")
            .unwrap();
        let e = est();
        assert!((18_000..22_000).contains(&e), "grown since ANALYZE: {e}");
        assert_eq!(
            Spi::get_one::<i64>("SELECT tide._estimate_rows('tide.backfills'::regclass)").unwrap(),
            None,
            "a view has no estimate"
        );
    }

    #[pg_test]
    fn check_reports_a_ready_server() {
        let s = Spi::get_one::<String>("SELECT tide.check()")
            .unwrap()
            .unwrap();
        assert!(s.contains("wal_level = logical"), "{s}");
    }

    #[pg_test]
    fn sqlstate_text_decodes_packed_codes() {
        use pgrx::pg_sys::errcodes::PgSqlErrorCode;
        assert_eq!(
            crate::error::sqlstate_text(PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
            "55000"
        );
        assert_eq!(
            crate::error::sqlstate_text(PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE),
            "22023"
        );
    }

    // A #[pg_test] runs in a transaction block, where drop_pipeline refuses before anything
    // else (the slot's drop cannot be rolled back); an unknown pipeline's 42704 is in the
    // api_errors transcript (pg_test/regress).
    #[pg_test(error = "tide.drop_pipeline cannot run inside a transaction block")]
    fn drop_pipeline_refuses_a_transaction_block() {
        Spi::run("SELECT tide.drop_pipeline('nope')").unwrap();
    }

    #[pg_test(error = "no pipeline of yours captures public.uncaptured")]
    fn backfill_of_an_uncaptured_table_is_an_error() {
        Spi::run("CREATE TABLE public.uncaptured (id int PRIMARY KEY)").unwrap();
        Spi::run("SELECT tide.start_backfill('public.uncaptured')").unwrap();
    }

    #[pg_test(error = "pipeline \"nope\" does not exist")]
    fn add_table_to_unknown_pipeline_is_an_error() {
        Spi::run("CREATE TABLE public.t1 (id int PRIMARY KEY)").unwrap();
        Spi::run("SELECT tide.add_table('nope', 'public.t1')").unwrap();
    }

    #[pg_test]
    fn conditions_must_be_one_expression() {
        use crate::api::backfill::one_expression;
        // Err, or a syntax ERROR raised by PostgreSQL's parser: both refuse the condition.
        let ok = |c: &str| {
            pgrx::PgTryBuilder::new(|| one_expression(c).is_ok())
                .catch_others(|_| false)
                .execute()
        };
        assert!(ok("v % 2 = 0"));
        assert!(ok("(a > 1) AND (b < 2)"));
        assert!(ok("note = 'x)' AND \"odd)col\" > 1"));
        assert!(ok("note = E'it\\'s)' "));
        assert!(ok("v > (SELECT 1)"));
        // Safe: the chunk query puts the condition on lines of its own.
        assert!(ok("v > 0 -- ) OR (true"));
        assert!(!ok("v > 0) OR (true"));
        assert!(!ok("(v > 0"));
        assert!(!ok("note = 'open"));
        assert!(!ok("true; DROP TABLE t"));
        assert!(!ok("1 AS x"));
        assert!(!ok("1, 2"));
        assert!(!ok("true FROM pg_class"));
        assert!(!ok("/* open comment"));
        // The escape the hand-written lexer let through (a quote after any e/E).
        assert!(!ok("name'\\' IS NOT NULL) OR (true OR E'\\'' IS NULL"));
    }

    /// The quoted literals of a deparsed constraint or predicate, sorted: `'queued'::text` gives
    /// `queued`. `what` is a query of one `text` value.
    fn literals(what: &str, args: &[pgrx::datum::DatumWithOid<'_>]) -> Vec<String> {
        let q = format!(
            "SELECT coalesce(array_agg(m[1] ORDER BY m[1]), '{{}}') FROM ({what}) AS d(def),
                    regexp_matches(d.def, '''([^'']*)''', 'g') AS m"
        );
        Spi::get_one_with_args::<Vec<String>>(&q, args)
            .unwrap()
            .unwrap()
    }

    /// The values the CHECK constraint on `table.column` (and on that column only) lists.
    fn check_values(table: &str, column: &str) -> Vec<String> {
        literals(
            "SELECT pg_catalog.pg_get_constraintdef(c.oid) FROM pg_catalog.pg_constraint c
              WHERE c.conrelid = $1::text::regclass AND c.contype = 'c'
                AND c.conkey = ARRAY[(SELECT a.attnum FROM pg_catalog.pg_attribute a
                                       WHERE a.attrelid = $1::text::regclass AND a.attname = $2)]",
            &[table.into(), column.into()],
        )
    }

    /// The texts of `values`, sorted.
    fn texts<T: Copy>(values: &[T], text: fn(T) -> &'static str) -> Vec<String> {
        let mut v: Vec<String> = values.iter().map(|&x| text(x).to_string()).collect();
        v.sort();
        v
    }

    /// A table target's rows travel as `text[]` literals (`tide_core::plan::text_array`):
    /// PostgreSQL's `array_in` reads back every value exactly, as the planner's model assumes.
    #[pg_test]
    fn text_arrays_read_back_exactly() {
        let values: Vec<Option<&str>> = vec![
            Some(""),
            None,
            Some("NULL"),
            Some("null"),
            Some("a,b"),
            Some("{x}"),
            Some("say \"hi\""),
            Some("back\\slash\\"),
            Some(" lead and trail "),
            Some("tab\tnew\nline\r"),
            Some("é ünïcode ✓ 😀"),
            Some("\"\\\""),
        ];
        let lit = tide_core::plan::text_array(values.iter().copied());
        let got = Spi::get_one_with_args::<Vec<Option<String>>>(
            "SELECT array_agg(v ORDER BY o) FROM unnest($1::text::text[]) WITH ORDINALITY AS u(v, o)",
            &[lit.as_str().into()],
        )
        .unwrap()
        .unwrap();
        let want: Vec<Option<String>> = values.iter().map(|v| v.map(str::to_string)).collect();
        assert_eq!(got, want, "{lit}");
    }

    /// The schema's CHECK constraints (and `backfill_one_active`'s predicate) list exactly the
    /// values of `tide_core::model`'s enums, which the Rust code binds into its statements: a
    /// value added to one side only fails here.
    #[pg_test]
    fn schema_checks_list_the_enums() {
        use tide_core::model::{
            BackfillState, ChunkWrite, MarkerOp, Op, PruneReason, TargetKind, WatermarkKind,
        };
        let states = texts(BackfillState::ALL, BackfillState::as_str);
        assert_eq!(states.len(), BackfillState::ALL.len());
        assert_eq!(check_values("tide.backfill", "state"), states);
        let active: Vec<BackfillState> = BackfillState::ALL
            .iter()
            .copied()
            .filter(|s| s.is_active())
            .collect();
        let active = texts(&active, BackfillState::as_str);
        assert!(!active.is_empty() && active.len() < states.len());
        assert_eq!(
            literals(
                "SELECT pg_catalog.pg_get_expr(i.indpred, i.indrelid) FROM pg_catalog.pg_index i
                  WHERE i.indexrelid = 'tide.backfill_one_active'::regclass",
                &[],
            ),
            active,
            "the partial unique index backfill_one_active covers the active states"
        );
        let others = [
            (
                "tide.signal",
                "kind",
                texts(WatermarkKind::ALL, WatermarkKind::as_str),
            ),
            ("tide.marker", "op", texts(MarkerOp::ALL, MarkerOp::as_str)),
            (
                "tide.pipeline",
                "target",
                texts(TargetKind::ALL, TargetKind::as_str),
            ),
            ("tide.outbox", "op", texts(Op::ALL, Op::as_str)),
            (
                "tide.outbox_prune",
                "last_reason",
                texts(PruneReason::ALL, PruneReason::as_str),
            ),
            (
                "tide.chunk",
                "written_as",
                texts(ChunkWrite::ALL, ChunkWrite::as_str),
            ),
        ];
        for (table, column, values) in others {
            assert_eq!(check_values(table, column), values, "{table}.{column}");
        }
    }

    #[pg_test]
    fn outbox_and_views_exist() {
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM tide.backfills").unwrap(),
            Some(0)
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM tide.readiness").unwrap(),
            Some(0)
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM tide.pipelines").unwrap(),
            Some(0)
        );
        assert_eq!(
            Spi::get_one::<i64>("SELECT count(*) FROM tide.outbox").unwrap(),
            Some(0)
        );
    }
}

/// Required by `cargo pgrx test`.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    #[must_use]
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![
            "shared_preload_libraries = 'pg_tide'",
            "wal_level = logical",
            // Only the test database: the launchers of others (postgres) would find no
            // extension and leave, but need not start at all.
            "tide.database = 'pgrx_tests'",
            "max_replication_slots = 10",
            "max_worker_processes = 20",
        ]
    }
}
