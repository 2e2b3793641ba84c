//! Wallets: no reader of the target ever sees half a transfer, during the backfill too (a
//! checker reads the target continuously in REPEATABLE READ), local and remote.

use crate::common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Transfers per second of the wallet scenario's writers.
const WALLET_TPS: f64 = 800.0;
// The wallets (WALLETS, WALLET_START_BALANCE, WALLET_SCHEMA, WALLET_TRANSFER_SCRIPT) are
// pg_test's fixtures, shared with the kafka suite.

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

/// The rows of `sql` (an int4 and two int8 columns) as "(label value, ...)", joined by ", ".
fn examples(
    tx: &mut postgres::Transaction,
    sql: &str,
    labels: [&str; 3],
) -> Result<String, postgres::Error> {
    Ok(tx
        .query(sql, &[])?
        .iter()
        .map(|r| {
            format!(
                "({} {}, {} {}, {} {})",
                labels[0],
                r.get::<_, i32>(0),
                labels[1],
                r.get::<_, i64>(1),
                labels[2],
                r.get::<_, i64>(2)
            )
        })
        .collect::<Vec<_>>()
        .join(", "))
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
                  WHERE w.balance <> {WALLET_START_BALANCE} + t.net),
                (SELECT count(*) FROM {s}.transfer_check t
                   LEFT JOIN (SELECT w, sum(d) AS s FROM (SELECT to_id AS w, amount AS d FROM {s}.ledger
                                                          UNION ALL SELECT from_id, -amount FROM {s}.ledger) x
                               GROUP BY w) l ON l.w = t.wallet_id
                  WHERE t.net <> coalesce(l.s, 0))"
    );
    let bad_balance = format!(
        "SELECT w.id, w.balance, t.net FROM {s}.wallets w JOIN {s}.transfer_check t ON t.wallet_id = w.id
          WHERE w.balance <> {WALLET_START_BALANCE} + t.net ORDER BY w.id LIMIT 5"
    );
    let bad_net = format!(
        "SELECT t.wallet_id, t.net, coalesce(l.s, 0)::int8 FROM {s}.transfer_check t
           LEFT JOIN (SELECT w, sum(d) AS s FROM (SELECT to_id AS w, amount AS d FROM {s}.ledger
                                                  UNION ALL SELECT from_id, -amount FROM {s}.ledger) x
                       GROUP BY w) l ON l.w = t.wallet_id
          WHERE t.net <> coalesce(l.s, 0) ORDER BY 1 LIMIT 5"
    );
    let total = WALLETS * WALLET_START_BALANCE;
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
                let rows = examples(&mut tx, &bad_balance, ["id", "balance", "net"])?;
                problems.push(format!(
                    "(b) {b1} wallets have balance <> 1000 + net (half a transfer applied), e.g. {rows}"
                ));
            }
            if b2 != 0 {
                let rows = examples(&mut tx, &bad_net, ["wallet", "net", "ledger sum"])?;
                problems.push(format!(
                    "(b) {b2} transfer_check rows disagree with the ledger rows at the target (ledger row without its balance change or the reverse), e.g. {rows}"
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
            c.pgbench(WALLET_TRANSFER_SCRIPT)
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
        WALLETS * WALLET_START_BALANCE,
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
