//! Pause, immediate restart, resume; then a re-seed.

use crate::common::*;
use std::time::{Duration, Instant};

/// Insert a row into a captured table and wait for the pipeline: proof that the worker runs
/// stream iterations (and so would read backfill chunks if one were due).
fn witness_worker_alive(c: &Cluster, pipeline: &str, table: &str, id: i32) {
    c.execute(&format!("INSERT INTO {table} VALUES ({id}, 0)"));
    wait_pipeline(c, pipeline, 60);
}

#[test]
fn resume_after_restart_and_reseed() {
    const P: &str = "res";
    const ROWS: i64 = 20_000;
    let c = setup("bf_resume");
    c.execute(&format!(
        "CREATE TABLE r1 (id int PRIMARY KEY, v int, s text);
         INSERT INTO r1 SELECT g, g, 'row ' || g FROM generate_series(1, {ROWS}) g;
         CREATE TABLE r2 (id int PRIMARY KEY, v int);
         INSERT INTO r2 SELECT g, g FROM generate_series(1, 3000) g;"
    ));
    create_pipeline(&c, P);
    add_table(&c, P, "r2", true);
    wait_backfill(&c, "r2", 60);
    add_table(&c, P, "r1", false);
    outbox_copy_keyed(&c, "r1", "public.r1", "copy_r1", &["id"]);

    // Small chunks, throttled so that the pause lands mid-way.
    let id = start_backfill_then(
        &c,
        "SELECT tide.start_backfill('r1', 'res', chunk_size => 200)",
        "SELECT tide.alter_backfill('r1', rows_per_second => 2000)",
    );
    c.wait_until(
        "5 chunks of r1",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || Ok(bf_i64(&c, id, "chunks_done") >= 5),
    );
    c.execute("SELECT tide.pause_backfill('r1')");
    let at_pause = bf_i64(&c, id, "rows_emitted");
    assert_eq!(bf_state(&c, id), "paused");
    assert!(
        at_pause < ROWS,
        "the backfill finished before it could be paused"
    );

    // At most the chunk already read is still emitted; then nothing, although the worker runs.
    witness_worker_alive(&c, P, "r2", 100_001);
    let settled = bf_i64(&c, id, "rows_emitted");
    assert!(
        settled <= at_pause + 200,
        "rows_emitted went from {at_pause} to {settled} after the pause: more than the chunk in flight"
    );
    let window = Instant::now();
    while window.elapsed() < Duration::from_millis(1500) {
        assert_eq!(
            bf_i64(&c, id, "rows_emitted"),
            settled,
            "a paused backfill emitted rows"
        );
        std::thread::sleep(POLL);
    }
    witness_worker_alive(&c, P, "r2", 100_002);
    assert_eq!(
        bf_i64(&c, id, "rows_emitted"),
        settled,
        "a paused backfill emitted rows"
    );
    let chunks_at_pause = bf_i64(&c, id, "chunks_done");
    let outbox_at_pause: i64 = c.query_scalar("SELECT max(id) FROM tide.outbox");

    // Immediate shutdown (a crash for the server) and start: still paused, nothing lost or redone.
    let old = worker_pid(&c, P);
    c.stop(StopMode::Immediate);
    c.start();
    wait_recovered(&c, P, old, Duration::from_secs(90), || diag(&c));
    assert_eq!(
        bf_state(&c, id),
        "paused",
        "the pause did not survive the restart"
    );
    witness_worker_alive(&c, P, "r2", 100_003);
    assert_eq!(bf_i64(&c, id, "rows_emitted"), settled);
    assert_eq!(bf_i64(&c, id, "chunks_done"), chunks_at_pause);

    // Resume (unthrottled): it continues from the chunk after the last one emitted.
    c.execute("SELECT tide.alter_backfill('r1', rows_per_second => 0)");
    let rps: Option<i32> = c.query_scalar(&format!(
        "SELECT rows_per_second FROM tide.backfills WHERE id = {id}"
    ));
    assert_eq!(rps, None, "rows_per_second => 0 should remove the throttle");
    c.execute("SELECT tide.resume_backfill('r1')");
    let st = bf_state(&c, id);
    assert!(
        st == "queued" || st == "running" || st == "done",
        "state after resume: {st}"
    );
    wait_backfill(&c, "r1", 120);
    let max_reads = check_backfill_invariants(&c, id);
    assert_eq!(
        max_reads, 1,
        "a key was emitted twice without any write to r1"
    );
    let (chunks, read, dropped, emitted) = (
        bf_i64(&c, id, "chunks_done"),
        bf_i64(&c, id, "rows_read"),
        bf_i64(&c, id, "rows_dropped"),
        bf_i64(&c, id, "rows_emitted"),
    );
    eprintln!(
        "resume: paused at {at_pause} rows ({chunks_at_pause} chunks, settled {settled}); finished with {chunks} chunks, \
         {read} read, {dropped} dropped, {emitted} emitted"
    );
    assert_eq!((read, dropped, emitted), (ROWS, 0, ROWS));
    assert!(
        chunks == ROWS / 200 || chunks == ROWS / 200 + 1,
        "{chunks} chunks for {ROWS} rows in chunks of 200"
    );
    let first_after: i64 = c.query_scalar(&format!(
        "SELECT min(chunk) FROM tide.outbox WHERE backfill_id = {id} AND id > {outbox_at_pause}"
    ));
    assert_eq!(
        first_after,
        chunks_at_pause + 1,
        "the resumed backfill did not continue after the last chunk"
    );
    replay(&c, "copy_r1", P, false);
    assert_converged(&c, "r1", "copy_r1");

    // Re-seed: generation 2 re-emits every row; the other table's backfill is untouched.
    let r2_before: String = c.query_scalar(
        "SELECT row_to_json(b)::text FROM tide.backfill b WHERE relid = 'r2'::regclass",
    );
    let r2_reads: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE relation = 'public.r2' AND op = 'read'",
    );
    let id2: i64 = c.query_scalar("SELECT tide.start_backfill('r1')");
    assert!(id2 > id);
    wait_backfill(&c, "r1", 120);
    let gens: Vec<(i64, i32, String)> = c
        .query("SELECT id, generation, state FROM tide.backfills WHERE source = 'r1'::regclass ORDER BY id")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        gens,
        vec![(id, 1, "done".to_string()), (id2, 2, "done".to_string())]
    );
    check_backfill_invariants(&c, id2);
    let (n, keys): (i64, i64) = {
        let r = c.query_one(&format!(
            "SELECT count(*), count(DISTINCT key) FROM tide.outbox WHERE backfill_id = {id2}"
        ));
        (r.get(0), r.get(1))
    };
    assert_eq!(
        (n, keys),
        (ROWS, ROWS),
        "the re-seed must emit every row once"
    );
    let r2_after: String = c.query_scalar(
        "SELECT row_to_json(b)::text FROM tide.backfill b WHERE relid = 'r2'::regclass",
    );
    assert_eq!(
        r2_before, r2_after,
        "the re-seed of r1 touched r2's backfill"
    );
    let r2_reads_after: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE relation = 'public.r2' AND op = 'read'",
    );
    assert_eq!(
        r2_reads, r2_reads_after,
        "the re-seed of r1 emitted rows of r2"
    );
    replay(&c, "copy_r1", P, false);
    assert_converged(&c, "r1", "copy_r1");
}
