//! One writer per target (DESIGN point 9, issue 43 item 1): a remote target belongs to one server.
//!
//! - A copy of the source (`pg_basebackup`, started beside production with pg_tide preloaded,
//!   written on) never writes into production's target while production runs: the target equals
//!   production's source both ways, and the copy's pipeline shows the fencing error (55006) with
//!   `tide.claim_target` in its remedy.
//! - A copy started after production stopped (a restore, a standby promoted after the primary
//!   died, with less WAL than the primary had applied to the target) takes the target over by
//!   itself once production's lease lapsed, resyncs, and ends with 0 rows differing, its writes
//!   after the resync included (they commit at positions the old primary had already applied:
//!   the old position must not be trusted across a takeover).
//! - A paused production keeps its lease (its worker renews it): a copy started meanwhile is
//!   fenced all the same, and production resumes into its own target.
//! - `tide.claim_target` on a copy moves the target at once: the copy's rows win, and the old
//!   writer's next write is refused (it pauses, fenced, with the reason and remedy).
//!
//! Every source has `tide.target_lease = 6` (seconds), so a takeover is due within seconds.

use pg_test::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const P: &str = "p";
const ROWS: i64 = 2000;
const LEASE: &str = "tide.target_lease = 6";
const POLL: Duration = Duration::from_millis(200);
const COLS: &str = "id, v, pad";

/// A source (lease 6 s) with `items` (ROWS rows) captured by pipeline `p` into a remote target,
/// backfilled.
fn production(name: &str) -> (Cluster, Cluster) {
    let c = start_cluster(Cluster::builder(name).conf(LEASE));
    init_extension(&c);
    let t = target_cluster(&format!("{name}_tgt"));
    create_server(&c, "tgt", &t);
    c.execute(&format!(
        "CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, pad text);
         INSERT INTO items SELECT g, g, 'p' FROM generate_series(1, {ROWS}) g;"
    ));
    create_pipeline(&c, P, "postgres", r#"{"server": "tgt"}"#);
    exec(&c, &format!("SELECT tide.add_table('{P}', 'items')"));
    wait_backfill(&c, "items", P, 120);
    wait_pipeline(&c, P, 60);
    (c, t)
}

/// Writes on `items` of `c` (update, upsert, delete of random rows) until `stop`; a failed round
/// (the server stopping) reconnects. Returns the rounds done.
fn writer(c: &Cluster, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    let cfg = c.config("postgres");
    std::thread::spawn(move || {
        let mut cl = cfg.connect(NoTls).ok();
        let mut rounds = 0;
        while !stop.load(Ordering::SeqCst) {
            let done = cl
                .as_mut()
                .is_some_and(|client| client.batch_execute(&churn_sql("items", ROWS)).is_ok());
            if done {
                rounds += 1;
            } else {
                std::thread::sleep(Duration::from_millis(200));
                cl = cfg.connect(NoTls).ok();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        rounds
    })
}

/// A pipeline's state, SQLSTATE, error and remedy.
type StateRow = (String, Option<String>, Option<String>, Option<String>);

/// The pipeline's state, SQLSTATE, error and remedy on `c`.
fn state(c: &Cluster) -> TestResult<StateRow> {
    let r = c.try_query_one(&format!(
        "SELECT state, last_error_sqlstate, last_error, remedy FROM tide.pipelines WHERE name = '{P}'"
    ))?;
    Ok((r.get(0), r.get(1), r.get(2), r.get(3)))
}

/// Wait until the pipeline on `c` shows the fencing error (55006), and return it.
#[track_caller]
fn wait_fenced(c: &Cluster, what: &str, timeout: Duration) -> (String, String, String) {
    let mut seen = None;
    c.wait_until(what, timeout, POLL, || {
        let (st, code, err, remedy) = state(c)?;
        if code.as_deref() == Some("55006") {
            seen = Some((st, err.unwrap_or_default(), remedy.unwrap_or_default()));
            return Ok(true);
        }
        Ok(false)
    });
    seen.unwrap_or_default()
}

/// The target's ownership row: (writer, epoch); an error (a target without the columns) as
/// its text, so the rows are compared before it is asserted.
fn owner(t: &Cluster) -> Result<(String, i64), String> {
    t.try_query_one(&format!(
        "SELECT writer, epoch FROM public.tide_applied WHERE pipeline = '{P}'"
    ))
    .map(|r| (r.get(0), r.get(1)))
    .map_err(|e| describe_error(&e))
}

/// The changes only a copy makes: rows inserted past the key range, 50 updated, 50 deleted.
const COPY_WRITES: &str = "
    INSERT INTO items SELECT g, -g, 'copy' FROM generate_series(100001, 100050) g;
    UPDATE items SET v = -1, pad = 'copy' WHERE id BETWEEN 1 AND 50;
    DELETE FROM items WHERE id BETWEEN 51 AND 100;";

#[test]
fn copy_beside_production_is_fenced() {
    let (c, t) = production("fence_copy");
    let stop = Arc::new(AtomicBool::new(false));
    let w = writer(&c, stop.clone());
    let before = owner(&t);

    let copy = c.basebackup("fence_copy_b", false);
    copy.start();
    copy.execute(COPY_WRITES);
    // The copy finds no slot (a base backup has none), makes one and resyncs: it is refused, or
    // (without fencing) it finishes its resync into production's target.
    let t0 = Instant::now();
    copy.wait_until(
        "the copy's pipeline to be fenced or done resyncing",
        Duration::from_secs(90),
        POLL,
        || {
            Ok(copy.try_query_scalar::<bool>(&format!(
                "SELECT last_error_sqlstate = '55006' OR (resync IS NULL AND state = 'streaming')
                   FROM tide.pipelines WHERE name = '{P}'"
            ))?)
        },
    );
    eprintln!("copy: its pipeline settled after {:.1?}", t0.elapsed());
    // Production keeps its lease (writes renew it) for several leases: the copy never takes over.
    std::thread::sleep(Duration::from_secs(20));
    stop.store(true, Ordering::SeqCst);
    let rounds = w.join().expect("writer thread");
    assert!(rounds > 50, "production wrote {rounds} rounds");
    wait_pipeline(&c, P, 60);
    // Production's target holds production's rows, none of the copy's.
    assert_same_rows("production's target", &c, "items", &t, "public.items", COLS);
    let copy_rows: i64 = t.query_scalar(
        "SELECT count(*) FROM public.items WHERE pad = 'copy' OR id BETWEEN 100001 AND 100050",
    );
    assert_eq!(copy_rows, 0, "rows of the copy reached production's target");
    let (st, code, err, remedy) = state(&copy).expect("the copy's pipeline row");
    eprintln!("copy: state {st:?}, SQLSTATE {code:?}: {err:?}; remedy {remedy:?}");
    assert_eq!(
        code.as_deref(),
        Some("55006"),
        "the copy is fenced, after 20 s too: {err:?}\n{}",
        diag(&copy)
    );
    let remedy = remedy.unwrap_or_default();
    assert!(
        remedy.contains("tide.claim_target('p')"),
        "the remedy names the claim: {remedy}"
    );
    assert_eq!(
        owner(&t).expect("the target's owner after"),
        before.expect("the target's owner before"),
        "the target's owner and epoch stayed production's"
    );
}

#[test]
fn restore_after_production_stopped_takes_over() {
    let (c, t) = production("fence_failover");
    // A standby, streaming, then stopped: production goes on without it (it misses that WAL).
    let standby = c.basebackup("fence_failover_s", true);
    standby.start();
    c.wait_until(
        "the standby to stream",
        Duration::from_secs(60),
        POLL,
        || Ok(c.try_query_scalar::<i64>("SELECT count(*) FROM pg_stat_replication")? == 1),
    );
    standby.stop(StopMode::Fast);
    c.execute(
        "UPDATE items SET pad = repeat('x', 400) WHERE id % 2 = 0;
               UPDATE items SET pad = repeat('y', 400) WHERE id % 2 = 1;
               UPDATE items SET v = v + 1;",
    );
    wait_pipeline(&c, P, 60);
    let applied_before: String = t.query_scalar(&format!(
        "SELECT applied_lsn::text FROM public.tide_applied WHERE pipeline = '{P}'"
    ));
    let old = owner(&t);
    c.stop(StopMode::Immediate);

    // The standby comes back without its primary and is promoted: it has less WAL than the
    // target's applied position.
    standby.start();
    standby.promote();
    let t0 = Instant::now();
    standby.execute(COPY_WRITES);
    wait_pipeline(&standby, P, 180);
    let took = t0.elapsed();
    // Writes after the resync, at positions below what the old primary had applied.
    standby.execute(
        "UPDATE items SET v = v * 10 WHERE id BETWEEN 200 AND 260;
         DELETE FROM items WHERE id BETWEEN 300 AND 320;
         INSERT INTO items VALUES (100100, 1, 'after');",
    );
    let after: bool = standby.query_scalar(&format!(
        "SELECT pg_current_wal_lsn() < '{applied_before}'::pg_lsn"
    ));
    assert!(
        after,
        "the test needs the promoted standby's writes below the old primary's applied position {applied_before}"
    );
    wait_pipeline(&standby, P, 60);
    eprintln!("failover: the promoted standby took the target over and resynced in {took:.1?}");
    assert_same_rows(
        "the promoted standby's target",
        &standby,
        "items",
        &t,
        "public.items",
        COLS,
    );
    let (old_writer, old_epoch) = old.expect("the target's owner before the failover");
    let (writer, epoch) = owner(&t).expect("the target's owner after the failover");
    assert_ne!(writer, old_writer, "the target's writer is the new server");
    assert_eq!(epoch, old_epoch + 1, "one takeover");
}

#[test]
fn claim_moves_the_target_and_fences_the_old_writer() {
    let (c, t) = production("fence_claim");
    let copy = c.basebackup("fence_claim_b", false);
    copy.start();
    copy.execute(COPY_WRITES);
    wait_fenced(
        &copy,
        "the copy's pipeline to be fenced",
        Duration::from_secs(90),
    );
    let (_, epoch_before) = owner(&t).expect("the target's owner");
    let epoch: i64 = copy.query_scalar(&format!("SELECT tide.claim_target('{P}')"));
    assert_eq!(epoch, epoch_before + 1, "the claim moves the epoch on");
    // Production writes on: its next commit is refused, and it pauses, fenced.
    c.execute("UPDATE items SET pad = 'production after the claim' WHERE id BETWEEN 500 AND 510");
    let (st, err, remedy) = wait_fenced(
        &c,
        "production's pipeline to be fenced",
        Duration::from_secs(60),
    );
    eprintln!("claim: production now {st:?}: {err}; remedy {remedy}");
    assert!(err.contains("was fenced"), "{err}");
    assert!(remedy.contains("tide.claim_target('p')"), "{remedy}");
    c.wait_until(
        "production's pipeline to pause",
        Duration::from_secs(30),
        POLL,
        || Ok(state(&c)?.0 == "paused"),
    );
    wait_pipeline(&copy, P, 180);
    assert_same_rows(
        "the claimed target",
        &copy,
        "items",
        &t,
        "public.items",
        COLS,
    );
    let late: i64 = t
        .query_scalar("SELECT count(*) FROM public.items WHERE pad = 'production after the claim'");
    assert_eq!(late, 0, "production wrote after the claim");
}

#[test]
fn paused_production_keeps_its_target() {
    let (c, t) = production("fence_paused");
    exec(&c, &format!("SELECT tide.pause_pipeline('{P}')"));
    c.wait_until(
        "the pipeline to pause",
        Duration::from_secs(30),
        POLL,
        || Ok(state(&c)?.0 == "paused"),
    );
    c.execute("UPDATE items SET v = v + 1000 WHERE id <= 100");
    let copy = c.basebackup("fence_paused_b", false);
    copy.start();
    copy.execute(COPY_WRITES);
    // The copy's catalog says paused too: someone resumes it there.
    copy.execute(&format!("SELECT tide.resume_pipeline('{P}')"));
    // Three leases and more: production's paused worker renews its lease all along.
    std::thread::sleep(Duration::from_secs(20));
    let (_, code, err, _) = state(&copy).expect("the copy's pipeline row");
    assert_eq!(
        code.as_deref(),
        Some("55006"),
        "the copy is fenced while production is paused: {err:?}\n{}",
        diag(&copy)
    );
    let copy_rows: i64 = t.query_scalar(
        "SELECT count(*) FROM public.items WHERE pad = 'copy' OR id BETWEEN 100001 AND 100050",
    );
    assert_eq!(copy_rows, 0, "rows of the copy reached production's target");
    exec(&c, &format!("SELECT tide.resume_pipeline('{P}')"));
    wait_pipeline(&c, P, 60);
    assert_same_rows(
        "production's target after the resume",
        &c,
        "items",
        &t,
        "public.items",
        COLS,
    );
}
