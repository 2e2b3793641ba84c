//! A pipeline whose replication slot is lost (issue 33): invalidated by
//! `max_slot_wal_keep_size`, dropped by hand, dropped by `tide.max_paused_wal_size`, missing
//! after a restore or a failover. The worker notices at its next iteration, says so in
//! `tide.pipelines`, creates a new slot and reads every table again through the watermark
//! backfill (`tide.on_slot_lost = 'resync'`, the default); a table target, local or remote
//! (`postgres`), loses the rows that no longer exist at the source, an outbox gets `resync`
//! events around the re-read (the kafka target's are in `kafka/resync.rs`). Before it happens,
//! `tide.pipelines` warns (`safe_wal_size`, `slot_warning`).
//!
//! Every test works as `alice`, a member of `tide_admin` (no superuser), except what only a DBA
//! does (server settings, `pg_drop_replication_slot` of someone else's slot, CHECKPOINT).

use pg_test::*;
use std::time::Duration;

fn diag(c: &Cluster) -> String {
    diag_of(
        c,
        &[
            (
                "pipelines",
                "SELECT name, state, resync, worker_pid, wal_status, safe_wal_size, slot_warning, slot_lost_reason, last_error, remedy FROM tide.pipelines",
                10,
            ),
            (
                "slots",
                "SELECT slot_name, plugin, active_pid, restart_lsn, confirmed_flush_lsn, wal_status, safe_wal_size FROM pg_replication_slots",
                10,
            ),
            (
                "backfills",
                "SELECT id, pipeline, relation, state, rows_emitted, last_key, error FROM tide.backfill ORDER BY id",
                20,
            ),
        ],
        40,
    )
}

/// A cluster with pg_tide, role alice (a tide_admin member) and her schema.
fn cluster(name: &str, conf: &[&str]) -> Cluster {
    let mut b = Cluster::builder(name);
    for line in conf {
        b = b.conf(line);
    }
    let c = start_cluster(b);
    init_extension(&c);
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA alice AUTHORIZATION alice;
         GRANT CREATE ON DATABASE postgres TO alice;
         CREATE TABLE filler (id bigserial PRIMARY KEY, pad text);",
    );
    c
}

#[track_caller]
fn as_alice(c: &Cluster, sql: &str) {
    if let Err(e) = connect_as(c, "alice").batch_execute(sql) {
        panic!(
            "as alice: {sql}\nfailed: {}\n{}",
            describe_error(&e),
            diag(c)
        );
    }
}

/// alice's table-target pipeline `p` over `alice.t` (`rows` rows), backfilled in chunks of 200
/// and caught up.
fn table_pipeline(c: &Cluster, rows: i64) {
    as_alice(
        c,
        &format!(
            "CREATE TABLE alice.t (id int PRIMARY KEY, v int, pad text);
             INSERT INTO alice.t SELECT g, g, md5(g::text) FROM generate_series(1, {rows}) g;"
        ),
    );
    as_alice(
        c,
        r#"SELECT tide.create_pipeline('p', 'table', '{"schema": "alice"}')"#,
    );
    as_alice(
        c,
        "SELECT tide.add_table('p', 'alice.t', target_table => 'copy')",
    );
    as_alice(
        c,
        "SELECT tide.alter_backfill('alice.t', 'p', chunk_size => 200)",
    );
    wait_for_backfill(c, "alice.t", Some("p"), 120, || diag(c));
    wait_for_pipeline(c, "p", 60, || diag(c));
    assert_converged(c, "after the first backfill");
}

/// The issue's 12,000 differing rows: 4,000 updated, 4,000 deleted, 4,000 inserted.
fn change_12000(c: &Cluster) {
    c.execute(
        "UPDATE alice.t SET v = -v WHERE id <= 4000;
         DELETE FROM alice.t WHERE id > 4000 AND id <= 8000;
         INSERT INTO alice.t SELECT g, g, 'new' FROM generate_series(20001, 24000) g;",
    );
}

/// Write about `mb` MB of WAL no pipeline captures.
fn write_wal(c: &Cluster, mb: i64) {
    c.execute(&format!(
        "INSERT INTO filler (pad) SELECT repeat(md5(g::text), 32) FROM generate_series(1, {}) g;
         TRUNCATE filler;",
        mb * 1024 * 1024 / 1100
    ));
}

#[track_caller]
fn assert_converged(c: &Cluster, when: &str) {
    match compare_rows(when, c, "alice.t", c, "alice.copy", "id, v, pad") {
        Ok(_) => {}
        Err(e) => panic!("{e}\n{}", diag(c)),
    }
}

/// Wait (at most `secs`) until the target equals the source, the pipeline says it resynced
/// (`slot_lost_at` set, `resync` over) and has caught up; panics with the differences.
#[track_caller]
fn wait_resynced(c: &Cluster, secs: u64) {
    let r = poll_every(
        Duration::from_secs(secs),
        Duration::from_millis(250),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT resync IS NULL AND slot_lost_at IS NOT NULL AND state = 'streaming'
                                    FROM tide.pipelines WHERE name = 'p'), false)",
            )?)
        },
    );
    if let Err(msg) = r {
        let differ = compare_rows("resync", c, "alice.t", c, "alice.copy", "id, v, pad")
            .err()
            .unwrap_or_default();
        panic!("the pipeline did not resync: {msg}\n{differ}\n{}", diag(c));
    }
    wait_for_pipeline(c, "p", 60, || diag(c));
    assert_converged(c, "after the resync");
}

/// The issue's measured case: a paused table-target pipeline on a server with
/// max_slot_wal_keep_size = 64MB; the source changes 12,000 rows and then writes more WAL than
/// that, so the slot becomes `lost`. After resume_pipeline, no manual step: 0 rows differ.
/// While the resync reads the table (throttled, so it is seen in progress), keys past the
/// current chunk are inserted and others deleted: the inserted ones stay, the deleted ones go.
#[test]
fn invalidated_slot_resyncs() {
    // (A warning margin below max_slot_wal_keep_size: the new slot must not warn.)
    let c = cluster(
        "slot_invalidated",
        &[
            "max_slot_wal_keep_size = 64MB",
            "tide.slot_warning_size = '16MB'",
        ],
    );
    table_pipeline(&c, 10000);
    as_alice(&c, "SELECT tide.pause_pipeline('p')");
    change_12000(&c);
    write_wal(&c, 200);
    c.execute("CHECKPOINT");
    c.wait_until(
        "the paused slot to be invalidated",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            c.execute("SELECT pg_switch_wal(); CHECKPOINT");
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT wal_status = 'lost' FROM pg_replication_slots WHERE slot_name = 'tide_5_p'), false)",
            )?)
        },
    );
    // Throttle the coming resync so it can be watched while it runs (it keeps the last
    // backfill's chunk size and throttle).
    c.execute("UPDATE tide.backfill SET rows_per_second = 2000 WHERE pipeline = 'p'");
    as_alice(&c, "SELECT tide.resume_pipeline('p')");
    // The resync is in progress, its chunks below key 8000 (the table's keys run to 24000).
    c.wait_until(
        "the resync to be reading alice.t",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT EXISTS (SELECT 1 FROM tide.pipelines WHERE name = 'p' AND resync = 'resyncing')
                    AND EXISTS (SELECT 1 FROM tide.backfill WHERE pipeline = 'p' AND resync
                                   AND state = 'running' AND last_key IS NOT NULL)",
            )?)
        },
    );
    let at: i64 = c.query_scalar(
        "SELECT coalesce(max(last_key[1]::int8), 0) FROM tide.backfill WHERE pipeline = 'p' AND resync AND state = 'running'",
    );
    assert!(
        at < 9000,
        "the resync read too far ({at}) to test writes ahead of it\n{}",
        diag(&c)
    );
    // Ahead of the resync: new keys (must stay), deleted keys (must go), changed keys.
    c.execute(
        "INSERT INTO alice.t SELECT g, g, 'during' FROM generate_series(30001, 30100) g;
         DELETE FROM alice.t WHERE id BETWEEN 9001 AND 9100;
         UPDATE alice.t SET pad = 'during' WHERE id BETWEEN 20001 AND 20100;",
    );
    wait_resynced(&c, 180);
    let (reason, warning): (String, Option<String>) = {
        let r = c.query_one(
            "SELECT slot_lost_reason, slot_warning FROM tide.pipelines WHERE name = 'p'",
        );
        (r.get(0), r.get(1))
    };
    assert!(reason.contains("invalidated"), "{reason}");
    assert_eq!(warning, None);
    // The new slot streams: a change after the resync arrives.
    c.execute("DELETE FROM alice.t WHERE id = 1; INSERT INTO alice.t VALUES (40000, 1, 'after')");
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    assert_converged(&c, "after the resync, streaming");
}

/// The slot dropped by hand while the pipeline was paused (as after a restore or a failover to a
/// standby without it: the catalog names a slot the server does not have).
#[test]
fn dropped_slot_resyncs() {
    let c = cluster("slot_dropped", &[]);
    table_pipeline(&c, 10000);
    as_alice(&c, "SELECT tide.pause_pipeline('p')");
    change_12000(&c);
    c.execute("SELECT pg_drop_replication_slot('tide_5_p')");
    as_alice(&c, "SELECT tide.resume_pipeline('p')");
    wait_resynced(&c, 180);
    let reason: String =
        c.query_scalar("SELECT slot_lost_reason FROM tide.pipelines WHERE name = 'p'");
    assert!(reason.contains("does not exist"), "{reason}");
}

/// A slot of the pipeline's name that is not pg_tide's (a physical slot someone created after
/// dropping it): lost, and left alone, with the remedy; once the DBA drops it the pipeline
/// resyncs. Then a pg_tide slot that someone consumed while the pipeline was paused: lost, and
/// resynced.
#[test]
fn foreign_or_moved_slot_resyncs() {
    let c = cluster("slot_foreign", &[]);
    table_pipeline(&c, 3000);
    as_alice(&c, "SELECT tide.pause_pipeline('p')");
    c.execute("DELETE FROM alice.t WHERE id <= 100");
    c.execute("SELECT pg_drop_replication_slot('tide_5_p')");
    c.execute("SELECT pg_create_physical_replication_slot('tide_5_p', true)");
    as_alice(&c, "SELECT tide.resume_pipeline('p')");
    c.wait_until(
        "the pipeline to report a slot it will not replace",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT state = 'slot lost'
                                         AND slot_lost_reason LIKE '%is not pg_tide''s (a physical slot%'
                                         AND last_error LIKE '%that pg_tide did not make exists%'
                                         AND remedy LIKE '%pg_drop_replication_slot(''tide_5_p'')%'
                                    FROM tide.pipelines WHERE name = 'p'), false)",
            )?)
        },
    );
    assert_eq!(
        c.query_scalar::<String>(
            "SELECT slot_type FROM pg_replication_slots WHERE slot_name = 'tide_5_p'"
        ),
        "physical"
    );
    c.execute("SELECT pg_drop_replication_slot('tide_5_p')");
    wait_resynced(&c, 120);
    // Paused (the worker has seen it: paused_lsn is kept), then its slot consumed by hand.
    as_alice(&c, "SELECT tide.pause_pipeline('p')");
    c.wait_until(
        "the paused worker to keep its slot's position",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT paused_lsn IS NOT NULL FROM tide.pipeline WHERE name = 'p'",
            )?)
        },
    );
    c.execute("DELETE FROM alice.t WHERE id <= 200; UPDATE alice.t SET v = 7 WHERE id > 2900");
    c.execute("SELECT pg_replication_slot_advance('tide_5_p', pg_current_wal_lsn())");
    as_alice(&c, "SELECT tide.resume_pipeline('p')");
    c.wait_until(
        "the moved slot to be noticed",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT slot_lost_reason LIKE '%moved while the pipeline was paused%'
                                    FROM tide.pipelines WHERE name = 'p'), false)",
            )?)
        },
    );
    wait_resynced(&c, 120);
}

/// tide.max_paused_wal_size drops a paused pipeline's slot: the paused pipeline shows the loss
/// at once (resync 'slot lost', the reason), and resyncs when resumed.
#[test]
fn paused_wal_bound_resyncs() {
    let c = cluster("slot_paused_bound", &["tide.max_paused_wal_size = '2MB'"]);
    table_pipeline(&c, 3000);
    as_alice(&c, "SELECT tide.pause_pipeline('p')");
    c.execute("DELETE FROM alice.t WHERE id <= 1000; UPDATE alice.t SET v = 0 WHERE id > 2500");
    write_wal(&c, 8);
    c.wait_until(
        "the paused pipeline to show its dropped slot",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT state = 'paused' AND resync = 'slot lost'
                                         AND slot_lost_reason LIKE '%tide.max_paused_wal_size%'
                                    FROM tide.pipelines WHERE name = 'p'), false)
                    AND NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = 'tide_5_p')",
            )?)
        },
    );
    as_alice(&c, "SELECT tide.resume_pipeline('p')");
    wait_resynced(&c, 180);
}

/// With tide.on_slot_lost = 'error' the pipeline stops with the reason and the remedy, and
/// resyncs once the setting allows it.
#[test]
fn on_slot_lost_error_waits() {
    let c = cluster("slot_error", &["tide.on_slot_lost = 'error'"]);
    table_pipeline(&c, 2000);
    as_alice(&c, "SELECT tide.pause_pipeline('p')");
    c.execute("DELETE FROM alice.t WHERE id <= 500");
    c.execute("SELECT pg_drop_replication_slot('tide_5_p')");
    as_alice(&c, "SELECT tide.resume_pipeline('p')");
    c.wait_until(
        "the pipeline to report its lost slot",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT state = 'slot lost' AND resync = 'slot lost' AND remedy LIKE '%tide.on_slot_lost%'
                                    FROM tide.pipelines WHERE name = 'p'), false)",
            )?)
        },
    );
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'tide_5_p'"
        ),
        0
    );
    c.execute("ALTER SYSTEM SET tide.on_slot_lost = 'resync'");
    c.execute("SELECT pg_reload_conf()");
    wait_resynced(&c, 180);
}

/// The worker killed during the recovery: while it waits to create the new slot (an open
/// writing transaction holds it up: terminated, restarted, waiting again), and with kill -9 while
/// the resync reads the table. The recovery resumes where it was; the open transaction's row,
/// committed before the new slot's start, arrives through the re-read.
#[test]
fn killed_during_recovery() {
    let c = cluster("slot_killed", &[]);
    table_pipeline(&c, 10000);
    as_alice(&c, "SELECT tide.pause_pipeline('p')");
    change_12000(&c);
    c.execute("SELECT pg_drop_replication_slot('tide_5_p')");
    // A writing transaction left open: creating a logical slot waits for it.
    let mut open = c.client();
    open.batch_execute("BEGIN; INSERT INTO alice.t VALUES (50000, 5, 'open')")
        .unwrap();
    as_alice(&c, "SELECT tide.resume_pipeline('p')");
    let waiting_pid = || -> Result<Option<i32>, postgres::Error> {
        c.try_query_scalar::<Option<i32>>(
            "SELECT (SELECT a.pid FROM pg_stat_activity a JOIN tide.pipelines p ON p.worker_pid = a.pid
                      WHERE p.name = 'p' AND p.resync = 'slot lost' AND a.wait_event_type = 'Lock')",
        )
    };
    let mut pids = Vec::new();
    for _ in 0..2 {
        c.wait_until(
            "the worker to wait for the open transaction to create its slot",
            Duration::from_secs(90),
            Duration::from_millis(100),
            || Ok(waiting_pid()?.is_some_and(|p| !pids.contains(&p))),
        );
        let pid = waiting_pid().unwrap().unwrap();
        pids.push(pid);
        // The first time: terminated (the launcher restarts it, and it waits again).
        if pids.len() == 1 {
            c.execute(&format!("SELECT pg_terminate_backend({pid})"));
        }
    }
    open.batch_execute("COMMIT").unwrap();
    c.wait_until(
        "the resync to be reading alice.t",
        Duration::from_secs(90),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT EXISTS (SELECT 1 FROM tide.pipelines WHERE name = 'p' AND resync = 'resyncing' AND worker_pid IS NOT NULL)",
            )?)
        },
    );
    c.execute("UPDATE tide.backfill SET rows_per_second = 2000 WHERE pipeline = 'p' AND resync AND state IN ('queued', 'running')");
    c.wait_until(
        "a resync chunk to be written",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT EXISTS (SELECT 1 FROM tide.backfill WHERE pipeline = 'p' AND resync AND last_key IS NOT NULL AND state = 'running')",
            )?)
        },
    );
    let pid = worker_pid(&c, "p").expect("a worker");
    // (Once the restart is over: a write retried until it succeeds could commit on the old
    // server and lose its answer to the restart, then fail on its own key forever.)
    kill9_and_wait_restart(&c, pid, Duration::from_secs(60));
    c.execute("INSERT INTO alice.t VALUES (50001, 6, 'after the kill'); DELETE FROM alice.t WHERE id = 9500");
    wait_resynced(&c, 240);
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM alice.copy WHERE id IN (50000, 50001)"),
        2
    );
}

/// An outbox pipeline: the resync is framed by `resync` events (start, end) per table, with the
/// table's rows as `read` events between them; a consumer that drops the keys it did not see
/// between them ends with the source's rows.
#[test]
fn outbox_resync_events() {
    let c = cluster("slot_outbox", &[]);
    as_alice(
        &c,
        "CREATE TABLE alice.o (id int PRIMARY KEY, v int);
         INSERT INTO alice.o SELECT g, g FROM generate_series(1, 1000) g;",
    );
    as_alice(&c, "SELECT tide.create_pipeline('p')");
    as_alice(&c, "SELECT tide.add_table('p', 'alice.o')");
    wait_for_backfill(&c, "alice.o", Some("p"), 60, || diag(&c));
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    as_alice(&c, "SELECT tide.pause_pipeline('p')");
    c.execute("DELETE FROM alice.o WHERE id <= 300; UPDATE alice.o SET v = -v WHERE id > 900");
    c.execute("SELECT pg_drop_replication_slot('tide_5_p')");
    as_alice(&c, "SELECT tide.resume_pipeline('p')");
    c.wait_until(
        "the resync to end",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM tide.outbox WHERE pipeline = 'p' AND op = 'resync' AND \"row\"->>'phase' = 'end'",
            )? == 1)
        },
    );
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    // As alice (her outbox rows): one start and one end, for alice.o.
    let mut a = connect_as(&c, "alice");
    let framing: Vec<(i64, String, String)> = a
        .query(
            "SELECT id, relation, \"row\"->>'phase' FROM tide.outbox WHERE pipeline = 'p' AND op = 'resync' ORDER BY id",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(framing.len(), 2, "{framing:?}");
    assert_eq!(framing[0].2, "start");
    assert_eq!(framing[1].2, "end");
    assert_eq!(framing[0].1, "alice.o");
    let (start, end) = (framing[0].0, framing[1].0);
    // The consumer's rule: after the end, the table is the keys seen (read, insert, update)
    // between start and end, with the latest value, minus the ones deleted since.
    let mut rebuilt: Vec<String> = a
        .query(
            "SELECT DISTINCT ON (key) format('(%s,%s)', \"row\"->>'id', \"row\"->>'v')
               FROM tide.outbox
              WHERE pipeline = 'p' AND relation = 'alice.o' AND id > $1 AND id < $2 AND op IN ('read', 'insert', 'update')
              ORDER BY key, id DESC",
            &[&start, &end],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    rebuilt.sort();
    let mut source = texts(&c, "SELECT format('(%s,%s)', id, v) FROM alice.o");
    source.sort();
    assert_eq!(rebuilt.len(), 700, "{}", diag(&c));
    assert_eq!(rebuilt, source);
}

/// Before the slot is lost: tide.pipelines shows the slot's wal_status and safe_wal_size, and
/// slot_warning says when the slot is within tide.slot_warning_size of being invalidated (by
/// max_slot_wal_keep_size, or tide.max_paused_wal_size for a paused pipeline).
#[test]
fn warns_before_the_slot_is_lost() {
    let c = cluster(
        "slot_warn",
        &[
            "max_slot_wal_keep_size = 256MB",
            "tide.slot_warning_size = '128MB'",
        ],
    );
    table_pipeline(&c, 100);
    let mut a = connect_as(&c, "alice");
    let row = a
        .query_one(
            "SELECT wal_status, safe_wal_size, slot_warning FROM tide.pipelines WHERE name = 'p'",
            &[],
        )
        .unwrap();
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("reserved"));
    assert!(row.get::<_, Option<i64>>(1).unwrap() > 128 * 1024 * 1024);
    assert_eq!(row.get::<_, Option<String>>(2), None);
    as_alice(&c, "SELECT tide.pause_pipeline('p')");
    write_wal(&c, 160);
    let (safe, warning): (Option<i64>, Option<String>) = {
        let r = a
            .query_one(
                "SELECT safe_wal_size, slot_warning FROM tide.pipelines WHERE name = 'p'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(safe.unwrap() < 128 * 1024 * 1024, "{safe:?}\n{}", diag(&c));
    let warning = warning.unwrap_or_else(|| panic!("no slot_warning\n{}", diag(&c)));
    assert!(warning.contains("max_slot_wal_keep_size"), "{warning}");
    // The paused pipeline's own bound (tide.max_paused_wal_size) warns too.
    c.execute("ALTER SYSTEM SET max_slot_wal_keep_size = -1");
    c.execute("ALTER SYSTEM SET tide.max_paused_wal_size = '200MB'");
    c.execute("SELECT pg_reload_conf()");
    c.wait_until(
        "the paused-size warning",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT slot_warning LIKE '%tide.max_paused_wal_size%' FROM tide.pipelines WHERE name = 'p'), false)",
            )?)
        },
    );
}

// --- a remote PostgreSQL target -------------------------------------------------------------------

/// A remote target cluster `t` for `c`'s pipeline `p` (target type `postgres`, run by the
/// superuser: a non-superuser's user mapping needs a password, which is not what these tests
/// are about) over `alice.t` (`rows` rows), into `rem.copy` there, backfilled in chunks of 200
/// and caught up. Then keys 30001..30100 are streamed there: above every key the source will
/// have, so only the resync's range past its last chunk reaches them once they are deleted.
fn remote_pipeline(name: &str, conf: &[&str], rows: i64) -> (Cluster, Cluster) {
    let c = cluster(name, conf);
    let t = target_cluster(&format!("{name}_tgt"));
    create_server(&c, "tgt", &t);
    c.execute(&format!(
        "CREATE TABLE alice.t (id int PRIMARY KEY, v int, pad text);
         INSERT INTO alice.t SELECT g, g, md5(g::text) FROM generate_series(1, {rows}) g;"
    ));
    // (Each on its own: create_pipeline creates a slot, in a transaction that has not written.)
    c.execute(
        r#"SELECT tide.create_pipeline('p', 'postgres', '{"server": "tgt", "schema": "rem"}')"#,
    );
    c.execute("SELECT tide.add_table('p', 'alice.t', target_table => 'copy')");
    c.execute("SELECT tide.alter_backfill('alice.t', 'p', chunk_size => 200)");
    wait_for_backfill(&c, "alice.t", Some("p"), 120, || diag(&c));
    c.execute("INSERT INTO alice.t SELECT g, g, 'top' FROM generate_series(30001, 30100) g");
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    assert_remote_converged(&c, &t, "after the first backfill");
    (c, t)
}

#[track_caller]
fn assert_remote_converged(c: &Cluster, t: &Cluster, when: &str) {
    if let Err(e) = compare_rows(when, c, "alice.t", t, "rem.copy", "id, v, pad") {
        panic!("{e}\n{}", diag(c));
    }
}

/// The source's changes while the slot is lost, beyond the issue's 12,000: the keys the target
/// holds above every other key are deleted (the range past the last chunk).
fn change_while_lost(c: &Cluster) {
    change_12000(c);
    c.execute("DELETE FROM alice.t WHERE id > 30000");
}

/// Wait (at most `secs`) until the pipeline says it resynced and has caught up; then the remote
/// target must equal the source, with no manual step.
#[track_caller]
fn wait_remote_resynced(c: &Cluster, t: &Cluster, secs: u64) {
    let r = poll_every(
        Duration::from_secs(secs),
        Duration::from_millis(250),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT resync IS NULL AND slot_lost_at IS NOT NULL AND state = 'streaming'
                                    FROM tide.pipelines WHERE name = 'p'), false)",
            )?)
        },
    );
    if let Err(msg) = r {
        let differ = compare_rows("resync", c, "alice.t", t, "rem.copy", "id, v, pad")
            .err()
            .unwrap_or_default();
        panic!("the pipeline did not resync: {msg}\n{differ}\n{}", diag(c));
    }
    wait_for_pipeline(c, "p", 60, || diag(c));
    assert_remote_converged(c, t, "after the resync");
}

/// The issue's measured case at a remote PostgreSQL target: paused, max_slot_wal_keep_size =
/// 64MB, 12,000 rows changed (4,000 of them deleted) and the keys above the source's last
/// deleted, then more WAL than that; after resume_pipeline the resync deletes at the target,
/// chunk by chunk, the rows the source no longer has: 0 rows differ, no tide.repair. While it
/// runs (throttled), keys ahead of it are inserted (they stay) and deleted (they go).
#[test]
fn remote_invalidated_slot_resyncs() {
    let (c, t) = remote_pipeline(
        "slot_remote",
        &[
            "max_slot_wal_keep_size = 64MB",
            "tide.slot_warning_size = '16MB'",
        ],
        10000,
    );
    c.execute("SELECT tide.pause_pipeline('p')");
    change_while_lost(&c);
    write_wal(&c, 200);
    c.execute("CHECKPOINT");
    c.wait_until(
        "the paused slot to be invalidated",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || {
            c.execute("SELECT pg_switch_wal(); CHECKPOINT");
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT wal_status = 'lost' FROM pg_replication_slots WHERE slot_name = 'tide_5_p'), false)",
            )?)
        },
    );
    c.execute("UPDATE tide.backfill SET rows_per_second = 2000 WHERE pipeline = 'p'");
    c.execute("SELECT tide.resume_pipeline('p')");
    c.wait_until(
        "the resync to be reading alice.t",
        Duration::from_secs(60),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT EXISTS (SELECT 1 FROM tide.pipelines WHERE name = 'p' AND resync = 'resyncing')
                    AND EXISTS (SELECT 1 FROM tide.backfill WHERE pipeline = 'p' AND resync
                                   AND state = 'running' AND last_key IS NOT NULL)",
            )?)
        },
    );
    let at: i64 = c.query_scalar(
        "SELECT coalesce(max(last_key[1]::int8), 0) FROM tide.backfill WHERE pipeline = 'p' AND resync AND state = 'running'",
    );
    assert!(
        at < 9000,
        "the resync read too far ({at}) to test writes ahead of it\n{}",
        diag(&c)
    );
    c.execute(
        "INSERT INTO alice.t SELECT g, g, 'during' FROM generate_series(40001, 40100) g;
         DELETE FROM alice.t WHERE id BETWEEN 9001 AND 9100;
         UPDATE alice.t SET pad = 'during' WHERE id BETWEEN 20001 AND 20100;",
    );
    wait_remote_resynced(&c, &t, 180);
    let reason: String =
        c.query_scalar("SELECT slot_lost_reason FROM tide.pipelines WHERE name = 'p'");
    assert!(reason.contains("invalidated"), "{reason}");
    // The deletes went as deletes (the rows gone at the source are gone at the target).
    assert_eq!(
        t.query_scalar::<i64>("SELECT count(*) FROM rem.copy WHERE id BETWEEN 4001 AND 8000 OR id > 30000 AND id <= 30100"),
        0
    );
    c.execute("DELETE FROM alice.t WHERE id = 1; INSERT INTO alice.t VALUES (50000, 1, 'after')");
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    assert_remote_converged(&c, &t, "after the resync, streaming");
}

/// kill -9 of the worker while the resync of a remote target reads the table: the chunks it had
/// not written are read (and swept) again; the target ends equal to the source.
#[test]
fn remote_killed_during_resync() {
    let (c, t) = remote_pipeline("slot_remote_kill", &[], 10000);
    c.execute("SELECT tide.pause_pipeline('p')");
    change_while_lost(&c);
    c.wait_until(
        "the paused worker to let go of its slot",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT NOT active FROM pg_replication_slots WHERE slot_name = 'tide_5_p'",
            )?)
        },
    );
    c.execute("SELECT pg_drop_replication_slot('tide_5_p')");
    c.execute("UPDATE tide.backfill SET rows_per_second = 2000 WHERE pipeline = 'p'");
    c.execute("SELECT tide.resume_pipeline('p')");
    c.wait_until(
        "a resync chunk past the keys deleted in the gap to be written",
        Duration::from_secs(90),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT EXISTS (SELECT 1 FROM tide.backfill WHERE pipeline = 'p' AND resync AND state = 'running'
                                   AND last_key[1]::int > 8000)",
            )?)
        },
    );
    // Those deletes are at the target already; the range past the last chunk is not swept yet.
    let gone: i64 =
        t.query_scalar("SELECT 4000 - count(*) FROM rem.copy WHERE id BETWEEN 4001 AND 8000");
    let pending: i64 = t.query_scalar("SELECT count(*) FROM rem.copy WHERE id > 30000");
    assert_eq!(gone, 4000, "{}", diag(&c));
    assert_eq!(
        pending,
        100,
        "the kill came after the resync's end\n{}",
        diag(&c)
    );
    // (A worker killed so makes the postmaster restart every backend.)
    let pid = worker_pid(&c, "p").expect("a worker");
    // (Once the restart is over: a write retried until it succeeds could commit on the old
    // server and lose its answer to the restart, then fail on its own key forever.)
    kill9_and_wait_restart(&c, pid, Duration::from_secs(60));
    c.execute("INSERT INTO alice.t VALUES (50001, 6, 'after the kill'); DELETE FROM alice.t WHERE id = 9500");
    wait_remote_resynced(&c, &t, 240);
}

/// A table without a key (`REPLICA IDENTITY FULL`, README "Tables without a key") whose
/// pipelines lose their slots: its resync is the copy such a table's backfill is (one copy of
/// the whole table at one point of the stream), which replaces the target's rows. Duplicate
/// rows are deleted, updated and inserted while the slots are lost; after the resync the local
/// table target holds the source's rows, each as many times as the source (0 rows differ, and
/// `tide.verify` agrees), and an outbox consumer that keeps a multiset of rows (a `resync` start
/// drops them; `read`/`insert` add `row`; `update`/`delete` remove one row equal to `key`, the
/// old row) ends with them too. A change after the resync streams.
#[test]
fn keyless_table_resyncs() {
    let c = cluster("slot_keyless", &[]);
    as_alice(
        &c,
        "CREATE TABLE alice.h (a int, b text);
         ALTER TABLE alice.h REPLICA IDENTITY FULL;
         INSERT INTO alice.h SELECT g % 300, 'n' || g % 7 FROM generate_series(1, 3000) g;",
    );
    as_alice(
        &c,
        r#"SELECT tide.create_pipeline('p', 'table', '{"schema": "alice"}')"#,
    );
    as_alice(&c, "SELECT tide.create_pipeline('o')");
    as_alice(
        &c,
        "SELECT tide.add_table('p', 'alice.h', target_table => 'hcopy')",
    );
    as_alice(&c, "SELECT tide.add_table('o', 'alice.h')");
    for p in ["p", "o"] {
        wait_for_backfill(&c, "alice.h", Some(p), 120, || diag(&c));
        wait_for_pipeline(&c, p, 60, || diag(&c));
    }
    let differ = |when: &str| {
        if let Err(e) = compare_rows(when, &c, "alice.h", &c, "alice.hcopy", "a, b") {
            panic!("{e}\n{}", diag(&c));
        }
    };
    differ("after the first copy");
    for p in ["p", "o"] {
        as_alice(&c, &format!("SELECT tide.pause_pipeline('{p}')"));
    }
    // While the slots are lost: one of several equal rows deleted and updated, many rows
    // deleted and updated, duplicates inserted. The new slots deliver none of it.
    c.execute(
        "DELETE FROM alice.h WHERE ctid = (SELECT ctid FROM alice.h WHERE a = 1 LIMIT 1);
         UPDATE alice.h SET b = 'changed' WHERE ctid = (SELECT ctid FROM alice.h WHERE a = 2 LIMIT 1);
         DELETE FROM alice.h WHERE a % 10 = 5;
         UPDATE alice.h SET a = a + 1000 WHERE a % 10 = 6;
         INSERT INTO alice.h SELECT 7, 'gap' FROM generate_series(1, 5);",
    );
    for slot in ["tide_5_p", "tide_5_o"] {
        c.execute(&format!("SELECT pg_drop_replication_slot('{slot}')"));
    }
    for p in ["p", "o"] {
        as_alice(&c, &format!("SELECT tide.resume_pipeline('{p}')"));
    }
    for p in ["p", "o"] {
        c.wait_until(
            &format!("pipeline {p} to resync"),
            Duration::from_secs(180),
            Duration::from_millis(250),
            || {
                Ok(c.try_query_scalar::<bool>(&format!(
                    "SELECT coalesce((SELECT resync IS NULL AND slot_lost_at IS NOT NULL AND state = 'streaming'
                                        FROM tide.pipelines WHERE name = '{p}'), false)"
                ))?)
            },
        );
        wait_for_pipeline(&c, p, 60, || diag(&c));
        // The resync's backfill of the table is the copy, done.
        let state: String = c.query_scalar(&format!(
            "SELECT state FROM tide.backfill WHERE pipeline = '{p}' AND resync ORDER BY id DESC LIMIT 1"
        ));
        assert_eq!(state, "done", "{p}\n{}", diag(&c));
    }
    differ("after the resync");
    let summary: (i64, i64, i64) = {
        let r = c.query_one(
            "SELECT missing, extra, changed FROM tide.verify('alice.h', 'p') WHERE kind LIKE 'summary%'",
        );
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(summary, (0, 0, 0), "tide.verify after the resync");
    // The outbox replayed as a multiset.
    c.execute(
        "CREATE TABLE replay (LIKE alice.h);
         DO $$
         DECLARE e record;
         BEGIN
           FOR e IN SELECT op, key, \"row\" FROM tide.outbox
                     WHERE pipeline = 'o' AND relation = 'alice.h' ORDER BY id LOOP
             IF e.op = 'resync' AND e.\"row\"->>'phase' = 'start' THEN
               DELETE FROM replay;
             END IF;
             IF e.op IN ('update', 'delete') THEN
               DELETE FROM replay r WHERE r.ctid = (SELECT x.ctid FROM replay x
                 WHERE row(x.*)::text = jsonb_populate_record(NULL::replay, e.key)::text LIMIT 1);
             END IF;
             IF e.op IN ('read', 'insert', 'update') THEN
               INSERT INTO replay SELECT * FROM jsonb_populate_record(NULL::replay, e.\"row\");
             END IF;
           END LOOP;
         END $$;",
    );
    if let Err(e) = compare_rows("the outbox replayed", &c, "alice.h", &c, "replay", "a, b") {
        panic!("{e}\n{}", diag(&c));
    }
    // The new slot streams.
    c.execute(
        "DELETE FROM alice.h WHERE ctid = (SELECT ctid FROM alice.h WHERE a = 7 LIMIT 1);
         INSERT INTO alice.h VALUES (NULL, NULL);",
    );
    wait_for_pipeline(&c, "p", 60, || diag(&c));
    differ("after the resync, streaming");
}
