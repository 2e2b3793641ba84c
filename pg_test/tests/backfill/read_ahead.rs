//! Read-ahead: a backfilling worker's reader process (`backend_type = 'pg_tide reader'`) reads
//! the next chunk while the worker writes the current one. It appears while a backfill runs and
//! goes away after; it survives nothing the worker does not (a kill -9 of it restarts the
//! server, and the backfill converges all the same); with `tide.read_ahead = off` (a reload stops
//! a running reader), or no free background worker slot, the worker reads every chunk itself.

use crate::common::*;
use std::time::{Duration, Instant};

const READER: &str = "pg_tide reader";

fn readers(c: &Cluster) -> i64 {
    c.query_scalar::<i64>(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = '{READER}'"
    ))
}

/// A table of `n` rows and its outbox replay copy.
fn table(c: &Cluster, n: i64) {
    c.execute(&format!(
        "CREATE TABLE ra (id int PRIMARY KEY, v int NOT NULL, s text);
         INSERT INTO ra SELECT g, g, repeat('x', 50) || g FROM generate_series(1, {n}) g;"
    ));
    outbox_copy_keyed(c, "ra", "public.ra", "copy_ra", &["id"]);
}

/// Writes on keys spread over the table, the chunk being read among them.
fn write_round(c: &Cluster, round: i64) {
    c.execute(&format!(
        "UPDATE ra SET v = v + 1, s = 'u{round}' WHERE id % 53 = {round} % 53;
         DELETE FROM ra WHERE id % 97 = {round} % 97;
         INSERT INTO ra VALUES (100000 + {round}, {round}, 'new') ON CONFLICT (id) DO UPDATE SET v = excluded.v;"
    ));
}

/// The reader shows up while the backfill runs, the writes during it converge, every chunk is
/// counted once in order (invariants), and the reader is gone once no backfill is due, having
/// left without a FATAL.
#[test]
fn the_reader_reads_ahead_while_a_backfill_runs() {
    let c = setup("bf_readahead");
    table(&c, 60_000);
    create_pipeline(&c, "ra");
    add_table(&c, "ra", "ra", false);
    let id: i64 = c.query_scalar("SELECT tide.start_backfill('ra', 'ra', chunk_size => 1000)");
    let mut seen = 0;
    let mut round = 0;
    let started = Instant::now();
    while bf_state(&c, id) != "done" && started.elapsed() < Duration::from_secs(120) {
        seen = seen.max(readers(&c));
        write_round(&c, round);
        round += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_backfill(&c, "ra", 60);
    wait_pipeline(&c, "ra", 60);
    assert_eq!(seen, 1, "one reader while the backfill ran\n{}", diag(&c));
    replay(&c, "copy_ra", "ra", false);
    assert_converged(&c, "public.ra", "copy_ra");
    check_backfill_invariants(&c, id);
    if let Err(msg) = poll_every(Duration::from_secs(10), POLL, || Ok(readers(&c) == 0)) {
        panic!("the reader stayed after the backfill: {msg}\n{}", diag(&c));
    }
    // It left normally (issue 43, item 8): no FATAL "terminating background worker ... due to
    // administrator command" for a reader whose backfill ended.
    assert_eq!(
        c.log_count("terminating background worker \"pg_tide reader"),
        0,
        "the reader was terminated at the end of its backfill:\n{}",
        c.log_tail(30)
    );
}

/// kill -9 of the reader while it reads: PostgreSQL restarts every process (as for any backend
/// killed so), the worker comes back and finishes the backfill, which converges.
#[test]
fn kill9_of_the_reader_restarts_and_converges() {
    let c = setup("bf_readahead_kill");
    table(&c, 100_000);
    create_pipeline(&c, "ra");
    add_table(&c, "ra", "ra", false);
    let id: i64 = c.query_scalar("SELECT tide.start_backfill('ra', 'ra', chunk_size => 500)");
    let pid: i32 = match poll_every(Duration::from_secs(60), Duration::from_millis(10), || {
        Ok(c.try_query_scalar::<i32>(&format!(
            "SELECT coalesce((SELECT pid FROM pg_stat_activity WHERE backend_type = '{READER}'), 0)"
        ))? != 0)
    }) {
        Ok(_) => c.query_scalar(&format!(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = '{READER}'"
        )),
        Err(msg) => panic!("no reader appeared: {msg}\n{}", diag(&c)),
    };
    write_round(&c, 1);
    let worker = worker_pid(&c, "ra");
    kill9(pid);
    wait_recovered(&c, "ra", worker, Duration::from_secs(60), || diag(&c));
    for round in 2..6 {
        write_round(&c, round);
    }
    wait_backfill(&c, "ra", 120);
    wait_pipeline(&c, "ra", 60);
    replay(&c, "copy_ra", "ra", false);
    assert_converged(&c, "public.ra", "copy_ra");
    assert_eq!(bf_state(&c, id), "done");
}

/// Without a free background worker slot for a reader, the worker reads every chunk itself and
/// says why in the server log.
#[test]
fn without_a_slot_the_worker_reads_itself() {
    // Slots: the logical replication launcher, pg_tide's supervisor, the database's launcher,
    // the pipeline's worker; none left for a reader.
    let c = start_cluster(Cluster::builder("bf_noreader").conf("max_worker_processes = 4"));
    init_extension(&c);
    table(&c, 20_000);
    create_pipeline(&c, "ra");
    add_table(&c, "ra", "ra", false);
    let id: i64 = c.query_scalar("SELECT tide.start_backfill('ra', 'ra', chunk_size => 1000)");
    write_round(&c, 1);
    wait_backfill(&c, "ra", 120);
    wait_pipeline(&c, "ra", 60);
    replay(&c, "copy_ra", "ra", false);
    assert_converged(&c, "public.ra", "copy_ra");
    check_backfill_invariants(&c, id);
    assert!(
        c.log_count("no background worker slot is free for a pg_tide reader") >= 1,
        "the log says why there is no reader\n{}",
        c.log_tail(30)
    );
}

/// `tide.read_ahead` turned off by a reload while a backfill runs with a reader: the reader goes
/// away before the backfill ends, the worker reads the rest itself, and a later backfill starts
/// none; the result converges all the same. (The backfill is held meanwhile by a lock on the
/// table, which makes every chunk read wait: the reader stays, idle, until the setting is off.)
#[test]
fn read_ahead_off_stops_the_reader() {
    let c = setup("bf_readahead_off");
    table(&c, 100_000);
    create_pipeline(&c, "ra");
    add_table(&c, "ra", "ra", false);
    let id: i64 = c.query_scalar("SELECT tide.start_backfill('ra', 'ra', chunk_size => 100)");
    if let Err(msg) = poll_every(Duration::from_secs(60), Duration::from_millis(5), || {
        Ok(readers(&c) == 1)
    }) {
        panic!("no reader appeared: {msg}\n{}", diag(&c));
    }
    // (a test's own connection: an error here is the test's failure)
    let mut lock = c.client();
    lock.batch_execute("BEGIN; LOCK TABLE ra IN ACCESS EXCLUSIVE MODE")
        .expect("lock the table");
    assert_eq!(
        bf_state(&c, id),
        "running",
        "the backfill ended before the table was locked (a larger table is needed)"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        readers(&c),
        1,
        "the reader stays while chunks wait for the lock"
    );
    c.execute("ALTER SYSTEM SET tide.read_ahead = off");
    c.execute("SELECT pg_reload_conf()");
    if let Err(msg) = poll_every(Duration::from_secs(30), Duration::from_millis(20), || {
        Ok(readers(&c) == 0)
    }) {
        panic!(
            "the reader stayed after tide.read_ahead = off: {msg}\n{}",
            diag(&c)
        );
    }
    assert_eq!(
        bf_state(&c, id),
        "running",
        "the backfill still waits for the lock"
    );
    lock.batch_execute("COMMIT").expect("unlock");
    write_round(&c, 2);
    wait_backfill(&c, "ra", 180);
    wait_pipeline(&c, "ra", 60);
    replay(&c, "copy_ra", "ra", false);
    assert_converged(&c, "public.ra", "copy_ra");
    check_backfill_invariants(&c, id);

    c.execute("TRUNCATE ra; INSERT INTO ra SELECT g, g, 'again' FROM generate_series(1, 20000) g;");
    let id2: i64 = c.query_scalar("SELECT tide.start_backfill('ra', 'ra', chunk_size => 1000)");
    let mut seen = 0;
    let started = Instant::now();
    while bf_state(&c, id2) != "done" && started.elapsed() < Duration::from_secs(120) {
        seen = seen.max(readers(&c));
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_backfill(&c, "ra", 60);
    assert_eq!(seen, 0, "no reader with tide.read_ahead = off");
    wait_pipeline(&c, "ra", 60);
    replay(&c, "copy_ra", "ra", false);
    assert_converged(&c, "public.ra", "copy_ra");
}
