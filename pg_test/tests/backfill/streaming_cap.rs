//! Shorter chunks while the stream is busy (`tide.streaming_chunk_size`): the stream's events
//! committed while a chunk is written wait for that write, so while the pipeline applies source
//! changes a backfill reads at most that many rows per chunk, and its full `chunk_size` once the
//! stream is quiet. Chunk size does not enter the watermark argument; the backfill under
//! writers, deletes and key updates still rebuilds its table exactly.
//!
//! Both sides are made, not hoped for: the writers run from before the backfill starts until it
//! is done (so capped chunks must appear: the check fails if the cap is never applied), and the
//! second backfill starts after the writers stopped and more than the one-second memory of the
//! last source change passed (nothing else writes the source), so every chunk but the last
//! reads the full chunk size.

use crate::common::*;
use crate::convergence::{CONVERGE_SCHEMA, CONVERGE_SCRIPT, WRITE_TPS};
use std::time::Duration;

#[test]
fn chunks_are_capped_while_the_stream_is_busy_and_the_backfill_converges() {
    capped_while_busy(1);
}

/// The same with three readers: the key ranges planned ahead hold the capped number of keys,
/// and the chunks read on them are capped too.
#[test]
fn several_readers_read_capped_chunks_while_the_stream_is_busy() {
    capped_while_busy(3);
}

fn capped_while_busy(readers: u32) {
    const P: &str = "cap";
    let c = start_cluster(
        Cluster::builder(&format!("bf_cap{readers}"))
            .conf("tide.streaming_chunk_size = 250")
            .conf(&format!("tide.max_backfill_readers = {readers}")),
    );
    init_extension(&c);
    c.execute(CONVERGE_SCHEMA);
    create_pipeline(&c, P);
    add_table(&c, P, "t_int", false);
    outbox_copy_keyed(&c, "t_int", "public.t_int", "copy_t_int", &["id"]);
    let script = write_script("backfill_cap", CONVERGE_SCRIPT);
    let run = spawn_pgbench(&c, &script, 4, 5, Some(WRITE_TPS));
    c.wait_until(
        "the writers' changes to reach the outbox",
        Duration::from_secs(60),
        POLL,
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.outbox WHERE relation = 'public.t_int' AND op <> 'read'",
            )? >= 200)
        },
    );
    let id: i64 = c.query_scalar("SELECT tide.start_backfill('t_int', chunk_size => 1000)");
    let (_, ok, summary) = run.finish_summary();
    assert!(ok, "pgbench failed: {summary}\n{}", diag(&c));
    // More rounds of writers until the backfill is done (a round's start leaves a gap of a few
    // tens of milliseconds without changes, well inside the cap's one second).
    let mut rounds = 0;
    while bf_state(&c, id) != "done" {
        rounds += 1;
        assert!(
            rounds <= 60,
            "the backfill did not finish within 60 rounds of writes\n{}",
            diag(&c)
        );
        let (_, ok, summary) = spawn_pgbench(&c, &script, 4, 2, Some(WRITE_TPS)).finish_summary();
        assert!(ok, "pgbench failed: {summary}\n{}", diag(&c));
    }
    let _ = std::fs::remove_file(&script);
    wait_pipeline(&c, P, 180);
    let n = replay(&c, "copy_t_int", P, false);
    eprintln!("streaming_cap: replayed {n} events onto copy_t_int");
    assert_converged(&c, "t_int", "copy_t_int");
    check_backfill_invariants(&c, id);
    // A chunk reads the cap's 250 rows, or, on a key range planned ahead (several readers), up
    // to twice that (keys inserted into the range since it was planned); uncapped, 1000 or more.
    let (capped, over): (i64, i64) = {
        let r = c.query_one(&format!(
            "SELECT count(*) FILTER (WHERE rows_read <= 500), count(*) FILTER (WHERE rows_read > 500)
               FROM tide.chunks WHERE backfill_id = {id}"
        ));
        (r.get(0), r.get(1))
    };
    assert!(
        capped >= 10,
        "only {capped} chunks of at most 500 rows (the cap: 250) while the writers ran, {over} larger\n{}",
        diag(&c)
    );

    // Quiet: no source change for more than a second (the writers stopped and were applied).
    std::thread::sleep(Duration::from_millis(1500));
    let again: i64 = c.query_scalar("SELECT tide.start_backfill('t_int', chunk_size => 1000)");
    wait_backfill(&c, "t_int", 120);
    let sizes: Vec<i32> = c
        .query(&format!(
            "SELECT rows_read FROM tide.chunks WHERE backfill_id = {again} ORDER BY chunk"
        ))
        .iter()
        .map(|r| r.get(0))
        .collect();
    let rows: i64 = c.query_scalar("SELECT count(*) FROM t_int");
    assert!(sizes.len() >= 2, "chunks of the quiet backfill: {sizes:?}");
    // Not empty: asserted just above.
    let (last, full) = sizes.split_last().expect("chunks");
    assert!(
        full.iter().all(|&n| n == 1000) && i64::from(*last) < 1000,
        "a quiet stream reads the full chunk size: {sizes:?} for {rows} rows\n{}",
        diag(&c)
    );
}
