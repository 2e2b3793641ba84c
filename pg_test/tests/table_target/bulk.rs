//! Backfill chunks loaded in bulk into a local table target (the access method's
//! `multi_insert`, as COPY FROM) when the target holds none of the chunk's keys, and through the
//! upsert when it holds some, or when the table has what a plain insert would bypass (triggers,
//! row security). `tide.chunks.written_as` says which; both must leave the same rows.

use crate::common::*;
use std::time::{Duration, Instant};

/// How the chunks of `pipeline`'s backfill of `relation` were written: `written_as` per chunk
/// (`-`: no row survived).
fn written_as(c: &Cluster, pipeline: &str, relation: &str) -> Vec<String> {
    texts(
        c,
        &format!(
            "SELECT coalesce(written_as, '-') FROM tide.chunks
              WHERE pipeline = '{pipeline}' AND relation = '{relation}' ORDER BY chunk"
        ),
    )
}

/// Chunks whose key range holds rows at the target go through the upsert (which keeps what only
/// the target has, a target-only column's value here); the others are loaded in bulk (rows get
/// the target-only column's default, as an INSERT gives it). A table with a trigger is never
/// loaded in bulk (the trigger fires for every row), nor, for an owner it applies to, one with
/// row security (the policy's check applies): here as `alice`, an ordinary role. Every table ends
/// equal to its source. (Convergence under concurrent writes, where chunks take either way, is
/// `row_values` and `convergence`.)
#[test]
fn bulk_where_the_range_is_empty_upsert_elsewhere() {
    let c = setup("tt_bulk");
    c.execute(
        "CREATE TABLE b (id int PRIMARY KEY, j jsonb, s text, n numeric(10,2), t timestamptz NOT NULL);
         INSERT INTO b SELECT g, CASE WHEN g % 2 = 0 THEN 'null'::jsonb ELSE jsonb_build_object('g', g) END,
                              E'tab\\there ' || g, g / 7.0, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s'
           FROM generate_series(1, 5000) g;
         CREATE SCHEMA rb;
         CREATE TABLE rb.b (id int PRIMARY KEY, j jsonb, s text, n numeric(10,2), t timestamptz NOT NULL,
                            origin text NOT NULL DEFAULT 'loaded');
         CREATE INDEX ON rb.b (t);
         CREATE TABLE trg (id int PRIMARY KEY, v text);
         INSERT INTO trg SELECT g, 'v' || g FROM generate_series(1, 1500) g;
         CREATE TABLE rb.trg (id int PRIMARY KEY, v text);
         CREATE TABLE rb.trg_log (id int);
         CREATE FUNCTION rb.log_trg() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN INSERT INTO rb.trg_log VALUES (NEW.id); RETURN NEW; END $$;
         CREATE TRIGGER trg_log BEFORE INSERT ON rb.trg FOR EACH ROW EXECUTE FUNCTION rb.log_trg();
         CREATE TABLE prt (id int PRIMARY KEY, v text);
         INSERT INTO prt SELECT g, 'v' || g FROM generate_series(1, 1500) g;
         CREATE TABLE rb.prt_all (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);
         CREATE TABLE rb.prt PARTITION OF rb.prt_all FOR VALUES FROM (1) TO (100000);",
    );
    create_pipeline(&c, "bk", "table", r#"{"schema": "rb"}"#);
    for t in ["b", "trg", "prt"] {
        exec(
            &c,
            &format!("SELECT tide.add_table('bk', '{t}', backfill => false)"),
        );
    }
    // Rows the stream writes before the backfill: keys 1200 and 3700 (in chunks 3 and 8 of
    // 500), whose ranges then hold rows at the target; a target-only value on one of them.
    c.execute("UPDATE b SET s = 'streamed' WHERE id IN (1200, 3700)");
    wait_pipeline(&c, "bk", 60);
    c.execute("UPDATE rb.b SET origin = 'kept' WHERE id = 1200");
    for t in ["b", "trg", "prt"] {
        exec(
            &c,
            &format!("SELECT tide.start_backfill('{t}', 'bk', chunk_size => 500)"),
        );
        wait_backfill(&c, t, "bk", 120);
    }
    wait_pipeline(&c, "bk", 60);

    assert_same_rows(
        "bulk and upsert",
        &c,
        "public.b",
        &c,
        "rb.b",
        "id, j::text, s, n, t",
    );
    let how = written_as(&c, "bk", "public.b");
    let mut want = vec!["bulk"; 10];
    want[2] = "upsert";
    want[7] = "upsert";
    want.push("-"); // the last chunk reads nothing
    assert_eq!(how, want, "how each chunk was written");
    assert_eq!(
        c.query_scalar::<String>("SELECT origin FROM rb.b WHERE id = 1200"),
        "kept",
        "the upsert keeps a target-only column's value"
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM rb.b WHERE origin = 'loaded'"),
        4999,
        "every other row got the column's default"
    );
    assert_same_rows("trigger", &c, "public.trg", &c, "rb.trg", "id, v");
    assert_eq!(
        written_as(&c, "bk", "public.trg"),
        vec!["upsert", "upsert", "upsert", "-"],
        "a table with a trigger is upserted"
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(DISTINCT id) FROM rb.trg_log"),
        1500,
        "the trigger fired for every backfilled row"
    );
    // A partition's constraint is checked by an INSERT into it, not by a multi-insert.
    assert_same_rows("partition", &c, "public.prt", &c, "rb.prt", "id, v");
    assert_eq!(
        written_as(&c, "bk", "public.prt"),
        vec!["upsert", "upsert", "upsert", "-"],
        "a partition is upserted"
    );

    // Row security that applies to the pipeline's owner (alice owns the target; FORCE makes the
    // policies apply to her): upserted, under the policy's check.
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA alice AUTHORIZATION alice;
         CREATE SCHEMA alice_rep AUTHORIZATION alice;",
    );
    let mut alice = connect_as(&c, "alice");
    alice
        .batch_execute(
            "CREATE TABLE alice.sec (id int PRIMARY KEY, v text);
             INSERT INTO alice.sec SELECT g, 'v' || g FROM generate_series(1, 1500) g;
             CREATE TABLE alice_rep.sec (id int PRIMARY KEY, v text);
             ALTER TABLE alice_rep.sec ENABLE ROW LEVEL SECURITY;
             ALTER TABLE alice_rep.sec FORCE ROW LEVEL SECURITY;
             CREATE POLICY sec_all ON alice_rep.sec USING (true) WITH CHECK (v <> 'v700');",
        )
        .unwrap_or_else(|e| panic!("as alice: {}", describe_error(&e)));
    alice
        .batch_execute(r#"SELECT tide.create_pipeline('ba', 'table', '{"schema": "alice_rep"}')"#)
        .unwrap_or_else(|e| panic!("as alice: {}", describe_error(&e)));
    wait_streaming(&c, "ba", Duration::from_secs(30));
    alice
        .batch_execute("SELECT tide.add_table('ba', 'alice.sec', backfill => false); SELECT tide.start_backfill('alice.sec', 'ba', chunk_size => 500)")
        .unwrap_or_else(|e| panic!("as alice: {}", describe_error(&e)));
    // The policy refuses row 700: its chunk (the second) fails with the policy's error, as an
    // INSERT would (a bulk load would have bypassed the check), and so does its backfill.
    if let Err(msg) = poll_every(Duration::from_secs(60), Duration::from_millis(100), || {
        Ok(c.try_query_scalar::<bool>(
            "SELECT coalesce((SELECT state = 'failed' AND error LIKE '%row-level security%'
                                FROM tide.backfills WHERE source = 'alice.sec'::regclass), false)",
        )?)
    }) {
        panic!(
            "the policy's check did not stop the chunk: {msg}\n{}",
            diag(&c)
        );
    }
    alice
        .batch_execute(
            "UPDATE alice.sec SET v = 'fixed' WHERE id = 700; SELECT tide.resume_backfill('alice.sec', 'ba')",
        )
        .unwrap_or_else(|e| panic!("as alice: {}", describe_error(&e)));
    wait_backfill(&c, "alice.sec", "ba", 120);
    wait_pipeline(&c, "ba", 60);
    assert_same_rows(
        "row security",
        &c,
        "alice.sec",
        &c,
        "alice_rep.sec",
        "id, v",
    );
    assert_eq!(
        written_as(&c, "ba", "alice.sec"),
        vec!["upsert", "upsert", "upsert", "-"],
        "a table with row security is upserted"
    );
}

/// kill -9 of the worker while a chunk is being loaded in bulk, before its transaction commits:
/// nothing of the chunk is visible, the cluster recovers, the chunk is read again under new
/// watermarks and loaded in bulk again, and the target ends equal to the source. The window is
/// deterministic: an index expression on the target calls a function that sleeps 8 s the first
/// time (a sequence, which the crash does not roll back, says which time) while the bulk load
/// maintains the indexes; the test waits until the worker shows that sleep in pg_stat_activity.
#[test]
fn kill_during_a_bulk_load_loses_and_duplicates_nothing() {
    const P: &str = "bkk";
    const ROWS: i64 = 20_000;
    let c = setup("tt_bulk_kill");
    c.execute(&format!(
        "CREATE TABLE big (id int PRIMARY KEY, v text NOT NULL, pad text);
         INSERT INTO big SELECT g, md5(g::text), repeat(E'p\\t', 20) FROM generate_series(1, {ROWS}) g;
         CREATE SCHEMA rk;
         CREATE TABLE rk.big (id int PRIMARY KEY, v text NOT NULL, pad text);
         CREATE SEQUENCE rk.stalls;
         CREATE FUNCTION rk.stall_once(v text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
         BEGIN
             IF nextval('rk.stalls') = 1 THEN PERFORM pg_sleep(8); END IF;
             RETURN v;
         END $$;
         CREATE INDEX big_stall ON rk.big (rk.stall_once(v));"
    ));
    create_pipeline(&c, P, "table", r#"{"schema": "rk"}"#);
    exec(
        &c,
        &format!("SELECT tide.add_table('{P}', 'big', backfill => false)"),
    );
    exec(
        &c,
        &format!("SELECT tide.start_backfill('big', '{P}', chunk_size => {ROWS})"),
    );
    let started = Instant::now();
    let in_window = "SELECT count(*) FROM pg_stat_activity
                      WHERE backend_type = 'pg_tide worker' AND wait_event = 'PgSleep'";
    if let Err(msg) = poll_every(Duration::from_secs(60), Duration::from_millis(20), || {
        Ok(c.try_query_scalar::<i64>(in_window)? == 1)
    }) {
        panic!("the bulk load never stalled: {msg}\n{}", diag(&c));
    }
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM rk.big"),
        0,
        "rows of the chunk visible before its commit"
    );
    let victim = worker_pid(&c, P).unwrap_or_else(|| panic!("no worker\n{}", diag(&c)));
    kill9(victim);
    eprintln!(
        "bulk kill: worker {victim} killed {:.1?} after the backfill started, inside the bulk load",
        started.elapsed()
    );
    wait_recovered(&c, P, Some(victim), Duration::from_secs(60), || diag(&c));
    wait_backfill(&c, "big", P, 120);
    wait_pipeline(&c, P, 60);
    assert_same_rows(
        "after the kill",
        &c,
        "public.big",
        &c,
        "rk.big",
        "id, v, pad",
    );
    // Every row went through the index after the crash (the sequence's own advance before it
    // may be lost with the crash).
    assert!(
        c.query_scalar::<i64>("SELECT last_value FROM rk.stalls") >= ROWS,
        "the chunk was loaded again after the crash"
    );
    assert_eq!(
        written_as(&c, P, "public.big"),
        vec!["bulk".to_string(), "-".to_string()],
        "one full chunk loaded in bulk, and the empty last one"
    );
}
