//! Corruption behind pg_tide's back is found in exactly the ranges that hold it (and nowhere
//! else) while writes continue, and a repair re-seeds those ranges and deletes the extra keys
//! (local and remote targets).

use crate::common::*;
use std::time::{Duration, Instant};

fn corruption_scenario(tag: &str, remote: bool) {
    let t0 = Instant::now();
    let c = setup(tag);
    let tgt_cluster = if remote {
        Some(target_cluster(&format!("{tag}_tgt")))
    } else {
        None
    };
    // The cluster holding the target table, and its name there.
    let (tc, target): (&Cluster, &str) = match &tgt_cluster {
        Some(t) => (t, "public.t"),
        None => (&c, "replica.t"),
    };
    let bf = if let Some(t) = &tgt_cluster {
        create_server(&c, "tgt", t);
        replicated_t(&c, ROWS, "postgres", r#"{"server": "tgt"}"#, 120)
    } else {
        replicated_t(&c, ROWS, "table", r#"{"schema": "replica"}"#, 120)
    };
    assert_same_rows("after the backfill", &c, "t", tc, target, COLS);
    eprintln!(
        "[{tag}] setup + backfill of {ROWS} rows: {:.1?} (backfill wait {bf:.1?})",
        t0.elapsed()
    );

    // A clean target first: 0 ranges differ.
    let v0 = verify(&c, "'public.t', 'v'");
    eprintln!("[{tag}] clean verify: {:.1?}: {}", v0.took, v0.summary.kind);
    assert_eq!(
        v0.differ,
        0,
        "a clean target: 0 ranges differ:\n{}\n{}",
        v0.dump(),
        diag(&c)
    );
    assert!(
        v0.checked >= ROWS / 1000,
        "10,000 keys in ranges of 1000: at least 10 ranges checked, got {}",
        v0.checked
    );
    assert_eq!(v0.summary.source_rows, ROWS);
    assert_eq!(v0.summary.target_rows, ROWS);

    // A writer in keys 8001..10000 (ranges 9 and up), ~200 transactions per second.
    let script = write_script(tag, &writer_script(8001, ROWS));
    let bench = spawn_pgbench(&c, &script, 1, 120, Some(200));
    c.wait_until("pgbench to connect", Duration::from_secs(10), POLL, || {
        Ok(bench_connected(&c))
    });
    std::thread::sleep(Duration::from_secs(1));

    // Corrupt the target behind pg_tide's back, one way per range.
    let corrupt = format!(
        "DELETE FROM {target} WHERE id = 150;
         INSERT INTO {target} (id, v, note) VALUES (50000, 1, 'ghost');
         UPDATE {target} SET v = -3500 WHERE id = 3500;
         UPDATE {target} SET id = 60200 WHERE id = 6200;"
    );
    tc.execute(&corrupt);

    let v1 = verify(&c, "'public.t', 'v'");
    eprintln!(
        "[{tag}] verify of the corrupted target under writes: {:.1?}\n{}",
        v1.took,
        v1.dump()
    );
    let fail =
        |what: &str| -> String { format!("{what}\nverify returned:\n{}\n{}", v1.dump(), diag(&c)) };
    let find = |from: Option<&str>, to: Option<&str>| -> Option<&VRow> {
        v1.ranges.iter().find(|r| {
            r.key_from.as_ref().map(|v| v.join(",")).as_deref() == from
                && r.key_to.as_ref().map(|v| v.join(",")).as_deref() == to
        })
    };
    // (from, to, kind, missing, extra, changed, source_rows, target_rows)
    type Expect<'a> = (
        Option<&'a str>,
        Option<&'a str>,
        &'a str,
        i64,
        i64,
        i64,
        Option<(i64, i64)>,
    );
    let expected: [Expect; 4] = [
        (
            None,
            Some("1000"),
            "missing rows",
            1,
            0,
            0,
            Some((1000, 999)),
        ),
        (
            Some("3000"),
            Some("4000"),
            "changed values",
            0,
            0,
            1,
            Some((1000, 1000)),
        ),
        (
            Some("6000"),
            Some("7000"),
            "missing rows",
            1,
            0,
            0,
            Some((1000, 999)),
        ),
        // The last, open range: the two keys beyond the source's last key. Its row counts
        // depend on the writer, so they are not checked.
        (None, None, "extra rows", 0, 2, 0, None),
    ];
    for (from, to, kind, missing, extra, changed, counts) in expected {
        let r = if from.is_none() && to.is_none() {
            v1.ranges.iter().find(|r| r.key_to.is_none())
        } else {
            find(from, to)
        };
        let r = r.unwrap_or_else(|| {
            panic!(
                "{}",
                fail(&format!(
                    "no differing range ({}, {}] was reported (expected {kind})",
                    from.unwrap_or("-inf"),
                    to.unwrap_or("+inf")
                ))
            )
        });
        assert_eq!(
            r.kind,
            kind,
            "{}",
            fail(&format!("kind of range {:?}", r.range))
        );
        assert_eq!(
            (r.missing, r.extra, r.changed),
            (missing, extra, changed),
            "{}",
            fail(&format!("(missing, extra, changed) of range {:?}", r.range))
        );
        if let Some((s, t)) = counts {
            assert_eq!(
                (r.source_rows, r.target_rows),
                (s, t),
                "{}",
                fail(&format!(
                    "(source_rows, target_rows) of range {:?}",
                    r.range
                ))
            );
        }
    }
    assert_eq!(
        v1.ranges.len(),
        4,
        "{}",
        fail("exactly the 4 corrupted ranges differ, no other (the writer's keys must not be reported)")
    );
    assert_eq!(v1.differ, 4);
    assert!(
        v1.columns.is_empty(),
        "no sample asked: no 'column values' rows"
    );
    assert_eq!(
        (v1.summary.missing, v1.summary.extra, v1.summary.changed),
        (2, 2, 1),
        "{}",
        fail("summary totals")
    );
    // The first range: key_from NULL, range number 1; numbers increase with the keys.
    let numbers: Vec<i32> = v1.ranges.iter().map(|r| r.range.unwrap()).collect();
    assert_eq!(numbers[0], 1, "{}", fail("the range of key 150 is range 1"));
    assert!(
        numbers.windows(2).all(|w| w[0] < w[1]),
        "{}",
        fail("ranges are reported in key order")
    );
    assert_eq!(
        *numbers.last().unwrap() as i64,
        v1.checked,
        "{}",
        fail("the open range is the last range checked")
    );

    let vr = verification(&c, "v", "public.t");
    eprintln!("[{tag}] tide.verifications after verify: {vr:?}");
    assert!(vr.finished);
    assert_eq!(vr.ranges_checked.map(i64::from), Some(v1.checked));
    assert_eq!(vr.ranges_differing, Some(4));
    assert_eq!(
        (vr.missing, vr.extra, vr.changed),
        (Some(2), Some(2), Some(1))
    );
    assert_eq!(vr.source_rows, Some(v1.summary.source_rows));
    assert_eq!(vr.target_rows, Some(v1.summary.target_rows));
    assert_eq!(vr.repair_backfill_id, None);
    assert_eq!(vr.repair_state, None);

    // Repair: re-seed the 4 ranges, delete the 2 extra keys.
    let t = Instant::now();
    let rep = repair(&c, "'public.t', 'v'");
    eprintln!("[{tag}] repair: {:.1?}: {rep:?}", t.elapsed());
    assert_eq!(rep.ranges_differing, 4, "{rep:?}\n{}", diag(&c));
    assert_eq!(
        rep.rows_missing_or_changed, 3,
        "150, 6200 missing; 3500 changed: {rep:?}"
    );
    assert_eq!(rep.rows_extra, 2, "50000 and 60200: {rep:?}");
    let bf_id = rep
        .backfill_id
        .expect("a repair that re-seeds has a backfill id");
    assert!(rep.action.contains(&bf_id.to_string()), "{rep:?}");
    let vr = verification(&c, "v", "public.t");
    assert!(vr.verification_id > 0);
    assert_eq!(vr.repair_backfill_id, Some(bf_id), "{vr:?}");
    assert_eq!(vr.ranges_differing, Some(4), "{vr:?}");
    let cond: String = c.query_scalar(&format!(
        "SELECT coalesce(condition, '') FROM tide.backfills WHERE id = {bf_id}"
    ));
    eprintln!("[{tag}] repair backfill {bf_id} condition: {cond}");

    let w = wait_backfill(&c, "public.t", "v", 120);
    eprintln!("[{tag}] repair backfill done in {w:.1?}");
    let (rows_read, state): (i64, String) = {
        let r = c.query_one(&format!(
            "SELECT rows_read, state FROM tide.backfills WHERE id = {bf_id}"
        ));
        (r.get(0), r.get(1))
    };
    eprintln!("[{tag}] repair backfill read {rows_read} rows (state {state})");
    assert_eq!(state, "done");
    assert!(
        rows_read <= 4000 + 50,
        "the repair re-seeds only the differing ranges (4 x 1000 keys), read {rows_read} rows\n{}",
        diag(&c)
    );
    let vr = verification(&c, "v", "public.t");
    assert_eq!(vr.repair_state.as_deref(), Some("done"), "{vr:?}");

    // A final verify, writer still running: equal.
    let v2 = verify(&c, "'public.t', 'v'");
    eprintln!(
        "[{tag}] verify after the repair (writes continue): {:.1?}: {}",
        v2.took, v2.summary.kind
    );
    assert_eq!(
        v2.differ,
        0,
        "after the repair, 0 ranges differ:\n{}\n{}",
        v2.dump(),
        diag(&c)
    );
    let vr = verification(&c, "v", "public.t");
    assert_eq!(vr.ranges_differing, Some(0), "{vr:?}");
    assert_eq!(
        (vr.missing, vr.extra, vr.changed),
        (Some(0), Some(0), Some(0))
    );
    assert_eq!(
        vr.repair_backfill_id, None,
        "the last verification is the final verify: {vr:?}"
    );

    // Repair again: nothing to do.
    let rep2 = repair(&c, "'public.t'");
    eprintln!("[{tag}] second repair: {rep2:?}");
    assert_eq!(rep2.ranges_differing, 0, "{rep2:?}");
    assert_eq!(rep2.backfill_id, None);
    assert!(rep2.action.starts_with("nothing to repair"), "{rep2:?}");

    let (txns, elapsed, status) = stop_bench(&c, bench);
    eprintln!("[{tag}] writer: {txns} transactions in {elapsed:.1?}, {status}");
    assert!(txns > 200, "the writer did write ({txns} transactions)");
    wait_pipeline(&c, "v", 60);
    let _ = std::fs::remove_file(&script);
    assert_same_rows("after the repair", &c, "t", tc, target, COLS);
    eprintln!("[{tag}] total {:.1?}", t0.elapsed());
}

#[test]
fn corruption_detected_and_repaired_local() {
    corruption_scenario("verify_local", false);
}

#[test]
fn corruption_detected_and_repaired_remote() {
    corruption_scenario("verify_remote", true);
}
