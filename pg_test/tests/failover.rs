//! Failover to a physical standby (issue 46; docs/high-availability.md): a primary with three
//! pipelines (an outbox, a local table, a remote table on a third cluster) under pgbench load,
//! a physical standby of it on its own physical slot (`primary_slot_name`, `hot_standby_feedback`;
//! from PostgreSQL 17 also `sync_replication_slots = on`, a `dbname` in `primary_conninfo`, and
//! the primary's `synchronized_standby_slots` naming the standby's slot, as PostgreSQL documents
//! for logical replication failover). The primary's postmaster is killed with `kill -9` under
//! load, the standby promoted.
//!
//! - **On the standby, before the promotion** every view answers and `tide.check()` says the
//!   server is a standby; from 17, `tide.pipelines` shows each slot synchronised
//!   (`slot_synced`, its position in `confirmed_lsn`) and says the promotion resumes from it;
//!   on 15 and 16, that the promotion resyncs.
//! - **From 17**: every pipeline resumes on the promoted standby from its synchronised slot: no
//!   lost slot, no resync, no new backfill; the remote target is taken over (after the old
//!   primary's lease) with its applied position kept; nothing the standby never received was
//!   delivered (the remote target's applied position at the kill is within the standby's WAL).
//! - **On 15 and 16** (the documented behaviour): every pipeline finds its slot missing and
//!   resyncs, by itself.
//! - **On every version**: 0 rows differ at the local and the remote target (and `tide.verify`
//!   finds none), and the outbox replayed by a consumer on the promoted server has every row
//!   of the source exactly once per change: no gap, no duplicate (from 17; on 15 and 16 the
//!   resync adds `read` events, so no gap).
//!
//! `TIDE_TEST_FAILOVER_SLOTS=off` runs the same test with `tide.failover_slots = off` on the
//! primary (slots made without failover): from 17 it must then fail (the slots are not
//! synchronised, and the pipelines resync).

use pg_test::*;
use std::time::{Duration, Instant};

const ROWS: i64 = 2000;
const COLS: &str = "id, v, pad";
const POLL: Duration = Duration::from_millis(200);
const PIPELINES: [&str; 3] = ["obx", "loc", "rem"];
const STANDBY_SLOT: &str = "fo_standby";

/// The load: an upsert and a delete on `items`, an insert into `events` (insert-only: each of
/// its rows is one outbox event).
const LOAD: &str = r"\set id random(1, 2400)
\set d random(1, 2400)
BEGIN;
INSERT INTO items (id, v, pad) VALUES (:id, 1, 'b') ON CONFLICT (id) DO UPDATE SET v = items.v + 1;
DELETE FROM items WHERE id = :d AND v % 5 = 0;
INSERT INTO events (v) VALUES (:id);
END;
";

fn failover_slots_off() -> bool {
    std::env::var("TIDE_TEST_FAILOVER_SLOTS").is_ok_and(|v| v == "off")
}

fn data_dir(c: &Cluster) -> String {
    let base = std::env::var("TIDE_CLUSTERS").unwrap_or_else(|_| "/tmp/pg_tide_clusters".into());
    format!("{base}/{}/data", c.name())
}

/// Append `lines` to `c`'s `postgresql.auto.conf` (after what `pg_basebackup -R` wrote there).
fn append_auto_conf(c: &Cluster, lines: &str) {
    let out = command_as_postgres("sh")
        .args([
            "-c",
            &format!(
                "printf '%s\\n' \"$1\" >> {}/postgresql.auto.conf",
                data_dir(c)
            ),
            "sh",
            lines,
        ])
        .output()
        .expect("append to postgresql.auto.conf");
    assert!(
        out.status.success(),
        "append to postgresql.auto.conf: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The postmaster's process id (`postmaster.pid`'s first line).
fn postmaster_pid(c: &Cluster) -> i32 {
    let text = std::fs::read_to_string(format!("{}/postmaster.pid", data_dir(c)))
        .expect("read postmaster.pid");
    text.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("a pid in postmaster.pid")
}

fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The source: `items` (ROWS rows) and `events`, captured by an outbox, a local table and a
/// remote table pipeline, all backfilled; the standby's physical slot.
fn primary() -> (Cluster, Cluster) {
    let mut b = Cluster::builder("failover").conf("tide.target_lease = 6");
    if failover_slots_off() {
        b = b.conf("tide.failover_slots = off");
    }
    let c = start_cluster(b);
    init_extension(&c);
    let t = target_cluster("failover_tgt");
    create_server(&c, "tgt", &t);
    c.execute(&format!(
        "CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, pad text);
         INSERT INTO items SELECT g, g, 'p' FROM generate_series(1, {ROWS}) g;
         CREATE TABLE events (id bigserial PRIMARY KEY, v int NOT NULL);
         INSERT INTO events (v) SELECT g FROM generate_series(1, 100) g;
         CREATE SCHEMA rep;
         SELECT pg_create_physical_replication_slot('{STANDBY_SLOT}');"
    ));
    create_pipeline(&c, "obx", "outbox", "{}");
    create_pipeline(&c, "loc", "table", r#"{"schema": "rep"}"#);
    create_pipeline(&c, "rem", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('obx', 'events')");
    exec(&c, "SELECT tide.add_table('loc', 'items')");
    exec(&c, "SELECT tide.add_table('rem', 'items')");
    wait_backfill(&c, "events", "obx", 120);
    wait_backfill(&c, "items", "loc", 120);
    wait_backfill(&c, "items", "rem", 120);
    for p in PIPELINES {
        wait_pipeline(&c, p, 60);
    }
    (c, t)
}

/// A streaming standby of `c` on the physical slot, set up for slot synchronisation from 17
/// (the primary's `synchronized_standby_slots` naming its slot).
fn standby(c: &Cluster) -> Cluster {
    standby_with(c, true)
}

/// [`standby`]; `wait_for_it`: whether the primary's `synchronized_standby_slots` names it.
fn standby_with(c: &Cluster, wait_for_it: bool) -> Cluster {
    let s = c.basebackup("failover_sb", true);
    let mut conf = format!(
        "primary_slot_name = '{STANDBY_SLOT}'\nhot_standby_feedback = on\nprimary_conninfo = 'host=127.0.0.1 port={} user=postgres dbname=postgres'",
        c.port()
    );
    if pg_major() >= 17 {
        conf.push_str("\nsync_replication_slots = on");
    }
    append_auto_conf(&s, &conf);
    s.start();
    c.wait_until(
        "the standby to stream on its slot",
        Duration::from_secs(60),
        POLL,
        || {
            Ok(c.try_query_scalar::<bool>(&format!(
                "SELECT coalesce(bool_and(active), false) FROM pg_replication_slots WHERE slot_name = '{STANDBY_SLOT}'"
            ))?)
        },
    );
    if pg_major() >= 17 && wait_for_it {
        c.execute(&format!(
            "ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'"
        ));
        c.execute("SELECT pg_reload_conf()");
    }
    s
}

/// The pipelines' (resync, slot_lost_at IS NOT NULL) on `c`, by name.
fn resyncs(c: &Cluster) -> Vec<(String, Option<String>, bool)> {
    c.query("SELECT name, resync, slot_lost_at IS NOT NULL FROM tide.pipelines ORDER BY name")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// What the standby shows before the promotion (item 5 of issue 46): every view answers, the
/// server says it is a standby, and (17+) each slot is synchronised.
fn check_standby_views(s: &Cluster, synced_expected: bool) {
    assert!(s.query_scalar::<bool>("SELECT pg_is_in_recovery()"));
    for v in [
        "pipelines",
        "tables",
        "backfills",
        "chunks",
        "readiness",
        "consumers",
        "outbox_retention",
        "skipped_tables",
        "skipped_transactions",
        "followed_schemas",
        "verifications",
    ] {
        s.try_query(&format!("SELECT * FROM tide.{v}"))
            .unwrap_or_else(|e| panic!("tide.{v} on the standby: {}", describe_error(&e)));
    }
    let check: String = s.query_scalar("SELECT tide.check()");
    assert!(
        check.contains("this server is a standby"),
        "tide.check(): {check}"
    );
    for r in s.query(
        "SELECT name, state, last_error, slot_synced, confirmed_lsn::text FROM tide.pipelines ORDER BY name",
    ) {
        let (name, state, why, synced, confirmed): (
            String,
            String,
            Option<String>,
            Option<bool>,
            Option<String>,
        ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        let why = why.unwrap_or_default();
        assert_eq!(state, "stopped", "{name} on the standby");
        assert!(why.contains("standby"), "{name}: {why}");
        if synced_expected {
            assert_eq!(synced, Some(true), "{name}: slot_synced on the standby");
            assert!(confirmed.is_some(), "{name}: the synchronised slot's position");
            assert!(why.contains("resumes from it"), "{name}: {why}");
            assert!(
                check.contains("3 of 3 pipeline slot(s) are synchronised"),
                "tide.check(): {check}"
            );
        } else {
            assert!(why.contains("resyncs"), "{name}: {why}");
            if pg_major() < 17 {
                assert_eq!(synced, None, "{name}: no slot_synced before 17");
            }
        }
    }
}

#[test]
fn kill_primary_under_load_and_promote() {
    let major = pg_major();
    // What the documentation promises on this version.
    let from_slot = major >= 17;
    let (c, t) = primary();
    let s = standby(&c);
    if from_slot {
        let failover: bool = c.query_scalar(
            "SELECT bool_and(slot_failover) FROM tide.pipelines WHERE name IN ('obx', 'loc', 'rem')",
        );
        eprintln!("slots are failover slots: {failover}");
    }
    let backfills_before: i64 = c.query_scalar("SELECT count(*) FROM tide.backfills");

    // Load, and the standby's slots synchronised (17+) while it runs.
    let script = write_script("failover", LOAD);
    let load = spawn_pgbench(&c, &script, 4, 120, Some(300));
    c.wait_until(
        "the pipelines to apply the load",
        Duration::from_secs(60),
        POLL,
        || Ok(c.try_query_scalar::<i64>("SELECT count(*) FROM events")? > 600),
    );
    if from_slot {
        let t0 = Instant::now();
        let mut synced = false;
        while t0.elapsed() < Duration::from_secs(90) {
            synced = s
                .try_query_scalar::<i64>(
                    "SELECT count(*) FROM pg_replication_slots WHERE synced AND NOT temporary AND slot_name LIKE 'tide\\_%'",
                )
                .is_ok_and(|n| n == 3);
            if synced {
                break;
            }
            std::thread::sleep(POLL);
        }
        eprintln!(
            "the standby synchronised the 3 slots: {synced} ({:.1?})",
            t0.elapsed()
        );
    }
    // (With tide.failover_slots off the standby has nothing to show: what fails is the outcome.)
    check_standby_views(&s, from_slot && !failover_slots_off());
    // More load after the last synchronisation seen, then the primary dies.
    let events_at_sync: i64 = c.query_scalar("SELECT count(*) FROM events");
    c.wait_until("more load", Duration::from_secs(60), POLL, || {
        Ok(c.try_query_scalar::<i64>("SELECT count(*) FROM events")? > events_at_sync + 300)
    });
    let workers: Vec<i32> = c
        .query("SELECT worker_pid FROM tide.pipelines WHERE worker_pid IS NOT NULL")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let pm = postmaster_pid(&c);
    kill9(pm);
    c.wait_until(
        "the old primary's processes to end",
        Duration::from_secs(60),
        POLL,
        || Ok(!alive(pm) && workers.iter().all(|&w| !alive(w))),
    );
    let load = load.finish();
    eprintln!("load: {} transactions before the kill", load.txns);
    // What the remote target had applied when the primary died, and what the standby received.
    let applied_at_kill: String =
        t.query_scalar("SELECT applied_lsn::text FROM public.tide_applied WHERE pipeline = 'rem'");
    let received: String = s
        .query_scalar("SELECT greatest(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::text");
    let within: bool = s.query_scalar(&format!(
        "SELECT '{applied_at_kill}'::pg_lsn <= '{received}'::pg_lsn"
    ));
    eprintln!(
        "remote target applied {applied_at_kill} at the kill; the standby received {received}"
    );

    let t0 = Instant::now();
    s.promote();
    // The promoted server writes too: the pipelines must carry both.
    s.execute(
        "INSERT INTO events (v) SELECT -g FROM generate_series(1, 50) g;
         UPDATE items SET v = v * 10 WHERE id BETWEEN 200 AND 260;
         DELETE FROM items WHERE id BETWEEN 300 AND 320;",
    );
    for p in PIPELINES {
        wait_pipeline(&s, p, 240);
    }
    eprintln!(
        "all pipelines caught up on the promoted standby in {:.1?}",
        t0.elapsed()
    );
    let after = resyncs(&s);
    let backfills_after: i64 = s.query_scalar("SELECT count(*) FROM tide.backfills");

    // 0 rows differ, at both table targets, and tide.verify agrees.
    assert_same_rows("the local target", &s, "items", &s, "rep.items", COLS);
    assert_same_rows("the remote target", &s, "items", &t, "public.items", COLS);
    let differing: i64 = s.query_scalar(
        "SELECT count(*) FROM tide.verify('items', 'loc') WHERE kind NOT LIKE 'summary%'",
    );
    assert_eq!(
        differing, 0,
        "tide.verify: ranges differing at the local target"
    );

    // The outbox, replayed by a consumer on the promoted server: every row of events, once
    // per change (no gap), and nothing the new primary does not have.
    let gaps: i64 = s.query_scalar(
        "SELECT count(*) FROM events e WHERE NOT EXISTS (
             SELECT 1 FROM tide.outbox o WHERE o.pipeline = 'obx' AND o.op IN ('insert', 'read')
                AND (o.key->>'id')::bigint = e.id)",
    );
    let foreign: i64 = s.query_scalar(
        "SELECT count(*) FROM tide.outbox o WHERE o.pipeline = 'obx' AND o.op IN ('insert', 'read')
            AND NOT EXISTS (SELECT 1 FROM events e WHERE e.id = (o.key->>'id')::bigint)",
    );
    let duplicates: i64 = s.query_scalar(
        "SELECT count(*) FROM (SELECT o.key->>'id' FROM tide.outbox o
                                WHERE o.pipeline = 'obx' AND o.op IN ('insert', 'read')
                                GROUP BY 1 HAVING count(*) > 1) d",
    );
    eprintln!(
        "outbox: {gaps} rows of events missing, {foreign} events of rows the new primary lacks, {duplicates} rows delivered twice; pipelines after: {after:?}; backfills {backfills_before} -> {backfills_after}"
    );
    assert_eq!(gaps, 0, "outbox: rows of events never delivered");
    assert_eq!(
        foreign, 0,
        "outbox: events of rows the promoted server never had"
    );

    if from_slot {
        // No resync, no re-read: each pipeline went on from its synchronised slot.
        for (name, resync, lost) in &after {
            assert!(
                resync.is_none() && !lost,
                "pipeline {name} resynced after the failover (resync {resync:?}, slot lost {lost}): its slot was not carried over\n{}",
                diag(&s)
            );
        }
        assert_eq!(
            backfills_after, backfills_before,
            "no table was read again after the failover"
        );
        assert_eq!(duplicates, 0, "outbox: rows delivered twice");
        assert!(
            within,
            "the remote target had applied {applied_at_kill}, WAL the standby never received (it had {received})"
        );
        let applied_now: String = t.query_scalar(
            "SELECT applied_lsn::text FROM public.tide_applied WHERE pipeline = 'rem'",
        );
        let kept: bool = s.query_scalar(&format!(
            "SELECT '{applied_now}'::pg_lsn >= '{applied_at_kill}'::pg_lsn"
        ));
        assert!(
            kept,
            "the takeover kept the remote target's applied position ({applied_at_kill} -> {applied_now})"
        );
    } else {
        // 15 and 16: no slot survives a failover; every pipeline resyncs by itself.
        for (name, _, lost) in &after {
            assert!(
                lost,
                "pipeline {name}: its slot was lost and recovered by a resync"
            );
        }
        assert!(
            backfills_after >= backfills_before + 3,
            "every table was read again ({backfills_before} -> {backfills_after})"
        );
    }
}

/// The state of pipeline `p` on `c`.
fn state_of(c: &Cluster, p: &str) -> TestResult<String> {
    Ok(c.try_query_scalar::<String>(&format!(
        "SELECT state FROM tide.pipelines WHERE name = '{p}'"
    ))?)
}

/// Whether the remote target `t` has row `id` of `items`.
fn remote_has(t: &Cluster, id: i64) -> TestResult<bool> {
    Ok(t.try_query_scalar::<bool>(&format!(
        "SELECT EXISTS (SELECT 1 FROM public.items WHERE id = {id})"
    ))?)
}

/// From 17, a remote pipeline on a failover slot delivers only WAL that the standbys of
/// `synchronized_standby_slots` confirmed, as PostgreSQL's walsenders do: with the standby
/// stopped, a change waits (`state = 'waiting for standby'`, the remote target without it)
/// while a local table pipeline, in the source database, delivers it; once the standby is back,
/// it arrives. On 15 and 16 (no failover slots, no such setting) it is delivered at once.
#[test]
fn remote_target_waits_for_the_standby() {
    let c = start_cluster(Cluster::builder("fo_gate").conf("tide.target_lease = 6"));
    init_extension(&c);
    let t = target_cluster("fo_gate_tgt");
    create_server(&c, "tgt", &t);
    c.execute(&format!(
        "CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, pad text);
         INSERT INTO items SELECT g, g, 'p' FROM generate_series(1, 100) g;
         CREATE SCHEMA rep;
         SELECT pg_create_physical_replication_slot('{STANDBY_SLOT}');"
    ));
    create_pipeline(&c, "rem", "postgres", r#"{"server": "tgt"}"#);
    create_pipeline(&c, "loc", "table", r#"{"schema": "rep"}"#);
    exec(&c, "SELECT tide.add_table('rem', 'items')");
    exec(&c, "SELECT tide.add_table('loc', 'items')");
    wait_backfill(&c, "items", "rem", 120);
    wait_backfill(&c, "items", "loc", 120);
    let s = standby(&c);
    c.execute("INSERT INTO items VALUES (1001, 1, 'with the standby')");
    c.wait_until(
        "the first row at the remote target",
        Duration::from_secs(60),
        POLL,
        || remote_has(&t, 1001),
    );

    s.stop(StopMode::Fast);
    c.execute("INSERT INTO items VALUES (1002, 1, 'without the standby')");
    if pg_major() >= 17 {
        c.wait_until(
            "the remote pipeline to wait for the standby",
            Duration::from_secs(60),
            POLL,
            || Ok(state_of(&c, "rem")? == "waiting for standby"),
        );
        c.wait_until(
            "the local target to have the row",
            Duration::from_secs(60),
            POLL,
            || {
                Ok(c.try_query_scalar::<bool>(
                    "SELECT EXISTS (SELECT 1 FROM rep.items WHERE id = 1002)",
                )?)
            },
        );
        // Long enough for several iterations: still not delivered.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            assert!(
                !remote_has(&t, 1002).expect("read the remote target"),
                "the remote target got a change the standby never received\n{}",
                diag(&c)
            );
            std::thread::sleep(POLL);
        }
        assert_eq!(state_of(&c, "rem").expect("state"), "waiting for standby");
        s.start();
    }
    c.wait_until(
        "the row at the remote target",
        Duration::from_secs(60),
        POLL,
        || remote_has(&t, 1002),
    );
    wait_pipeline(&c, "rem", 60);
    assert_eq!(state_of(&c, "rem").expect("state"), "streaming");
    assert_same_rows("the remote target", &c, "items", &t, "public.items", COLS);
}

/// A failover whose standby missed WAL the remote target already had (no
/// `synchronized_standby_slots` on the primary, the standby stopped while the primary went on):
/// the promoted standby must not trust the target's applied position. From 17 its slot came
/// with it (synchronised before the standby stopped), so only the takeover can tell: the
/// position is past where the new timeline left the old one, the takeover resets it, the slot
/// is marked lost with that reason, and the pipeline resyncs. On 15 and 16 the slot is missing:
/// a resync as well. Either way 0 rows differ, the promoted server's own writes included.
#[test]
fn takeover_past_the_new_history_resyncs() {
    let c = start_cluster(Cluster::builder("fo_diverge").conf("tide.target_lease = 6"));
    init_extension(&c);
    let t = target_cluster("fo_diverge_tgt");
    create_server(&c, "tgt", &t);
    c.execute(&format!(
        "CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL, pad text);
         INSERT INTO items SELECT g, g, 'p' FROM generate_series(1, {ROWS}) g;
         SELECT pg_create_physical_replication_slot('{STANDBY_SLOT}');"
    ));
    create_pipeline(&c, "rem", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('rem', 'items')");
    wait_backfill(&c, "items", "rem", 120);
    let s = standby_with(&c, false);
    c.execute("UPDATE items SET v = v + 1 WHERE id <= 100");
    wait_pipeline(&c, "rem", 60);
    if pg_major() >= 17 {
        s.wait_until("the slot to be synchronised", Duration::from_secs(90), POLL, || {
            Ok(s.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_replication_slots WHERE synced AND NOT temporary AND slot_name LIKE 'tide\\_%'",
            )? == 1)
        });
    }
    s.stop(StopMode::Fast);
    c.execute(
        "UPDATE items SET pad = repeat('x', 300) WHERE id % 2 = 0;
         UPDATE items SET v = v + 7 WHERE id % 3 = 0;
         DELETE FROM items WHERE id BETWEEN 500 AND 520;",
    );
    wait_pipeline(&c, "rem", 60);
    c.stop(StopMode::Immediate);
    s.start();
    s.promote();
    s.execute("UPDATE items SET v = -v WHERE id BETWEEN 1 AND 30");
    s.wait_until("the resync", Duration::from_secs(120), POLL, || {
        Ok(s.try_query_scalar::<bool>(
            "SELECT slot_lost_at IS NOT NULL FROM tide.pipelines WHERE name = 'rem'",
        )?)
    });
    wait_pipeline(&s, "rem", 180);
    let reason: String =
        s.query_scalar("SELECT slot_lost_reason FROM tide.pipelines WHERE name = 'rem'");
    eprintln!("the promoted standby resynced: {reason}");
    if pg_major() >= 17 {
        assert!(
            reason.contains("this server never had") && reason.contains("applied position"),
            "slot_lost_reason: {reason}"
        );
    }
    assert_same_rows("the remote target", &s, "items", &t, "public.items", COLS);
}
