//! Text, timestamp and composite keys under concurrent updates.

use crate::common::*;
use std::time::{Duration, Instant};

const KEYS_SCHEMA: &str = r#"
CREATE FUNCTION tkey(g int) RETURNS text LANGUAGE sql IMMUTABLE
    AS $$ SELECT format('key %s ''q'' "dq" \ é,{x} (y)', g) $$;
CREATE FUNCTION tskey(g int) RETURNS timestamp LANGUAGE sql IMMUTABLE
    AS $$ SELECT '2024-02-28 23:59:58'::timestamp + g * interval '1 second 1 microsecond' $$;
CREATE TABLE k_text (k text PRIMARY KEY, v int);
CREATE TABLE k_ts (ts timestamp PRIMARY KEY, v int);
CREATE TABLE k_comp (a int, b text, v int, PRIMARY KEY (a, b));
INSERT INTO k_text SELECT tkey(g), g FROM generate_series(1, 3000) g;
INSERT INTO k_text VALUES (''), (' '), ('O''Brien'), ('{a,b}'), ('NULL'), ('tab	inside'), ('back\slash'), (repeat('long', 300));
INSERT INTO k_ts SELECT tskey(g), g FROM generate_series(1, 3000) g;
INSERT INTO k_ts VALUES ('infinity', 1), ('-infinity', 2), ('0044-03-15 12:00:00 BC', 3), ('1999-12-31 23:59:59.999999', 4);
INSERT INTO k_comp SELECT g / 10, format('part %s "x" ''y''', g % 10), g FROM generate_series(1, 3000) g;
CREATE FUNCTION move_text(p_from int, p_to int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN UPDATE k_text SET k = tkey(p_to) WHERE k = tkey(p_from);
EXCEPTION WHEN unique_violation THEN NULL; END $$;
CREATE FUNCTION move_ts(p_from int, p_to int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN UPDATE k_ts SET ts = tskey(p_to) WHERE ts = tskey(p_from);
EXCEPTION WHEN unique_violation THEN NULL; END $$;
"#;

/// Random upserts, updates, deletes and key changes; two thirds of the transactions update or
/// delete one of the next ~100 rows after the table's backfill progress (the chunk being read).
/// The special keys are never deleted.
const KEYS_SCRIPT: &str = r#"\set g random(1, 3300)
\set g2 random(1, 3300)
\set v random(1, 100000)
\set off random(0, 100)
\set r random(1, 90)
\if :r > 30
\set r2 random(1, 6)
\if :r2 = 1
UPDATE k_text SET v = v + 1 WHERE k = (SELECT k FROM k_text WHERE k > (SELECT coalesce(last_key[1], '') FROM tide.backfill WHERE relation = 'public.k_text' ORDER BY id DESC LIMIT 1) ORDER BY k OFFSET :off LIMIT 1);
\elif :r2 = 2
DELETE FROM k_text WHERE k = (SELECT k FROM k_text WHERE k > (SELECT coalesce(last_key[1], '') FROM tide.backfill WHERE relation = 'public.k_text' ORDER BY id DESC LIMIT 1) AND k LIKE 'key %' ORDER BY k OFFSET :off LIMIT 1);
\elif :r2 = 3
UPDATE k_ts SET v = v + 1 WHERE ts = (SELECT ts FROM k_ts WHERE ts > (SELECT coalesce(last_key[1]::timestamp, '-infinity') FROM tide.backfill WHERE relation = 'public.k_ts' ORDER BY id DESC LIMIT 1) ORDER BY ts OFFSET :off LIMIT 1);
\elif :r2 = 4
DELETE FROM k_ts WHERE ts = (SELECT ts FROM k_ts WHERE ts > (SELECT coalesce(last_key[1]::timestamp, '-infinity') FROM tide.backfill WHERE relation = 'public.k_ts' ORDER BY id DESC LIMIT 1) AND ts BETWEEN '2024-01-01' AND '2100-01-01' ORDER BY ts OFFSET :off LIMIT 1);
\elif :r2 = 5
UPDATE k_comp SET v = v + 1 WHERE (a, b) = (SELECT a, b FROM k_comp WHERE (a, b) > (SELECT coalesce(last_key[1]::int, -1), coalesce(last_key[2], '') FROM tide.backfill WHERE relation = 'public.k_comp' ORDER BY id DESC LIMIT 1) ORDER BY a, b OFFSET :off LIMIT 1);
\else
DELETE FROM k_comp WHERE (a, b) = (SELECT a, b FROM k_comp WHERE (a, b) > (SELECT coalesce(last_key[1]::int, -1), coalesce(last_key[2], '') FROM tide.backfill WHERE relation = 'public.k_comp' ORDER BY id DESC LIMIT 1) ORDER BY a, b OFFSET :off LIMIT 1);
\endif
\elif :r <= 3
INSERT INTO k_text VALUES (tkey(:g), :v) ON CONFLICT (k) DO UPDATE SET v = excluded.v;
\elif :r <= 6
UPDATE k_text SET v = v + 1 WHERE k = tkey(:g);
\elif :r <= 8
DELETE FROM k_text WHERE k = tkey(:g);
\elif :r <= 9
SELECT move_text(:g, :g2);
\elif :r <= 12
INSERT INTO k_ts VALUES (tskey(:g), :v) ON CONFLICT (ts) DO UPDATE SET v = excluded.v;
\elif :r <= 15
UPDATE k_ts SET v = v + 1 WHERE ts = tskey(:g);
\elif :r <= 17
DELETE FROM k_ts WHERE ts = tskey(:g);
\elif :r <= 18
SELECT move_ts(:g, :g2);
\elif :r <= 22
INSERT INTO k_comp VALUES (:g / 10, format('part %s "x" ''y''', :g % 10), :v) ON CONFLICT (a, b) DO UPDATE SET v = excluded.v;
\elif :r <= 26
UPDATE k_comp SET v = v + 1 WHERE a = :g / 10 AND b = format('part %s "x" ''y''', :g % 10);
\elif :r <= 28
DELETE FROM k_comp WHERE a = :g / 10 AND b = format('part %s "x" ''y''', :g % 10);
\else
UPDATE k_comp SET b = format('part %s "x" ''y''', :g2 % 10 + 10) WHERE a = :g / 10 AND b = format('part %s "x" ''y''', :g % 10) AND NOT EXISTS (SELECT 1 FROM k_comp WHERE a = :g / 10 AND b = format('part %s "x" ''y''', :g2 % 10 + 10));
\endif
"#;

#[test]
fn composite_text_timestamp_keys() {
    const P: &str = "keys";
    let c = setup("bf_keys");
    c.execute(KEYS_SCHEMA);
    create_pipeline(&c, P);
    let tables: [(&str, &[&str]); 3] = [
        ("k_text", &["k"]),
        ("k_ts", &["ts"]),
        ("k_comp", &["a", "b"]),
    ];
    for (t, keys) in tables {
        add_table(&c, P, t, false);
        outbox_copy_keyed(&c, t, &format!("public.{t}"), &format!("copy_{t}"), keys);
    }
    let script = write_script("backfill_keys", KEYS_SCRIPT);
    let run = spawn_pgbench(&c, &script, 2, 300, Some(600));
    c.wait_until(
        "the writes to stream",
        Duration::from_secs(30),
        POLL,
        || Ok(c.try_query_scalar::<i64>("SELECT count(*) FROM tide.outbox")? >= 100),
    );
    let ids: Vec<i64> = {
        let r = c.query_one(
            "SELECT tide.start_backfill('k_text', chunk_size => 100), tide.start_backfill('k_ts', chunk_size => 100),
                    tide.start_backfill('k_comp', chunk_size => 100)",
        );
        vec![r.get(0), r.get(1), r.get(2)]
    };
    let t0 = Instant::now();
    c.wait_until(
        "the three backfills",
        Duration::from_secs(120),
        POLL,
        || all_done(&c, &ids),
    );
    let took = t0.elapsed();
    // Keep the writes going a little past the end, then stop them.
    std::thread::sleep(Duration::from_millis(500)); // more writes, not an assertion
    c.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgbench'",
    );
    let (txns, _ok, summary) = run.finish_summary();
    let _ = std::fs::remove_file(&script);
    for (t, _) in tables {
        wait_backfill(&c, t, 60);
    }
    wait_pipeline(&c, P, 60);
    eprintln!(
        "keys: backfills took {took:.1?} under {txns} concurrent txns ({summary})\n{}",
        sample(&c, "SELECT relation, chunks_done, rows_read, rows_dropped, rows_emitted FROM tide.backfills ORDER BY id", 5)
    );
    for id in &ids {
        check_backfill_invariants(&c, *id);
    }
    let dropped: i64 = c.query_scalar(&format!(
        "SELECT sum(rows_dropped)::int8 FROM tide.backfills WHERE id IN ({}, {}, {})",
        ids[0], ids[1], ids[2]
    ));
    assert!(
        dropped > 0,
        "no chunk row was dropped: stream keys never matched chunk keys (or the writes missed the windows)"
    );
    for (t, _) in tables {
        let n = replay(&c, &format!("copy_{t}"), P, false);
        eprintln!("keys: replayed {n} events onto copy_{t}");
        assert_converged(&c, t, &format!("copy_{t}"));
    }
    // The odd keys made it through as themselves.
    for (t, cond) in [
        ("k_text", "k IN ('', ' ', 'O''Brien', '{a,b}', 'NULL', 'tab\tinside', 'back\\slash', repeat('long', 300))"),
        ("k_ts", "ts IN ('infinity', '-infinity', '0044-03-15 12:00:00 BC', '1999-12-31 23:59:59.999999')"),
    ] {
        let n: i64 = c.query_scalar(&format!("SELECT count(*) FROM copy_{t} WHERE {cond}"));
        assert_eq!(n, 4 + if t == "k_text" { 4 } else { 0 }, "{t}: special keys in the copy");
    }
}
