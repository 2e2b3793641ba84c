//! Convergence under concurrent writes, with kill -9 of the worker mid-backfill; and the replay
//! check is sensitive: a broken replay is caught.

use crate::common::*;
use std::time::{Duration, Instant};

pub(crate) const CONVERGE_SCHEMA: &str = r#"
CREATE TABLE t_int (id int PRIMARY KEY, v int, s text);
CREATE TABLE t_comp (a int, b text, v int, PRIMARY KEY (a, b));
CREATE TABLE t_uuid (id uuid PRIMARY KEY, v int);
-- The key universe: 15,000 keys per table (k -> each table's key), 10,000 of them seeded.
CREATE TABLE universe (k int PRIMARY KEY, a int NOT NULL, b text NOT NULL, u uuid NOT NULL UNIQUE);
INSERT INTO universe SELECT k, (k - 1) / 10 + 1, format('b %s''s', (k - 1) % 10), md5('tide-' || k)::uuid
  FROM generate_series(1, 15000) k;
CREATE INDEX ON universe (a, b);
INSERT INTO t_int SELECT k, k, 'seed ' || k FROM universe WHERE k % 3 <> 0;
INSERT INTO t_comp SELECT a, b, k FROM universe WHERE k % 3 <> 0;
INSERT INTO t_uuid SELECT u, k FROM universe WHERE k % 3 <> 0;
-- Key changes (a delete of the old key and an insert of the new one in the stream); a move onto
-- an existing key is skipped, in a subtransaction.
CREATE FUNCTION move_int(p_from int, p_to int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE t_int SET id = p_to, s = 'moved from ' || p_from WHERE id = p_from;
EXCEPTION WHEN unique_violation THEN NULL;
END $$;
CREATE FUNCTION move_comp(p_from int, p_to int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE t_comp t SET a = u2.a, b = u2.b, v = -p_from
      FROM universe u1, universe u2
     WHERE u1.k = p_from AND u2.k = p_to AND t.a = u1.a AND t.b = u1.b;
EXCEPTION WHEN unique_violation THEN NULL;
END $$;
CREATE FUNCTION move_uuid(p_from int, p_to int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE t_uuid SET id = (SELECT u FROM universe WHERE k = p_to), v = -p_from
     WHERE id = (SELECT u FROM universe WHERE k = p_from);
EXCEPTION WHEN unique_violation THEN NULL;
END $$;
"#;

/// Random inserts (upserts), updates, key changes, deletes and delete+re-insert transactions on
/// random existing and new keys of the three tables. 60% of them hit the next ~600 keys after
/// the table's backfill progress (`last_key`), i.e. the chunk being read: the worst case for
/// the watermark windows.
pub(crate) const CONVERGE_SCRIPT: &str = r#"\set k random(1, 15000)
\set k2 random(1, 15000)
\set v random(1, 1000000)
\set off random(0, 600)
\set h random(1, 100)
SELECT coalesce((SELECT u.k FROM universe u WHERE u.k > (SELECT coalesce(b.last_key[1]::int, 0) FROM tide.backfill b WHERE b.relation = 'public.t_int' ORDER BY b.id DESC LIMIT 1) ORDER BY u.k OFFSET :off LIMIT 1), :k) AS fi, coalesce((SELECT u.k FROM universe u WHERE (u.a, u.b) > (SELECT coalesce(b.last_key[1]::int, 0), coalesce(b.last_key[2], '') FROM tide.backfill b WHERE b.relation = 'public.t_comp' ORDER BY b.id DESC LIMIT 1) ORDER BY u.a, u.b OFFSET :off LIMIT 1), :k) AS fc, coalesce((SELECT u.k FROM universe u WHERE u.u > (SELECT coalesce(b.last_key[1]::uuid, '00000000-0000-0000-0000-000000000000') FROM tide.backfill b WHERE b.relation = 'public.t_uuid' ORDER BY b.id DESC LIMIT 1) ORDER BY u.u OFFSET :off LIMIT 1), :k) AS fu \gset
\set ki case when :h <= 60 then :fi else :k end
\set kc case when :h <= 60 then :fc else :k end
\set ku case when :h <= 60 then :fu else :k end
\set a (:kc - 1) / 10 + 1
\set bn (:kc - 1) % 10
\set r random(1, 99)
\if :r <= 11
INSERT INTO t_int VALUES (:ki, :v, 'w ' || :v) ON CONFLICT (id) DO UPDATE SET v = excluded.v, s = excluded.s;
\elif :r <= 19
UPDATE t_int SET v = v + 1, s = 'u ' || :v WHERE id = :ki;
\elif :r <= 21
SELECT move_int(:ki, :k2);
\elif :r <= 29
DELETE FROM t_int WHERE id = :ki;
\elif :r <= 33
BEGIN;
DELETE FROM t_int WHERE id = :ki;
INSERT INTO t_int VALUES (:ki, :v, 'again ' || :v) ON CONFLICT (id) DO UPDATE SET v = excluded.v, s = excluded.s;
UPDATE t_int SET v = -v WHERE id = :k2;
COMMIT;
\elif :r <= 44
INSERT INTO t_comp VALUES (:a, format('b %s''s', :bn), :v) ON CONFLICT (a, b) DO UPDATE SET v = excluded.v;
\elif :r <= 52
UPDATE t_comp SET v = v + 1 WHERE a = :a AND b = format('b %s''s', :bn);
\elif :r <= 54
SELECT move_comp(:kc, :k2);
\elif :r <= 62
DELETE FROM t_comp WHERE a = :a AND b = format('b %s''s', :bn);
\elif :r <= 66
BEGIN;
DELETE FROM t_comp WHERE a = :a AND b = format('b %s''s', :bn);
INSERT INTO t_comp VALUES (:a, format('b %s''s', :bn), :v) ON CONFLICT (a, b) DO UPDATE SET v = excluded.v;
UPDATE t_comp SET v = -v WHERE (a, b) = (SELECT a, b FROM universe WHERE k = :k2);
COMMIT;
\elif :r <= 77
INSERT INTO t_uuid SELECT u, :v FROM universe WHERE k = :ku ON CONFLICT (id) DO UPDATE SET v = excluded.v;
\elif :r <= 85
UPDATE t_uuid SET v = v + 1 WHERE id = (SELECT u FROM universe WHERE k = :ku);
\elif :r <= 87
SELECT move_uuid(:ku, :k2);
\elif :r <= 95
DELETE FROM t_uuid WHERE id = (SELECT u FROM universe WHERE k = :ku);
\else
BEGIN;
DELETE FROM t_uuid WHERE id = (SELECT u FROM universe WHERE k = :ku);
INSERT INTO t_uuid SELECT u, :v FROM universe WHERE k = :ku ON CONFLICT (id) DO UPDATE SET v = excluded.v;
UPDATE t_uuid SET v = -v WHERE id = (SELECT u FROM universe WHERE k = :k2);
COMMIT;
\endif
"#;

/// Total pgbench rate of the writers. "Full speed" (no -R) outruns the pipeline worker on a
/// 2-core machine (hundreds of MB of lag within a minute), and a backfill chunk cannot be emitted
/// before the stream reaches its high watermark, so the writers run at a rate the worker sustains.
pub(crate) const WRITE_TPS: u32 = 1200;

pub(crate) const CONVERGE_TABLES: [(&str, &[&str]); 3] = [
    ("t_int", &["id"]),
    ("t_comp", &["a", "b"]),
    ("t_uuid", &["id"]),
];

/// What the backfills looked like just before a kill, in one snapshot.
struct KillPoint {
    /// Largest outbox id committed before the kill.
    max_outbox_id: i64,
    /// (backfill id, chunks_done, state) per backfill.
    progress: Vec<(i64, i64, String)>,
    /// The pipeline's signal row: (backfill id, chunk, kind) of the last watermark written.
    signal: Option<(i64, i64, String)>,
}

fn kill_point(c: &Cluster, ids: &[i64]) -> KillPoint {
    let mut cl = c.client();
    let mut tx = cl.transaction().expect("begin");
    tx.batch_execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .expect("repeatable read");
    let max_outbox_id: i64 = tx
        .query_one("SELECT coalesce(max(id), 0) FROM tide.outbox", &[])
        .expect("max outbox id")
        .get(0);
    let progress = ids
        .iter()
        .map(|id| {
            let r = tx
                .query_one(
                    "SELECT chunks_done, state FROM tide.backfill WHERE id = $1",
                    &[id],
                )
                .expect("backfill progress");
            (*id, r.get::<_, i64>(0), r.get::<_, String>(1))
        })
        .collect();
    let signal = tx
        .query_opt(
            "SELECT backfill_id, chunk, kind FROM tide.signal WHERE pipeline = 'conv'",
            &[],
        )
        .expect("signal row")
        .map(|r| (r.get(0), r.get(1), r.get(2)));
    tx.commit().expect("commit");
    KillPoint {
        max_outbox_id,
        progress,
        signal,
    }
}

impl KillPoint {
    /// The chunk read (high watermark written) but not yet emitted at the kill, if any.
    fn pending_chunk(&self) -> Option<(i64, i64)> {
        let (id, chunk, kind) = self.signal.clone()?;
        let done = self.progress.iter().find(|p| p.0 == id)?.1;
        (kind == "high" && chunk > done).then_some((id, chunk))
    }
}

#[test]
fn convergence_under_concurrent_writes_with_kill9() {
    const P: &str = "conv";
    let t_all = Instant::now();
    // One backfill at a time, so that each kill lands in the middle of the next table's (the
    // parallel backfills have their own test: `parallel`).
    let c = start_cluster(Cluster::builder("bf_converge").conf("tide.max_parallel_backfills = 1"));
    init_extension(&c);
    c.execute(CONVERGE_SCHEMA);
    create_pipeline(&c, P);
    for (t, keys) in CONVERGE_TABLES {
        add_table(&c, P, t, false);
        outbox_copy_keyed(&c, t, &format!("public.{t}"), &format!("copy_{t}"), keys);
    }
    let seeded_deleted_before: i64 = c.query_scalar(
        "SELECT (SELECT count(*) FROM universe WHERE k % 3 <> 0) * 3
              - (SELECT count(*) FROM t_int) - (SELECT count(*) FROM t_comp) - (SELECT count(*) FROM t_uuid)",
    );
    assert_eq!(seeded_deleted_before, 0, "the seed is not 3 x 10,000 rows");
    let script = write_script("backfill_converge", CONVERGE_SCRIPT);

    // Phase 1: writers at full speed; once their changes stream, start the three backfills.
    let mut run = spawn_pgbench(&c, &script, 4, 120, Some(WRITE_TPS));
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
    let ids: Vec<i64> = {
        let r = c.query_one(
            "SELECT tide.start_backfill('t_int', chunk_size => 500),
                    tide.start_backfill('t_comp', chunk_size => 500),
                    tide.start_backfill('t_uuid', pipeline => 'conv', chunk_size => 500)",
        );
        vec![r.get(0), r.get(1), r.get(2)]
    };
    // A throttle keeps the backfills running long enough for two crashes to land mid-way
    // (chunks still interleave with the writers: only the pause between chunks grows).
    for (t, _) in CONVERGE_TABLES {
        c.execute(&format!(
            "SELECT tide.alter_backfill('{t}', rows_per_second => 2500)"
        ));
    }
    let t_backfill = Instant::now();

    // kill -9 of the worker in the middle of each table's backfill (the backfills of this
    // pipeline run one at a time, in order); pgbench dies with the server's backends each time and is
    // restarted.
    let mut kills: Vec<KillPoint> = Vec::new();
    let mut txns_total = 0u64;
    for (k, id) in ids.iter().enumerate() {
        let k = k + 1;
        let target = if k == 1 { 4 } else { 3 };
        c.wait_until(
            &format!("backfill {id} to emit {target} chunks before kill {k}"),
            Duration::from_secs(120),
            Duration::from_millis(50),
            || Ok(bf_i64(&c, *id, "chunks_done") >= target),
        );
        // Try for a moment to kill while a chunk is read but not yet emitted (it must then be
        // read again, not lost); otherwise kill anyway.
        let _ = poll_every(Duration::from_secs(2), Duration::from_millis(2), || {
            Ok(c.try_query_scalar::<bool>(&format!(
                "SELECT coalesce((SELECT s.kind = 'high' AND s.chunk > b.chunks_done
                                    FROM tide.signal s JOIN tide.backfill b ON b.id = s.backfill_id
                                   WHERE s.pipeline = '{P}' AND b.id = {id}), false)"
            ))?)
        });
        let kp = kill_point(&c, &ids);
        let (_, done, state) = kp.progress.iter().find(|p| p.0 == *id).cloned().unwrap();
        assert!(
            state == "running" && done >= target,
            "kill {k}: backfill {id} is {state} with {done} chunks done; the kill would not land mid-backfill\n{}",
            diag(&c)
        );
        let victim = worker_pid(&c, P).unwrap_or_else(|| panic!("no worker to kill\n{}", diag(&c)));
        kill9(victim);
        let (txns, _ok, summary) = run.finish_summary();
        txns_total += txns;
        let back = wait_recovered(&c, P, Some(victim), Duration::from_secs(90), || diag(&c));
        eprintln!(
            "converge: kill {k}: kill -9 worker {victim} at {:.1?} into the backfill, progress {:?}, \
             chunk read but not emitted: {:?}; pgbench {txns} txns ({summary}); worker back in {back:.1?}",
            t_backfill.elapsed(),
            kp.progress,
            kp.pending_chunk()
        );
        kills.push(kp);
        if k == ids.len() {
            break;
        }
        run = spawn_pgbench(&c, &script, 4, 120, Some(WRITE_TPS));
        if k == 1 {
            // Table rewrites while the backfills run and the writers go on: VACUUM FULL of the
            // table being backfilled (a new relation file, the same rows: its chunks must
            // neither stop early nor skip rows) and a rewriting ALTER COLUMN TYPE of a table
            // whose backfill is queued (the worker answers it by reading that table again).
            c.execute("VACUUM FULL t_int");
            c.execute("ALTER TABLE t_uuid ALTER COLUMN v TYPE bigint");
        }
    }
    // Keep writing, in bounded rounds, until every backfill is done.
    let mut rounds = 0;
    while !all_done(&c, &ids).unwrap_or(false) {
        rounds += 1;
        assert!(
            rounds <= 30,
            "the backfills did not finish within 30 rounds of writes\n{}",
            diag(&c)
        );
        let (txns, ok, summary) =
            spawn_pgbench(&c, &script, 4, 3, Some(WRITE_TPS)).finish_summary();
        txns_total += txns;
        assert!(
            ok,
            "pgbench failed without a crash: {summary}\n{}",
            diag(&c)
        );
    }
    let backfill_time = t_backfill.elapsed();
    let _ = std::fs::remove_file(&script);

    let t_wait = Instant::now();
    for (t, _) in CONVERGE_TABLES {
        wait_backfill(&c, t, 180);
    }
    wait_pipeline(&c, P, 180);
    let catch_up = t_wait.elapsed();

    // Event counts.
    eprintln!(
        "converge: {txns_total} pgbench txns; backfills took {backfill_time:.1?} (+{rounds} write rounds after the kills); \
         catch-up {catch_up:.1?}\n{}\n{}",
        sample(
            &c,
            "SELECT relation, op, count(*) FROM tide.outbox WHERE pipeline = 'conv' GROUP BY 1, 2 ORDER BY 1, 2",
            30
        ),
        sample(
            &c,
            "SELECT id, relation, state, chunks_done, rows_read, rows_dropped, rows_emitted FROM tide.backfills ORDER BY id",
            10
        )
    );
    assert!(
        c.log_count("terminated by signal 9") >= 2,
        "expected two worker kills in the server log\n{}",
        c.log_tail(60)
    );

    // Replay onto the empty copies and compare.
    let t_replay = Instant::now();
    for (t, _) in CONVERGE_TABLES {
        let n = replay(&c, &format!("copy_{t}"), P, false);
        let rows: i64 = c.query_scalar(&format!("SELECT count(*) FROM {t}"));
        eprintln!("converge: replayed {n} events onto copy_{t}; source has {rows} rows");
        assert_converged(&c, t, &format!("copy_{t}"));
    }
    eprintln!("converge: replay took {:.1?}", t_replay.elapsed());

    // No resurrected deletes (covered above, asserted explicitly) and deletes did happen.
    for (t, keys) in CONVERGE_TABLES {
        let cols = keys.join(", ");
        let resurrected: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM (SELECT {cols} FROM copy_{t} EXCEPT SELECT {cols} FROM {t}) x"
        ));
        assert_eq!(
            resurrected, 0,
            "{t}: keys deleted at the source exist in the copy"
        );
        let deleted_seeded: i64 = c.query_scalar(&match t {
            "t_int" => "SELECT count(*) FROM universe WHERE k % 3 <> 0 AND k NOT IN (SELECT id FROM t_int)".to_string(),
            "t_comp" => "SELECT count(*) FROM universe u WHERE k % 3 <> 0 AND NOT EXISTS (SELECT 1 FROM t_comp c WHERE (c.a, c.b) = (u.a, u.b))".to_string(),
            _ => "SELECT count(*) FROM universe WHERE k % 3 <> 0 AND u NOT IN (SELECT id FROM t_uuid)".to_string(),
        });
        let deletes: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM tide.outbox WHERE relation = 'public.{t}' AND op = 'delete'"
        ));
        eprintln!("converge: {t}: {deleted_seeded} seeded keys absent at the end, {deletes} delete events");
        assert!(
            deleted_seeded > 100 && deletes > 100,
            "{t}: too few deletes for the check to mean anything"
        );
        for op in ["insert", "update", "read"] {
            let n: i64 = c.query_scalar(&format!(
                "SELECT count(*) FROM tide.outbox WHERE relation = 'public.{t}' AND op = '{op}'"
            ));
            assert!(
                n > 100,
                "{t}: only {n} {op} events; the test did not do enough work"
            );
        }
    }

    // Reconciliation actually happened.
    let dropped: i64 = c.query_scalar(&format!(
        "SELECT sum(rows_dropped)::int8 FROM tide.backfills WHERE id IN ({}, {}, {})",
        ids[0], ids[1], ids[2]
    ));
    assert!(
        dropped > 0,
        "no backfill dropped a row: the windows never overlapped a write\n{}",
        diag(&c)
    );

    // Every backfill is consistent, and those hit by a kill resumed instead of restarting.
    let mut max_reads = 0;
    for id in &ids {
        max_reads = max_reads.max(check_backfill_invariants(&c, *id));
    }
    let mut resumed = 0;
    for (k, kp) in kills.iter().enumerate() {
        for (id, done_before, state) in &kp.progress {
            if state == "done" {
                continue;
            }
            assert_no_rows(
                &c,
                &format!("kill {}: backfill {id} re-emitted chunks it had finished before the kill", k + 1),
                &format!(
                    "SELECT id, chunk FROM tide.outbox WHERE backfill_id = {id} AND id > {} AND chunk <= {done_before}",
                    kp.max_outbox_id
                ),
            );
            if *done_before > 0 {
                let first_after: Option<i64> = c.query_scalar(&format!(
                    "SELECT min(chunk) FROM tide.outbox WHERE backfill_id = {id} AND id > {}",
                    kp.max_outbox_id
                ));
                eprintln!(
                    "converge: kill {}: backfill {id} had {done_before} chunks done; first chunk emitted after the kill: {first_after:?}",
                    k + 1
                );
                resumed += 1;
            }
        }
    }
    for (k, kp) in kills.iter().enumerate() {
        if let Some((id, chunk)) = kp.pending_chunk() {
            // Lost with the worker, read again under new watermarks, emitted once, after the kill.
            let (n, first): (i64, Option<i64>) = {
                let r = c.query_one(&format!(
                    "SELECT count(*), min(id) FROM tide.outbox WHERE backfill_id = {id} AND chunk = {chunk}"
                ));
                (r.get(0), r.get(1))
            };
            let rows: i64 = c.query_scalar(&format!(
                "SELECT rows_emitted::int8 FROM tide.chunks WHERE backfill_id = {id} AND chunk = {chunk}"
            ));
            assert_eq!(n, rows, "kill {}: chunk {chunk} of backfill {id}", k + 1);
            assert!(
                n == 0 || first.unwrap_or(0) > kp.max_outbox_id,
                "kill {}: chunk {chunk} of backfill {id} was pending at the kill but has events before it",
                k + 1
            );
        }
    }
    assert!(
        resumed >= kills.len(),
        "expected each kill to interrupt a backfill that had emitted chunks ({resumed} did)"
    );
    // Positive control for the window check in check_backfill_invariants: read events and stream
    // events of the same key do join (keys render identically in both).
    let same_key: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.outbox r JOIN tide.outbox s
             ON s.relation = r.relation AND s.key = r.key AND s.backfill_id IS NULL
          WHERE r.backfill_id IN ({}, {}, {})",
        ids[0], ids[1], ids[2]
    ));
    assert!(
        same_key > 1000,
        "only {same_key} stream events share a key with a read event"
    );
    let (chunk_rows, in_window): (i64, i64) = {
        let r = c.query_one(&format!(
            "SELECT (SELECT count(*) FROM tide.chunks WHERE backfill_id IN ({0}, {1}, {2})),
                    (SELECT count(*) FROM tide.chunks ch JOIN tide.outbox o
                         ON o.relation = ch.relation AND o.backfill_id IS NULL
                        AND o.commit_lsn > ch.low_lsn AND o.commit_lsn < ch.high_lsn
                      WHERE ch.backfill_id IN ({0}, {1}, {2}))",
            ids[0], ids[1], ids[2]
        ));
        (r.get(0), r.get(1))
    };
    eprintln!(
        "converge: rows_dropped total {dropped}; {chunk_rows} chunks; {in_window} stream events of the table inside chunk windows; max read events per key per backfill {max_reads}; \
         whole test {:.1?}",
        t_all.elapsed()
    );
}

#[test]
fn broken_variant_is_caught() {
    const P: &str = "brk";
    let c = setup("bf_broken");
    c.execute(
        "CREATE TABLE small (id int PRIMARY KEY, v int, s text);
         INSERT INTO small SELECT g, g, 's ' || g FROM generate_series(1, 2000) g;",
    );
    create_pipeline(&c, P);
    outbox_copy_keyed(&c, "small", "public.small", "copy_small", &["id"]);
    add_table(&c, P, "small", true); // the default: a backfill is queued
    c.execute(
        "UPDATE small SET v = -v WHERE id % 7 = 0;
         DELETE FROM small WHERE id % 11 = 0;
         INSERT INTO small SELECT g, g, 'new' FROM generate_series(2001, 2100) g;",
    );
    wait_backfill(&c, "small", 60);
    // Deletes after the backfill: a replay that skips deletes must leave at least these behind.
    let deleted_after: i64 =
        c.query_scalar("SELECT count(*) FROM small WHERE id % 13 = 0 OR id % 17 = 0");
    c.execute(
        "DELETE FROM small WHERE id % 13 = 0;
         UPDATE small SET id = id + 10000 WHERE id % 17 = 0;",
    );
    wait_pipeline(&c, P, 60);

    // The correct replay converges.
    let n = replay(&c, "copy_small", P, false);
    assert_converged(&c, "small", "copy_small");
    eprintln!("broken: correct replay of {n} events converges");

    // 1. Skipping delete events (a resurrecting consumer) is caught.
    replay(&c, "copy_small", P, true);
    let (missing, extra) = set_difference(&c, "small", "copy_small");
    eprintln!("broken: replay without deletes: {missing} missing, {extra} extra rows");
    assert_eq!(missing, 0, "skipping deletes should not lose rows");
    assert!(
        extra >= deleted_after,
        "the set-difference missed skipped deletes: {extra} extra rows, expected at least {deleted_after}"
    );

    // 2. One corrupted row is caught both ways. 3. One lost row is caught.
    for (damage, expected, what) in [
        (
            "UPDATE copy_small SET v = v + 1 WHERE id = (SELECT min(id) FROM copy_small)",
            (1, 1),
            "one corrupted row",
        ),
        (
            "DELETE FROM copy_small WHERE id = (SELECT max(id) FROM copy_small)",
            (1, 0),
            "one lost row",
        ),
    ] {
        replay(&c, "copy_small", P, false);
        c.execute(damage);
        assert_eq!(
            set_difference(&c, "small", "copy_small"),
            expected,
            "{what}"
        );
    }
}
