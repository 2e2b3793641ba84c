//! Several backfills of one pipeline at once (`tide.max_parallel_backfills`): their chunks are in
//! the worker's memory together, each reconciled against its own watermark window, under
//! concurrent writes, deletes and key updates and a kill -9 of the worker, and every copy ends
//! equal to its source; many small tables with a pause, a throttle and a cancel among them, the
//! views true throughout, never more chunks in memory than the setting allows. And several
//! readers of one table (`tide.max_backfill_readers`): disjoint key ranges of one backfill read
//! at once, with several tables, under the same writers and a kill -9, to the outbox, a local
//! table and a remote PostgreSQL target, each ending equal to its source.
//!
//! That chunks of different backfills were in memory at once is read from `tide.chunk`, not
//! hoped for: a chunk is in memory from its `read_at` to its `emitted_at` (the start of the
//! iteration that wrote it); one backfill at a time (main before this setting) never has two
//! such intervals of different backfills overlap, and one reader per worker never has two of
//! the same backfill overlap (it reads chunk N+1 during the iteration that writes N).

use crate::common::*;
use crate::convergence::{CONVERGE_SCHEMA, CONVERGE_SCRIPT, CONVERGE_TABLES, WRITE_TPS};
use std::time::Duration;

/// Pairs of chunks of different backfills among `ids` that were in memory at once (one read
/// while the other was read and not yet emitted).
fn overlapping_chunks(c: &Cluster, ids: &str) -> i64 {
    c.query_scalar(&format!(
        "SELECT count(*) FROM tide.chunk a JOIN tide.chunk b
             ON b.backfill_id <> a.backfill_id AND b.read_at >= a.read_at AND b.read_at < a.emitted_at
          WHERE a.backfill_id IN ({ids}) AND b.backfill_id IN ({ids})"
    ))
}

/// The most chunks of `ids` in memory at one time: at each chunk's read, those read before (or
/// then) and not yet emitted, itself included.
fn most_chunks_in_memory(c: &Cluster, ids: &str) -> i64 {
    c.query_scalar(&format!(
        "SELECT coalesce(max(n), 0) FROM (
             SELECT count(*) AS n FROM tide.chunk a JOIN tide.chunk b
                 ON b.read_at <= a.read_at AND b.emitted_at > a.read_at
              WHERE a.backfill_id IN ({ids}) AND b.backfill_id IN ({ids})
              GROUP BY a.backfill_id, a.chunk) s"
    ))
}

/// Three tables backfilled at once (`tide.max_parallel_backfills = 3`) while writers insert,
/// update, delete and move keys, 60% of them inside the chunks being read; a kill -9 of the
/// worker while the three are mid-way. Each copy rebuilt from the outbox equals its source.
#[test]
fn parallel_backfills_converge_under_writes_with_kill9() {
    const P: &str = "par";
    let c = start_cluster(Cluster::builder("bf_parallel").conf("tide.max_parallel_backfills = 3"));
    init_extension(&c);
    c.execute(CONVERGE_SCHEMA);
    create_pipeline(&c, P);
    for (t, keys) in CONVERGE_TABLES {
        add_table(&c, P, t, false);
        outbox_copy_keyed(&c, t, &format!("public.{t}"), &format!("copy_{t}"), keys);
    }
    let script = write_script("backfill_parallel", CONVERGE_SCRIPT);
    let run = spawn_pgbench(&c, &script, 4, 120, Some(WRITE_TPS));
    c.wait_until(
        "the writers' changes to reach the outbox",
        Duration::from_secs(60),
        POLL,
        || {
            Ok(
                c.try_query_scalar::<i64>("SELECT count(*) FROM tide.outbox WHERE op <> 'read'")?
                    >= 500,
            )
        },
    );
    // The three start together, each paced (a throttle of its own: 20 chunks of 500 rows each
    // take about 4 s), so a kill lands while all three are mid-way.
    let ids: Vec<i64> = {
        let mut cl = c.client();
        let mut tx = cl.transaction().expect("begin");
        let r = tx
            .query_one(
                "SELECT tide.start_backfill('t_int', chunk_size => 500),
                        tide.start_backfill('t_comp', chunk_size => 500),
                        tide.start_backfill('t_uuid', chunk_size => 500)",
                &[],
            )
            .expect("start the backfills");
        for (t, _) in CONVERGE_TABLES {
            tx.execute(
                &format!("SELECT tide.alter_backfill('{t}', rows_per_second => 2500)"),
                &[],
            )
            .expect("throttle");
        }
        tx.commit().expect("commit");
        vec![r.get(0), r.get(1), r.get(2)]
    };
    let list = format!("{}, {}, {}", ids[0], ids[1], ids[2]);
    // All three progress at once: each has emitted 3 of its 20 chunks while none is done (one
    // backfill at a time would finish the first before the second emits anything).
    c.wait_until(
        "each of the three backfills to emit 3 chunks",
        Duration::from_secs(120),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<i64>(&format!(
                "SELECT min(chunks_done) FROM tide.backfill WHERE id IN ({list})"
            ))? >= 3)
        },
    );
    let states: Vec<String> = c
        .query(&format!(
            "SELECT state FROM tide.backfills WHERE id IN ({list}) ORDER BY id"
        ))
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        states,
        ["running", "running", "running"],
        "the three backfills should run at once\n{}",
        diag(&c)
    );
    // Kill, trying for a moment to do it while a chunk is read and not yet emitted.
    let _ = poll_every(Duration::from_secs(2), Duration::from_millis(2), || {
        Ok(c.try_query_scalar::<bool>(&format!(
            "SELECT coalesce((SELECT s.kind = 'high' AND s.chunk > b.chunks_done
                                FROM tide.signal s JOIN tide.backfill b ON b.id = s.backfill_id
                               WHERE s.pipeline = '{P}'), false)"
        ))?)
    });
    // In one snapshot: the outbox's last event and each backfill's chunks done.
    let (max_outbox_before, done_before): (i64, Vec<i64>) = {
        let r = c.query_one(&format!(
            "SELECT (SELECT coalesce(max(id), 0) FROM tide.outbox),
                    ARRAY(SELECT chunks_done FROM tide.backfill WHERE id IN ({list}) ORDER BY id)"
        ));
        (r.get(0), r.get(1))
    };
    let victim = worker_pid(&c, P).unwrap_or_else(|| panic!("no worker to kill\n{}", diag(&c)));
    kill9(victim);
    let (_, _, summary) = run.finish_summary();
    let back = wait_recovered(&c, P, Some(victim), Duration::from_secs(90), || diag(&c));
    eprintln!(
        "parallel: kill -9 of worker {victim} with chunks done {done_before:?}; pgbench: {summary}; back in {back:.1?}"
    );
    // After the restart the three go on together again, from where each stood.
    let run = spawn_pgbench(&c, &script, 4, 8, Some(WRITE_TPS));
    c.wait_until(
        "each backfill to emit 2 more chunks after the kill",
        Duration::from_secs(120),
        Duration::from_millis(50),
        || {
            for (id, before) in ids.iter().zip(&done_before) {
                if bf_i64(&c, *id, "chunks_done") < before + 2 && bf_state(&c, *id) != "done" {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    );
    let (_, ok, summary) = run.finish_summary();
    assert!(
        ok,
        "pgbench failed without a crash: {summary}\n{}",
        diag(&c)
    );
    let mut rounds = 0;
    while !all_done(&c, &ids).unwrap_or(false) {
        rounds += 1;
        assert!(
            rounds <= 30,
            "the backfills did not finish within 30 rounds of writes\n{}",
            diag(&c)
        );
        let (_, ok, summary) = spawn_pgbench(&c, &script, 4, 3, Some(WRITE_TPS)).finish_summary();
        assert!(
            ok,
            "pgbench failed without a crash: {summary}\n{}",
            diag(&c)
        );
    }
    let _ = std::fs::remove_file(&script);
    wait_pipeline(&c, P, 180);

    for (t, keys) in CONVERGE_TABLES {
        let n = replay(&c, &format!("copy_{t}"), P, false);
        eprintln!("parallel: replayed {n} events onto copy_{t}");
        assert_converged(&c, t, &format!("copy_{t}"));
        let cols = keys.join(", ");
        let resurrected: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM (SELECT {cols} FROM copy_{t} EXCEPT SELECT {cols} FROM {t}) x"
        ));
        assert_eq!(
            resurrected, 0,
            "{t}: keys deleted at the source exist in the copy"
        );
        let deletes: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM tide.outbox WHERE relation = 'public.{t}' AND op = 'delete'"
        ));
        assert!(deletes > 50, "{t}: only {deletes} delete events");
    }
    // Key updates happened (the move_* functions of the writers' script).
    let moved: i64 = c.query_scalar(
        "SELECT (SELECT count(*) FROM t_int WHERE s LIKE 'moved from %')
              + (SELECT count(*) FROM t_comp WHERE v < 0) + (SELECT count(*) FROM t_uuid WHERE v < 0)",
    );
    assert!(moved > 0, "no key was moved");
    for id in &ids {
        check_backfill_invariants(&c, *id);
    }
    // Chunks finished before the kill were not emitted again.
    for (id, before) in ids.iter().zip(&done_before) {
        assert_no_rows(
            &c,
            &format!("backfill {id} re-emitted chunks it had finished before the kill"),
            &format!(
                "SELECT id FROM tide.outbox WHERE backfill_id = {id} AND id > {max_outbox_before} AND chunk <= {before}"
            ),
        );
    }
    let dropped: i64 = c.query_scalar(&format!(
        "SELECT sum(rows_dropped)::int8 FROM tide.backfill WHERE id IN ({list})"
    ));
    assert!(dropped > 0, "no chunk dropped a row: no window met a write");
    // The interleaving itself: chunks of different backfills in memory at once, never more
    // than three. (The first step after the start reads a chunk of each of the three, none held
    // yet: three such pairs in that step alone, unless a read had to be repeated; 20 and more
    // steps follow.)
    let overlapping = overlapping_chunks(&c, &list);
    let most = most_chunks_in_memory(&c, &list);
    eprintln!(
        "parallel: {dropped} rows dropped; {overlapping} pairs of chunks of different backfills in memory at once; at most {most} at a time"
    );
    assert!(
        overlapping >= 3,
        "the backfills' chunks did not interleave\n{}",
        diag(&c)
    );
    assert!(
        (2..=3).contains(&most),
        "{most} chunks in memory at once with tide.max_parallel_backfills = 3"
    );
}

/// Twelve small tables queued at once, at the default `tide.max_parallel_backfills` (4): they
/// finish interleaved, never more than four chunks in memory; a paused backfill takes no place
/// and waits, a throttled one holds back only itself (it keeps its place), a cancelled one
/// emits nothing more; the views say so throughout.
#[test]
fn many_small_tables_with_pause_throttle_cancel() {
    const P: &str = "many";
    let c = setup("bf_many");
    let mut ddl = String::new();
    for i in 1..=12 {
        ddl.push_str(&format!(
            "CREATE TABLE s{i:02} (id int PRIMARY KEY, v text);
             INSERT INTO s{i:02} SELECT g, md5(g::text) FROM generate_series(1, 2000) g;"
        ));
    }
    c.execute(&ddl);
    create_pipeline(&c, P);
    for i in 1..=12 {
        let t = format!("s{i:02}");
        add_table(&c, P, &t, false);
        outbox_copy_keyed(
            &c,
            &t,
            &format!("public.{t}"),
            &format!("copy_{t}"),
            &["id"],
        );
    }
    // s01 paused and s02, s03 throttled (20 rows/s: one chunk of 500, then 25 s to the next) in
    // the transaction that starts them all.
    let ids: Vec<i64> = {
        let mut cl = c.client();
        let mut tx = cl.transaction().expect("begin");
        let mut ids = Vec::new();
        for i in 1..=12 {
            ids.push(
                tx.query_one(
                    &format!("SELECT tide.start_backfill('s{i:02}', chunk_size => 500)"),
                    &[],
                )
                .expect("start")
                .get::<_, i64>(0),
            );
        }
        tx.execute("SELECT tide.pause_backfill('s01')", &[])
            .expect("pause");
        for t in ["s02", "s03"] {
            tx.execute(
                &format!("SELECT tide.alter_backfill('{t}', rows_per_second => 20)"),
                &[],
            )
            .expect("throttle");
        }
        tx.commit().expect("commit");
        ids
    };
    let plain = ids[3..]
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    // The nine others finish while s02 and s03 are still at their first chunks and s01 paused.
    c.wait_until(
        "the nine unthrottled backfills",
        Duration::from_secs(120),
        POLL,
        || all_done(&c, &ids[3..]),
    );
    assert_eq!(bf_state(&c, ids[0]), "paused");
    assert_eq!(
        bf_i64(&c, ids[0], "chunks_done"),
        0,
        "the paused backfill read"
    );
    for id in &ids[1..3] {
        assert_eq!(bf_state(&c, *id), "running", "throttled backfill {id}");
        assert!(
            bf_i64(&c, *id, "chunks_done") < 4,
            "throttled backfill {id} was not held back"
        );
    }
    // The views: a throttled backfill mid-way has a fraction and a time left; s01 is still
    // backfilling, the nine are ready once applied.
    let (fraction, left): (f64, bool) = {
        let r = c.query_one(&format!(
            "SELECT fraction_done, estimated_time_left IS NOT NULL FROM tide.backfills WHERE id = {}",
            ids[1]
        ));
        (r.get(0), r.get(1))
    };
    assert!(
        fraction > 0.0 && fraction < 1.0 && left,
        "s02: fraction {fraction}, time left known: {left}"
    );
    wait_pipeline(&c, P, 60);
    let readiness: Vec<(String, String)> = c
        .query("SELECT relation, readiness FROM tide.readiness WHERE pipeline = 'many' ORDER BY relation")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (rel, r) in &readiness {
        let expected = if ["public.s01", "public.s02", "public.s03"].contains(&rel.as_str()) {
            "backfilling"
        } else {
            "ready"
        };
        assert_eq!(r, expected, "{rel}: {readiness:?}");
    }
    // s02 and s03, running (throttled), take two of the four places: the nine others had two.
    let all = ids
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let most = most_chunks_in_memory(&c, &all);
    let most_plain = most_chunks_in_memory(&c, &plain);
    let overlapping = overlapping_chunks(&c, &plain);
    eprintln!(
        "many: {overlapping} pairs of chunks of different backfills in memory at once; at most {most} at a time ({most_plain} of the nine)"
    );
    assert!(
        overlapping > 0,
        "the small tables' chunks did not interleave\n{}",
        diag(&c)
    );
    assert!(most <= 4, "{most} chunks in memory at once (default 4)");
    assert_eq!(
        most_plain, 2,
        "the nine unthrottled backfills had two places"
    );

    // Cancel s03 mid-way: nothing more of it is emitted. Resume s01, unthrottle s02: both finish.
    let max_before: i64 = c.query_scalar("SELECT coalesce(max(id), 0) FROM tide.outbox");
    c.execute("SELECT tide.cancel_backfill('s03')");
    c.execute("SELECT tide.resume_backfill('s01')");
    c.execute("SELECT tide.alter_backfill('s02', rows_per_second => 0)");
    wait_backfill(&c, "s01", 60);
    wait_backfill(&c, "s02", 60);
    wait_pipeline(&c, P, 60);
    assert_eq!(bf_state(&c, ids[2]), "cancelled");
    assert_no_rows(
        &c,
        "the cancelled backfill emitted rows after its cancel",
        &format!(
            "SELECT id FROM tide.outbox WHERE backfill_id = {} AND id > {max_before}",
            ids[2]
        ),
    );
    for (i, id) in ids.iter().enumerate() {
        if i == 2 {
            continue;
        }
        check_backfill_invariants(&c, *id);
        let t = format!("s{:02}", i + 1);
        replay(&c, &format!("copy_{t}"), P, false);
        assert_converged(&c, &t, &format!("copy_{t}"));
    }
}

// ------------------------------------------------------- several readers of one table (issue 35)

/// The three targets of [`several_readers_of_one_table_converge_through_kill9`]: the outbox, a
/// local table target (schema `rep`) and a remote PostgreSQL target (the remote's `public`).
const READER_PIPELINES: [&str; 3] = ["rob", "rtab", "rrem"];

/// Each table's column list, to compare a source with its target as multisets.
const COLUMNS: [(&str, &str); 3] = [
    ("t_int", "id, v, s"),
    ("t_comp", "a, b, v"),
    ("t_uuid", "id, v"),
];

/// Pairs of chunks of the SAME backfill `id` that were in memory at once (one read while the
/// other was read and not yet emitted). One reader per worker never has such a pair: it reads
/// chunk N+1 during the iteration that writes N, after N's `emitted_at`.
fn same_backfill_overlaps(c: &Cluster, id: i64) -> i64 {
    c.query_scalar(&format!(
        "SELECT count(*) FROM tide.chunk a JOIN tide.chunk b
             ON b.backfill_id = a.backfill_id AND b.chunk <> a.chunk
            AND b.read_at >= a.read_at AND b.read_at < a.emitted_at
          WHERE a.backfill_id = {id}"
    ))
}

/// The most `pg_tide reader` processes seen at once per pipeline (a reader's process title is
/// its `bgw_name`, `pg_tide reader <pipeline>`), sampled by [`ReaderWatch::sample`].
#[derive(Default)]
struct ReaderWatch {
    most: std::collections::BTreeMap<String, usize>,
    samples: u64,
}

impl ReaderWatch {
    fn sample(&mut self, c: &Cluster) -> TestResult<()> {
        let pids: Vec<i32> = c
            .try_query("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_tide reader'")?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut now = std::collections::BTreeMap::<String, usize>::new();
        for pid in pids {
            // Gone since (a reader that exited): not counted.
            let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let title = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if let Some(rest) = title.split("pg_tide reader ").nth(1) {
                let p = rest.split_whitespace().next().unwrap_or("").to_string();
                *now.entry(p).or_default() += 1;
            }
        }
        for (p, n) in now {
            let m = self.most.entry(p).or_default();
            *m = (*m).max(n);
        }
        self.samples += 1;
        Ok(())
    }

    fn most(&self, pipeline: &str) -> usize {
        self.most.get(pipeline).copied().unwrap_or(0)
    }
}

/// A finished backfill's chunks, whatever its target: done, numbered 1..chunks_done, each key
/// range starting where the previous one ended (the first at NULL), a proper
/// low < high watermark each, written in chunk (key) order, and sums equal to the backfill's
/// counters.
fn check_chunk_ranges(c: &Cluster, id: i64) {
    assert_eq!(
        bf_state(c, id),
        "done",
        "backfill {id} is not done\n{}",
        diag(c)
    );
    let chunks = || {
        sample(
            c,
            &format!(
                "SELECT chunk, key_from, key_to, rows_read, low_lsn, high_lsn, read_at, emitted_at
                   FROM tide.chunk WHERE backfill_id = {id} ORDER BY chunk"
            ),
            200,
        )
    };
    let r = c.query_one(&format!(
        "SELECT count(*), coalesce(min(chunk), 0), coalesce(max(chunk), 0),
                coalesce(sum(rows_read), 0)::int8, coalesce(sum(rows_dropped), 0)::int8,
                coalesce(sum(rows_emitted), 0)::int8,
                count(*) FILTER (WHERE low_lsn IS NULL OR high_lsn IS NULL OR low_lsn >= high_lsn)
           FROM tide.chunk WHERE backfill_id = {id}"
    ));
    let got: [i64; 7] = std::array::from_fn(|i| r.get(i));
    let done = bf_i64(c, id, "chunks_done");
    let expected = [
        done,
        1,
        done,
        bf_i64(c, id, "rows_read"),
        bf_i64(c, id, "rows_dropped"),
        bf_i64(c, id, "rows_emitted"),
        0,
    ];
    assert_eq!(
        got,
        expected,
        "backfill {id}: [chunks, first, last, rows read, dropped, emitted, without low < high] \
         in tide.chunk differ from tide.backfills'\n{}",
        chunks()
    );
    let breaks: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM (SELECT chunk, key_from, lag(key_to) OVER (ORDER BY chunk) AS prev_to
                                 FROM tide.chunk WHERE backfill_id = {id}) s
          WHERE (chunk = 1 AND key_from IS NOT NULL)
             OR (chunk > 1 AND key_from IS DISTINCT FROM prev_to)"
    ));
    assert_eq!(
        breaks,
        0,
        "backfill {id}: chunk key ranges are not contiguous\n{}",
        chunks()
    );
    // Written in key order: a chunk read before an earlier one was written is held until then.
    let out_of_order: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM (SELECT emitted_at, lag(emitted_at) OVER (ORDER BY chunk) AS prev
                                 FROM tide.chunk WHERE backfill_id = {id}) s
          WHERE emitted_at < prev"
    ));
    assert_eq!(
        out_of_order,
        0,
        "backfill {id}: a chunk was written before an earlier one\n{}",
        chunks()
    );
}

/// The source cluster `c` with [`CONVERGE_SCHEMA`] captured by the three pipelines of
/// [`READER_PIPELINES`] (the remote one writing to `t`), and the outbox's replay copies.
fn three_targets(c: &Cluster, t: &Cluster) {
    create_server(c, "tgt", t);
    c.execute(CONVERGE_SCHEMA);
    let [ob, tab, rem] = READER_PIPELINES;
    create_pipeline(c, ob);
    pg_test::create_pipeline(c, tab, "table", r#"{"schema": "rep"}"#);
    pg_test::create_pipeline(c, rem, "postgres", r#"{"server": "tgt"}"#);
    for p in READER_PIPELINES {
        for (tb, _) in CONVERGE_TABLES {
            add_table(c, p, tb, false);
        }
    }
    for (tb, keys) in CONVERGE_TABLES {
        outbox_copy_keyed(c, tb, &format!("public.{tb}"), &format!("copy_{tb}"), keys);
    }
}

/// In one snapshot: the outbox's last event id and (id, state, chunks_done) of each backfill.
fn kill_point(c: &Cluster, list: &str) -> (i64, Vec<(i64, String, i64)>) {
    let mut cl = c.client();
    let mut tx = cl.transaction().expect("begin");
    tx.batch_execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .expect("repeatable read");
    let max: i64 = tx
        .query_one("SELECT coalesce(max(id), 0) FROM tide.outbox", &[])
        .expect("max outbox id")
        .get(0);
    let rows = tx
        .query(
            &format!(
                "SELECT id, state, chunks_done FROM tide.backfill WHERE id IN ({list}) ORDER BY id"
            ),
            &[],
        )
        .expect("progress");
    tx.commit().expect("commit");
    (
        max,
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect(),
    )
}

/// Every target equals its source: the outbox replayed onto copies, the local (`rep`) and the
/// remote tables compared as multisets; and keys were moved meanwhile.
fn assert_three_targets_converged(c: &Cluster, t: &Cluster) {
    let [ob, tab, rem] = READER_PIPELINES;
    for (tb, cols) in COLUMNS {
        let n = replay(c, &format!("copy_{tb}"), ob, false);
        eprintln!("readers: replayed {n} events onto copy_{tb}");
        assert_converged(c, tb, &format!("copy_{tb}"));
        let source = format!("public.{tb}");
        assert_same_rows(
            &format!("{tab}: {tb}"),
            c,
            &source,
            c,
            &format!("rep.{tb}"),
            cols,
        );
        assert_same_rows(&format!("{rem}: {tb}"), c, &source, t, &source, cols);
    }
    let moved: i64 = c.query_scalar(
        "SELECT (SELECT count(*) FROM t_int WHERE s LIKE 'moved from %')
              + (SELECT count(*) FROM t_comp WHERE v < 0) + (SELECT count(*) FROM t_uuid WHERE v < 0)",
    );
    assert!(moved > 0, "no key was moved");
}

/// Each backfill (`(id, table)`): its chunks numbered 1..n with contiguous key ranges
/// ([`check_chunk_ranges`]), and it read at least every row of its table that existed
/// throughout (in the source now, and no stream event of its key ever reached the outbox).
fn assert_read_every_row(c: &Cluster, backfills: &[(i64, &str)]) {
    for (id, tb) in backfills {
        check_chunk_ranges(c, *id);
        let key = match *tb {
            "t_comp" => "jsonb_build_object('a', s.a, 'b', s.b)",
            _ => "jsonb_build_object('id', s.id)",
        };
        let untouched: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM {tb} s
              WHERE NOT EXISTS (SELECT 1 FROM tide.outbox o
                                 WHERE o.pipeline = '{}' AND o.relation = 'public.{tb}'
                                   AND o.backfill_id IS NULL AND o.key = {key})",
            READER_PIPELINES[0]
        ));
        let read = bf_i64(c, *id, "rows_read");
        assert!(
            untouched > 1000 && read >= untouched,
            "backfill {id} of {tb}: read {read} rows, but {untouched} rows existed throughout"
        );
    }
}

/// Several readers of one table: `tide.max_backfill_readers = 3`, three pipelines capturing the
/// same three tables (the outbox, a local table target, a remote PostgreSQL target), writers
/// inserting, updating, deleting and moving keys across the key range (60% in the chunks being
/// read), a kill -9 of the outbox's worker while its three backfills run; every target ends
/// equal to its source. `t_int` (200 chunks) starts alone, so that each worker has three
/// readers for one backfill: two chunks of it must have been in memory at once
/// ([`same_backfill_overlaps`]: never with one reader), and each worker must have had two
/// reader processes at least. `t_comp` and `t_uuid` (40 chunks each) join while the outbox's
/// `t_int` runs: several tables at once, read by the same readers.
#[test]
fn several_readers_of_one_table_converge_through_kill9() {
    let t_all = std::time::Instant::now();
    let c = start_cluster(Cluster::builder("bf_readers").conf("tide.max_backfill_readers = 3"));
    init_extension(&c);
    // (A setting pg_tide does not define would be a string placeholder here.)
    let setting = sample(
        &c,
        "SELECT name, setting, vartype, context, min_val, max_val FROM pg_settings
          WHERE name = 'tide.max_backfill_readers'",
        1,
    );
    let t = target_cluster("bf_readers_tgt");
    three_targets(&c, &t);
    let ob = READER_PIPELINES[0];
    // Three workers decode every write: the writers at half the one-pipeline rate.
    let rate = WRITE_TPS / 2;
    let script = write_script("backfill_readers", CONVERGE_SCRIPT);
    let run = spawn_pgbench(&c, &script, 4, 120, Some(rate));
    c.wait_until(
        "the writers' changes to reach the outbox",
        Duration::from_secs(60),
        POLL,
        || {
            Ok(
                c.try_query_scalar::<i64>("SELECT count(*) FROM tide.outbox WHERE op <> 'read'")?
                    >= 300,
            )
        },
    );
    let mut watch = ReaderWatch::default();
    // Phase 1: t_int alone in each pipeline (200 chunks), until the outbox's (the slowest
    // target) has emitted 4.
    let mut backfills: Vec<(i64, &str)> = Vec::new();
    for p in READER_PIPELINES {
        backfills.push((
            c.query_scalar(&format!(
                "SELECT tide.start_backfill('t_int', '{p}', chunk_size => 50)"
            )),
            "t_int",
        ));
    }
    c.wait_until(
        "the outbox's t_int backfill to emit 4 chunks",
        Duration::from_secs(120),
        Duration::from_millis(20),
        || {
            watch.sample(&c)?;
            Ok(bf_i64(&c, backfills[0].0, "chunks_done") >= 4)
        },
    );
    // Phase 2: t_comp and t_uuid (40 chunks each) join.
    for p in READER_PIPELINES {
        for tb in ["t_comp", "t_uuid"] {
            backfills.push((
                c.query_scalar(&format!(
                    "SELECT tide.start_backfill('{tb}', '{p}', chunk_size => 250)"
                )),
                tb,
            ));
        }
    }
    let ids: Vec<i64> = backfills.iter().map(|b| b.0).collect();
    let list = join(&ids);
    let of_ob = [ids[0], ids[3], ids[4]];
    c.wait_until(
        "each of the outbox's three backfills to emit 2 chunks",
        Duration::from_secs(120),
        Duration::from_millis(20),
        || {
            watch.sample(&c)?;
            Ok(c.try_query_scalar::<i64>(&format!(
                "SELECT min(chunks_done) FROM tide.backfill WHERE id IN ({})",
                join(&of_ob)
            ))? >= 2)
        },
    );
    // Kill, trying for a moment to do it while a chunk is read and not yet written (the last
    // watermark written is the high one of a chunk after those done).
    let read_not_written = poll_every(Duration::from_secs(2), Duration::from_millis(2), || {
        Ok(c.try_query_scalar::<bool>(&format!(
            "SELECT coalesce((SELECT s.kind = 'high' AND s.chunk > b.chunks_done
                                FROM tide.signal s JOIN tide.backfill b ON b.id = s.backfill_id
                               WHERE s.pipeline = '{ob}'), false)"
        ))?)
    })
    .is_ok();
    let (max_outbox_before, progress) = kill_point(&c, &list);
    assert!(
        of_ob.iter().all(|id| progress
            .iter()
            .any(|p| p.0 == *id && p.1 == "running" && p.2 >= 2)),
        "the kill would not land in the middle of the outbox's three backfills: {progress:?}\n{}",
        diag(&c)
    );
    let old: Vec<Option<i32>> = READER_PIPELINES.iter().map(|p| worker_pid(&c, p)).collect();
    let victim = old[0].unwrap_or_else(|| panic!("no worker to kill\n{}", diag(&c)));
    kill9_and_wait_restart(&c, victim, Duration::from_secs(90));
    let (_, _, summary) = run.finish_summary();
    for (p, pid) in READER_PIPELINES.iter().zip(&old) {
        wait_recovered(&c, p, *pid, Duration::from_secs(90), || diag(&c));
    }
    eprintln!(
        "readers: kill -9 of worker {victim} ({ob}) at (backfill, state, chunks done) {progress:?}, a chunk read and not yet written: {read_not_written}; pgbench: {summary}"
    );
    // Writers again until every backfill is done, in bounded rounds.
    let mut rounds = 0;
    while !all_done(&c, &ids).unwrap_or(false) {
        rounds += 1;
        assert!(
            rounds <= 40,
            "the backfills did not finish within 40 rounds of writes\n{}",
            diag(&c)
        );
        let run = spawn_pgbench(&c, &script, 4, 3, Some(rate));
        let t_round = std::time::Instant::now();
        while t_round.elapsed() < Duration::from_secs(3) {
            let _ = watch.sample(&c);
            std::thread::sleep(Duration::from_millis(50));
        }
        let (_, ok, summary) = run.finish_summary();
        assert!(
            ok,
            "pgbench failed without a crash: {summary}\n{}",
            diag(&c)
        );
    }
    let _ = std::fs::remove_file(&script);
    for p in READER_PIPELINES {
        wait_pipeline(&c, p, 180);
    }
    assert!(
        c.log_count("terminated by signal 9") >= 1,
        "the kill is not in the server log\n{}",
        c.log_tail(40)
    );

    assert_three_targets_converged(&c, &t);
    assert_read_every_row(&c, &backfills);
    // The outbox's backfills, in full (events, windows, a key read at most twice), and no
    // chunk finished before the kill emitted again.
    for (id, done) in of_ob
        .iter()
        .map(|id| (id, progress.iter().find(|p| p.0 == *id).map_or(0, |p| p.2)))
    {
        check_backfill_invariants(&c, *id);
        assert_no_rows(
            &c,
            &format!("backfill {id} re-emitted chunks it had finished before the kill"),
            &format!(
                "SELECT id FROM tide.outbox WHERE backfill_id = {id} AND id > {max_outbox_before} AND chunk <= {done}"
            ),
        );
    }
    let dropped: i64 = c.query_scalar(&format!(
        "SELECT sum(rows_dropped)::int8 FROM tide.backfill WHERE id IN ({list})"
    ));
    assert!(dropped > 0, "no chunk dropped a row: no window met a write");
    // Several tables at once, in each pipeline (t_comp and t_uuid start together).
    for (k, p) in READER_PIPELINES.iter().enumerate() {
        let of_p = join(&[ids[k], ids[3 + 2 * k], ids[4 + 2 * k]]);
        let across = overlapping_chunks(&c, &of_p);
        assert!(
            across > 0,
            "{p}: the tables' chunks did not interleave\n{}",
            diag(&c)
        );
    }
    // The feature itself: two chunks of one backfill in memory at once, in each pipeline, and
    // several reader processes per worker.
    let same: Vec<i64> = ids
        .iter()
        .map(|id| same_backfill_overlaps(&c, *id))
        .collect();
    eprintln!(
        "readers: {setting}; {dropped} rows dropped; pairs of chunks of one backfill in memory at once {same:?} \
         (t_int: the first 3); most readers per pipeline {:?} in {} samples; {rounds} write rounds after the kill; whole test {:.1?}",
        watch.most, watch.samples, t_all.elapsed()
    );
    for (p, (id, n)) in READER_PIPELINES.iter().zip(ids.iter().zip(&same)) {
        assert!(
            *n >= 1,
            "{p}: no two chunks of t_int's backfill {id} were in memory at once (one reader?)\n{}",
            sample(&c, &format!("SELECT chunk, key_from, key_to, read_at, emitted_at FROM tide.chunk WHERE backfill_id = {id} ORDER BY chunk"), 12)
        );
    }
    for p in READER_PIPELINES {
        assert!(
            watch.most(p) >= 2,
            "{p}: at most {} reader process(es) at once with tide.max_backfill_readers = 3",
            watch.most(p)
        );
    }
    assert_eq!(
        setting,
        r#"{"name":"tide.max_backfill_readers","setting":"3","vartype":"integer","context":"sighup","min_val":"1","max_val":"16"}"#,
        "the setting"
    );
}

fn join(ids: &[i64]) -> String {
    ids.iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
