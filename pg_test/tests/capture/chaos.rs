//! Chaos: kill -9 of the worker and an immediate shutdown under concurrent load; every event
//! delivered exactly once and in order, the replay equal to the source.

use crate::common::*;
use std::path::Path;
use std::time::{Duration, Instant};

const CHAOS_SCRIPT: &str = r#"\set r random(1, 100)
\set a random(1, 2000)
\set b random(1, 2000)
\set o random(1, 400)
\set l random(1, 5)
\set o2 random(1, 400)
\set l2 random(1, 5)
\set amt random(-500, 500)
\set lo least(:a, :b)
\set hi greatest(:a, :b)
\if :r <= 22
INSERT INTO acct VALUES (:a, 'owner ' || :a, :amt, md5(random()::text)) ON CONFLICT (id) DO UPDATE SET balance = acct.balance + excluded.balance, note = excluded.note;
\elif :r <= 36
UPDATE acct SET balance = balance + :amt WHERE id = :a;
\elif :r <= 39
UPDATE acct SET id = nextval('acct_move') WHERE id = :a;
\elif :r <= 46
DELETE FROM acct WHERE id = :a;
\elif :r <= 60
INSERT INTO "Order Lines" VALUES (:o, :l, :amt, :amt * 1.25) ON CONFLICT (order_id, line) DO UPDATE SET qty = excluded.qty, price = excluded.price;
\elif :r <= 70
UPDATE "Order Lines" SET qty = qty + 1, price = price + 0.01 WHERE order_id = :o AND line = :l;
\elif :r <= 76
UPDATE "Order Lines" SET order_id = nextval('ol_move') WHERE order_id = :o AND line = :l;
\elif :r <= 82
DELETE FROM "Order Lines" WHERE order_id = :o AND line = :l;
\else
BEGIN;
UPDATE acct SET balance = balance - :amt WHERE id = :lo;
UPDATE acct SET balance = balance + :amt, note = 'moved ' || :amt WHERE id = :hi;
INSERT INTO "Order Lines" VALUES (:o, :l, 1, :amt) ON CONFLICT (order_id, line) DO UPDATE SET qty = "Order Lines".qty + 1;
UPDATE "Order Lines" SET price = price * 2 WHERE order_id = :o AND line = :l;
INSERT INTO acct VALUES (nextval('acct_move'), 'new', :amt, NULL);
COMMIT;
\endif
"#;

#[test]
fn chaos_kill9_and_immediate_restart_exactly_once() {
    // Small target transactions: many commit/slot-advance boundaries for the kills to hit.
    let c = Cluster::builder("chaos")
        .conf("tide.batch_events=200")
        .start();
    init_extension(&c);
    c.execute(
        r#"
CREATE TABLE public.acct (id int PRIMARY KEY, owner text, balance bigint, note text);
CREATE TABLE public."Order Lines" (order_id int, line int, qty int, price numeric(12,2),
                                   PRIMARY KEY (order_id, line));
CREATE SEQUENCE acct_move START 100000;
CREATE SEQUENCE ol_move START 100000;
INSERT INTO acct SELECT g, 'seed ' || g, g * 10, md5(g::text) FROM generate_series(1, 600, 2) g;
INSERT INTO "Order Lines" SELECT o, l, o + l, (o * l) / 7.0 FROM generate_series(1, 200) o, generate_series(1, 3) l;
CREATE TABLE replay_acct (LIKE acct INCLUDING ALL);
CREATE TABLE replay_lines (LIKE "Order Lines" INCLUDING ALL);
INSERT INTO replay_acct TABLE acct;
INSERT INTO replay_lines TABLE "Order Lines";
"#,
    );
    create_pipeline(&c, "chaos");
    c.execute(
        r#"SELECT tide.add_table('chaos', 'public.acct', backfill => false);
           SELECT tide.add_table('chaos', 'public."Order Lines"', backfill => false);"#,
    );
    let relations = texts(
        &c,
        "SELECT relation FROM tide.tables WHERE pipeline = 'chaos' ORDER BY relation",
    );
    assert_eq!(relations, ["public.\"Order Lines\"", "public.acct"]);

    // The script must be readable by the postgres OS user.
    let script = write_script("chaos", CHAOS_SCRIPT);

    // Phases of load; each but the last ends with a disruption while pgbench is running.
    enum Disrupt {
        Kill9,
        Immediate,
        Nothing,
    }
    let phases = [
        (Disrupt::Kill9, 6u64),
        (Disrupt::Kill9, 7),
        (Disrupt::Immediate, 6),
        (Disrupt::Kill9, 8),
        (Disrupt::Nothing, 8),
    ];
    let mut total_txns = 0u64;
    let mut kills = 0;
    let mut pid = worker_pid(&c, "chaos");
    let t_all = Instant::now();
    for (i, (what, after)) in phases.iter().enumerate() {
        let secs = match what {
            Disrupt::Nothing => *after,
            _ => after + 20, // cut short by the disruption
        };
        let run = spawn_pgbench(&c, &script, 4, secs);
        std::thread::sleep(Duration::from_secs(*after)); // load generation, not an assertion
        let backlog: String = c
            .try_query_scalar::<String>(
                "SELECT format('events_applied=%s lag_bytes=%s', events_applied, lag_bytes)
                   FROM tide.pipelines WHERE name = 'chaos'",
            )
            .unwrap_or_else(|e| describe_error(&e));
        let label = match what {
            Disrupt::Kill9 => {
                let victim = worker_pid(&c, "chaos")
                    .unwrap_or_else(|| panic!("no worker to kill\n{}", diag(&c)));
                kill9(victim);
                kills += 1;
                pid = Some(victim);
                format!("kill -9 worker pid {victim}")
            }
            Disrupt::Immediate => {
                c.stop(StopMode::Immediate);
                c.start();
                "pg_ctl stop -m immediate; start".to_string()
            }
            Disrupt::Nothing => "no disruption".to_string(),
        };
        let (txns, status, errs) = finish_pgbench(run);
        total_txns += txns;
        let back = match what {
            Disrupt::Nothing => Duration::ZERO,
            _ => {
                let back = wait_recovered(&c, "chaos", pid, Duration::from_secs(60), || diag(&c));
                pid = worker_pid(&c, "chaos");
                back
            }
        };
        eprintln!(
            "chaos phase {}: {label} after {after} s ({backlog}); pgbench: {txns} txns, {status}{}; worker back in {back:.1?}",
            i + 1,
            if errs.is_empty() { String::new() } else { format!(" [{errs}]") },
        );
    }
    let _ = std::fs::remove_file(&script);
    assert!(
        c.log_count("was terminated by signal 9") >= kills,
        "expected {kills} workers terminated by signal 9 in the server log\n{}",
        c.log_tail(60)
    );
    assert!(
        total_txns >= 1000,
        "pgbench processed only {total_txns} transactions"
    );

    let t_wait = Instant::now();
    wait_pipeline(&c, "chaos", 180);
    eprintln!(
        "chaos: load + disruptions took {:.1?}; catch-up after the load {:.1?}",
        t_wait.duration_since(t_all),
        t_wait.elapsed()
    );

    let (events, txns): (i64, i64) = {
        let r = c.query_one(
            "SELECT count(*), count(DISTINCT commit_lsn) FROM tide.outbox WHERE pipeline = 'chaos'",
        );
        (r.get(0), r.get(1))
    };
    let by_op = sample(
        &c,
        "SELECT relation, op, count(*) FROM tide.outbox WHERE pipeline = 'chaos' GROUP BY 1, 2 ORDER BY 1, 2",
        20,
    );
    eprintln!(
        "chaos: {events} events in {txns} source transactions (pgbench: {total_txns} txns)\n{by_op}"
    );
    assert!(
        events >= 3000,
        "only {events} events were captured; the test did not do enough work"
    );
    for (rel, op) in [
        ("public.acct", "insert"),
        ("public.acct", "update"),
        ("public.acct", "delete"),
        ("public.\"Order Lines\"", "insert"),
        ("public.\"Order Lines\"", "update"),
        ("public.\"Order Lines\"", "delete"),
    ] {
        let n: i64 = c.query_scalar(&format!(
            "SELECT count(*) FROM tide.outbox WHERE pipeline = 'chaos' AND relation = '{}' AND op = '{op}'",
            rel.replace('\'', "''")
        ));
        assert!(n > 0, "no {op} events for {rel}:\n{by_op}");
    }
    assert_no_rows(
        &c,
        "events of unexpected relations",
        "SELECT DISTINCT relation FROM tide.outbox WHERE pipeline = 'chaos'
          AND relation NOT IN ('public.acct', 'public.\"Order Lines\"')",
    );
    // Multi-table transactions came through whole.
    let mixed: i64 = c.query_scalar(
        "SELECT count(*) FROM (SELECT commit_lsn FROM tide.outbox WHERE pipeline = 'chaos'
                                GROUP BY 1 HAVING count(DISTINCT relation) = 2) x",
    );
    assert!(mixed > 0, "no transaction touched both tables");

    assert_stream_invariants(&c, "chaos");

    // Replay the outbox onto the copies of the seed; note anomalies a correct stream never has.
    c.execute(
        r#"
CREATE TABLE replay_anomaly (id bigint, what text);
DO $$
DECLARE
    e record;
    pa acct; na acct; ka acct;
    pl "Order Lines"; nl "Order Lines"; kl "Order Lines";
    found_prev boolean;
BEGIN
    FOR e IN SELECT * FROM tide.outbox WHERE pipeline = 'chaos' ORDER BY id LOOP
        IF e.op NOT IN ('insert', 'update', 'delete') THEN
            INSERT INTO replay_anomaly VALUES (e.id, 'unexpected op ' || e.op);
            CONTINUE;
        END IF;
        IF e.unchanged IS NOT NULL THEN
            INSERT INTO replay_anomaly VALUES (e.id, 'unexpected unchanged ' || e.unchanged::text);
        END IF;
        IF (e.op = 'delete') <> (e."row" IS NULL) THEN
            INSERT INTO replay_anomaly VALUES (e.id, 'row is NULL iff delete, violated');
        END IF;
        IF e.relation = 'public.acct' THEN
            ka := jsonb_populate_record(NULL::acct, e.key);
            SELECT * INTO pa FROM replay_acct WHERE id = ka.id;
            found_prev := FOUND;
            IF e.op = 'insert' AND found_prev THEN
                INSERT INTO replay_anomaly VALUES (e.id, 'insert of an existing key ' || e.key::text);
            ELSIF e.op <> 'insert' AND NOT found_prev THEN
                INSERT INTO replay_anomaly VALUES (e.id, e.op || ' of a missing key ' || e.key::text);
            END IF;
            DELETE FROM replay_acct WHERE id = ka.id;
            IF e.op <> 'delete' THEN
                na := jsonb_populate_record(CASE WHEN found_prev THEN pa END, e."row");
                IF na.id IS DISTINCT FROM ka.id THEN
                    INSERT INTO replay_anomaly VALUES (e.id, 'key and row disagree');
                END IF;
                INSERT INTO replay_acct SELECT (na).*;
            END IF;
        ELSIF e.relation = 'public."Order Lines"' THEN
            kl := jsonb_populate_record(NULL::"Order Lines", e.key);
            SELECT * INTO pl FROM replay_lines WHERE order_id = kl.order_id AND line = kl.line;
            found_prev := FOUND;
            IF e.op = 'insert' AND found_prev THEN
                INSERT INTO replay_anomaly VALUES (e.id, 'insert of an existing key ' || e.key::text);
            ELSIF e.op <> 'insert' AND NOT found_prev THEN
                INSERT INTO replay_anomaly VALUES (e.id, e.op || ' of a missing key ' || e.key::text);
            END IF;
            DELETE FROM replay_lines WHERE order_id = kl.order_id AND line = kl.line;
            IF e.op <> 'delete' THEN
                nl := jsonb_populate_record(CASE WHEN found_prev THEN pl END, e."row");
                IF (nl.order_id, nl.line) IS DISTINCT FROM (kl.order_id, kl.line) THEN
                    INSERT INTO replay_anomaly VALUES (e.id, 'key and row disagree');
                END IF;
                INSERT INTO replay_lines SELECT (nl).*;
            END IF;
        ELSE
            INSERT INTO replay_anomaly VALUES (e.id, 'unexpected relation ' || e.relation);
        END IF;
    END LOOP;
END $$;
"#,
    );
    assert_no_rows(
        &c,
        "replay anomalies (duplicate or lost events)",
        "SELECT a.id, a.what, o.commit_lsn, o.position, o.op, o.key FROM replay_anomaly a
           JOIN tide.outbox o ON o.id = a.id ORDER BY a.id",
    );
    assert_no_rows(
        &c,
        "public.acct and its replay differ",
        "(SELECT 'source' AS side, * FROM (TABLE acct EXCEPT TABLE replay_acct) a)
         UNION ALL (SELECT 'replay', * FROM (TABLE replay_acct EXCEPT TABLE acct) b)",
    );
    assert_no_rows(
        &c,
        "public.\"Order Lines\" and its replay differ",
        "(SELECT 'source' AS side, * FROM (TABLE \"Order Lines\" EXCEPT TABLE replay_lines) a)
         UNION ALL (SELECT 'replay', * FROM (TABLE replay_lines EXCEPT TABLE \"Order Lines\") b)",
    );
    let counts = sample(
        &c,
        "SELECT (SELECT count(*) FROM acct) AS acct_rows, (SELECT count(*) FROM \"Order Lines\") AS line_rows",
        1,
    );
    eprintln!("chaos: replay matches the source ({counts})");
    let st: String = c.query_scalar("SELECT state FROM tide.pipelines WHERE name = 'chaos'");
    assert_eq!(st, "streaming", "{}", diag(&c));
}

/// pgbench with `script` at 1000 transactions per second in total (enough work, and a catch-up
/// that takes seconds).
fn spawn_pgbench(c: &Cluster, script: &Path, clients: u32, secs: u64) -> PgbenchRun {
    pg_test::spawn_pgbench_tries(c, script, clients, secs, Some(1000), 10)
}

/// (transactions, "exit status after elapsed", the first lines of stderr).
fn finish_pgbench(run: PgbenchRun) -> (u64, String, String) {
    let r = run.finish();
    (r.txns, r.status, r.errors)
}
