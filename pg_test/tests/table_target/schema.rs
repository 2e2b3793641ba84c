//! Schema changes: ADD COLUMN and safe widenings propagated; under `'pause'` the pipeline pauses
//! with the reason and resumes from the same place once the target is fixed.

use crate::common::*;
use std::time::{Duration, Instant};

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
            pipeline_row(&c, "pz")
        );
        let err = err.unwrap_or_else(|| {
            panic!(
                "pz is {state} without a last_error: {}",
                pipeline_row(&c, "pz")
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
            pipeline_row(&c, "pz")
        );
        assert_eq!(
            applied,
            applied2,
            "pz applied changes while paused: {}",
            pipeline_row(&c, "pz")
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

/// The text of the remedy after `Run at the target: ` up to the `Then` that follows: the
/// statements the user is told to run at the target, as printed.
fn printed_ddl(remedy: &str) -> String {
    let (_, rest) = remedy
        .split_once("Run at the target: ")
        .unwrap_or_else(|| panic!("the remedy prints no statement to run at the target: {remedy}"));
    let (ddl, _) = rest
        .split_once(" Then SELECT tide.resume_pipeline(")
        .unwrap_or_else(|| panic!("the remedy prints no resume after its statements: {remedy}"));
    ddl.to_string()
}

/// Wait for pipeline `p` to pause; its (last_error, remedy).
fn wait_paused(c: &Cluster, p: &str) -> (String, String) {
    c.wait_until(
        &format!("pipeline {p} to pause"),
        Duration::from_secs(60),
        POLL,
        || {
            Ok(c.try_query_scalar::<String>(&format!(
                "SELECT state FROM tide.pipelines WHERE name = '{p}'"
            ))? == "paused")
        },
    );
    let r = c.query_one(&format!(
        "SELECT last_error, remedy FROM tide.pipelines WHERE name = '{p}'"
    ));
    (r.get(0), r.get(1))
}

/// Issue 43, item 5: a column added at the source with a default, at a remote target under
/// `schema_changes = 'pause'`, while writers run. The rows that existed before the column have
/// its value only at the source (the stream never carries them). First the remedy exactly as
/// printed (its DDL, run at the target); then the way the trial did it when the remedy only
/// said "change the target to match the source" (the column added without its default). Both
/// must end with 0 rows different: the resume reads the table again. Before the fix the first
/// finds no statement in the remedy and the second leaves every old row without its value.
#[test]
fn remedy_as_printed_leaves_no_difference_remote() {
    let (c, t) = setup_remote("tt_schema_remedy");
    c.execute(
        "CREATE TABLE tenant_tags (id int PRIMARY KEY, v int NOT NULL);
         INSERT INTO tenant_tags SELECT g, g FROM generate_series(1, 3000) g;",
    );
    create_pipeline(
        &c,
        "rz",
        "postgres",
        r#"{"server": "tgt", "schema": "mirror", "schema_changes": "pause"}"#,
    );
    exec(&c, "SELECT tide.add_table('rz', 'tenant_tags')");
    wait_backfill(&c, "tenant_tags", "rz", 120);
    let script = write_script(
        "tt_schema_remedy",
        "\\set id random(1, 3000)\nUPDATE tenant_tags SET v = v + 1 WHERE id = :id;\n",
    );
    let bench = spawn_pgbench(&c, &script, 1, 40, Some(100));
    let cols = "id, v, region, tier";
    for (round, col, fix) in [
        (1, "region", None),
        (
            2,
            "tier",
            Some("ALTER TABLE mirror.tenant_tags ADD COLUMN tier text"),
        ),
    ] {
        exec(
            &c,
            &format!("ALTER TABLE tenant_tags ADD COLUMN {col} text DEFAULT 'eu'"),
        );
        exec(
            &c,
            &format!("INSERT INTO tenant_tags (id, v) VALUES (10000 + {round}, 0)"),
        );
        let (error, remedy) = wait_paused(&c, "rz");
        eprintln!("round {round}: paused: {error}; remedy: {remedy}");
        assert!(error.contains(&format!("add column {col} text")), "{error}");
        let ddl = printed_ddl(&remedy);
        assert!(
            ddl.contains(&format!("ADD COLUMN \"{col}\" text DEFAULT 'eu'::text"))
                || ddl.contains(&format!("ADD COLUMN {col} text DEFAULT 'eu'::text")),
            "the printed DDL gives existing rows the source's value: {ddl}"
        );
        assert!(
            remedy.contains("reads the source table again"),
            "the remedy says the table is read again: {remedy}"
        );
        // The fix: as printed, or (round 2) the column without its default.
        t.execute(fix.unwrap_or(&ddl));
        let resume = "SELECT tide.resume_pipeline('rz');";
        assert!(remedy.contains(resume), "{remedy}");
        exec(&c, resume);
        wait_backfill(&c, "tenant_tags", "rz", 120);
        wait_pipeline(&c, "rz", 60);
    }
    let (n, ok, summary) = bench.finish_summary();
    assert!(ok && n > 0, "pgbench failed: {summary}");
    wait_pipeline(&c, "rz", 60);
    assert_same_rows(
        "tenant_tags",
        &c,
        "public.tenant_tags",
        &t,
        "mirror.tenant_tags",
        cols,
    );
    let reported: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.verify('tenant_tags', 'rz', sample => 100)
          WHERE kind NOT LIKE 'summary: % ranges checked, 0 differ%'",
    );
    assert_eq!(reported, 0, "tide.verify after both rounds\n{}", diag(&c));
}
