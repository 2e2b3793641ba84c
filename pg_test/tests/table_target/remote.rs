//! A remote target's apply: it goes down and comes back (error state, recovery, every event
//! applied exactly once and in order); statements are grouped per table per batch; a chunk that
//! fails after the events before it were committed neither re-applies nor loses them.

use crate::common::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const AUDIT_FN: &str = "
CREATE TABLE IF NOT EXISTS write_log (seq bigserial PRIMARY KEY, id int NOT NULL, op text NOT NULL, n int);
CREATE OR REPLACE FUNCTION log_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO write_log (id, op) VALUES (OLD.id, 'd');
    ELSE
        INSERT INTO write_log (id, op, n) VALUES (NEW.id, 'w', NEW.n);
    END IF;
    RETURN NULL;
END $$;
";

const OUTAGE_SCRIPT: &str = r#"\set id random(1, 400)
\set id2 random(1, 400)
\set r random(1, 100)
\if :r <= 12
DELETE FROM items WHERE id = :id;
\elif :r <= 30
BEGIN;
INSERT INTO items AS i (id, n, v) VALUES (least(:id, :id2), 1, md5(random()::text)) ON CONFLICT (id) DO UPDATE SET n = i.n + 1, v = excluded.v;
INSERT INTO items AS i (id, n, v) VALUES (greatest(:id, :id2), 1, md5(random()::text)) ON CONFLICT (id) DO UPDATE SET n = i.n + 1, v = excluded.v;
COMMIT;
\else
INSERT INTO items AS i (id, n, v) VALUES (:id, 1, md5(random()::text)) ON CONFLICT (id) DO UPDATE SET n = i.n + 1, v = excluded.v;
\endif
"#;

/// id → "w1,w2,d,w1,..." from a write_log.
fn write_logs(c: &Cluster) -> BTreeMap<i32, String> {
    c.query("SELECT id, string_agg(op || coalesce(n::text, ''), ',' ORDER BY seq) FROM write_log GROUP BY id")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[test]
fn remote_target_outage_recovers() {
    const P: &str = "o";
    let t_all = Instant::now();
    let (c, t) = setup_remote("tt_outage");
    c.execute(AUDIT_FN);
    c.execute(
        "CREATE TABLE items (id int PRIMARY KEY, n int NOT NULL, v text);
         CREATE TRIGGER items_log AFTER INSERT OR UPDATE OR DELETE ON items FOR EACH ROW EXECUTE FUNCTION log_write();",
    );
    create_pipeline(&c, P, "postgres", r#"{"server": "tgt"}"#);
    exec(
        &c,
        &format!("SELECT tide.add_table('{P}', 'items', backfill => false)"),
    );
    // The same log on the target table (ENABLE ALWAYS: fires whatever session_replication_role
    // the sink uses).
    t.execute(AUDIT_FN);
    t.execute(
        "CREATE TRIGGER items_log AFTER INSERT OR UPDATE OR DELETE ON public.items FOR EACH ROW EXECUTE FUNCTION log_write();
         ALTER TABLE public.items ENABLE ALWAYS TRIGGER items_log;",
    );

    // Watches the remote applied position: it must never go back.
    let stop = AtomicBool::new(false);
    let applied_seen: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let mut error_seen: Option<(String, String, String)> = None;
    let mut down_for = Duration::ZERO;
    let mut recovered_in = Duration::ZERO;
    let mut bench_out = String::new();
    std::thread::scope(|s| {
        let monitor = s.spawn(|| {
            let mut regressions = Vec::new();
            let mut client: Option<Client> = None;
            while !stop.load(Ordering::SeqCst) {
                if client.is_none() {
                    client = t.try_client().ok();
                }
                if let Some(cl) = client.as_mut() {
                    match cl.query_opt(
                        "SELECT applied_lsn::text FROM public.tide_applied WHERE pipeline = $1",
                        &[&P],
                    ) {
                        Ok(Some(r)) => {
                            let l = parse_lsn(&r.get::<_, String>(0)).unwrap_or(0);
                            let mut seen = applied_seen.lock().unwrap();
                            if let Some(&prev) = seen.last() {
                                if l < prev {
                                    regressions.push(format!("{prev:X} -> {l:X}"));
                                }
                            }
                            seen.push(l);
                        }
                        Ok(None) => {}
                        Err(_) => client = None,
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            regressions
        });
        let writers = s.spawn(|| {
            c.pgbench(OUTAGE_SCRIPT)
                .clients(2)
                .rate(150.0)
                .duration(Duration::from_secs(30))
                .run()
        });
        t.wait_until(
            "events to reach the target",
            Duration::from_secs(60),
            POLL,
            || Ok(t.try_query_scalar::<i64>("SELECT count(*) FROM write_log")? >= 300),
        );
        let applied_before: i64 = t.query_scalar("SELECT count(*) FROM write_log");

        // The outage.
        let t_down = Instant::now();
        t.stop(StopMode::Immediate);
        match poll_every(Duration::from_secs(40), POLL, || {
            let r = c.try_query_one(&format!(
                "SELECT state, last_error, remedy FROM tide.pipelines WHERE name = '{P}'"
            ))?;
            let (state, err, remedy): (String, Option<String>, Option<String>) = (r.get(0), r.get(1), r.get(2));
            if state == "error" && err.is_some() {
                error_seen = Some((state, err.unwrap_or_default(), remedy.unwrap_or_default()));
                return Ok(true);
            }
            Ok(false)
        }) {
            Ok(d) => eprintln!("outage: tide.pipelines showed state 'error' {d:.1?} after the target went down"),
            Err(msg) => panic!(
                "while the target was down, tide.pipelines never showed state 'error' with a last_error: {msg}\n{}",
                diag(&c)
            ),
        }
        // Keep it down for at least 6 s in all.
        if let Some(rest) = Duration::from_secs(6).checked_sub(t_down.elapsed()) {
            std::thread::sleep(rest);
        }
        let still: String = c.query_scalar(&format!(
            "SELECT state FROM tide.pipelines WHERE name = '{P}'"
        ));
        assert_eq!(
            still,
            "error",
            "the target is still down\n{}",
            pipeline_row(&c, P)
        );
        t.start();
        down_for = t_down.elapsed();

        // Recovers by itself: streaming, error cleared, and the target moves again.
        let t_up = Instant::now();
        if let Err(msg) = poll_every(Duration::from_secs(90), POLL, || {
            Ok(c.try_query_scalar::<bool>(&format!(
                "SELECT state = 'streaming' AND last_error IS NULL FROM tide.pipelines WHERE name = '{P}'"
            ))? && t.try_query_scalar::<i64>("SELECT count(*) FROM write_log")? > applied_before)
        }) {
            panic!(
                "the pipeline did not recover after the target came back: {msg}\n{}",
                diag(&c)
            );
        }
        recovered_in = t_up.elapsed();
        bench_out = writers.join().expect("pgbench thread");
        wait_pipeline(&c, P, 180);
        stop.store(true, Ordering::SeqCst);
        let regressions = monitor.join().expect("monitor thread");
        assert!(
            regressions.is_empty(),
            "the remote applied position went backwards: {regressions:?}"
        );
    });
    let (state, err, remedy) = error_seen.expect("error state recorded");
    eprintln!(
        "outage: target down {down_for:.1?}; state {state:?}, last_error {err:?}, remedy {remedy:?}; \
         recovered {recovered_in:.1?} after the restart; pgbench tps {:?}",
        pgbench_tps(&bench_out)
    );
    assert!(!remedy.is_empty(), "the error state has no remedy");
    let seen = applied_seen.lock().unwrap().clone();
    assert!(
        seen.len() > 20,
        "the remote applied position was read only {} times",
        seen.len()
    );
    let final_remote: String = t.query_scalar(&format!(
        "SELECT applied_lsn::text FROM public.tide_applied WHERE pipeline = '{P}'"
    ));
    eprintln!(
        "outage: remote tide_applied read {} times, monotonic; final {final_remote}; source applied_lsn {}",
        seen.len(),
        c.query_scalar::<String>(&format!("SELECT applied_lsn::text FROM tide.pipelines WHERE name = '{P}'"))
    );

    assert_same_rows("items", &c, "public.items", &t, "public.items", "id, n, v");
    // Exactly once, in order, per row.
    let src_log = write_logs(&c);
    let tgt_log = write_logs(&t);
    let writes: i64 = c.query_scalar("SELECT count(*) FROM write_log");
    let mut bad = Vec::new();
    for id in src_log.keys().chain(tgt_log.keys()) {
        let (a, b) = (src_log.get(id), tgt_log.get(id));
        if a != b {
            bad.push(format!(
                "id {id}:\n    source: {}\n    target: {}",
                a.map(String::as_str).unwrap_or("-"),
                b.map(String::as_str).unwrap_or("-")
            ));
        }
    }
    bad.dedup();
    assert!(
        bad.is_empty(),
        "{} rows were written at the target in a different sequence than at the source \
         (extra entries: applied twice; missing: lost; swapped: reordered), e.g.\n  {}",
        bad.len(),
        bad.iter().take(8).cloned().collect::<Vec<_>>().join("\n  ")
    );
    assert!(
        writes > 2000,
        "only {writes} writes: the test did not do enough work"
    );
    eprintln!(
        "outage: {writes} source writes on {} rows, each applied exactly once and in order; whole test {:.1?}",
        src_log.len(),
        t_all.elapsed()
    );
}

/// Source transactions that each write two tables are applied with a statement per table per
/// batch, not a statement per table per transaction (a run per table; tables are independent
/// within the target transaction). Counted in the remote's statement log.
#[test]
fn statements_are_grouped_per_table() {
    let c = setup("tt_grouping");
    let t = start_cluster(
        Cluster::builder("tt_grouping_tgt")
            .no_preload()
            .conf("log_statement = 'mod'"),
    );
    create_server(&c, "tgt", &t);
    c.execute(
        "CREATE TABLE a (id int PRIMARY KEY, v int);
         CREATE TABLE b (id int PRIMARY KEY, v int);",
    );
    create_pipeline(&c, "g", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('g', 'a', backfill => false)");
    exec(&c, "SELECT tide.add_table('g', 'b', backfill => false)");
    wait_pipeline(&c, "g", 60);
    // Paused while the transactions commit, so that the worker finds them all at once.
    exec(&c, "SELECT tide.pause_pipeline('g')");
    c.execute(
        "DO $$ BEGIN
           FOR i IN 1..1000 LOOP
             INSERT INTO a VALUES (i, i);
             INSERT INTO b VALUES (i, -i);
             COMMIT;
           END LOOP;
         END $$",
    );
    exec(&c, "SELECT tide.resume_pipeline('g')");
    wait_pipeline(&c, "g", 120);

    assert_same_rows("a", &c, "public.a", &t, "public.a", "id, v");
    assert_same_rows("b", &c, "public.b", &t, "public.b", "id, v");
    let a = t.log_count("INSERT INTO public.a ");
    let b = t.log_count("INSERT INTO public.b ");
    eprintln!("statements at the target: {a} for a, {b} for b (2000 events in 1000 transactions)");
    // A statement per 1000 rows of a table and per batch: the worker may take the 1000
    // transactions in a few batches, so at most 6 each. One run at a time would need a
    // statement per event here, since a and b alternate: 1000 each.
    for (table, n) in [("a", a), ("b", b)] {
        assert!(
            (1..=6).contains(&n),
            "{n} statements for table {table}\n{}",
            diag(&c)
        );
    }
}

/// A remote target commits the stream events that precede a backfill chunk before the chunk's
/// rows. When the chunk then fails at the target, the retried iteration must neither apply
/// those events again nor lose any: here every `ev` row must reach the target exactly once (a
/// trigger at the target logs each write; a second apply of an insert would be an update),
/// while a chunk of `big` fails at the target (its backfill fails, and is resumed once the
/// target takes the row).
#[test]
fn chunk_failure_after_early_commit_is_exactly_once() {
    let (c, t) = setup_remote("tt_early");
    c.execute(
        "CREATE TABLE ev (id bigserial PRIMARY KEY, v int NOT NULL);
         CREATE TABLE big (id int PRIMARY KEY, pad text NOT NULL);
         INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, 30000) g;",
    );
    create_pipeline(&c, "e", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('e', 'ev', backfill => false)");
    wait_pipeline(&c, "e", 60);
    // At the target: log every write of ev, and refuse the row id 15000 of big while
    // boom.on is true.
    t.execute(
        "CREATE TABLE ev_log (seq bigserial PRIMARY KEY, id bigint NOT NULL, op text NOT NULL);
         CREATE FUNCTION log_ev() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO ev_log (id, op) VALUES (NEW.id, TG_OP); RETURN NULL; END $$;
         CREATE TRIGGER ev_log AFTER INSERT OR UPDATE ON public.ev FOR EACH ROW EXECUTE FUNCTION log_ev();
         ALTER TABLE public.ev ENABLE ALWAYS TRIGGER ev_log;
         CREATE TABLE boom (on_ bool NOT NULL);
         INSERT INTO boom VALUES (true);",
    );
    let script = write_script("table_target_early", "INSERT INTO ev (v) VALUES (1);\n");
    let bench = spawn_pgbench(&c, &script, 2, 25, Some(300));
    std::thread::sleep(Duration::from_secs(2));
    // big's target is created by add_table; the trigger goes on it once it exists.
    exec(&c, "SELECT tide.add_table('e', 'big', backfill => true)");
    let found = poll_every(Duration::from_secs(30), POLL, || {
        Ok(t.try_query_scalar::<bool>("SELECT to_regclass('public.big') IS NOT NULL")?)
    });
    assert!(found.is_ok(), "target table big not created\n{}", diag(&c));
    t.execute(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.id = 15000 AND (SELECT on_ FROM boom) THEN
             RAISE EXCEPTION 'refusing row 15000 (test)';
           END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON public.big FOR EACH ROW EXECUTE FUNCTION refuse();
         ALTER TABLE public.big ENABLE ALWAYS TRIGGER refuse;",
    );
    // The chunk holding 15000 fails (its backfill with it: the target refuses it) while ev
    // keeps streaming.
    let failed = poll_every(Duration::from_secs(60), POLL, || {
        Ok(c.try_query_scalar::<bool>(
            "SELECT coalesce((SELECT state = 'failed' AND error LIKE '%refusing row 15000%'
                                FROM tide.backfills WHERE source = 'big'::regclass), false)",
        )?)
    });
    assert!(failed.is_ok(), "the chunk never failed\n{}", diag(&c));
    std::thread::sleep(Duration::from_secs(3));
    t.execute("UPDATE boom SET on_ = false");
    exec(&c, "SELECT tide.resume_backfill('big', 'e')");
    let (n, ok, summary) = bench.finish_summary();
    assert!(ok && n > 0, "pgbench failed: {summary}");
    wait_backfill(&c, "big", "e", 120);
    wait_pipeline(&c, "e", 120);

    assert_same_rows("ev", &c, "public.ev", &t, "public.ev", "id, v");
    assert_same_rows("big", &c, "public.big", &t, "public.big", "id, pad");
    let twice: Vec<String> = texts(
        &t,
        "SELECT id || ': ' || string_agg(op, ',' ORDER BY seq) FROM ev_log GROUP BY id HAVING count(*) <> 1 OR bool_or(op <> 'INSERT') ORDER BY id LIMIT 20",
    );
    assert!(
        twice.is_empty(),
        "ev rows written more than once at the target: {twice:?}\n{}",
        diag(&c)
    );
    let logged: i64 = t.query_scalar("SELECT count(*) FROM ev_log");
    assert_eq!(logged, n as i64, "one write per ev row");
}

/// The `add_table`s of one transaction share one connection to a remote target (each used to
/// open its own: 41-57 ms apiece, 8 s of 200 tables' 18.6 s in benchmark B7); the next
/// transaction opens a new one, so a connection never outlives the transaction that opened it.
/// Counted in the target's log (`log_connections`, by application name).
#[test]
fn add_tables_of_one_transaction_share_a_remote_connection() {
    let c = setup("rt_shared_conn");
    let t = start_cluster(
        Cluster::builder("rt_shared_conn_tgt")
            .no_preload()
            .conf("log_connections = on"),
    );
    create_server(&c, "tgt", &t);
    let opened = || {
        std::fs::read_to_string(t.log_path())
            .unwrap_or_default()
            .matches("application_name=pg_tide add_table")
            .count()
    };
    c.execute(r#"SELECT tide.create_pipeline('p', 'postgres', '{"server": "tgt"}')"#);
    c.execute(
        "CREATE SCHEMA many;
         CREATE TABLE many.a (id int PRIMARY KEY); CREATE TABLE many.b (id int PRIMARY KEY);
         CREATE TABLE many.c (id int PRIMARY KEY); CREATE TABLE many.d (id int PRIMARY KEY);
         CREATE TABLE solo (id int PRIMARY KEY)",
    );
    let before = opened();
    let added: i32 = c.query_scalar("SELECT tide.add_tables_in_schema('p', 'many')");
    assert_eq!(added, 4);
    assert_eq!(opened() - before, 1, "one connection for the four tables");
    c.execute("SELECT tide.add_table('p', 'solo')");
    assert_eq!(opened() - before, 2, "a new transaction, a new connection");
    // Every target table was created at the remote.
    let n: i64 = t.query_scalar(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename IN ('a', 'b', 'c', 'd', 'solo')",
    );
    assert_eq!(n, 5);
    // The connection is closed at the end of its transaction: none is left at the remote.
    t.wait_until(
        "no add_table connection left at the remote",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            Ok(t.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_tide add_table'",
            )? == 0)
        },
    );
}

/// Rows written in `add_table`'s own transaction, after it, reach the target even when the worker
/// read its table list before that transaction committed and decoded it after (CI, stop 40:
/// `consumers::drop_pipeline_waits_for_the_retention_lock_first` found an empty outbox). The
/// decoder's plugin was then not sending the table's changes: the marker ends the batch, and
/// the transaction must be decoded again with the table listed, not taken as applied without
/// the rows after its marker. The window is made deterministic as in `remote_copy`: a lock on
/// the target's `tide_applied` holds the worker's first iteration in its `begin` (reading its
/// applied position, after its table list was read); the test waits until the target shows the
/// worker waiting, then commits.
#[test]
fn rows_in_add_tables_transaction_reach_the_target_when_added_mid_iteration() {
    let (c, t) = setup_remote("tt_addtx");
    c.execute(
        "CREATE TABLE a (id int PRIMARY KEY, s text);
         CREATE TABLE b (id int PRIMARY KEY, s text);",
    );
    t.execute(
        "CREATE TABLE public.a (id int PRIMARY KEY, s text);
         CREATE TABLE public.b (id int PRIMARY KEY, s text);",
    );
    let mut lock = hold_applied(&t, "public");
    exec(
        &c,
        r#"SELECT tide.create_pipeline('addtx', 'postgres', '{"server": "tgt"}')"#,
    );
    wait_worker_held(&t, "public");
    // One transaction: rows of a before and after, the tables added, rows of b after.
    exec(
        &c,
        "BEGIN;
         INSERT INTO a VALUES (0, 'before its add_table: not captured');
         SELECT tide.add_table('addtx', 'a', backfill => false);
         INSERT INTO a VALUES (1, 'same transaction, after');
         SELECT tide.add_table('addtx', 'b', backfill => false);
         INSERT INTO b SELECT g, 'same transaction' FROM generate_series(1, 10) g;
         INSERT INTO a VALUES (2, 'same transaction, last');
         COMMIT;",
    );
    exec(&c, "INSERT INTO b VALUES (11, 'next transaction')");
    // The test's own session on the test's own cluster: a failure is the test's failure.
    lock.batch_execute("ROLLBACK").expect("release the lock");
    wait_pipeline(&c, "addtx", 60);
    assert_eq!(
        texts(&t, "SELECT id || ':' || s FROM public.a ORDER BY id"),
        vec!["1:same transaction, after", "2:same transaction, last"],
        "a's rows from its add_table on"
    );
    assert_same_rows("b", &c, "public.b", &t, "public.b", "id, s");
    assert_eq!(
        t.query_scalar::<i64>("SELECT count(*) FROM public.b"),
        11,
        "b's rows of add_table's transaction and after"
    );
    // The window was made: the worker met a's marker with a list it was not in, and did its
    // iteration again once (not as a failure: no error recorded).
    assert_eq!(
        c.log_count(
            "after this iteration read its table list: the iteration is done again with it"
        ),
        1,
        "{}",
        c.log_tail(40)
    );
    assert!(
        !c.query_scalar::<bool>(
            "SELECT last_error IS NOT NULL FROM tide.pipeline WHERE name = 'addtx'"
        ),
        "no error recorded"
    );
}

/// A table removed and added again while the worker's iteration is under way (both after it read
/// its table list, which had the table): the batch meets the add marker, the remove marker,
/// and the add marker again. The plugin sends the table's changes all along (it is in the
/// decoder's list), so the second add marker captures it again in that batch: its rows after
/// the re-add arrive, those between the removal and the re-add do not, and the iteration is not
/// done again (a restart there would meet the same markers again and again). The window is
/// made as in the test above: the pipeline and its first table are created in one transaction,
/// so the worker's first iteration lists the table, then waits on the target's lock.
#[test]
fn a_table_removed_and_added_again_mid_iteration_is_captured_again() {
    let (c, t) = setup_remote("tt_readd");
    c.execute("CREATE TABLE a (id int PRIMARY KEY, s text);");
    let mut lock = hold_applied(&t, "rem");
    t.execute("CREATE TABLE rem.a (id int PRIMARY KEY, s text);");
    exec(
        &c,
        r#"BEGIN;
           SELECT tide.create_pipeline('readd', 'postgres', '{"server": "tgt", "schema": "rem"}');
           SELECT tide.add_table('readd', 'a', backfill => false);
           COMMIT;"#,
    );
    wait_worker_held(&t, "rem");
    exec(
        &c,
        "INSERT INTO a VALUES (1, 'captured');
         SELECT tide.remove_table('readd', 'a');",
    );
    exec(&c, "INSERT INTO a VALUES (2, 'while removed')");
    exec(
        &c,
        "BEGIN;
         SELECT tide.add_table('readd', 'a', backfill => false);
         INSERT INTO a VALUES (3, 'added again, same transaction');
         COMMIT;
         INSERT INTO a VALUES (4, 'after');",
    );
    // The test's own session on the test's own cluster: a failure is the test's failure.
    lock.batch_execute("ROLLBACK").expect("release the lock");
    wait_pipeline(&c, "readd", 60);
    assert_eq!(
        texts(&t, "SELECT id || ':' || s FROM rem.a ORDER BY id"),
        vec!["1:captured", "3:added again, same transaction", "4:after"],
        "a's rows while captured\n{}",
        c.log_tail(40)
    );
    assert_eq!(
        c.log_count("the iteration is done again with it"),
        0,
        "no restart: the table was in the decoder's list\n{}",
        c.log_tail(40)
    );
    assert!(
        !c.query_scalar::<bool>(
            "SELECT last_error IS NOT NULL FROM tide.pipeline WHERE name = 'readd'"
        ),
        "no error recorded"
    );
}
