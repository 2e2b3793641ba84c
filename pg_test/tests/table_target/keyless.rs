//! Tables without a key (`REPLICA IDENTITY FULL`, README "Tables without a key"): an audit table
//! with duplicate rows, NULLs and a `json` column, captured while pgbench inserts, updates and
//! deletes duplicate rows, at a local and a remote table target and into the outbox (replayed
//! by a consumer written in SQL from `key` and `row`): once with its existing rows copied by hand
//! in the transaction of `tide.add_table` (writers wait on the lock), once with pg_tide's own
//! backfill of such a table (one copy at a point of the stream, no lock: `worker::backfill::keyless`). Each
//! target ends equal to the source as a multiset (count per distinct row). The copy's retake
//! check is shown at work: a transaction the stream already applied that the copy's snapshot
//! does not see yet (its commit waits for a synchronous standby) holds the copy back until it is
//! visible. Then: one of two identical rows updated and deleted changes exactly one at the
//! target; `tide.repair` of a copy too many and a copy too few (it copies the table again); the
//! refusals (no identity, a backfill condition, a column list, `verify`'s sample, a change of
//! the replica identity while captured).

use crate::common::*;

/// The audit table; `doc` is `json` (no equality operator: matched by its text).
const TABLE: &str =
    "CREATE TABLE hist (tid int, aid int, delta int, note text, doc json, mtime timestamp);
     ALTER TABLE hist REPLICA IDENTITY FULL;";

/// Inserts of few distinct rows (duplicates), updates and deletes of one of several equal rows.
fn script() -> String {
    let mut s = String::from("BEGIN;\n");
    for i in 0..3 {
        s.push_str(&format!(
            r#"\set a{i} random(1, 40)
\set d{i} random(1, 3)
\set r{i} random(1, 10)
\if :r{i} <= 6
INSERT INTO hist VALUES (:a{i} % 10, :a{i}, :d{i}, CASE WHEN :d{i} = 1 THEN NULL ELSE 'n' || :d{i} END, ('{{"a":  ' || :d{i} || '}}')::json, '2026-01-01'::timestamp + :d{i} * interval '1 day');
\elif :r{i} <= 8
UPDATE hist SET delta = delta + 1, doc = NULL WHERE ctid = (SELECT ctid FROM hist WHERE aid = :a{i} LIMIT 1);
\else
DELETE FROM hist WHERE ctid = (SELECT ctid FROM hist WHERE aid = :a{i} AND delta = :d{i} LIMIT 1);
\endif
"#
        ));
    }
    s.push_str("COMMIT;\n");
    s
}

const COLS: &str = "tid, aid, delta, note, doc::text, mtime";
/// The same, `doc` as `jsonb` (the outbox's `row` is jsonb, which normalizes a json's text).
const COLS_JSONB: &str = "tid, aid, delta, note, doc::jsonb, mtime";

/// Wait until pgbench's transactions on `hist` are committing (the source's xact counter moves
/// by 100).
fn writes_go_on(c: &Cluster) {
    let then: i64 = c.query_scalar("SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE relid = 'hist'::regclass");
    c.wait_until(
        "pgbench writing hist",
        std::time::Duration::from_secs(60),
        POLL,
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE relid = 'hist'::regclass",
            )? > then + 100)
        },
    );
}

/// Rows that appear more than once at `table` of `c` (the point of the test: duplicates).
fn duplicated(c: &Cluster, table: &str) -> i64 {
    c.query_scalar(&format!(
        "SELECT count(*) FROM (SELECT row({COLS})::text FROM {table} GROUP BY 1 HAVING count(*) > 1) d"
    ))
}

/// Replay the outbox pipeline `p`'s events of `hist` onto `replay` (which starts as
/// `seed`, the rows copied when the table was added, its `json` normalized as the
/// outbox's jsonb normalizes it, or empty) as a consumer would: an
/// update or a delete removes one row equal to `key` (the old row), an insert or an update adds
/// `row`; a `resync` start (pg_tide's copy of the table) empties it, and the `read` events that
/// follow are its rows.
fn replay_outbox(c: &Cluster, p: &str, seed: Option<&str>) {
    let seed = seed.map_or(String::new(), |s| {
        format!(
            "INSERT INTO replay SELECT tid, aid, delta, note, doc::jsonb::json, mtime FROM {s};"
        )
    });
    exec(
        c,
        &format!(
            "CREATE TABLE IF NOT EXISTS replay (LIKE hist);
             TRUNCATE replay;
             {seed}
             DO $$
             DECLARE e record;
             BEGIN
               FOR e IN SELECT op, key, \"row\" FROM tide.outbox
                         WHERE pipeline = '{p}' AND relation = 'public.hist' ORDER BY id LOOP
                 IF e.op = 'resync' AND e.\"row\"->>'phase' = 'start' THEN
                   DELETE FROM replay;
                 END IF;
                 IF e.op = 'read' THEN
                   INSERT INTO replay SELECT * FROM jsonb_populate_record(NULL::replay, e.\"row\");
                 END IF;
                 IF e.op IN ('update', 'delete') THEN
                   DELETE FROM replay r WHERE r.ctid = (SELECT x.ctid FROM replay x
                     WHERE row(x.*)::text = jsonb_populate_record(NULL::replay, e.key)::text LIMIT 1);
                 END IF;
                 IF e.op IN ('insert', 'update') THEN
                   INSERT INTO replay SELECT * FROM jsonb_populate_record(NULL::replay, e.\"row\");
                 END IF;
               END LOOP;
             END $$;"
        ),
    );
}

#[test]
fn keyless_audit_table_converges_under_writes_at_every_target() {
    let (c, t) = setup_remote("tt_keyless");
    exec(&c, TABLE);
    exec(
        &c,
        "INSERT INTO hist SELECT g % 10, g % 40, 1, NULL, '{\"a\": 1}', '2026-01-01' FROM generate_series(1, 2000) g",
    );
    create_pipeline(&c, "loc", "table", r#"{"schema": "rep"}"#);
    create_pipeline(&c, "rem", "postgres", r#"{"server": "tgt"}"#);
    create_pipeline(&c, "ob", "outbox", "{}");
    let script = write_script("table_target_keyless", &script());
    let bench = spawn_pgbench(&c, &script, 2, 20, Some(150));
    // Under writes: each target starts from the rows that exist, copied in the transaction that
    // adds the table, writers waiting on the lock (README, Tables without a key).
    writes_go_on(&c);
    exec(
        &c,
        "BEGIN;
         LOCK TABLE hist IN SHARE MODE;
         SELECT tide.add_table('loc', 'hist', backfill => false);
         INSERT INTO rep.hist SELECT * FROM hist;
         COMMIT;",
    );
    writes_go_on(&c);
    exec(
        &c,
        "BEGIN;
         LOCK TABLE hist IN SHARE MODE;
         SELECT tide.add_table('rem', 'hist', backfill => false, target_table => 'mirror.hist');
         CREATE FOREIGN TABLE hist_at_tgt (tid int, aid int, delta int, note text, doc json, mtime timestamp)
           SERVER tgt OPTIONS (schema_name 'mirror', table_name 'hist');
         INSERT INTO hist_at_tgt SELECT * FROM hist;
         COMMIT;",
    );
    writes_go_on(&c);
    exec(
        &c,
        "BEGIN;
         LOCK TABLE hist IN SHARE MODE;
         SELECT tide.add_table('ob', 'hist', backfill => false);
         CREATE TABLE replay_seed AS SELECT * FROM hist;
         COMMIT;",
    );
    let (txns, ok, summary) = bench.finish_summary();
    assert!(ok, "pgbench failed: {summary}\n{}", diag(&c));
    for p in ["loc", "rem", "ob"] {
        wait_pipeline(&c, p, 120);
    }
    let dups = duplicated(&c, "hist");
    let updates: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE pipeline = 'ob' AND op IN ('update', 'delete')",
    );
    eprintln!("keyless: {txns} write txns ({summary}); {dups} distinct rows duplicated at the source; {updates} updates and deletes in the outbox");
    assert!(dups > 10, "the source holds duplicates ({dups})");
    assert!(
        updates > 50,
        "updates and deletes were captured ({updates})"
    );
    assert_same_rows("local", &c, "public.hist", &c, "rep.hist", COLS);
    assert_same_rows("remote", &c, "public.hist", &t, "mirror.hist", COLS);
    for p in ["loc", "rem"] {
        let r = c.query_one(&format!(
            "SELECT missing, extra, changed, source_rows FROM tide.verify('hist', '{p}') WHERE kind LIKE 'summary%'"
        ));
        let found: (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
        assert_eq!(found, (0, 0, 0), "tide.verify at {p}");
        assert!(r.get::<_, i64>(3) > 1000, "every row compared at {p}");
    }
    // The outbox: inserts carry no key; updates and deletes the whole old row as key.
    let keyed_inserts: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE pipeline = 'ob' AND op = 'insert' AND key IS NOT NULL",
    );
    assert_eq!(keyed_inserts, 0, "an insert of a keyless table has no key");
    let old_rows: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE pipeline = 'ob' AND op IN ('update', 'delete')
            AND NOT (key ?& ARRAY['tid', 'aid', 'delta', 'note', 'doc', 'mtime'])",
    );
    assert_eq!(old_rows, 0, "every update and delete carries the old row");
    replay_outbox(&c, "ob", Some("replay_seed"));
    assert_same_rows(
        "outbox replayed",
        &c,
        "public.hist",
        &c,
        "replay",
        COLS_JSONB,
    );
    // At the remote target: one copy of a duplicated row gone, two copies of another too many;
    // tide.verify finds them, tide.repair copies the table again, and nothing differs after.
    t.execute(
        "DELETE FROM mirror.hist WHERE ctid = (SELECT ctid FROM mirror.hist WHERE aid = 3 LIMIT 1);
         INSERT INTO mirror.hist SELECT * FROM mirror.hist WHERE ctid = (SELECT ctid FROM mirror.hist WHERE aid = 5 LIMIT 1);
         INSERT INTO mirror.hist SELECT * FROM mirror.hist WHERE ctid = (SELECT ctid FROM mirror.hist WHERE aid = 5 LIMIT 1);",
    );
    let r = c.query_one(
        "SELECT rows_missing_or_changed, rows_extra, backfill_id FROM tide.repair('hist', 'rem')",
    );
    let found: (i64, i64) = (r.get(0), r.get(1));
    assert_eq!(found, (1, 2), "tide.repair at the remote target");
    assert!(
        r.get::<_, Option<i64>>(2).is_some(),
        "the repair's backfill"
    );
    wait_backfill(&c, "hist", "rem", 60);
    wait_pipeline(&c, "rem", 60);
    assert_same_rows(
        "remote repaired",
        &c,
        "public.hist",
        &t,
        "mirror.hist",
        COLS,
    );
    let r = c.query_one(
        "SELECT missing, extra, changed FROM tide.verify('hist', 'rem') WHERE kind LIKE 'summary%'",
    );
    let found: (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
    assert_eq!(found, (0, 0, 0), "tide.verify after the repair");
}

#[test]
fn keyless_duplicates_change_one_row_and_refusals() {
    let c = setup("tt_keyless_dups");
    exec(
        &c,
        &format!(
            "{TABLE}
             CREATE TABLE nokey (a int, b text);
             CREATE TABLE other (a int, b text);
             ALTER TABLE other REPLICA IDENTITY FULL;"
        ),
    );
    create_pipeline(&c, "p", "table", r#"{"schema": "rep"}"#);
    // No key and not FULL: refused, the hint says how to capture it.
    let e = c
        .try_execute("SELECT tide.add_table('p', 'nokey')")
        .unwrap_err();
    assert_db_error(
        &e,
        "55000",
        Some("ALTER TABLE public.nokey REPLICA IDENTITY FULL"),
    );
    // Keyless: a column list is refused (0A000), with what to do instead.
    let e = c
        .try_execute(
            "SELECT tide.add_table('p', 'other', backfill => false, columns => ARRAY['a'])",
        )
        .unwrap_err();
    assert_db_error(&e, "0A000", Some("Omit columns"));
    exec(&c, "SELECT tide.add_table('p', 'hist', backfill => false)");
    wait_pipeline(&c, "p", 60);
    let e = c
        .try_execute("SELECT tide.alter_table('p', 'hist', columns => ARRAY['aid'])")
        .unwrap_err();
    assert_db_error(&e, "0A000", None);
    // Its backfill copies the whole table: a condition cannot restrict it.
    let e = c
        .try_execute("SELECT tide.start_backfill('hist', 'p', condition => 'aid > 1')")
        .unwrap_err();
    assert_db_error(&e, "0A000", Some("without a condition"));
    // Three identical rows (NULLs and json included); one updated, one deleted.
    exec(
        &c,
        "INSERT INTO hist SELECT 1, 2, 3, NULL, '{\"x\":  [1]}', NULL FROM generate_series(1, 3);
         INSERT INTO hist VALUES (9, 9, 9, 'other', NULL, '2026-01-01');",
    );
    exec(
        &c,
        "UPDATE hist SET delta = 4 WHERE ctid = (SELECT ctid FROM hist WHERE delta = 3 LIMIT 1)",
    );
    exec(
        &c,
        "DELETE FROM hist WHERE ctid = (SELECT ctid FROM hist WHERE delta = 3 LIMIT 1)",
    );
    wait_pipeline(&c, "p", 60);
    let counts = |table: &str| -> String {
        texts(
            &c,
            &format!("SELECT delta || ':' || count(*) FROM {table} GROUP BY delta ORDER BY delta"),
        )
        .join(" ")
    };
    assert_eq!(counts("hist"), "3:1 4:1 9:1");
    assert_eq!(
        counts("rep.hist"),
        "3:1 4:1 9:1",
        "one of the equal rows each"
    );
    assert_same_rows("hist", &c, "public.hist", &c, "rep.hist", COLS);
    // A value stored out of line (TOAST) that an update leaves unchanged is not in the new row:
    // the old row (logged whole under FULL) finds the target's row, which keeps its value.
    exec(
        &c,
        "INSERT INTO hist SELECT 6, 6, 6, string_agg(md5(g::text), ''), NULL, NULL FROM generate_series(1, 400) g;
         INSERT INTO hist SELECT * FROM hist WHERE delta = 6;",
    );
    exec(
        &c,
        "UPDATE hist SET delta = 60 WHERE ctid = (SELECT ctid FROM hist WHERE delta = 6 LIMIT 1)",
    );
    wait_pipeline(&c, "p", 60);
    assert_eq!(
        counts("rep.hist"),
        "3:1 4:1 6:1 9:1 60:1",
        "the toasted row updated once"
    );
    assert_same_rows("hist (TOAST)", &c, "public.hist", &c, "rep.hist", COLS);
    // verify compares the table as a multiset: equal now; one copy too few and one too many
    // at the target are found, and the copy the README prescribes fixes them.
    let summary = |c: &Cluster| -> (i64, i64, i64) {
        let r = c.query_one(
            "SELECT missing, extra, changed FROM tide.verify('hist', 'p') WHERE kind LIKE 'summary%'",
        );
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(summary(&c), (0, 0, 0));
    exec(
        &c,
        "INSERT INTO hist SELECT 7, 7, 7, NULL, NULL, NULL FROM generate_series(1, 2)",
    );
    wait_pipeline(&c, "p", 60);
    exec(
        &c,
        "DELETE FROM rep.hist WHERE ctid = (SELECT ctid FROM rep.hist WHERE delta = 7 LIMIT 1);
         INSERT INTO rep.hist VALUES (9, 9, 9, 'other', NULL, '2026-01-01');",
    );
    assert_eq!(summary(&c), (1, 1, 0), "one copy missing, one extra");
    let e = c
        .try_execute("SELECT * FROM tide.verify('hist', 'p', sample => 5)")
        .unwrap_err();
    assert_db_error(&e, "0A000", Some("Omit sample"));
    // tide.repair: the table copied again, with no lock; it says what it found and started.
    let (missing, extra, id, action): (i64, i64, Option<i64>, String) = {
        let r = c.query_one(
            "SELECT rows_missing_or_changed, rows_extra, backfill_id, action FROM tide.repair('hist', 'p')",
        );
        (r.get(0), r.get(1), r.get(2), r.get(3))
    };
    assert_eq!((missing, extra), (1, 1), "{action}");
    assert!(action.contains("copying the table again"), "{action}");
    let id = id.expect("the repair's backfill");
    wait_backfill(&c, "hist", "p", 60);
    wait_pipeline(&c, "p", 60);
    let copied: (String, i64) = {
        let r = c.query_one(&format!(
            "SELECT state, rows_emitted FROM tide.backfill WHERE id = {id}"
        ));
        (r.get(0), r.get(1))
    };
    let rows: i64 = c.query_scalar("SELECT count(*) FROM hist");
    assert_eq!(copied, ("done".to_string(), rows), "the repair's copy");
    assert_eq!(summary(&c), (0, 0, 0), "repaired");
    assert_same_rows("hist repaired", &c, "public.hist", &c, "rep.hist", COLS);
    // Nothing left to repair.
    let action: String = c.query_scalar("SELECT action FROM tide.repair('hist', 'p')");
    assert!(action.starts_with("nothing to repair"), "{action}");
    // The replica identity stays FULL while the table is captured.
    let e = c
        .try_execute("ALTER TABLE hist REPLICA IDENTITY DEFAULT")
        .unwrap_err();
    assert_db_error(&e, "55000", Some("tide.remove_table('p', 'public.hist')"));
    let ident: String =
        c.query_scalar("SELECT relreplident::text FROM pg_class WHERE oid = 'hist'::regclass");
    assert_eq!(ident, "f");
    // Other ALTER TABLEs of it are not refused; a table with a key is not concerned.
    exec(&c, "ALTER TABLE hist ADD COLUMN extra int");
    exec(&c, "ALTER TABLE other REPLICA IDENTITY DEFAULT");
    exec(&c, "INSERT INTO hist VALUES (5, 5, 5, NULL, NULL, NULL, 5)");
    wait_pipeline(&c, "p", 60);
    assert_same_rows(
        "hist after ADD COLUMN",
        &c,
        "public.hist",
        &c,
        "rep.hist",
        &format!("{COLS}, extra"),
    );
}

/// pg_tide's backfill of a keyless table (one copy at a point of the stream, no lock) while
/// pgbench inserts, updates and deletes duplicate rows: the rows loaded before the pipeline and
/// every change reach the local and remote targets and the outbox (replayed) as multisets, and
/// `tide.verify` finds nothing.
#[test]
fn keyless_backfill_converges_under_writes_at_every_target() {
    let (c, t) = setup_remote("tt_keyless_bf");
    exec(&c, TABLE);
    exec(
        &c,
        "INSERT INTO hist SELECT g % 10, g % 40, 1, NULL, '{\"a\": 1}', '2026-01-01' FROM generate_series(1, 2000) g",
    );
    create_pipeline(&c, "loc", "table", r#"{"schema": "rep"}"#);
    create_pipeline(&c, "rem", "postgres", r#"{"server": "tgt"}"#);
    create_pipeline(&c, "ob", "outbox", "{}");
    let script = write_script("table_target_keyless_bf", &script());
    let bench = spawn_pgbench(&c, &script, 2, 20, Some(150));
    writes_go_on(&c);
    exec(&c, "SELECT tide.add_table('loc', 'hist')");
    writes_go_on(&c);
    exec(
        &c,
        "SELECT tide.add_table('rem', 'hist', target_table => 'mirror.hist')",
    );
    writes_go_on(&c);
    exec(&c, "SELECT tide.add_table('ob', 'hist')");
    for p in ["loc", "rem", "ob"] {
        wait_backfill(&c, "hist", p, 120);
    }
    // More writes after every copy.
    writes_go_on(&c);
    let (txns, ok, summary) = bench.finish_summary();
    assert!(ok, "pgbench failed: {summary}\n{}", diag(&c));
    for p in ["loc", "rem", "ob"] {
        wait_pipeline(&c, p, 120);
    }
    let copies: Vec<String> = texts(
        &c,
        "SELECT pipeline || ':' || state || ':' || rows_emitted || ':' || (copy_snapshot IS NOT NULL)
           FROM tide.backfill WHERE relation = 'public.hist' ORDER BY pipeline",
    );
    let dups = duplicated(&c, "hist");
    eprintln!("keyless backfill: {txns} write txns ({summary}); {dups} distinct rows duplicated; copies {copies:?}");
    assert!(dups > 10, "the source holds duplicates ({dups})");
    for row in &copies {
        let f: Vec<&str> = row.split(':').collect();
        assert_eq!(f[1], "done", "{row}");
        assert_eq!(f[3], "true", "the copy's snapshot is recorded: {row}");
        assert!(
            f[2].parse::<i64>().unwrap() >= 1000,
            "the copy read the table: {row}"
        );
    }
    assert_same_rows("local", &c, "public.hist", &c, "rep.hist", COLS);
    assert_same_rows("remote", &c, "public.hist", &t, "mirror.hist", COLS);
    for p in ["loc", "rem"] {
        let r = c.query_one(&format!(
            "SELECT missing, extra, changed, source_rows FROM tide.verify('hist', '{p}') WHERE kind LIKE 'summary%'"
        ));
        let found: (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
        assert_eq!(found, (0, 0, 0), "tide.verify at {p}");
    }
    // The outbox: the copy is one resync start, a read per row, one resync end.
    let marks: Vec<String> = texts(
        &c,
        "SELECT op || ':' || (\"row\"->>'phase') FROM tide.outbox
          WHERE pipeline = 'ob' AND op = 'resync' ORDER BY id",
    );
    assert_eq!(marks, vec!["resync:start", "resync:end"]);
    replay_outbox(&c, "ob", None);
    assert_same_rows(
        "outbox replayed",
        &c,
        "public.hist",
        &c,
        "replay",
        COLS_JSONB,
    );
}

/// The copy's retake check, forced: a transaction whose commit waits for a synchronous standby
/// that never answers has its commit record in the WAL (the stream applies it) but stays in the
/// process array, so a snapshot does not see it. A copy taken with such a snapshot would replace
/// the target's rows without it: lost. The copy waits (tide.backfill says why) until the
/// transaction is visible, then converges.
#[test]
fn keyless_copy_waits_for_an_applied_transaction_its_snapshot_misses() {
    // Every process commits locally but the session below, which waits for a standby.
    let c = start_cluster(Cluster::builder("tt_keyless_gap").conf("synchronous_commit = local"));
    init_extension(&c);
    exec(&c, TABLE);
    exec(
        &c,
        "INSERT INTO hist SELECT 1, g, 1, NULL, NULL, NULL FROM generate_series(1, 10) g",
    );
    create_pipeline(&c, "p", "table", r#"{"schema": "rep"}"#);
    exec(&c, "SELECT tide.add_table('p', 'hist', backfill => false)");
    wait_pipeline(&c, "p", 60);
    exec(&c, "ALTER SYSTEM SET synchronous_standby_names = 'nobody'");
    exec(&c, "SELECT pg_reload_conf()");
    let mut waiter = c.client();
    let pid: i32 = waiter
        .query_one("SELECT pg_backend_pid()", &[])
        .unwrap()
        .get(0);
    c.wait_until(
        "synchronous_standby_names in effect",
        std::time::Duration::from_secs(30),
        POLL,
        || Ok(c.try_query_scalar::<String>("SHOW synchronous_standby_names")? == "nobody"),
    );
    let gap = std::thread::spawn(move || {
        waiter.batch_execute(
            "SET synchronous_commit = on; INSERT INTO hist VALUES (7, 7, 7, 'gap', NULL, NULL)",
        )
    });
    // The stream applies it: its commit record is in the WAL.
    c.wait_until(
        "the waiting transaction applied at the target",
        std::time::Duration::from_secs(60),
        POLL,
        || Ok(c.try_query_scalar::<i64>("SELECT count(*) FROM rep.hist WHERE note = 'gap'")? == 1),
    );
    let waiting: bool = c.query_scalar(&format!(
        "SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE pid = {pid}"
    ));
    assert!(waiting, "the transaction waits for the standby");
    exec(&c, "SELECT tide.start_backfill('hist', 'p')");
    // Either the copy waits (the check) or it was taken (without the check).
    c.wait_until(
        "the copy waits or is taken",
        std::time::Duration::from_secs(60),
        POLL,
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT state = 'done' OR coalesce(error LIKE 'waiting: the copy%', false)
                   FROM tide.backfill WHERE relation = 'public.hist'",
            )?)
        },
    );
    let held: String = c.query_scalar(
        "SELECT state || ': ' || coalesce(error, '') FROM tide.backfill WHERE relation = 'public.hist'",
    );
    eprintln!("keyless gap: while the transaction waits, the backfill is {held}");
    exec(&c, &format!("SELECT pg_cancel_backend({pid})"));
    gap.join()
        .unwrap()
        .expect("the waiting insert ends, committed, when its wait is cancelled");
    wait_backfill(&c, "hist", "p", 60);
    exec(&c, "ALTER SYSTEM RESET synchronous_standby_names");
    exec(&c, "SELECT pg_reload_conf()");
    exec(&c, "INSERT INTO hist VALUES (8, 8, 8, 'after', NULL, NULL)");
    wait_pipeline(&c, "p", 60);
    assert_same_rows("hist", &c, "public.hist", &c, "rep.hist", COLS);
    let n: i64 = c.query_scalar("SELECT count(*) FROM rep.hist WHERE note = 'gap'");
    assert_eq!(n, 1, "the applied transaction's row is at the target once");
    assert!(
        held.starts_with("queued: waiting: the copy's snapshot does not yet see transaction"),
        "the copy waited for the transaction the stream had applied: {held}"
    );
}

/// A worker killed (`kill -9`) while it writes the copy of a keyless table (held on a lock of
/// the target table, after the backfill was marked done in the same transaction): nothing of
/// the copy stays, the restarted worker copies the table again, and the target ends equal to
/// the source, each row as many times as there.
#[test]
fn keyless_copy_killed_midway_is_taken_again() {
    let c = setup("tt_keyless_crash");
    exec(&c, TABLE);
    exec(
        &c,
        "INSERT INTO hist SELECT g % 10, g % 40, 1, NULL, NULL, NULL FROM generate_series(1, 500) g",
    );
    create_pipeline(&c, "p", "table", r#"{"schema": "rep"}"#);
    exec(&c, "SELECT tide.add_table('p', 'hist', backfill => false)");
    wait_pipeline(&c, "p", 60);
    exec(
        &c,
        "INSERT INTO hist SELECT 1, 1, 2, 'streamed', NULL, NULL FROM generate_series(1, 3)",
    );
    wait_pipeline(&c, "p", 60);
    // A lock on the target table that its writes wait for. Nothing of hist is left for the
    // stream to write (applied above), and the copy comes first in an iteration, so the worker
    // that waits on it is in the middle of the copy (the backfill already marked done in its
    // transaction).
    let mut holder = c.client();
    holder
        .batch_execute("BEGIN; LOCK TABLE rep.hist IN SHARE MODE")
        .unwrap();
    exec(&c, "SELECT tide.start_backfill('hist', 'p')");
    c.wait_until(
        "the copy waiting for the target's lock",
        std::time::Duration::from_secs(60),
        POLL,
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide worker' AND wait_event_type = 'Lock'",
            )? == 1)
        },
    );
    exec(
        &c,
        "INSERT INTO hist SELECT 2, 2, 3, 'during', NULL, NULL FROM generate_series(1, 2);
         DELETE FROM hist WHERE ctid = (SELECT ctid FROM hist WHERE delta = 2 LIMIT 1)",
    );
    let pid: i32 = c.query_scalar("SELECT worker_pid FROM tide.pipelines WHERE name = 'p'");
    kill9_and_wait_restart(&c, pid, std::time::Duration::from_secs(60));
    drop(holder);
    exec(
        &c,
        "INSERT INTO hist SELECT 3, 3, 4, 'after', NULL, NULL FROM generate_series(1, 2)",
    );
    wait_backfill(&c, "hist", "p", 120);
    wait_pipeline(&c, "p", 120);
    assert_same_rows("hist", &c, "public.hist", &c, "rep.hist", COLS);
    let r = c.query_one(
        "SELECT missing, extra, changed FROM tide.verify('hist', 'p') WHERE kind LIKE 'summary%'",
    );
    let found: (i64, i64, i64) = (r.get(0), r.get(1), r.get(2));
    assert_eq!(found, (0, 0, 0), "tide.verify");
}

/// Whether the pipelines' workers commit nothing for 3 seconds (each replication origin's
/// `local_lsn`, which every commit of a worker's transaction that got an id moves, stays put),
/// looked for in up to 10 windows: an idle pipeline writes no WAL. A worker that wrote at each
/// iteration would see its own WAL at its next poll and iterate again, forever; none is quiet
/// for 3 s then.
fn quiet(c: &Cluster) -> Result<(), String> {
    let origins = |c: &Cluster| {
        texts(
            c,
            "SELECT o.roname || ' ' || s.local_lsn FROM pg_replication_origin_status s
               JOIN pg_replication_origin o ON o.roident = s.local_id ORDER BY 1",
        )
    };
    let mut seen = Vec::new();
    for _ in 0..10 {
        let before = origins(c);
        std::thread::sleep(std::time::Duration::from_secs(3));
        let after = origins(c);
        if before == after {
            return Ok(());
        }
        seen.push(format!("{before:?} -> {after:?}"));
    }
    Err(seen.join("\n"))
}

/// Idle pipelines, one capturing a table without a key (whose worker looks for keyless work at
/// every iteration) and one capturing only a keyed table (which skips that): neither commits
/// anything while nothing changes at the source. (The check for backfills the copy cannot do
/// once ran an `UPDATE` at every iteration, which got the transaction an id and a commit record:
/// idle workers then iterated about 5 times a second, each writing one.)
#[test]
fn keyless_idle_pipelines_write_nothing() {
    let c = setup("tt_keyless_idle");
    exec(
        &c,
        &format!(
            "{TABLE}
             INSERT INTO hist SELECT g % 10, g % 40, 1, NULL, NULL, NULL FROM generate_series(1, 100) g;
             CREATE TABLE keyed (id int PRIMARY KEY, v int);
             INSERT INTO keyed SELECT g, g FROM generate_series(1, 100) g;"
        ),
    );
    create_pipeline(&c, "p", "table", r#"{"schema": "rep"}"#);
    create_pipeline(&c, "q", "table", r#"{"schema": "rep2"}"#);
    exec(&c, "SELECT tide.add_table('p', 'hist')");
    exec(&c, "SELECT tide.add_table('p', 'keyed')");
    exec(&c, "SELECT tide.add_table('q', 'keyed')");
    wait_backfill(&c, "hist", "p", 60);
    wait_backfill(&c, "keyed", "p", 60);
    wait_backfill(&c, "keyed", "q", 60);
    exec(&c, "INSERT INTO hist VALUES (1, 1, 1, NULL, NULL, NULL)");
    wait_pipeline(&c, "p", 60);
    wait_pipeline(&c, "q", 60);
    let origins: i64 = c.query_scalar("SELECT count(*) FROM pg_replication_origin_status");
    assert_eq!(origins, 2, "one replication origin per pipeline");
    if let Err(e) = quiet(&c) {
        panic!("the idle workers committed in every 3 s window:\n{e}");
    }
    assert_same_rows("hist", &c, "public.hist", &c, "rep.hist", COLS);
}
