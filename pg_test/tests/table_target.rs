//! Table-target e2e tests: pipelines whose target is a set of tables, in the same database
//! (`'table'`) or in another PostgreSQL server reached through a postgres_fdw foreign server
//! (`'postgres'`).
//!
//! What is checked, against the contract of `tide.create_pipeline` / `tide.add_table`:
//! - readers of the target never see half of a source transaction, during a backfill too
//!   (the wallet tests: a checker reads the target continuously in REPEATABLE READ);
//! - a remote target that goes down shows `state = 'error'`, then catches up by itself, with
//!   every event applied exactly once and in order (a target-side audit trigger);
//! - schema changes: ADD COLUMN and safe widenings are propagated; under `'pause'` (or for an
//!   unsafe change) the pipeline pauses with the reason and resumes from the same place;
//! - unchanged TOAST values are kept at the target;
//! - backfill + concurrent writes + kill -9 of the worker converge on a table target;
//! - target tables are created when missing and checked when present; option errors.
//!
//! Convergence is always checked the same way: the rows of the source and of the target
//! (rendered as text, explicit column lists) compared as multisets both ways: 0 differences.
//!
//! Needs pg_tide installed into the system PostgreSQL 15 (`scripts/install.sh`). Each test runs
//! on its own scratch cluster (pg_tide preloaded, `wal_level = logical`); remote tests add a
//! second scratch cluster (pg_tide not preloaded) as the target.

use pg_test::*;
use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(100);

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

/// One line: the pipeline's row of `tide.pipelines`.
fn pipeline_json(c: &Cluster, name: &str) -> String {
    sample(
        c,
        &format!("SELECT * FROM tide.pipelines WHERE name = '{name}'"),
        1,
    )
}

/// The first column (text) of every row of `sql`.
fn texts(c: &Cluster, sql: &str) -> Vec<String> {
    c.query(sql).iter().map(|r| r.get::<_, String>(0)).collect()
}

/// Multiset difference: (in `a` but not `b`, in `b` but not `a`), with multiplicity.
fn multiset_diff(a: &[String], b: &[String]) -> (Vec<String>, Vec<String>) {
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for r in a {
        *counts.entry(r.as_str()).or_default() += 1;
    }
    for r in b {
        *counts.entry(r.as_str()).or_default() -= 1;
    }
    let mut only_a = Vec::new();
    let mut only_b = Vec::new();
    for (r, n) in counts {
        for _ in 0..n.max(0) {
            only_a.push(r.to_string());
        }
        for _ in 0..(-n).max(0) {
            only_b.push(r.to_string());
        }
    }
    only_a.sort();
    only_b.sort();
    (only_a, only_b)
}

/// The source table and its target hold exactly the same rows (set difference both ways is 0
/// rows, duplicates counted). `cols` is the column list, so both sides render rows alike.
#[track_caller]
fn assert_same_rows(
    what: &str,
    src: &Cluster,
    source: &str,
    tgt: &Cluster,
    target: &str,
    cols: &str,
) {
    match compare_rows(what, src, source, tgt, target, cols) {
        Ok(msg) => eprintln!("  {msg}"),
        Err(msg) => panic!("{msg}\n{}", diag(src)),
    }
}

/// Like [`assert_same_rows`], without panicking: Ok(summary) or Err(description).
fn compare_rows(
    what: &str,
    src: &Cluster,
    source: &str,
    tgt: &Cluster,
    target: &str,
    cols: &str,
) -> Result<String, String> {
    let a = texts(src, &format!("SELECT row({cols})::text FROM {source}"));
    let b = texts(tgt, &format!("SELECT row({cols})::text FROM {target}"));
    let (only_src, only_tgt) = multiset_diff(&a, &b);
    if !only_src.is_empty() || !only_tgt.is_empty() {
        return Err(format!(
            "{what}: {source} ({} rows) and its target {target} ({} rows) differ: {} rows only at the source, \
             {} only at the target.\nonly at the source (first 15, ({cols})):\n  {}\nonly at the target (first 15):\n  {}",
            a.len(),
            b.len(),
            only_src.len(),
            only_tgt.len(),
            only_src.iter().take(15).cloned().collect::<Vec<_>>().join("\n  "),
            only_tgt.iter().take(15).cloned().collect::<Vec<_>>().join("\n  "),
        ));
    }
    Ok(format!(
        "{what}: {source} = {target}: {} rows, 0 differences either way",
        a.len()
    ))
}

/// (column, type, not null) of a table, in column order; and its primary key columns in key
/// order.
fn shape(c: &Cluster, table: &str) -> (Vec<(String, String, bool)>, Vec<String>) {
    let cols = c
        .query(&format!(
            "SELECT attname::text, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute
              WHERE attrelid = to_regclass('{table}') AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ))
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let key = texts(
        c,
        &format!(
            "SELECT a.attname::text FROM pg_index i
               JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
              WHERE i.indrelid = to_regclass('{table}') AND i.indisprimary ORDER BY k.ord"
        ),
    );
    (cols, key)
}

/// "X/Y" → u64.
fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

// ------------------------------------------------------------------------------------------
// 1. Wallets: no reader of the target ever sees half a transfer (local and remote)
// ------------------------------------------------------------------------------------------

const WALLETS: i64 = 1000;
/// Transfers per second of the wallet scenario's writers.
const WALLET_TPS: f64 = 800.0;
const START_BALANCE: i64 = 1000;

/// `transfer_check.net` is the wallet's net transfers, updated in the same transaction as the
/// balance, so `balance = 1000 + net` holds in every committed state of the source (and the
/// ledger sums to the same net).
const WALLET_SCHEMA: &str = "
CREATE TABLE wallets (id int PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE ledger (id bigserial PRIMARY KEY, from_id int, to_id int, amount bigint);
CREATE TABLE transfer_check (wallet_id int PRIMARY KEY, net bigint NOT NULL);
INSERT INTO wallets SELECT g, 1000 FROM generate_series(1, 1000) g;
INSERT INTO transfer_check SELECT g, 0 FROM generate_series(1, 1000) g;
";

/// One transfer per transaction: two UPDATEs of wallets (in id order: no deadlocks), the two
/// transfer_check rows, one ledger row.
const TRANSFER_SCRIPT: &str = r#"\set from random(1, 1000)
\set off random(1, 999)
\set to 1 + ((:from - 1 + :off) % 1000)
\set amt random(1, 100)
\set lo least(:from, :to)
\set hi greatest(:from, :to)
\set dlo case when :lo = :from then -:amt else :amt end
\set dhi -:dlo
BEGIN;
UPDATE wallets SET balance = balance + :dlo WHERE id = :lo;
UPDATE wallets SET balance = balance + :dhi WHERE id = :hi;
UPDATE transfer_check SET net = net + :dlo WHERE wallet_id = :lo;
UPDATE transfer_check SET net = net + :dhi WHERE wallet_id = :hi;
INSERT INTO ledger (from_id, to_id, amount) VALUES (:from, :to, :amt);
COMMIT;
"#;

#[derive(Default, Debug)]
struct CheckerStats {
    reads: u64,
    /// Reads taken before the wallets' backfill was known to be done.
    reads_before_done: u64,
    /// Reads in which the target had some but not all wallets (backfill in progress).
    partial_reads: u64,
    /// Reads in which (a) was asserted (backfill done).
    full_reads: u64,
    /// Of those, reads that began while the transfers were still running.
    full_reads_while_writing: u64,
    /// When a read first saw the wallets' backfill applied in its own snapshot.
    first_done_at: Option<Instant>,
    max_ledger: i64,
    failure: Option<String>,
}

/// Reads the target continuously, each read one REPEATABLE READ transaction, until `stop`.
/// (b) in every read: for each wallet present in both wallets and transfer_check at the target,
/// balance = 1000 + net; and for each transfer_check row, net = the sum of the ledger rows at
/// the target. A target holding part of a source transaction breaks one of them.
/// (a) once the wallets' backfill is done (known from `bf_done`, set after
/// tide.wait_for_backfill returned true, or for a local target from tide.backfill in the same
/// snapshot): all 1000 wallets are there and sum(balance) is the constant total.
fn checker(
    tgt: &Cluster,
    schema: &str,
    source: Option<&Cluster>,
    stop: &AtomicBool,
    bf_done: &AtomicBool,
    writing: &AtomicBool,
    once: bool,
) -> CheckerStats {
    let mut st = CheckerStats::default();
    let mut finished_lsn: Option<u64> = None;
    let mut client = match tgt.try_client() {
        Ok(c) => c,
        Err(e) => {
            st.failure = Some(format!("checker cannot connect to the target: {e}"));
            return st;
        }
    };
    let s = schema;
    let q = format!(
        "SELECT (SELECT count(*) FROM {s}.wallets),
                (SELECT coalesce(sum(balance), 0)::int8 FROM {s}.wallets),
                (SELECT count(*) FROM {s}.transfer_check),
                (SELECT count(*) FROM {s}.ledger),
                (SELECT count(*) FROM {s}.wallets w JOIN {s}.transfer_check t ON t.wallet_id = w.id
                  WHERE w.balance <> {START_BALANCE} + t.net),
                (SELECT count(*) FROM {s}.transfer_check t
                   LEFT JOIN (SELECT w, sum(d) AS s FROM (SELECT to_id AS w, amount AS d FROM {s}.ledger
                                                          UNION ALL SELECT from_id, -amount FROM {s}.ledger) x
                               GROUP BY w) l ON l.w = t.wallet_id
                  WHERE t.net <> coalesce(l.s, 0))"
    );
    let bad_balance = format!(
        "SELECT w.id, w.balance, t.net FROM {s}.wallets w JOIN {s}.transfer_check t ON t.wallet_id = w.id
          WHERE w.balance <> {START_BALANCE} + t.net ORDER BY w.id LIMIT 5"
    );
    let bad_net = format!(
        "SELECT t.wallet_id, t.net, coalesce(l.s, 0)::int8 FROM {s}.transfer_check t
           LEFT JOIN (SELECT w, sum(d) AS s FROM (SELECT to_id AS w, amount AS d FROM {s}.ledger
                                                  UNION ALL SELECT from_id, -amount FROM {s}.ledger) x
                       GROUP BY w) l ON l.w = t.wallet_id
          WHERE t.net <> coalesce(l.s, 0) ORDER BY 1 LIMIT 5"
    );
    let total = WALLETS * START_BALANCE;
    while !(stop.load(Ordering::SeqCst) || (once && st.reads > 0)) {
        // Read before the snapshot: if set, the backfill was applied before the snapshot.
        let done_before = bf_done.load(Ordering::SeqCst);
        let writers_running = writing.load(Ordering::SeqCst);
        // Remote: the wallets' backfill's finishing position, from the source, once it is done.
        if let (Some(src), None) = (source, finished_lsn) {
            finished_lsn = src
                .try_query_scalar::<Option<String>>(
                    "SELECT (SELECT finished_lsn::text FROM tide.backfill WHERE relation = 'public.wallets' AND state = 'done' ORDER BY id DESC LIMIT 1)",
                )
                .ok()
                .flatten()
                .and_then(|s| parse_lsn(&s));
        }
        let res = (|| -> Result<Option<String>, postgres::Error> {
            let mut tx = client.transaction()?;
            tx.batch_execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")?;
            let r = tx.query_one(q.as_str(), &[])?;
            let (nw, sum, nt, nl, b1, b2): (i64, i64, i64, i64, i64, i64) =
                (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
            // Applied in this snapshot: local, the backfill's state (set in the transaction
            // that applies its last chunk); remote, the applied position kept with the data
            // has passed the backfill's finishing position.
            let done_in_snapshot = match source {
                None => tx
                    .query_opt(
                        "SELECT state = 'done' FROM tide.backfill WHERE relation = 'public.wallets' ORDER BY id DESC LIMIT 1",
                        &[],
                    )?
                    .map(|r| r.get::<_, bool>(0))
                    .unwrap_or(false),
                Some(_) => match finished_lsn {
                    Some(f) => tx
                        .query_opt(
                            "SELECT applied_lsn::text FROM public.tide_applied WHERE pipeline = 'w'",
                            &[],
                        )?
                        .and_then(|r| parse_lsn(&r.get::<_, String>(0)))
                        .is_some_and(|a| a >= f),
                    None => false,
                },
            };
            if done_in_snapshot && st.first_done_at.is_none() {
                st.first_done_at = Some(Instant::now());
            }
            let done = done_before || done_in_snapshot;
            st.reads += 1;
            st.max_ledger = st.max_ledger.max(nl);
            if !done {
                st.reads_before_done += 1;
            } else {
                st.full_reads += 1;
                if writers_running {
                    st.full_reads_while_writing += 1;
                }
            }
            if nw > 0 && nw < WALLETS {
                st.partial_reads += 1;
            }
            let mut problems = Vec::new();
            if b1 != 0 {
                let rows: Vec<String> = tx
                    .query(bad_balance.as_str(), &[])?
                    .iter()
                    .map(|r| {
                        format!(
                            "(id {}, balance {}, net {})",
                            r.get::<_, i32>(0),
                            r.get::<_, i64>(1),
                            r.get::<_, i64>(2)
                        )
                    })
                    .collect();
                problems.push(format!(
                    "(b) {b1} wallets have balance <> 1000 + net (half a transfer applied), e.g. {}",
                    rows.join(", ")
                ));
            }
            if b2 != 0 {
                let rows: Vec<String> = tx
                    .query(bad_net.as_str(), &[])?
                    .iter()
                    .map(|r| {
                        format!(
                            "(wallet {}, net {}, ledger sum {})",
                            r.get::<_, i32>(0),
                            r.get::<_, i64>(1),
                            r.get::<_, i64>(2)
                        )
                    })
                    .collect();
                problems.push(format!(
                    "(b) {b2} transfer_check rows disagree with the ledger rows at the target (ledger row without its balance change or the reverse), e.g. {}",
                    rows.join(", ")
                ));
            }
            if done && (nw != WALLETS || sum != total) {
                problems.push(format!(
                    "(a) the wallets' backfill is done{} but the target has {nw} wallets with sum(balance) = {sum} (expected {WALLETS} and {total})",
                    if done_in_snapshot { " (in this snapshot)" } else { " (wait_for_backfill returned true before this read)" }
                ));
            }
            tx.commit()?;
            if problems.is_empty() {
                Ok(None)
            } else {
                Ok(Some(format!(
                    "read #{}: wallets {nw}, transfer_check {nt}, ledger {nl}, sum(balance) {sum}:\n  {}",
                    st.reads,
                    problems.join("\n  ")
                )))
            }
        })();
        match res {
            Ok(None) => {}
            Ok(Some(msg)) => {
                st.failure = Some(msg);
                return st;
            }
            Err(e) => {
                st.failure = Some(format!(
                    "checker read #{} failed: {}",
                    st.reads + 1,
                    describe_error(&e)
                ));
                return st;
            }
        }
    }
    st
}

fn wallet_scenario(tag: &str, remote: bool) {
    const P: &str = "w";
    let t_all = Instant::now();
    let c = setup(tag);
    let remote_cluster = remote.then(|| target_cluster(&format!("{tag}_tgt")));
    c.execute(WALLET_SCHEMA);
    let schema = if let Some(t) = &remote_cluster {
        create_server(&c, "tgt", t);
        create_pipeline(&c, P, "postgres", r#"{"server": "tgt"}"#);
        "public"
    } else {
        create_pipeline(&c, P, "table", r#"{"schema": "replica"}"#);
        "replica"
    };
    let tgt: &Cluster = remote_cluster.as_ref().unwrap_or(&c);
    // The ledger is captured from the start (empty: its backfill has nothing to read).
    exec(&c, &format!("SELECT tide.add_table('{P}', 'ledger')"));

    let stop = AtomicBool::new(false);
    let bf_done = AtomicBool::new(false);
    let writing = AtomicBool::new(true);
    let mut added_at = Instant::now();
    let mut stats = CheckerStats::default();
    let mut bench_out = String::new();
    let mut bf_time = Duration::ZERO;
    let mut catch_up = Duration::ZERO;
    std::thread::scope(|s| {
        let writers = s.spawn(|| {
            // Rate-limited: on a 2-core machine shared with the checker, unthrottled pgbench
            // commits faster than the worker applies, and a backfill only advances as the
            // stream reaches its watermarks, so the total would never be checked under load.
            // The property (no half transfer in any read) does not depend on the rate.
            c.pgbench(TRANSFER_SCRIPT)
                .clients(3)
                .jobs(2)
                .rate(WALLET_TPS)
                .duration(Duration::from_secs(20))
                .run()
        });
        c.wait_until(
            "the transfers to start",
            Duration::from_secs(30),
            POLL,
            || Ok(c.try_query_scalar::<i64>("SELECT count(*) FROM ledger")? >= 500),
        );
        // Wallets and their check rows are added, with add_table's default backfill, while the
        // transfers run: the backfill's window overlaps them, and the target holds part of the
        // wallets (those the stream wrote) until the backfill is applied.
        let t_bf = Instant::now();
        added_at = t_bf;
        exec(
            &c,
            &format!(
                "BEGIN;
                 SELECT tide.add_table('{P}', 'wallets');
                 SELECT tide.add_table('{P}', 'transfer_check');
                 COMMIT;"
            ),
        );
        let source = remote.then_some(&c);
        let (stop_r, bf_done_r, writing_r) = (&stop, &bf_done, &writing);
        let check =
            s.spawn(move || checker(tgt, schema, source, stop_r, bf_done_r, writing_r, false));
        wait_backfill(&c, "wallets", P, 300);
        bf_done.store(true, Ordering::SeqCst);
        bf_time = t_bf.elapsed();
        let transfers_at_done: i64 = c.query_scalar("SELECT count(*) FROM ledger");
        eprintln!(
            "wallet[{tag}]: tide.wait_for_backfill('wallets') returned {bf_time:.1?} after add_table, {transfers_at_done} transfers committed by then"
        );
        wait_backfill(&c, "transfer_check", P, 300);
        bench_out = writers.join().expect("pgbench thread");
        writing.store(false, Ordering::SeqCst);
        let t_wait = Instant::now();
        wait_pipeline(&c, P, 300);
        catch_up = t_wait.elapsed();
        // A few more reads of the converged target, then stop the checker.
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::SeqCst);
        stats = check.join().expect("checker thread");
    });
    let transfers: i64 = c.query_scalar("SELECT count(*) FROM ledger");
    eprintln!(
        "wallet[{tag}]: the checker first saw the wallets' backfill applied in its snapshot {:.1?} after add_table; \
         tide.wait_for_backfill returned {bf_time:.1?} after it",
        stats.first_done_at.map(|t| t.duration_since(added_at))
    );
    eprintln!(
        "wallet[{tag}]: {transfers} transfers (pgbench tps {:?}); catch-up after the writers {catch_up:.1?}; \
         checker: {} reads ({} before the wallets' backfill was done, {} with part of the wallets, {} asserting the total, \
         {} of them while the transfers ran), max ledger rows seen {}",
        pgbench_tps(&bench_out),
        stats.reads,
        stats.reads_before_done,
        stats.partial_reads,
        stats.full_reads,
        stats.full_reads_while_writing,
        stats.max_ledger
    );
    if let Some(f) = &stats.failure {
        panic!(
            "wallet[{tag}]: the checker saw an inconsistent target:\n{f}\n{}",
            diag(&c)
        );
    }
    assert!(stats.reads > 50, "only {} checker reads ran", stats.reads);
    assert!(
        stats.reads_before_done > 0 && stats.full_reads > 0,
        "the checker must read both during and after the wallets' backfill: {stats:?}"
    );
    assert!(
        stats.full_reads_while_writing > 10,
        "the wallets' backfill was applied only after the transfers ended, so the total was never \
         checked under load: {stats:?}"
    );
    assert!(
        transfers > 5000,
        "only {transfers} transfers: the test did not do enough work"
    );
    let source_sum: i64 = c.query_scalar("SELECT sum(balance)::int8 FROM wallets");
    assert_eq!(
        source_sum,
        WALLETS * START_BALANCE,
        "the source itself lost money"
    );
    assert_same_rows(
        "wallets",
        &c,
        "public.wallets",
        tgt,
        &format!("{schema}.wallets"),
        "id, balance",
    );
    assert_same_rows(
        "transfer_check",
        &c,
        "public.transfer_check",
        tgt,
        &format!("{schema}.transfer_check"),
        "wallet_id, net",
    );
    assert_same_rows(
        "ledger",
        &c,
        "public.ledger",
        tgt,
        &format!("{schema}.ledger"),
        "id, from_id, to_id, amount",
    );
    // The checker is sensitive: half a transfer written into the target by hand (one wallet's
    // balance without its transfer_check and ledger rows) fails its next read.
    tgt.execute(&format!(
        "UPDATE {schema}.wallets SET balance = balance - 7 WHERE id = 1"
    ));
    let broken = checker(
        tgt,
        schema,
        remote.then_some(&c),
        &AtomicBool::new(false),
        &AtomicBool::new(true),
        &AtomicBool::new(false),
        true,
    );
    let msg = broken.failure.unwrap_or_default();
    assert!(
        msg.contains("(b)") && msg.contains("(a)"),
        "the checker did not catch half a transfer at the target: {msg:?}"
    );
    eprintln!("wallet[{tag}]: whole test {:.1?}", t_all.elapsed());
}

#[test]
fn wallet_no_half_transfers_local() {
    wallet_scenario("tt_wallet_local", false);
}

#[test]
fn wallet_no_half_transfers_remote() {
    wallet_scenario("tt_wallet_remote", true);
}

// ------------------------------------------------------------------------------------------
// 2. A remote target goes down and comes back: error state, recovery, exactly once, in order
// ------------------------------------------------------------------------------------------

/// Every write of `items` (source) and of its target (remote) is logged by a trigger, in the
/// order it happens, as (id, op, n): 'w' (insert or update) with the row's counter `n`, 'd'
/// (delete). Per id, writers are serialized by the row lock (and by the unique index for
/// inserts), so the source log's seq order per id is commit order; the target log's seq order
/// is apply order.
///
/// Why a trigger: the sink writes whole rows (`INSERT ... ON CONFLICT DO UPDATE` of every sent
/// column), so applying an event twice leaves the same row: a double apply is idempotent and
/// the final set-difference cannot see it (nor a batch re-applied after a newer one, since the
/// newer events are re-applied after it). The per-id sequence of writes at the target, compared
/// with the source's, shows any event applied twice (an extra entry), lost (a missing entry) or
/// out of order. The per-row counter `n = n + 1` makes each entry of a row's life distinct.
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
    let c = setup("tt_outage");
    let t = target_cluster("tt_outage_tgt");
    create_server(&c, "tgt", &t);
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
            pipeline_json(&c, P)
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

// ------------------------------------------------------------------------------------------
// 3. Schema changes: propagate, and pause / fix / resume
// ------------------------------------------------------------------------------------------

const ORDERS_SCRIPT_A: &str = r#"\set id random(1, 6000)
\set v random(1, 100000)
\set r random(1, 10)
\if :r <= 6
INSERT INTO orders AS o (id, total, qty) VALUES (:id, :v, 1) ON CONFLICT (id) DO UPDATE SET total = excluded.total, qty = o.qty + 1;
\elif :r <= 9
UPDATE orders SET total = total + 1 WHERE id = :id;
\else
DELETE FROM orders WHERE id = :id;
\endif
"#;

/// After ADD COLUMN note: the same, plus writes of note.
const ORDERS_SCRIPT_B: &str = r#"\set id random(1, 6000)
\set v random(1, 100000)
\set r random(1, 10)
\if :r <= 5
INSERT INTO orders AS o (id, total, qty) VALUES (:id, :v, 1) ON CONFLICT (id) DO UPDATE SET total = excluded.total, qty = o.qty + 1;
\elif :r <= 7
UPDATE orders SET total = total + 1 WHERE id = :id;
\elif :r <= 9
UPDATE orders SET note = 'n' || :v WHERE id = :id;
\else
DELETE FROM orders WHERE id = :id;
\endif
"#;

fn col_type(c: &Cluster, table: &str, col: &str) -> Option<String> {
    c.query_scalar(&format!(
        "SELECT (SELECT format_type(atttypid, atttypmod) FROM pg_attribute
                  WHERE attrelid = to_regclass('{table}') AND attname = '{col}' AND NOT attisdropped)"
    ))
}

#[test]
fn schema_change_propagate_and_pause() {
    let t_all = Instant::now();
    let c = setup("tt_schema");
    c.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, total integer NOT NULL, qty int NOT NULL DEFAULT 1);
         INSERT INTO orders SELECT g, g * 10, 1 FROM generate_series(1, 2000) g;",
    );
    // live: propagate, caught up. lag: propagate, but behind the source across the DDL (paused
    // by hand while it happens, as a slow worker would be). pz: schema_changes = pause.
    create_pipeline(&c, "live", "table", r#"{"schema": "rep_live"}"#);
    create_pipeline(
        &c,
        "lag",
        "table",
        r#"{"schema": "rep_lag", "schema_changes": "propagate"}"#,
    );
    create_pipeline(
        &c,
        "pz",
        "table",
        r#"{"schema": "rep_pz", "schema_changes": "pause"}"#,
    );
    for p in ["live", "lag", "pz"] {
        exec(&c, &format!("SELECT tide.add_table('{p}', 'orders')"));
    }
    for p in ["live", "lag", "pz"] {
        wait_backfill(&c, "orders", p, 120);
    }
    let count = |c: &Cluster| c.query_scalar::<i64>("SELECT count(*) FROM orders");
    let pz_state = |c: &Cluster| -> (String, bool, Option<String>, Option<String>, Option<String>) {
        let r = c.query_one(
            "SELECT state, enabled, last_error, remedy, applied_lsn::text FROM tide.pipelines WHERE name = 'pz'",
        );
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))
    };

    let mut pz_errors: Vec<(String, String)> = Vec::new();
    let mut paused_checked = false;
    std::thread::scope(|s| {
        let phase_a = s.spawn(|| {
            c.pgbench(ORDERS_SCRIPT_A)
                .clients(2)
                .rate(300.0)
                .duration(Duration::from_secs(12))
                .run()
        });
        c.wait_until(
            "the writes to reach the live target",
            Duration::from_secs(30),
            POLL,
            || {
                Ok(c.try_query_scalar::<i64>(
                    "SELECT events_applied FROM tide.pipelines WHERE name = 'live'",
                )? > 300)
            },
        );
        exec(&c, "SELECT tide.pause_pipeline('lag')");
        c.wait_until(
            "pipeline lag to pause",
            Duration::from_secs(30),
            POLL,
            || {
                Ok(c.try_query_scalar::<String>(
                    "SELECT state FROM tide.pipelines WHERE name = 'lag'",
                )? == "paused")
            },
        );
        // While the writers run: widen total, let new rows arrive, add note with a default.
        let n0 = count(&c);
        exec(
            &c,
            "ALTER TABLE orders ALTER COLUMN total TYPE numeric(12,2)",
        );
        c.wait_until(
            "new rows after the type change",
            Duration::from_secs(30),
            POLL,
            || Ok(count(&c) >= n0 + 30),
        );
        let n1 = count(&c);
        exec(&c, "ALTER TABLE orders ADD COLUMN note text DEFAULT 'x'");
        c.wait_until(
            "new rows after ADD COLUMN",
            Duration::from_secs(30),
            POLL,
            || Ok(count(&c) >= n1 + 30),
        );
        exec(&c, "SELECT tide.resume_pipeline('lag')");

        // pz pauses, with the reason and the remedy, and applies nothing while paused.
        if let Err(msg) = poll_every(Duration::from_secs(60), POLL, || {
            Ok(pz_state(&c).0 == "paused")
        }) {
            panic!(
                "pipeline pz did not pause on the schema change: {msg}\n{}",
                diag(&c)
            );
        }
        let (state, enabled, err, remedy, applied) = pz_state(&c);
        eprintln!("schema: pz paused: enabled {enabled}, last_error {err:?}, remedy {remedy:?}");
        assert!(
            !enabled,
            "a paused pipeline must show enabled = false: {}",
            pipeline_json(&c, "pz")
        );
        let err = err.unwrap_or_else(|| {
            panic!(
                "pz is {state} without a last_error: {}",
                pipeline_json(&c, "pz")
            )
        });
        let remedy = remedy.unwrap_or_default();
        assert!(
            err.contains("total") || err.contains("note"),
            "last_error does not name the change: {err:?}"
        );
        assert!(
            remedy.contains("resume_pipeline"),
            "the remedy does not say how to resume: {remedy:?}"
        );
        pz_errors.push((err, remedy));
        // Writes continue at the source; nothing more is applied to pz's target.
        let n2 = count(&c);
        c.wait_until(
            "more writes while pz is paused",
            Duration::from_secs(30),
            POLL,
            || Ok(count(&c) >= n2 + 30),
        );
        let (state2, _, _, _, applied2) = pz_state(&c);
        assert_eq!(
            state2,
            "paused",
            "pz resumed by itself: {}",
            pipeline_json(&c, "pz")
        );
        assert_eq!(
            applied,
            applied2,
            "pz applied changes while paused: {}",
            pipeline_json(&c, "pz")
        );
        paused_checked = true;
        let out_a = phase_a.join().expect("phase A pgbench");
        eprintln!("schema: phase A pgbench tps {:?}", pgbench_tps(&out_a));

        let phase_b = s.spawn(|| {
            c.pgbench(ORDERS_SCRIPT_B)
                .clients(2)
                .rate(300.0)
                .duration(Duration::from_secs(6))
                .run()
        });
        // Fix pz's target as a user would (same defaults as the source), resume; it may pause
        // once more for the second change.
        let mut fixed_total = false;
        let mut fixed_note = false;
        for round in 1..=3 {
            let err = pz_errors.last().map(|e| e.0.clone()).unwrap_or_default();
            if err.contains("total") && !fixed_total {
                exec(
                    &c,
                    "ALTER TABLE rep_pz.orders ALTER COLUMN total TYPE numeric(12,2)",
                );
                fixed_total = true;
            }
            if err.contains("note") && !fixed_note {
                exec(
                    &c,
                    "ALTER TABLE rep_pz.orders ADD COLUMN note text DEFAULT 'x'",
                );
                fixed_note = true;
            }
            exec(&c, "SELECT tide.resume_pipeline('pz')");
            // Either it pauses again (another change) or it catches up.
            let mut repaused = false;
            if let Err(msg) = poll_every(Duration::from_secs(60), POLL, || {
                let (_, enabled, _, _, _) = pz_state(&c);
                if !enabled {
                    repaused = true;
                    return Ok(true);
                }
                Ok(c.try_query_scalar::<bool>("SELECT tide.wait_for_pipeline('pz', '1 second')")?)
            }) {
                panic!(
                    "pz neither paused again nor caught up after resume (round {round}): {msg}\n{}",
                    diag(&c)
                );
            }
            if !repaused {
                break;
            }
            c.wait_until("pz to show paused", Duration::from_secs(30), POLL, || {
                Ok(pz_state(&c).0 == "paused")
            });
            let (_, _, err, remedy, _) = pz_state(&c);
            let err = err.unwrap_or_default();
            eprintln!("schema: pz paused again (round {round}): {err:?}");
            assert_ne!(round, 3, "pz keeps pausing: {err:?}\n{}", diag(&c));
            pz_errors.push((err, remedy.unwrap_or_default()));
        }
        let out_b = phase_b.join().expect("phase B pgbench");
        eprintln!("schema: phase B pgbench tps {:?}", pgbench_tps(&out_b));
    });
    assert!(paused_checked);
    let all_errors = pz_errors
        .iter()
        .map(|e| e.0.as_str())
        .collect::<Vec<_>>()
        .join(" | ");
    assert!(
        all_errors.contains("total") && all_errors.contains("note"),
        "pz's pauses did not name both changes (total, note): {all_errors}"
    );
    for p in ["live", "lag", "pz"] {
        wait_pipeline(&c, p, 120);
    }
    for p in ["live", "lag"] {
        let t = format!("rep_{p}.orders");
        assert_eq!(
            col_type(&c, &t, "total").as_deref(),
            Some("numeric(12,2)"),
            "{t}.total was not widened"
        );
        assert_eq!(
            col_type(&c, &t, "note").as_deref(),
            Some("text"),
            "{t}.note was not added"
        );
    }
    let rows_x: i64 = c.query_scalar("SELECT count(*) FROM orders WHERE note = 'x'");
    let rows_n: i64 = c.query_scalar("SELECT count(*) FROM orders WHERE note <> 'x'");
    eprintln!(
        "schema: source has {} rows, {rows_x} with the added default, {rows_n} with a note written",
        count(&c)
    );
    // All three compared before failing, so one run shows which pipelines diverge.
    let mut failures = Vec::new();
    for p in ["live", "lag", "pz"] {
        match compare_rows(
            &format!("pipeline {p}"),
            &c,
            "public.orders",
            &c,
            &format!("rep_{p}.orders"),
            "id, total, qty, note",
        ) {
            Ok(msg) => eprintln!("  {msg}"),
            Err(msg) => failures.push(msg),
        }
    }
    eprintln!("schema: whole test {:.1?}", t_all.elapsed());
    assert!(
        failures.is_empty(),
        "{} of 3 targets diverged from the source after the schema changes \
         (rows inserted before ADD COLUMN ... DEFAULT but applied after it must get the default, as at the source):\n{}\n{}",
        failures.len(),
        failures.join("\n"),
        diag(&c)
    );
}

// ------------------------------------------------------------------------------------------
// 4. Unchanged TOAST values stay at the target
// ------------------------------------------------------------------------------------------

/// A `json` column keeps its text exactly (whitespace, key order, duplicate keys) at local and
/// remote table targets, through the backfill and through the stream; a bare JSON string keeps
/// its value. (Through jsonb, as the targets' statements used to parse the rows, objects and
/// arrays arrived normalized: a permanent difference that verify reports and repair cannot
/// fix. This test failed so.)
#[test]
fn json_text_reaches_table_targets_exactly() {
    let c = setup("tt_json");
    let t = target_cluster("tt_json_tgt");
    create_server(&c, "tgt", &t);
    let values = [
        r#"{"b": 1,  "a": [1, 2.50]}"#,
        r#"{"a":1,"a":2}"#,
        "[1, 2.50,\n 3e2]",
        r#""str\u00e9""#,
    ];
    c.execute("CREATE TABLE j (id int PRIMARY KEY, k json, b jsonb)");
    for (i, v) in values.iter().enumerate() {
        c.execute(&format!(
            "INSERT INTO j VALUES ({i}, '{}', '{}')",
            v.replace('\'', "''"),
            v.replace('\'', "''")
        ));
    }
    create_pipeline(&c, "lj", "table", r#"{"schema": "rep"}"#);
    create_pipeline(&c, "rj", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('lj', 'j')");
    exec(&c, "SELECT tide.add_table('rj', 'j')");
    wait_backfill(&c, "j", "lj", 60);
    wait_backfill(&c, "j", "rj", 60);
    // And through the stream.
    for (i, v) in values.iter().enumerate() {
        c.execute(&format!(
            "INSERT INTO j VALUES ({}, '{}', '{}')",
            i + 100,
            v.replace('\'', "''"),
            v.replace('\'', "''")
        ));
    }
    wait_pipeline(&c, "lj", 60);
    wait_pipeline(&c, "rj", 60);
    // The text of k, except for a bare JSON string (json_populate_recordset re-escapes a top-level
    // string: "str\u00e9" arrives as "stré", the same JSON value): that one as jsonb.
    let rows = |cl: &Cluster, table: &str| -> Vec<(i32, String, String)> {
        cl.query(&format!(
            "SELECT id, CASE WHEN json_typeof(k) = 'string' THEN k::jsonb::text ELSE k::text END, b::text
               FROM {table} ORDER BY id"
        ))
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
    };
    let src = rows(&c, "public.j");
    assert_eq!(src.len(), 2 * values.len());
    assert_eq!(src[0].1, values[0], "the source keeps the json text");
    assert_eq!(rows(&c, "rep.j"), src, "local target");
    assert_eq!(rows(&t, "public.j"), src, "remote target");
}

#[test]
fn toast_unchanged_keeps_target_value() {
    let c = setup("tt_toast");
    // ~100 kB of random hex per row, stored out of line and uncompressed.
    c.execute(
        "CREATE TABLE docs (id int PRIMARY KEY, small int NOT NULL, big text);
         ALTER TABLE docs ALTER COLUMN big SET STORAGE EXTERNAL;
         CREATE FUNCTION big_value(seed text) RETURNS text LANGUAGE sql AS
           $$ SELECT string_agg(md5(seed || '-' || i || '-' || random()), '') FROM generate_series(1, 3200) i $$;
         INSERT INTO docs SELECT g, 0, big_value('seed' || g) FROM generate_series(1, 5) g;",
    );
    let toasted: i64 = c.query_scalar(
        "SELECT count(*) FROM docs WHERE pg_column_size(big) > 90000 AND pg_column_size(big) < octet_length(big) + 100",
    );
    assert_eq!(toasted, 5, "the big values are not ~100 kB uncompressed");
    create_pipeline(&c, "tt", "table", r#"{"schema": "rep"}"#);
    // An outbox pipeline too, to prove the updates below do send big as unchanged TOAST.
    create_pipeline(&c, "ob", "outbox", "{}");
    exec(&c, "SELECT tide.add_table('tt', 'docs')");
    exec(&c, "SELECT tide.add_table('ob', 'docs', backfill => false)");
    wait_backfill(&c, "docs", "tt", 60);
    // Rows arriving through the stream too.
    c.execute(
        "INSERT INTO docs SELECT g, 0, big_value('stream' || g) FROM generate_series(6, 8) g",
    );
    wait_pipeline(&c, "tt", 60);
    let cols = "id, small, md5(big), length(big)";
    assert_same_rows(
        "after backfill and inserts",
        &c,
        "public.docs",
        &c,
        "rep.docs",
        cols,
    );

    // Only the small column changes (several times, and mixed with a change of big in one
    // transaction).
    c.execute("UPDATE docs SET small = small + 1");
    c.execute("UPDATE docs SET small = small + 10 WHERE id % 2 = 0");
    c.execute(
        "BEGIN;
         UPDATE docs SET small = small + 100 WHERE id = 1;
         UPDATE docs SET big = big_value('changed'), small = small + 100 WHERE id = 2;
         UPDATE docs SET small = small + 100 WHERE id = 3;
         COMMIT;",
    );
    wait_pipeline(&c, "tt", 60);
    wait_pipeline(&c, "ob", 60);
    let unchanged_events: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE pipeline = 'ob' AND op = 'update' AND 'big' = ANY (unchanged)",
    );
    assert!(
        unchanged_events >= 8,
        "only {unchanged_events} update events sent big as unchanged TOAST: the test does not exercise the case\n{}",
        sample(&c, "SELECT id, op, key, unchanged FROM tide.outbox WHERE pipeline = 'ob'", 20)
    );
    let t_small: Vec<String> = texts(&c, "SELECT row(id, small)::text FROM rep.docs ORDER BY id");
    let s_small: Vec<String> = texts(&c, "SELECT row(id, small)::text FROM docs ORDER BY id");
    assert_eq!(t_small, s_small, "the small column did not follow");
    let nulls: i64 =
        c.query_scalar("SELECT count(*) FROM rep.docs WHERE big IS NULL OR length(big) < 100000");
    assert_eq!(
        nulls,
        0,
        "the target lost big values:\n{}",
        sample(&c, "SELECT id, small, length(big) FROM rep.docs", 10)
    );
    assert_same_rows(
        "after small-column updates",
        &c,
        "public.docs",
        &c,
        "rep.docs",
        cols,
    );
    eprintln!(
        "toast: {unchanged_events} updates with big unchanged; big values intact at the target"
    );
}

// ------------------------------------------------------------------------------------------
// 5. Backfill convergence on a table target, with kill -9 of the worker mid-backfill
// ------------------------------------------------------------------------------------------

/// 8 random inserts/updates/deletes on random keys (1..15000) per transaction.
fn converge_script() -> String {
    let mut s = String::from("BEGIN;\n");
    for i in 0..8 {
        s.push_str(&format!(
            r#"\set k{i} random(1, 15000)
\set v{i} random(1, 1000000)
\set r{i} random(1, 10)
\if :r{i} <= 4
INSERT INTO t VALUES (:k{i}, :v{i}, 'w ' || :v{i}) ON CONFLICT (id) DO UPDATE SET v = excluded.v, s = excluded.s;
\elif :r{i} <= 7
UPDATE t SET v = v + 1, s = 'u' WHERE id = :k{i};
\else
DELETE FROM t WHERE id = :k{i};
\endif
"#
        ));
    }
    s.push_str("COMMIT;\n");
    s
}

/// Backfill progress and pipeline lag, one line.
fn progress(c: &Cluster, id: i64) -> String {
    sample(
        c,
        &format!(
            "SELECT b.state, b.chunks_done, b.rows_read, p.lag_bytes, p.events_applied, p.state AS pipeline
               FROM tide.backfills b, tide.pipelines p WHERE b.id = {id} AND p.name = b.pipeline"
        ),
        1,
    )
}

#[test]
fn convergence_with_table_target() {
    const P: &str = "conv";
    let t_all = Instant::now();
    let c = setup("tt_converge");
    c.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v int, s text);
         INSERT INTO t SELECT g, g, 'seed ' || g FROM generate_series(1, 10000) g;",
    );
    create_pipeline(&c, P, "table", r#"{"schema": "rep"}"#);
    exec(
        &c,
        &format!("SELECT tide.add_table('{P}', 't', backfill => false)"),
    );
    let script = write_script("table_target_converge", &converge_script());

    // Calibration: a burst at full speed, and how fast the worker drains it. Continuous writes
    // at full speed outrun the worker on this 2-core machine (a backfill chunk is emitted only
    // once the stream reaches its high watermark, so a growing backlog stalls the backfill),
    // so the writers then run at 70% of the measured apply rate, whatever the build's speed.
    let t_cal = Instant::now();
    let (n_cal, ok, summary) = spawn_pgbench(&c, &script, 2, 3, None).finish_summary();
    assert!(ok, "calibration pgbench failed: {summary}");
    wait_pipeline(&c, P, 300);
    let apply_tps = n_cal as f64 / t_cal.elapsed().as_secs_f64();
    let rate = ((apply_tps * 0.7) as u32).max(50);
    eprintln!(
        "converge: full speed burst: {n_cal} txns ({summary}), drained in {:.1?}: the worker applies ~{apply_tps:.0} txns/s; writers at {rate} txns/s",
        t_cal.elapsed()
    );

    let mut run = spawn_pgbench(&c, &script, 2, 120, Some(rate));
    let id: i64 = c.query_scalar("SELECT tide.start_backfill('t', 'conv', chunk_size => 1000)");
    let t_bf = Instant::now();
    let mut last_report = Instant::now();
    c.wait_until(
        "3 chunks before the kill",
        Duration::from_secs(120),
        Duration::from_millis(50),
        || {
            if last_report.elapsed() > Duration::from_secs(5) {
                last_report = Instant::now();
                eprintln!("converge: {:.0?}: {}", t_bf.elapsed(), progress(&c, id));
            }
            Ok(c.try_query_scalar::<i64>(&format!(
                "SELECT chunks_done FROM tide.backfills WHERE id = {id}"
            ))? >= 3)
        },
    );
    let (state, done): (String, i64) = {
        let r = c.query_one(&format!(
            "SELECT state, chunks_done FROM tide.backfills WHERE id = {id}"
        ));
        (r.get(0), r.get(1))
    };
    assert_eq!(
        state,
        "running",
        "the kill would not land mid-backfill ({done} chunks done)\n{}",
        diag(&c)
    );
    let victim = worker_pid(&c, P).unwrap_or_else(|| panic!("no worker to kill\n{}", diag(&c)));
    let st = Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill -9 {victim} failed");
    let (txns1, _, summary1) = run.finish_summary();
    // The kill restarts the server, which ends the writers. They resume as soon as it accepts
    // connections again, before the new worker reads its next chunk, so that the chunks after
    // the kill are read under writes too: a chunk read with no write in its window cannot drop
    // a row, and the drop count below is what shows the interleaving was tested.
    if let Err(msg) = poll_every(Duration::from_secs(90), Duration::from_millis(20), || {
        Ok(c.try_query_scalar::<i32>("SELECT 1")? == 1)
    }) {
        panic!("the server did not come back after kill -9: {msg}");
    }
    run = spawn_pgbench(&c, &script, 2, 3, Some(rate));
    if let Err(msg) = poll_every(Duration::from_secs(90), POLL, || {
        let pid = c.try_query_scalar::<Option<i32>>(&format!(
            "SELECT (SELECT worker_pid FROM tide.pipelines WHERE name = '{P}' AND state = 'streaming')"
        ))?;
        Ok(pid.is_some() && pid != Some(victim))
    }) {
        panic!(
            "the worker did not come back after kill -9: {msg}\n{}",
            diag(&c)
        );
    }
    eprintln!(
        "converge: kill -9 worker {victim} at {:.1?} into the backfill with {done} chunks done; pgbench {txns1} txns ({summary1})",
        t_bf.elapsed()
    );
    // Keep writing, in rounds, until the backfill is done.
    let mut txns_total = txns1;
    let mut rounds = 0;
    loop {
        let (txns, ok, summary) = run.finish_summary();
        txns_total += txns;
        assert!(
            ok,
            "pgbench failed without a crash: {summary}\n{}",
            diag(&c)
        );
        let state: String =
            c.query_scalar(&format!("SELECT state FROM tide.backfills WHERE id = {id}"));
        if state == "done" {
            break;
        }
        assert!(
            state == "running" || state == "queued",
            "backfill {id} is {state}\n{}",
            diag(&c)
        );
        rounds += 1;
        assert!(
            rounds <= 40,
            "the backfill did not finish within 40 rounds of writes\n{}",
            diag(&c)
        );
        run = spawn_pgbench(&c, &script, 2, 3, Some(rate));
    }
    let bf_time = t_bf.elapsed();
    let _ = std::fs::remove_file(&script);
    let t_wait = Instant::now();
    wait_backfill(&c, "t", P, 180);
    wait_pipeline(&c, P, 180);
    eprintln!(
        "converge: {txns_total} write txns; backfill {bf_time:.1?} (+{rounds} write rounds after the kill); catch-up {:.1?}\n{}",
        t_wait.elapsed(),
        sample(&c, &format!("SELECT state, chunks_done, rows_read, rows_dropped, rows_emitted FROM tide.backfills WHERE id = {id}"), 1)
    );
    assert!(
        c.log_count("terminated by signal 9") >= 1,
        "the kill is not in the server log"
    );
    assert_same_rows("t", &c, "public.t", &c, "rep.t", "id, v, s");
    let resurrected: i64 = c.query_scalar(
        "SELECT count(*) FROM (SELECT id FROM rep.t EXCEPT SELECT id FROM public.t) x",
    );
    assert_eq!(
        resurrected, 0,
        "keys deleted at the source exist at the target"
    );
    let deleted_seeded: i64 = c.query_scalar(
        "SELECT count(*) FROM generate_series(1, 10000) g WHERE g NOT IN (SELECT id FROM t)",
    );
    let new_keys: i64 = c.query_scalar("SELECT count(*) FROM t WHERE id > 10000");
    let dropped: i64 = c.query_scalar(&format!(
        "SELECT rows_dropped FROM tide.backfills WHERE id = {id}"
    ));
    eprintln!(
        "converge: {deleted_seeded} seeded keys deleted, {new_keys} new keys, {dropped} backfill rows dropped (changed in their window); whole test {:.1?}",
        t_all.elapsed()
    );
    assert!(
        deleted_seeded > 100 && new_keys > 100,
        "too few deletes/inserts for the check to mean anything"
    );
    assert!(
        dropped > 0,
        "no backfill row was dropped: no chunk window overlapped a write, the test did not test the interleaving\n{}",
        diag(&c)
    );
}

// ------------------------------------------------------------------------------------------
// 6. Target tables: created, checked; option errors
// ------------------------------------------------------------------------------------------

#[track_caller]
fn expect_fail(c: &Cluster, sql: &str, code: &str, hint: Option<&str>) -> DbError {
    let db = match c.try_execute(sql) {
        Ok(()) => panic!("{sql}: expected SQLSTATE {code}, but it succeeded"),
        Err(e) => {
            eprintln!(
                "  {sql}\n    -> {}",
                describe_error(&e).replace('\n', "\n       ")
            );
            match e.as_db_error() {
                Some(db) => db.clone(),
                None => panic!("{sql}: expected SQLSTATE {code}, got a non-server error: {e}"),
            }
        }
    };
    assert_eq!(
        db.code().code(),
        code,
        "{sql}: expected SQLSTATE {code}, got {} {} (hint {:?})",
        db.code().code(),
        db.message(),
        db.hint()
    );
    if let Some(h) = hint {
        let got = db.hint().unwrap_or("");
        assert!(
            got.contains(h),
            "{sql}: expected a HINT containing {h:?}, got {got:?}"
        );
    }
    db
}

#[test]
fn target_table_checks() {
    let c = setup("tt_checks");
    c.execute(
        "CREATE TABLE shape_src (a int, b text, v numeric(10,2) NOT NULL, t varchar(20), arr int[], ts timestamptz DEFAULT now(),
                                 PRIMARY KEY (b, a));
         CREATE TABLE pre (id int PRIMARY KEY, a int NOT NULL, s text);
         CREATE TABLE mism (id int PRIMARY KEY, missing_col int, typed_col int, ok_col text);
         CREATE TABLE named (id int PRIMARY KEY, x text);
         CREATE TABLE named2 (id int PRIMARY KEY, x text);",
    );
    create_pipeline(&c, "l", "table", r#"{"schema": "rep"}"#);

    // Created when missing: same columns, types, NOT NULL and key as the source.
    exec(&c, "SELECT tide.add_table('l', 'shape_src')");
    let (src_cols, src_key) = shape(&c, "public.shape_src");
    let (tgt_cols, tgt_key) = shape(&c, "rep.shape_src");
    assert_eq!(
        tgt_cols, src_cols,
        "the created target's columns differ from the source's"
    );
    assert_eq!(
        tgt_key, src_key,
        "the created target's primary key differs from the source's"
    );
    assert_eq!(src_key, vec!["b".to_string(), "a".to_string()]);

    // target_table: 'name' (in the schema option) and 'schema.name'.
    exec(
        &c,
        "SELECT tide.add_table('l', 'named', target_table => 'renamed')",
    );
    exec(
        &c,
        "SELECT tide.add_table('l', 'named2', target_table => 'elsewhere.other_name')",
    );
    assert!(c.query_scalar::<bool>("SELECT to_regclass('rep.renamed') IS NOT NULL AND to_regclass('elsewhere.other_name') IS NOT NULL"));

    // An existing matching table is used as it is (wider compatible type, extra row kept).
    c.execute(
        "CREATE TABLE rep.pre (id int PRIMARY KEY, a bigint NOT NULL, s text);
         INSERT INTO rep.pre VALUES (-1, -1, 'was here before');",
    );
    exec(&c, "SELECT tide.add_table('l', 'pre', backfill => false)");
    c.execute(
        "INSERT INTO pre VALUES (1, 10, 'one'), (2, 20, 'two');
         INSERT INTO shape_src (a, b, v, t, arr) VALUES (1, 'k', 1.5, 'short', '{1,2}');
         INSERT INTO named VALUES (1, 'n'); INSERT INTO named2 VALUES (1, 'n2');",
    );
    wait_pipeline(&c, "l", 60);
    assert_eq!(
        texts(&c, "SELECT row(id, a, s)::text FROM rep.pre ORDER BY id"),
        vec!["(-1,-1,\"was here before\")", "(1,10,one)", "(2,20,two)"],
        "the existing target table was not used as it is"
    );
    assert_same_rows(
        "shape_src",
        &c,
        "public.shape_src",
        &c,
        "rep.shape_src",
        "a, b, v, t, arr, ts",
    );
    assert_same_rows("named", &c, "public.named", &c, "rep.renamed", "id, x");
    assert_same_rows(
        "named2",
        &c,
        "public.named2",
        &c,
        "elsewhere.other_name",
        "id, x",
    );
    assert_eq!(
        c.query_scalar::<String>("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'rep.pre'::regclass AND attname = 'a'"),
        "bigint",
        "the existing table was altered"
    );

    // A mismatching one: each difference in the DETAIL, nothing captured.
    c.execute("CREATE TABLE rep.mism (id int, typed_col text, ok_col text, other int PRIMARY KEY)");
    let db = expect_fail(&c, "SELECT tide.add_table('l', 'mism')", "42P16", None);
    let detail = db.detail().unwrap_or("").to_string();
    for needle in ["missing_col", "typed_col", "key"] {
        assert!(
            detail.contains(needle),
            "the DETAIL does not mention {needle:?}: {detail:?}"
        );
    }
    assert!(
        !detail.contains("ok_col"),
        "the DETAIL lists a column that matches: {detail:?}"
    );
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM tide.pipeline_table WHERE relid = 'mism'::regclass"
        ),
        0,
        "a refused table is captured anyway"
    );
    // Only a different key.
    c.execute("CREATE TABLE rep.named3 (id int, x text PRIMARY KEY); CREATE TABLE named3 (id int PRIMARY KEY, x text);");
    let db = expect_fail(&c, "SELECT tide.add_table('l', 'named3')", "42P16", None);
    assert!(
        db.detail().unwrap_or("").contains("key"),
        "DETAIL: {:?}",
        db.detail()
    );

    // The source itself as the target.
    expect_fail(
        &c,
        "SELECT tide.add_table('l', 'mism', target_table => 'public.mism')",
        "22023",
        None,
    );
    create_pipeline(&c, "selfp", "table", r#"{"schema": "public"}"#);
    expect_fail(&c, "SELECT tide.add_table('selfp', 'mism')", "22023", None);

    // target_table on an outbox pipeline.
    create_pipeline(&c, "ob", "outbox", "{}");
    expect_fail(
        &c,
        "SELECT tide.add_table('ob', 'mism', target_table => 'x.y')",
        "22023",
        None,
    );

    // Options.
    expect_fail(
        &c,
        "SELECT tide.create_pipeline('e1', 'table', '{}')",
        "22023",
        Some("schema"),
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e2', 'table', '{"schema": 5}')"#,
        "22023",
        None,
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e3', 'table', '{"schema": "r", "schema_changes": "later"}')"#,
        "22023",
        None,
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e4', 'table', '{"schema": "r", "schema_changes": 1}')"#,
        "22023",
        None,
    );
    expect_fail(
        &c,
        "SELECT tide.create_pipeline('e5', 'postgres', '{}')",
        "22023",
        Some("server"),
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e6', 'postgres', '{"server": 7}')"#,
        "22023",
        None,
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e7', 'postgres', '{"server": "nope"}')"#,
        "42704",
        Some("CREATE SERVER"),
    );
    c.execute(
        "CREATE EXTENSION postgres_fdw;
         CREATE FOREIGN DATA WRAPPER dummy_fdw;
         CREATE SERVER dummy FOREIGN DATA WRAPPER dummy_fdw;
         CREATE USER MAPPING FOR postgres SERVER dummy;
         CREATE SERVER nomap FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '1', dbname 'postgres');
         CREATE SERVER down FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '127.0.0.1', port '1', dbname 'postgres');
         CREATE USER MAPPING FOR postgres SERVER down OPTIONS (user 'postgres');",
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e8', 'postgres', '{"server": "dummy"}')"#,
        "22023",
        None,
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e9', 'postgres', '{"server": "nomap"}')"#,
        "42704",
        Some("CREATE USER MAPPING"),
    );
    expect_fail(
        &c,
        r#"SELECT tide.create_pipeline('e10', 'postgres', '{"server": "down"}')"#,
        "08001",
        None,
    );
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.pipeline WHERE name LIKE 'e%'"),
        0,
        "a refused pipeline was created"
    );
}

#[test]
fn target_table_checks_remote() {
    let c = setup("tt_checks_remote");
    let t = target_cluster("tt_checks_remote_tgt");
    create_server(&c, "tgt", &t);
    c.execute(
        "CREATE TABLE shape_src (a int, b text, v numeric(10,2) NOT NULL, t varchar(20), arr int[], PRIMARY KEY (b, a));
         CREATE TABLE pre (id int PRIMARY KEY, a int NOT NULL);
         CREATE TABLE mism (id int PRIMARY KEY, missing_col int, typed_col int);
         CREATE TABLE named (id int PRIMARY KEY, x text);
         CREATE TABLE later (id int PRIMARY KEY, x text);",
    );
    // schema defaults to public on the remote.
    create_pipeline(&c, "r", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('r', 'shape_src')");
    let (src_cols, src_key) = shape(&c, "public.shape_src");
    let (tgt_cols, tgt_key) = shape(&t, "public.shape_src");
    assert_eq!(
        tgt_cols, src_cols,
        "the created remote target's columns differ from the source's"
    );
    assert_eq!(
        tgt_key, src_key,
        "the created remote target's key differs from the source's"
    );
    // On another server, a table named like the source is not the source: no 22023.
    exec(
        &c,
        "SELECT tide.add_table('r', 'named', target_table => 'other.named_here')",
    );
    t.execute(
        "CREATE TABLE public.pre (id int PRIMARY KEY, a bigint NOT NULL);
         INSERT INTO public.pre VALUES (-1, -1);
         CREATE TABLE public.mism (id int, typed_col text, other int PRIMARY KEY);",
    );
    exec(&c, "SELECT tide.add_table('r', 'pre', backfill => false)");
    let db = expect_fail(&c, "SELECT tide.add_table('r', 'mism')", "42P16", None);
    let detail = db.detail().unwrap_or("").to_string();
    for needle in ["missing_col", "typed_col", "key"] {
        assert!(
            detail.contains(needle),
            "the DETAIL does not mention {needle:?}: {detail:?}"
        );
    }
    c.execute(
        "INSERT INTO shape_src VALUES (1, 'k', 2.5, 'x', '{3}'); INSERT INTO pre VALUES (1, 1);
         INSERT INTO named VALUES (1, 'one');",
    );
    wait_pipeline(&c, "r", 60);
    assert_same_rows(
        "shape_src",
        &c,
        "public.shape_src",
        &t,
        "public.shape_src",
        "a, b, v, t, arr",
    );
    assert_same_rows("named", &c, "public.named", &t, "other.named_here", "id, x");
    assert_eq!(
        texts(&t, "SELECT row(id, a)::text FROM public.pre ORDER BY id"),
        vec!["(-1,-1)", "(1,1)"],
        "the existing remote table was not used as it is"
    );
    let n: i64 = t.query_scalar("SELECT count(*) FROM public.tide_applied WHERE pipeline = 'r'");
    assert_eq!(n, 1, "the remote has no applied position for pipeline r");

    // A schema option naming a schema the remote does not have yet: add_table creates it (with
    // the table); the new pipeline must not be in error before that.
    let t_rs = Instant::now();
    exec(
        &c,
        r#"SELECT tide.create_pipeline('rs', 'postgres', '{"server": "tgt", "schema": "replica"}')"#,
    );
    let streaming = poll_every(Duration::from_secs(15), POLL, || {
        Ok(c.try_query_scalar::<bool>(
            "SELECT coalesce((SELECT state = 'streaming' AND last_error IS NULL FROM tide.pipelines WHERE name = 'rs'), false)",
        )?)
    });
    let before_add = pipeline_json(&c, "rs");
    exec(&c, "SELECT tide.add_table('rs', 'later')");
    c.execute("INSERT INTO later VALUES (1, 'l')");
    wait_pipeline(&c, "rs", 60);
    assert_same_rows("later", &c, "public.later", &t, "replica.later", "id, x");
    assert_eq!(
        t.query_scalar::<i64>("SELECT count(*) FROM replica.tide_applied WHERE pipeline = 'rs'"),
        1,
        "the applied position is not kept in the schema option's schema"
    );
    if let Err(msg) = streaming {
        panic!(
            "a new 'postgres' pipeline whose schema option names a schema the remote does not have yet \
             is not streaming {:.1?} after create_pipeline ({msg}), before any add_table:\n{before_add}",
            t_rs.elapsed()
        );
    }
}

// ------------------------------------------------------------------------------------------
// Statements per batch
// ------------------------------------------------------------------------------------------

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
    // A statement per 1000 rows of a table (and per batch): 1 or 2 each. One run at a time
    // would need a statement per event here, since a and b alternate: 1000 each.
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
/// while a chunk of `big` fails at the target for a while.
#[test]
fn chunk_failure_after_early_commit_is_exactly_once() {
    let c = setup("tt_early");
    let t = target_cluster("tt_early_tgt");
    create_server(&c, "tgt", &t);
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
    // The chunk holding 15000 fails, and is retried, while ev keeps streaming.
    let failed = poll_every(Duration::from_secs(60), POLL, || {
        Ok(c.try_query_scalar::<bool>(
            "SELECT coalesce((SELECT last_error LIKE '%refusing row 15000%' FROM tide.pipelines WHERE name = 'e'), false)",
        )?)
    });
    assert!(failed.is_ok(), "the chunk never failed\n{}", diag(&c));
    std::thread::sleep(Duration::from_secs(3));
    t.execute("UPDATE boom SET on_ = false");
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
