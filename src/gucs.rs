//! Every pg_tide setting, one documented static each (prefix `tide.`).

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CStr;

/// `tide.database`: an optional restriction, the comma-separated names of the databases where
/// pipelines may run. Empty (the default): every database where the extension is installed.
/// See [`databases`] and [`database_allowed`].
pub static DATABASE: GucSetting<Option<std::ffi::CString>> =
    GucSetting::<Option<std::ffi::CString>>::new(Some(c""));
/// `tide.poll_interval`: how long (ms) a pipeline worker sleeps when it has read all WAL, before
/// it compares the flush position with its decoder's position again.
pub static POLL_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(10);
/// `tide.batch_events`: events after which a worker closes its target transaction (at the next
/// source-transaction boundary; a source transaction is never split).
pub static BATCH_EVENTS: GucSetting<i32> = GucSetting::<i32>::new(5000);
/// `tide.snapshot_interval`: while a worker is busy, how often (ms) it logs a running-xacts
/// record so that its slot's restart point (where a reopened decoder starts, and up to which WAL
/// is retained) follows.
pub static SNAPSHOT_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// `tide.max_retry_delay`: cap (s) of the exponential back-off after a failed worker iteration.
pub static MAX_RETRY_DELAY_S: GucSetting<i32> = GucSetting::<i32>::new(30);
/// Longest a backfill chunk's SELECT (with its condition) may run, in milliseconds.
pub static CHUNK_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(5000);
/// `tide.outbox_retention`: outbox events of a pipeline without consumers older than this many
/// seconds are deleted by the launcher; 0 or -1 (the default 0) keeps them.
pub static OUTBOX_RETENTION_S: GucSetting<i32> = GucSetting::<i32>::new(0);
/// `tide.outbox_prune_batch`: the most outbox rows the retention deletes per transaction.
pub static OUTBOX_PRUNE_BATCH: GucSetting<i32> = GucSetting::<i32>::new(1000);
/// `tide.read_ahead`: a pipeline worker that backfills has a helper process read the next chunk
/// while it writes the current one (see `worker::backfill::read_ahead`).
pub static READ_AHEAD: GucSetting<bool> = GucSetting::<bool>::new(true);
/// `tide.max_parallel_backfills`: the most backfills of one pipeline that run at once (each with
/// a chunk of its own in the worker's memory, waiting for its high watermark; see
/// `worker::backfill`). 1 reads the pipeline's backfills one after the other.
pub static MAX_PARALLEL_BACKFILLS: GucSetting<i32> = GucSetting::<i32>::new(4);
/// `tide.max_backfill_readers`: how many reader processes a backfilling pipeline worker has
/// (`worker::backfill::read_ahead`); with more than one, the next chunks of one table are read at once, on
/// key ranges planned ahead (`worker::backfill::ranges`), and several backfills' chunks at once.
pub static MAX_BACKFILL_READERS: GucSetting<i32> = GucSetting::<i32>::new(1);
/// `tide.streaming_chunk_size`: the most rows a backfill's chunk reads while its pipeline's
/// stream applies source changes (any in the last second); 0: no cap. The stream's events wait
/// behind a chunk's write (`worker::backfill`), so shorter chunks then bound their latency.
pub static STREAMING_CHUNK_SIZE: GucSetting<i32> =
    GucSetting::<i32>::new(DEFAULT_STREAMING_CHUNK_SIZE);
/// The default of [`STREAMING_CHUNK_SIZE`].
pub const DEFAULT_STREAMING_CHUNK_SIZE: i32 = 1000;
/// `tide.stream_in_progress`: whether a worker's decoder asks the output plugin to stream
/// transactions larger than `logical_decoding_work_mem` while they run (spooled by the worker
/// until their commit) instead of having PostgreSQL hold them until their commit.
pub static STREAM_IN_PROGRESS: GucSetting<bool> = GucSetting::<bool>::new(true);
/// `tide.remote_stream_connections`: how many streamed transactions a remote target's worker
/// writes at once, while they run, each into a remote transaction of its own on a connection
/// of its own (see `worker::stream_apply`); 0: every one is applied at its commit.
pub static REMOTE_STREAM_CONNECTIONS: GucSetting<i32> = GucSetting::<i32>::new(2);
/// `tide.fail_stream_blocks` (fault injection, for tests; off): a worker's decoder refuses every
/// streamed block it receives, as if it could not read it, so the way out of such a failure
/// (`Worker::no_stream_until`: reading again without streaming) can be shown.
pub static FAIL_STREAM_BLOCKS: GucSetting<bool> = GucSetting::<bool>::new(false);
/// `tide.max_pipelines_per_role`: the most pipelines one role may own in all databases together (superusers are not
/// limited); -1 (the default) is a quarter of `max_replication_slots`, at least 1, so one role
/// cannot take every slot. See [`max_pipelines_per_role`].
pub static MAX_PIPELINES_PER_ROLE: GucSetting<i32> = GucSetting::<i32>::new(-1);
/// `tide.max_workers_per_role`: the most background processes pg_tide runs at once for one
/// role's pipelines, in all databases together (pipeline workers and backfill readers;
/// superusers are not limited); -1 (the default): see [`max_workers_per_role`].
pub static MAX_WORKERS_PER_ROLE: GucSetting<i32> = GucSetting::<i32>::new(-1);
/// `tide.max_paused_wal_size`: the most WAL (MB) a paused pipeline's slot may retain; past it the
/// slot is dropped and the pipeline fails with the remedy, instead of filling the disk. -1: no
/// limit.
pub static MAX_PAUSED_WAL_MB: GucSetting<i32> = GucSetting::<i32>::new(8192);
/// `tide.target_lease`: how long (s) a remote target stays its writer's after the writer last
/// renewed its lease there (every commit, and at least every third of this while idle, paused or
/// failing); another server's pipeline of the same name takes the target over only once it
/// lapsed, or by `tide.claim_target` (see `target::table::fence`).
pub static TARGET_LEASE_S: GucSetting<i32> = GucSetting::<i32>::new(30);

/// What a pipeline worker does when its slot is lost (invalidated, missing, or not pg_tide's):
/// see `catalog::slots` and README, Concepts > Lost slots.
#[derive(pgrx::PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum OnSlotLost {
    /// Create a new slot and read every table again (the default).
    #[name = c"resync"]
    Resync,
    /// Stop with the error and its remedy until the setting changes or the pipeline is dropped.
    #[name = c"error"]
    Error,
}
/// `tide.on_slot_lost`: `resync` (the default) or `error`.
pub static ON_SLOT_LOST: GucSetting<OnSlotLost> = GucSetting::<OnSlotLost>::new(OnSlotLost::Resync);
/// `tide.failover_slots`: whether pg_tide creates its slots as failover slots (PostgreSQL 17 and
/// later: `pg_create_logical_replication_slot(..., failover => true)`, so that a physical standby
/// with `sync_replication_slots = on` keeps them; no effect before 17). Read when a slot is
/// created; a slot keeps what it was created with (docs/high-availability.md).
pub static FAILOVER_SLOTS: GucSetting<bool> = GucSetting::<bool>::new(true);
/// `tide.slot_warning_size`: `tide.pipelines.slot_warning` warns when a slot is within this much
/// WAL (MB) of being invalidated (`max_slot_wal_keep_size`) or dropped
/// (`tide.max_paused_wal_size`). Read by the view through `current_setting`.
pub static SLOT_WARNING_MB: GucSetting<i32> = GucSetting::<i32>::new(1024);

/// `tide.decoding_work_mem` (kB): what a pipeline worker's reorder buffer may hold before it
/// spills a transaction to disk (or streams it), in place of `logical_decoding_work_mem`
/// for the worker's own decoding; -1: `logical_decoding_work_mem` itself. See
/// `worker::decoder`.
pub static DECODING_WORK_MEM_KB: GucSetting<i32> = GucSetting::<i32>::new(32 * 1024);
/// `tide.spool_file_limit` (kB): the most a pipeline worker's temporary files (its decoded
/// output past 8 MB, its streamed transactions' spools) may hold at once; -1 (the default): the
/// same as `temp_file_limit` (which does not count them: they are not PostgreSQL's temporary
/// files), itself -1 (no limit) by default. See [`spool_file_limit`] and `worker::decoder`.
pub static SPOOL_FILE_LIMIT_KB: GucSetting<i32> = GucSetting::<i32>::new(-1);

/// The limit in bytes of a worker's temporary files now ([`SPOOL_FILE_LIMIT_KB`], or
/// `temp_file_limit` for -1), with the setting that set it; `None`: no limit.
pub fn spool_file_limit() -> Option<(u64, &'static str)> {
    let own = SPOOL_FILE_LIMIT_KB.get();
    if own >= 0 {
        return Some((own as u64 * 1024, "tide.spool_file_limit"));
    }
    // SAFETY: a lookup by a static name of a setting every server has (an integer in kB, as
    // text); the string is read at once.
    let kb = unsafe {
        let v = pgrx::pg_sys::GetConfigOption(c"temp_file_limit".as_ptr(), true, false);
        if v.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(v)
            .to_str()
            .ok()
            .and_then(|t| t.parse::<i64>().ok())
    };
    match kb {
        Some(kb) if kb >= 0 => Some((kb as u64 * 1024, "temp_file_limit")),
        _ => None,
    }
}

/// The settings of backfills: `tide.read_ahead`, `tide.max_parallel_backfills`,
/// `tide.max_backfill_readers`, `tide.streaming_chunk_size`.
fn init_backfill_settings() {
    GucRegistry::define_bool_guc(
        c"tide.read_ahead",
        c"Whether a backfilling pipeline worker has a helper process read its next chunk.",
        c"The helper (backend_type 'pg_tide reader', tide.max_backfill_readers of them per backfilling pipeline, from max_worker_processes) reads the next chunk while the worker writes the current one. Off, or when no background worker slot is free, the worker reads every chunk itself.",
        &READ_AHEAD,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tide.max_parallel_backfills",
        c"The most backfills of one pipeline that run at once.",
        c"With one reader, each running backfill has at most one chunk in the pipeline worker's memory, waiting for its high watermark: the worker reads the next chunk of each between stream iterations, and one iteration writes every chunk whose high watermark it reaches. More backfills wait queued, oldest first; a throttled one keeps its place, a paused one takes none. 1: one backfill at a time.",
        &MAX_PARALLEL_BACKFILLS,
        1,
        64,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tide.max_backfill_readers",
        c"How many reader processes a backfilling pipeline worker reads chunks with.",
        c"With tide.read_ahead on, each reader is a background worker (max_worker_processes) that reads a chunk, under watermarks of its own, while the worker writes others. With more than one, the worker plans the key ranges of a table's next chunks ahead and has them read at once (still written in key order), and several backfills' chunks at once: use more than one on a machine with cores to spare. Repairs, resyncs and throttled backfills read one chunk at a time.",
        &MAX_BACKFILL_READERS,
        1,
        16,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tide.streaming_chunk_size",
        c"The most rows a backfill chunk reads while the pipeline's stream applies source changes.",
        c"The stream's events committed while a chunk is written wait for that write: while the pipeline applied source changes in the last second, chunks read at most this many rows (whatever the backfill's chunk_size), trading backfill speed for the stream's latency. 0: always the backfill's chunk_size.",
        &STREAMING_CHUNK_SIZE,
        0,
        10_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

pub fn init() {
    init_slot_settings();
    init_target_settings();
    init_memory_settings();
    init_backfill_settings();
    init_stream_settings();
    GucRegistry::define_string_guc(
        c"tide.database",
        c"Databases where pg_tide runs pipelines: a comma-separated list; empty means every database.",
        c"Empty (the default): pipelines run in every database where the extension is installed. A list restricts them to the databases named (a name with a comma or spaces in double quotes). A reload applies a change: the launchers of databases no longer listed stop with their workers, those newly listed start.",
        &DATABASE,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tide.poll_interval",
        c"Milliseconds a pipeline worker waits when it has read all WAL.",
        c"After the wait it compares the WAL flush position with its own (no transaction, no query). Lower values lower the commit-to-target latency.",
        &POLL_INTERVAL_MS,
        1,
        60_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tide.chunk_timeout",
        c"Longest a backfill chunk's SELECT may run before the backfill fails.",
        c"The stream waits while a chunk is read, so a slow condition must not hold it: past this time the chunk is cancelled and the backfill fails with the reason. Raise it, or give the condition an index, for very selective conditions on large tables.",
        &CHUNK_TIMEOUT_MS,
        10,
        3_600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tide.batch_events",
        c"Events after which a pipeline worker commits its target transaction.",
        c"The worker commits at the next source transaction boundary after this many events; a source transaction is never split.",
        &BATCH_EVENTS,
        1,
        10_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tide.snapshot_interval",
        c"While a pipeline worker is busy, how often it logs a running-transactions record.",
        c"The slot's restart point (where a reopened decoder starts, and up to which WAL is retained) only moves at such records; logging one keeps it within about this interval of the worker.",
        &SNAPSHOT_INTERVAL_MS,
        1,
        600_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_int_guc(
        c"tide.outbox_retention",
        c"Age after which outbox events of a pipeline without consumers are deleted.",
        c"0 or -1 (the default 0) keeps them until you delete them. Events of a pipeline with consumers are deleted once every consumer has committed them, whatever their age.",
        &OUTBOX_RETENTION_S,
        -1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"tide.outbox_prune_batch",
        c"The most outbox events the retention deletes in one transaction.",
        c"The launcher deletes in batches of this size, one transaction each, so no deletion holds a long transaction.",
        &OUTBOX_PRUNE_BATCH,
        1,
        1_000_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tide.max_pipelines_per_role",
        c"The most pipelines one role may own, in all databases together; -1 is a quarter of max_replication_slots.",
        c"Each pipeline takes a replication slot, an origin and a worker, all server-wide. The limit keeps one role from taking them all; superusers are not limited. -1 (the default): max_replication_slots / 4, at least 1.",
        &MAX_PIPELINES_PER_ROLE,
        -1,
        10_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tide.max_workers_per_role",
        c"The most background processes pg_tide runs at once for one role's pipelines; -1 is a quarter of max_worker_processes.",
        c"Counted in all databases together: each pipeline's worker and its backfill readers. create_pipeline refuses a pipeline past it; a worker reads its chunks itself rather than start a reader past it. Superusers are not limited. -1 (the default): max_worker_processes / 4, but at least one more than the role's tide.max_pipelines_per_role.",
        &MAX_WORKERS_PER_ROLE,
        -1,
        10_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tide.max_paused_wal_size",
        c"The most WAL a paused pipeline's slot may retain before it is dropped; -1 means no limit.",
        c"A paused pipeline's slot keeps every change since the pause. Past this size the worker drops the slot (as max_slot_wal_keep_size invalidates one) and records the error with its remedy in tide.pipelines.",
        &MAX_PAUSED_WAL_MB,
        -1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
    GucRegistry::define_int_guc(
        c"tide.max_retry_delay",
        c"Longest back-off, in seconds, after a failed pipeline iteration.",
        c"A failed iteration is retried after a delay that doubles with each failure in a row, up to this many seconds; a success resets it.",
        &MAX_RETRY_DELAY_S,
        1,
        3600,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
}

/// The settings about large transactions in progress (README, Concepts > Large transactions).
fn init_stream_settings() {
    GucRegistry::define_bool_guc(
        c"tide.stream_in_progress",
        c"Whether pipeline workers receive large transactions while they run.",
        c"On: a transaction larger than tide.decoding_work_mem reaches the worker in blocks while it runs; the worker keeps it in a temporary file of its own and applies it at its commit, so the decoding work is done before the commit (a remote target also writes it to the remote while it runs: tide.remote_stream_connections). Off: PostgreSQL holds it (spilling to pg_replslot) until its commit. A change applies when a worker next opens its decoder.",
        &STREAM_IN_PROGRESS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tide.remote_stream_connections",
        c"How many streamed transactions a remote target's pipeline worker writes to the remote while they run.",
        c"With tide.stream_in_progress on, the blocks of a large transaction in progress are written into a remote transaction of their own, on a second connection per transaction, left open until the source commits (then committed with the applied position) or rolls back. Past this many at once, or after a conflict, a transaction is applied at its commit from the worker's temporary file. 0: every one is. A change applies when a worker next opens its decoder.",
        &REMOTE_STREAM_CONNECTIONS,
        0,
        64,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"tide.fail_stream_blocks",
        c"Fault injection, for tests: pipeline workers refuse every streamed block they receive.",
        c"Each refusal fails the worker's iteration as an unreadable stream would; the worker then reads again without streaming transactions in progress until it is past that point. Leave off.",
        &FAIL_STREAM_BLOCKS,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

/// The settings that bound a worker's memory (README, Concepts > Large transactions).
fn init_memory_settings() {
    GucRegistry::define_int_guc(
        c"tide.decoding_work_mem",
        c"Memory a pipeline worker's decoding may hold of transactions in progress; -1 uses logical_decoding_work_mem.",
        c"A pipeline worker decodes the WAL itself: its reorder buffer holds the changes of transactions in progress up to this much (PostgreSQL's logical_decoding_work_mem for walsenders), then hands the largest to the worker in blocks (tide.stream_in_progress) or writes it to disk under pg_replslot. With the worker's other buffers (8MB of decoded output, up to 8MB per streamed transaction's spool, what a target buffers), this bounds its memory whatever the size of a source transaction.",
        &DECODING_WORK_MEM_KB,
        -1,
        i32::MAX / 1024,
        GucContext::Sighup,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"tide.spool_file_limit",
        c"Most disk space a pipeline worker's temporary files may hold at once; -1 uses temp_file_limit.",
        c"A pipeline worker keeps decoded output past 8MB, and each streamed transaction in progress past 8MB, in files under base/pgsql_tmp, which temp_file_limit does not count. Past this limit the worker's iteration fails with SQLSTATE 53400 (shown in tide.pipelines, nothing is lost: the slot keeps the changes) and is retried; raise the setting and reload to let it through. A streamed transaction needs about twice its decoded size at its commit (its spool, copied into the output). -1: temp_file_limit's value (no limit when that is -1).",
        &SPOOL_FILE_LIMIT_KB,
        -1,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_KB,
    );
}

/// The settings of remote targets' ownership (README, Concepts > One writer per target).
fn init_target_settings() {
    GucRegistry::define_int_guc(
        c"tide.target_lease",
        c"How long a remote PostgreSQL target stays its writer's after the writer last renewed its lease there.",
        c"Every commit at the target renews the lease, and a running, idle, failing or paused worker renews it at least every third of this. A pipeline of the same name on another server (a copy of the source, a restored backup, a promoted standby) writes the target only once the lease lapsed, or after tide.claim_target; until then it stops with SQLSTATE 55006. A failover therefore takes over the target after at most this long.",
        &TARGET_LEASE_S,
        5,
        3600,
        GucContext::Sighup,
        GucFlags::UNIT_S,
    );
}

/// The lease [`TARGET_LEASE_S`] sets.
pub fn target_lease() -> std::time::Duration {
    std::time::Duration::from_secs(TARGET_LEASE_S.get().clamp(5, 3600) as u64)
}

/// The settings about lost slots (README, Concepts > Lost slots).
fn init_slot_settings() {
    GucRegistry::define_enum_guc(
        c"tide.on_slot_lost",
        c"What a pipeline does when its replication slot is lost: resync or error.",
        c"resync: the worker creates a new slot, then reads every table of the pipeline again through the watermark backfill (a table target loses the rows that no longer exist at the source; an outbox gets resync events around the re-read). error: the pipeline stops with the reason and the remedy in tide.pipelines until this setting allows a resync.",
        &ON_SLOT_LOST,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"tide.failover_slots",
        c"Whether pg_tide creates its replication slots as failover slots (PostgreSQL 17 and later).",
        c"On (the default), a slot pg_tide creates on PostgreSQL 17 or later is a failover slot: a physical standby with sync_replication_slots = on keeps it, and the pipeline resumes from it on the promoted standby with no resync. Read when a slot is created (a pipeline's creation, a lost slot's resync): an existing slot stays what it was created as. No effect on PostgreSQL 15 and 16, which have no failover slots.",
        &FAILOVER_SLOTS,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"tide.slot_warning_size",
        c"tide.pipelines.slot_warning warns when a pipeline's slot is within this much WAL of being invalidated or dropped.",
        c"Compared with the slot's safe_wal_size (max_slot_wal_keep_size) and, for a paused pipeline, with what tide.max_paused_wal_size still allows. 0: warn only when the slot is unreserved.",
        &SLOT_WARNING_MB,
        0,
        i32::MAX,
        GucContext::Sighup,
        GucFlags::UNIT_MB,
    );
}

/// The raw `tide.database` setting.
pub fn database() -> String {
    DATABASE
        .get()
        .as_deref()
        .map(CStr::to_string_lossy)
        .map(|s| s.into_owned())
        .unwrap_or_default()
}

/// The databases `tide.database` lists; empty: every database.
pub fn databases() -> Vec<String> {
    tide_core::name_list::split(&database())
}

/// Whether pipelines may run in database `name` (see [`DATABASE`]).
pub fn database_allowed(name: &str) -> bool {
    let list = databases();
    list.is_empty() || list.iter().any(|d| d == name)
}

/// The limit of `tide.max_workers_per_role`: its value, or for -1 a quarter of
/// `max_worker_processes`, at least one more than [`max_pipelines_per_role`] (each pipeline's
/// worker and one reader).
pub fn max_workers_per_role() -> i64 {
    match MAX_WORKERS_PER_ROLE.get() {
        n if n >= 0 => i64::from(n),
        _ => {
            // SAFETY: server settings fixed at start (PGC_POSTMASTER), read-only after.
            let (workers, slots) = unsafe {
                (
                    i64::from(pgrx::pg_sys::max_worker_processes),
                    i64::from(pgrx::pg_sys::max_replication_slots),
                )
            };
            (workers / 4).max(max_pipelines_per_role(slots) + 1)
        }
    }
}

/// The most pipelines one role may own now: `tide.max_pipelines_per_role`, or for -1 a quarter
/// of `max_replication_slots` (at least 1).
/// Counted in all databases together (`crate::quota`).
pub fn max_pipelines_per_role(max_replication_slots: i64) -> i64 {
    match MAX_PIPELINES_PER_ROLE.get() {
        n if n >= 0 => i64::from(n),
        _ => (max_replication_slots / 4).max(1),
    }
}
