//! One source transaction much larger than the decoding memory (issue 34): every target applies
//! it with the worker's memory flat, a rolled-back one leaves nothing, and a kill -9 while one is
//! half-written to a remote target loses and duplicates nothing.
//!
//! Memory is the worker's `RssAnon` (its private memory, not the shared buffers it touches),
//! sampled from /proc every 10 ms from before the transaction until its last row is at the
//! target. A sample can only miss a peak, so each test also asserts that enough samples were
//! taken while the worker applied the transaction; on the code before issue 34 the growth was
//! held until the end of the worker's iteration (every statement's arguments in the SPI
//! connection's memory, every remote statement buffered until the remote commit, the decoded
//! output in memory up to `logical_decoding_work_mem`), so it could not be missed.

use pg_test::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Rows of the big transaction, about 260 bytes each: ~65 MB of changes, 16 times
/// `tide.decoding_work_mem` below.
const ROWS: i64 = 250_000;
/// The most the worker's private memory may grow while it applies the transaction. Before
/// issue 34 it grew by about the transaction's size (table and remote targets: ~240 bytes per
/// row) or up to twice `logical_decoding_work_mem` (the outbox).
const BOUND_KB: i64 = 24 * 1024;

fn source(name: &str) -> Cluster {
    // The server's logical_decoding_work_mem stays at its default (64MB): the worker's own
    // setting bounds its decoding.
    let c = start_cluster(
        Cluster::builder(name)
            .conf("tide.decoding_work_mem = '4MB'")
            .conf("max_wal_size = '2GB'"),
    );
    init_extension(&c);
    c.execute(
        "CREATE TABLE big (id int8 PRIMARY KEY, a int, b text, c timestamptz);
         CREATE SCHEMA replica;",
    );
    c
}

fn rss_anon_kb(pid: i32) -> Option<i64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix("RssAnon:")
            .and_then(|r| r.trim().trim_end_matches("kB").trim().parse().ok())
    })
}

const INSERT: &str = "INSERT INTO big SELECT g, g % 1000, repeat(md5(g::text), 6), '2026-01-01'::timestamptz + g * interval '1 s' FROM generate_series(1, $N) g";
const DIGEST: &str = "SELECT count(*)::text || ' ' || coalesce(sum(id), 0)::text || ' ' || coalesce(sum(a), 0)::text || ' ' || coalesce(sum(hashtext(b)::int8), 0)::text || ' ' || coalesce(max(c)::text, '') FROM ";

/// Count of rows the target holds of `big`.
fn target_count(c: &Cluster, t: Option<&Cluster>, target: &str) -> i64 {
    match target {
        "outbox" => c.query_scalar(
            "SELECT count(*) FROM tide.outbox WHERE relation = 'public.big' AND op = 'insert'",
        ),
        "table" => c.query_scalar("SELECT count(*) FROM replica.big"),
        _ => t
            .expect("remote cluster")
            .try_query_scalar("SELECT count(*) FROM public.big")
            .unwrap_or(0),
    }
}

struct Watch {
    name: &'static str,
    target: &'static str,
    pid: i32,
    idle_kb: i64,
    peak_kb: i64,
    /// Samples taken while the target held some but not all of the transaction's rows, or
    /// none yet after the insert committed.
    during: u32,
}

#[test]
fn one_huge_transaction_at_flat_memory_per_target() {
    let c = source("large_tx_mem");
    let t = target_cluster("large_tx_mem_tgt");
    create_server(&c, "tgt", &t);
    create_pipeline(&c, "ob", "outbox", "{}");
    create_pipeline(&c, "tb", "table", r#"{"schema": "replica"}"#);
    create_pipeline(&c, "rm", "postgres", r#"{"server": "tgt"}"#);
    for p in ["ob", "tb", "rm"] {
        exec(
            &c,
            &format!("SELECT tide.add_table('{p}', 'big', backfill => false)"),
        );
    }
    // A first small transaction creates the targets' tables and warms every worker's caches.
    exec(&c, "INSERT INTO big VALUES (0, 0, 'warm', now())");
    for (p, target) in [("ob", "outbox"), ("tb", "table"), ("rm", "postgres")] {
        c.wait_until(
            &format!("the first row at {target}"),
            Duration::from_secs(60),
            Duration::from_millis(50),
            || Ok(target_count(&c, Some(&t), target) == 1),
        );
        wait_pipeline(&c, p, 60);
    }
    let mut watches: Vec<Watch> = [("ob", "outbox"), ("tb", "table"), ("rm", "postgres")]
        .into_iter()
        .map(|(name, target)| {
            let pid = worker_pid(&c, name).expect("worker");
            let idle_kb = rss_anon_kb(pid).expect("RssAnon");
            Watch {
                name,
                target,
                pid,
                idle_kb,
                peak_kb: idle_kb,
                during: 0,
            }
        })
        .collect();

    let t0 = Instant::now();
    let inserted = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            c.execute(&INSERT.replace("$N", &ROWS.to_string()));
            inserted.store(true, Ordering::SeqCst);
        });
        let mut done = [false; 3];
        let mut last_count = Instant::now();
        let mut counts = [0i64; 3];
        while done.iter().any(|d| !d) {
            assert!(
                t0.elapsed() < Duration::from_secs(600),
                "the transaction was not applied in 10 minutes: {counts:?}\n{}",
                diag(&c)
            );
            for w in watches.iter_mut() {
                if let Some(kb) = rss_anon_kb(w.pid) {
                    w.peak_kb = w.peak_kb.max(kb);
                }
            }
            if last_count.elapsed() >= Duration::from_millis(200) {
                last_count = Instant::now();
                for (i, w) in watches.iter().enumerate() {
                    counts[i] = target_count(&c, Some(&t), w.target) - 1;
                    done[i] = counts[i] == ROWS;
                }
            }
            if inserted.load(Ordering::SeqCst) {
                for (i, w) in watches.iter_mut().enumerate() {
                    if !done[i] {
                        w.during += 1;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        writer.join().expect("writer");
    });
    let elapsed = t0.elapsed();

    let expected: String = c.query_scalar(&format!("{DIGEST} big"));
    assert_eq!(
        c.query_scalar::<String>(&format!("{DIGEST} replica.big")),
        expected,
        "the local table target equals the source"
    );
    assert_eq!(
        t.query_scalar::<String>(&format!("{DIGEST} public.big")),
        expected,
        "the remote target equals the source"
    );
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(DISTINCT key->>'id') FROM tide.outbox WHERE relation = 'public.big' AND op = 'insert'"
        ),
        ROWS + 1,
        "the outbox has one insert event per row"
    );
    let mut report = String::new();
    for w in &watches {
        report.push_str(&format!(
            "{} ({}): idle {} kB, peak {} kB, growth {} kB, {} samples while applying\n",
            w.name,
            w.target,
            w.idle_kb,
            w.peak_kb,
            w.peak_kb - w.idle_kb,
            w.during
        ));
    }
    eprintln!("{ROWS} rows in one transaction, all applied after {elapsed:.1?}:\n{report}");
    for w in &watches {
        assert!(
            w.during >= 20,
            "too few samples of {} while it applied the transaction to tell its peak\n{report}",
            w.name
        );
        assert!(
            w.peak_kb - w.idle_kb <= BOUND_KB,
            "the {} worker's memory grew by {} kB applying one transaction of {ROWS} rows (bound {BOUND_KB} kB)\n{report}",
            w.target,
            w.peak_kb - w.idle_kb
        );
        // The same worker applied it all (no restart that would reset its memory).
        assert_eq!(
            worker_pid(&c, w.name),
            Some(w.pid),
            "{}'s worker restarted\n{}",
            w.name,
            diag(&c)
        );
    }
}

/// A rolled-back huge transaction leaves nothing at any target; a kill -9 of the source server's
/// worker while a huge transaction is half-written into the remote target's open transaction
/// loses and duplicates nothing there, nor at the local table target.
#[test]
fn rolled_back_and_killed_huge_transactions() {
    let c = source("large_tx_kill");
    let t = target_cluster("large_tx_kill_tgt");
    create_server(&c, "tgt", &t);
    create_pipeline(&c, "tb", "table", r#"{"schema": "replica"}"#);
    create_pipeline(&c, "rm", "postgres", r#"{"server": "tgt"}"#);
    for p in ["tb", "rm"] {
        exec(
            &c,
            &format!("SELECT tide.add_table('{p}', 'big', backfill => false)"),
        );
    }
    // Rolled back: its rows (negative keys) never reach a target.
    exec(
        &c,
        &format!(
            "BEGIN; {}; ROLLBACK;",
            INSERT
                .replace("SELECT g,", "SELECT -g,")
                .replace("$N", &ROWS.to_string())
        ),
    );
    exec(
        &c,
        "INSERT INTO big VALUES (0, 0, 'after the rollback', now())",
    );
    for target in ["table", "postgres"] {
        c.wait_until(
            &format!("the row after the rollback at {target}"),
            Duration::from_secs(120),
            Duration::from_millis(50),
            || Ok(target_count(&c, Some(&t), target) >= 1),
        );
    }
    assert_eq!(c.query_scalar::<i64>("SELECT count(*) FROM replica.big"), 1);
    assert_eq!(t.query_scalar::<i64>("SELECT count(*) FROM public.big"), 1);

    // Committed, and the worker killed while the remote transaction holds part of it.
    let pid = worker_pid(&c, "rm").expect("worker");
    let t0 = Instant::now();
    c.execute(&INSERT.replace("$N", &ROWS.to_string()));
    let open_remote = "SELECT count(*) FROM pg_stat_activity
                        WHERE application_name LIKE 'pg_tide%' AND backend_xid IS NOT NULL";
    t.wait_until(
        "the remote transaction to hold part of the source transaction",
        Duration::from_secs(300),
        Duration::from_millis(10),
        || Ok(t.try_query_scalar::<i64>(open_remote)? >= 1),
    );
    assert_eq!(
        t.query_scalar::<i64>("SELECT count(*) FROM public.big"),
        1,
        "nothing of the transaction is visible at the remote before its commit"
    );
    kill9(pid);
    eprintln!("killed the worker {:.1?} after the commit", t0.elapsed());
    wait_recovered(&c, "rm", Some(pid), Duration::from_secs(120), || diag(&c));
    wait_pipeline(&c, "rm", 600);
    wait_pipeline(&c, "tb", 600);
    let expected: String = c.query_scalar(&format!("{DIGEST} big"));
    assert!(
        expected.starts_with(&format!("{} ", ROWS + 1)),
        "{expected}"
    );
    assert_eq!(
        t.query_scalar::<String>(&format!("{DIGEST} public.big")),
        expected,
        "the remote target equals the source after the kill"
    );
    assert_eq!(
        c.query_scalar::<String>(&format!("{DIGEST} replica.big")),
        expected,
        "the local table target equals the source after the kill"
    );
    assert_eq!(
        t.query_scalar::<i64>("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pg_tide%' AND backend_xid IS NOT NULL"),
        0,
        "no remote transaction is left open"
    );
}

/// A batch that fails in the worker after part of it was sent into its open remote transaction
/// (the owner lost SELECT on a second table the same source transaction writes after 250,000
/// rows of the first) leaves no transaction open there: the worker rolls it back at once when it
/// resets, so it does not hold the rows' locks while the pipeline waits (here: paused after the
/// error, when no retry would roll it back).
#[test]
fn a_failed_batch_leaves_no_remote_transaction_open() {
    let c = source("large_tx_fail");
    let t = target_cluster("large_tx_fail_tgt");
    create_server(&c, "tgt", &t);
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         GRANT USAGE ON FOREIGN SERVER tgt TO alice;
         CREATE USER MAPPING FOR alice SERVER tgt OPTIONS (user 'postgres', password_required 'false');
         CREATE TABLE small (id int PRIMARY KEY);
         GRANT SELECT ON big, small TO alice;",
    );
    let mut alice = connect_as(&c, "alice");
    alice
        .batch_execute(r#"SELECT tide.create_pipeline('rm', 'postgres', '{"server": "tgt"}');"#)
        .unwrap_or_else(|e| panic!("create_pipeline: {}\n{}", describe_error(&e), diag(&c)));
    wait_streaming(&c, "rm", Duration::from_secs(30));
    alice
        .batch_execute(
            "SELECT tide.add_table('rm', 'big', backfill => false);
             SELECT tide.add_table('rm', 'small', backfill => false);",
        )
        .unwrap_or_else(|e| panic!("add_table: {}\n{}", describe_error(&e), diag(&c)));
    c.execute("INSERT INTO small VALUES (0)");
    c.wait_until(
        "the first row at the remote",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || Ok(t.try_query_scalar::<i64>("SELECT count(*) FROM public.small")? == 1),
    );
    c.execute("REVOKE SELECT ON small FROM alice");
    c.execute(&format!(
        "BEGIN; {}; INSERT INTO small VALUES (1); COMMIT;",
        INSERT.replace("$N", &ROWS.to_string())
    ));
    c.wait_until(
        "the pipeline to fail on the revoked right",
        Duration::from_secs(300),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce(last_error_sqlstate = '42501', false) FROM tide.pipelines WHERE name = 'rm'",
            )?)
        },
    );
    alice
        .batch_execute("SELECT tide.pause_pipeline('rm')")
        .unwrap_or_else(|e| panic!("pause: {}", describe_error(&e)));
    let open = "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name LIKE 'pg_tide%' AND xact_start IS NOT NULL";
    if let Err(m) = poll_every(Duration::from_secs(30), Duration::from_millis(100), || {
        Ok(t.try_query_scalar::<i64>(open)? == 0)
    }) {
        panic!(
            "a remote transaction of the failed batch is still open while the pipeline is paused: {m}\n{}",
            sample(
                &t,
                "SELECT pid, state, xact_start, left(query, 80) AS query FROM pg_stat_activity WHERE application_name LIKE 'pg_tide%'",
                5
            )
        );
    }
    assert_eq!(
        t.query_scalar::<i64>("SELECT count(*) FROM public.big"),
        0,
        "nothing of the failed batch is at the target"
    );
}
