//! Readiness: `tide.readiness` goes from 'no backfill' through 'backfilling' and 'catching up'
//! to 'ready', never backwards.

use crate::common::*;
use std::time::Duration;

#[test]
fn readiness_states() {
    const P: &str = "rdy";
    let c = setup("bf_readiness");
    c.execute(
        "CREATE TABLE rd (id int PRIMARY KEY, v int); INSERT INTO rd SELECT g, g FROM generate_series(1, 5000) g;
         CREATE TABLE rd_none (id int PRIMARY KEY); INSERT INTO rd_none SELECT generate_series(1, 10);",
    );
    create_pipeline(&c, P);
    add_table(&c, P, "rd_none", false);
    add_table(&c, P, "rd", false);
    let readiness = |t: &str| -> (Option<i64>, Option<String>, bool, bool, bool, String) {
        let r = c.query_one(&format!(
            "SELECT backfill_id, backfill_state, snapshot_read_complete, snapshot_emitted, target_caught_up, readiness
               FROM tide.readiness WHERE pipeline = '{P}' AND source = '{t}'::regclass"
        ));
        (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))
    };
    assert_eq!(
        readiness("rd_none"),
        (None, None, false, false, false, "no backfill".into())
    );
    assert_eq!(readiness("rd").5, "no backfill");

    // Start it paused (deterministically 'backfilling'), then resume and watch.
    let id = start_backfill_then(
        &c,
        "SELECT tide.start_backfill('rd', chunk_size => 250)",
        "SELECT tide.pause_backfill('rd')",
    );
    assert_eq!(
        readiness("rd"),
        (
            Some(id),
            Some("paused".into()),
            false,
            false,
            false,
            "backfilling".into()
        )
    );
    c.execute("SELECT tide.resume_backfill('rd')");
    let mut seen: Vec<String> = Vec::new();
    c.wait_until(
        "readiness 'ready'",
        Duration::from_secs(60),
        Duration::from_millis(5),
        || {
            let r = readiness("rd").5;
            if seen.last() != Some(&r) {
                seen.push(r.clone());
            }
            Ok(r == "ready")
        },
    );
    eprintln!("readiness: observed {seen:?}");
    let order = ["backfilling", "catching up", "ready"];
    let ranks: Vec<usize> = seen
        .iter()
        .map(|s| {
            order
                .iter()
                .position(|o| o == s)
                .unwrap_or_else(|| panic!("unexpected readiness {s:?}"))
        })
        .collect();
    assert!(
        ranks.windows(2).all(|w| w[0] < w[1]),
        "readiness went backwards: {seen:?}"
    );
    assert_eq!(seen.first().map(String::as_str), Some("backfilling"));
    assert_eq!(
        readiness("rd"),
        (
            Some(id),
            Some("done".into()),
            true,
            true,
            true,
            "ready".into()
        )
    );
    // Once ready, wait_for_backfill answers at once and the rows are there.
    let waited = wait_backfill(&c, "rd", 5);
    assert!(
        waited < Duration::from_secs(1),
        "wait_for_backfill took {waited:?} on a ready table"
    );
    assert_eq!(bf_i64(&c, id, "rows_emitted"), 5000);
    let reads: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.outbox WHERE backfill_id = {id}"
    ));
    assert_eq!(reads, 5000);
    assert_eq!(readiness("rd_none").5, "no backfill");
}
