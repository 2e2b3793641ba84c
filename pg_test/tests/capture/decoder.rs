//! The decoder: one decoding session per worker, which reads each WAL record once and does not
//! decode the worker's own writes; a huge transaction spills to a temporary file and arrives
//! whole; what the WAL reader allocates stays in the decoding session's memory.

use crate::common::*;
use std::time::{Duration, Instant};

/// Bytes the process has read through read(2) and friends (`rchar` of /proc/PID/io): the WAL
/// the worker decodes is read that way.
fn read_bytes(pid: i32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/io (run the tests as root): {e}"));
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no rchar in /proc/{pid}/io: {io}"))
}

fn current_lsn_bytes(c: &Cluster) -> i64 {
    c.query_scalar::<i64>("SELECT (pg_current_wal_lsn() - '0/0')::int8")
}

/// The worker reads each WAL record once. A decoding call per iteration (what pg_tide did
/// before it kept its decoding session open) starts at the slot's restart point every time,
/// which stays behind a large transaction until the next running-transactions record (up to
/// 15 s): this test measures the worker's reads while such a transaction lies between the
/// restart point and the stream, and would see gigabytes instead of megabytes.
#[test]
fn decoder_reads_wal_once() {
    let c = setup("read_once");
    c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)");
    c.execute("CREATE TABLE noise (id int, pad text)");
    capture_table(&c, "p", "t");
    let pid = worker_pid(&c, "p").expect("worker pid");
    // The slot is held by the worker for as long as it streams.
    let active: Option<i32> =
        c.query_scalar("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'tide_5_p'");
    assert_eq!(active, Some(pid), "the worker holds its slot");

    // ~40 MB of WAL the pipeline does not capture, in one transaction.
    c.execute("INSERT INTO noise SELECT g, repeat('x', 300) FROM generate_series(1, 100000) g");
    c.execute("INSERT INTO t VALUES (0, 'after noise')");
    wait_pipeline(&c, "p", 60);

    // Steady small writes for 3 s, then 2 s of nothing.
    let rchar0 = read_bytes(pid);
    let lsn0 = current_lsn_bytes(&c);
    let mut cl = c.client();
    let start = Instant::now();
    let mut n = 1;
    while start.elapsed() < Duration::from_secs(3) {
        cl.execute("INSERT INTO t VALUES ($1, 'row')", &[&n])
            .unwrap();
        n += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_pipeline(&c, "p", 60);
    let written = (current_lsn_bytes(&c) - lsn0).max(0) as u64;
    let rchar1 = read_bytes(pid);
    std::thread::sleep(Duration::from_secs(2));
    let rchar2 = read_bytes(pid);

    let busy = rchar1 - rchar0;
    let idle = rchar2 - rchar1;
    eprintln!(
        "{n} transactions, {written} bytes of WAL written; the worker read {busy} bytes while \
         they streamed and {idle} bytes in 2 s idle"
    );
    assert!(
        busy < 4 * written + (4 << 20),
        "the worker read {busy} bytes for {written} bytes of WAL: it re-reads WAL\n{}",
        diag(&c)
    );
    assert!(
        idle < (1 << 20),
        "an idle worker read {idle} bytes in 2 s\n{}",
        diag(&c)
    );
    let delivered: i64 = c.query_scalar(
        "SELECT count(DISTINCT (row->>'id')) FROM tide.outbox WHERE pipeline = 'p' AND relation = 'public.t'",
    );
    assert_eq!(delivered, n as i64, "every row of t delivered");
    assert_stream_invariants(&c, "p");
}

/// One source transaction larger than `logical_decoding_work_mem` goes through a temporary
/// file and arrives whole, in order, exactly once; the file is removed afterwards.
#[test]
fn huge_transaction_spills_and_arrives_whole() {
    let c = Cluster::builder("spill")
        .conf("logical_decoding_work_mem = '64kB'")
        .conf("tide.decoding_work_mem = '64kB'")
        .start();
    init_extension(&c);
    c.execute("CREATE TABLE big (id int PRIMARY KEY, pad text)");
    capture_table(&c, "p", "big");
    c.execute("INSERT INTO big SELECT g, repeat(md5(g::text), 3) FROM generate_series(1, 20000) g");
    c.execute("UPDATE big SET pad = 'small' WHERE id % 2 = 0");
    wait_pipeline(&c, "p", 120);

    assert!(
        c.log_count("bytes of decoded changes went to a temporary file") >= 1,
        "the decoded output did not spill (logical_decoding_work_mem = 64kB)\n{}",
        diag(&c)
    );
    let per_txn: Vec<(i64, i64, i64)> = c
        .query(
            "SELECT count(*), count(DISTINCT row->>'id'), min(position)::int8
               FROM tide.outbox WHERE pipeline = 'p' AND relation = 'public.big'
              GROUP BY commit_lsn ORDER BY commit_lsn",
        )
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        per_txn.len(),
        2,
        "two source transactions, two groups: {per_txn:?}"
    );
    assert_eq!(per_txn[0].0, 20000, "insert transaction: {per_txn:?}");
    assert_eq!(per_txn[0].1, 20000);
    assert_eq!(per_txn[1].0, 10000, "update transaction: {per_txn:?}");
    assert_stream_invariants(&c, "p");
    let ids_in_order: bool = c.query_scalar(
        "SELECT bool_and(ok) FROM (
           SELECT (row->>'id')::int = row_number() OVER (ORDER BY position) AS ok
             FROM tide.outbox WHERE pipeline = 'p' AND relation = 'public.big' AND op = 'insert') s",
    );
    assert!(ids_in_order, "inserts arrive in the order they were made");
    let left: i64 =
        c.query_scalar("SELECT count(*) FROM pg_ls_tmpdir() WHERE name LIKE 'pgsql_tmp_pg_tide%'");
    assert_eq!(left, 0, "temporary files left behind");
}

/// A worker does not decode what it wrote itself: once the output plugin knows the worker's
/// replication origin (from its first transaction), the transactions that carry it are dropped
/// before decoding (`filter_by_origin`), so a local table target's backfill does not make its
/// own slot decode every row it writes. Measured with the slot's statistics: `total_bytes` is
/// what decoding handed to the output plugin. Without the filter every chunk's rows counted
/// (4.4 MB here, for a 12.9 MB target); with it 27 kB (the watermarks and the streamed rows;
/// at most the first chunk's rows, were the origin learnt only then).
#[test]
fn own_writes_are_not_decoded() {
    let c = setup("own_writes");
    c.execute(
        "CREATE TABLE t (id int PRIMARY KEY, pad text);
         INSERT INTO t SELECT g, repeat(md5(g::text), 6) FROM generate_series(1, 50000) g;",
    );
    pg_test::create_pipeline(&c, "l", "table", r#"{"schema": "rep"}"#);
    exec(&c, "SELECT tide.add_table('l', 't', backfill => false)");
    exec(
        &c,
        "SELECT tide.start_backfill('t', 'l', chunk_size => 5000)",
    );
    wait_backfill(&c, "t", "l", 120);
    // And rows through the stream: they are decoded (they are the source's).
    c.execute("INSERT INTO t SELECT g, 'streamed' FROM generate_series(50001, 50100) g");
    wait_pipeline(&c, "l", 60);
    let target_bytes: i64 = c.query_scalar("SELECT pg_total_relation_size('rep.t')::int8");
    let decoded: i64 = c.query_scalar(
        "SELECT total_bytes::int8 FROM pg_stat_replication_slots WHERE slot_name = 'tide_5_l'",
    );
    eprintln!("the target holds {target_bytes} bytes; the slot decoded {decoded} bytes");
    let rows: i64 = c.query_scalar("SELECT count(*) FROM rep.t");
    assert_eq!(rows, 50100, "every row at the target");
    assert!(
        decoded > 0,
        "the slot decoded nothing: its statistics are not what this test reads"
    );
    assert!(
        decoded < target_bytes / 20,
        "the slot decoded {decoded} bytes for a target of {target_bytes} bytes written by the \
         worker itself: it decodes its own writes\n{}",
        diag(&c)
    );
}

/// What the WAL reader allocates after the decoder replayed a transaction, in the same read,
/// lives as long as the decoding session, not as long as the worker's iteration. Replaying a
/// committed transaction leaves the iteration's transaction memory context current (PostgreSQL
/// ends the replay's internal subtransaction there); the reader then grew its record buffer for
/// the 300 kB logical message in the iteration's TopTransactionContext, and that buffer dangled
/// once the iteration committed: the reader frees it again when a longer record needs a longer
/// buffer, or when the decoder closes. That is a free of freed memory, which corrupts the
/// process's memory silently or crashes it (the upgrade suite's workers segfaulted over and
/// over). Checked where it is deterministic: the buffer's size in the decoding context, from
/// `pg_log_backend_memory_contexts`; then the longer record, the close, and no crash.
/// Pausing first puts the insert's commit and the message in one read.
#[test]
fn records_read_after_a_replay_outlive_the_iteration() {
    let c = setup("after_replay");
    c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)");
    capture_table(&c, "p", "t");
    // Paused, and its decoder closed: the next read, after the resume, starts behind all of it.
    let pause = || {
        c.execute("SELECT tide.pause_pipeline('p')");
        c.wait_until(
            "the paused worker to release its slot",
            Duration::from_secs(60),
            POLL,
            || {
                Ok(c.try_query_scalar::<bool>(
                    "SELECT (SELECT state = 'paused' FROM tide.pipelines WHERE name = 'p')
                        AND (SELECT active_pid IS NULL FROM pg_replication_slots
                              WHERE slot_name = 'tide_5_p')",
                )?)
            },
        );
    };
    pause();
    // One read after the resume: the insert's commit (replayed), then a record spanning pages,
    // longer than the reader's buffer so far.
    c.execute("INSERT INTO t VALUES (1, 'a')");
    c.execute("SELECT pg_logical_emit_message(false, 'pg_tide_test', repeat('x', 300000))");
    c.execute("SELECT tide.resume_pipeline('p')");
    wait_pipeline(&c, "p", 60);
    // The reader's buffer for that record (303,104 bytes: the record rounded up to whole WAL
    // pages) is the decoding context's, which the open decoder still holds; without the switch
    // back it was allocated in the iteration's TopTransactionContext (seen with gdb) and this
    // context held only the reader's first buffers (about 120 kB).
    let pid = worker_pid(&c, "p").expect("the worker runs");
    c.execute(&format!("SELECT pg_log_backend_memory_contexts({pid})"));
    let needle = "Logical decoding context: ";
    c.wait_until(
        "the worker's memory contexts in the log",
        Duration::from_secs(30),
        POLL,
        || Ok(c.log_count(needle) > 0),
    );
    let log = c.log();
    let line = log.lines().find(|l| l.contains(needle)).unwrap_or_default();
    let total: u64 = line
        .split(needle)
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no total in {line:?}"));
    assert!(
        total >= 303_104,
        "the WAL reader's buffer is not in the decoding context ({total} bytes): {line}"
    );
    // A longer record, in a later iteration: the reader frees its buffer to grow it.
    c.execute("SELECT pg_logical_emit_message(false, 'pg_tide_test', repeat('y', 900000))");
    c.execute("INSERT INTO t VALUES (2, 'b')");
    wait_pipeline(&c, "p", 60);
    // The decoder closes (freeing the reader) at the pause.
    pause();
    c.execute("SELECT tide.resume_pipeline('p')");
    c.execute("INSERT INTO t VALUES (3, 'c')");
    wait_pipeline(&c, "p", 60);
    assert_eq!(events(&c, "p", "public.t"), inserts(1..=3), "{}", diag(&c));
    assert_eq!(
        c.log_count("terminated by signal"),
        0,
        "a process crashed\n{}",
        diag(&c)
    );
    assert_eq!(
        c.log_count("could not close its decoder"),
        0,
        "the decoder did not close cleanly\n{}",
        diag(&c)
    );
    assert_stream_invariants(&c, "p");
}
