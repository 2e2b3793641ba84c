//! A repair never deletes a key inserted at the source meanwhile, wherever the insert's commit
//! lands relative to the repair chunk's watermarks.

use crate::common::*;
use std::time::{Duration, Instant};

/// When the key K is inserted at the source, relative to the repair.
#[derive(Debug, Clone, Copy)]
enum When {
    /// In the repair's own transaction (committed with the queued backfill).
    SameTx,
    /// Right after the repair returns, after sleeping this many ms.
    After(u64),
    /// Inserted (uncommitted) before the repair; committed as soon as the repair backfill has
    /// written its low watermark ('low') or its high watermark ('high') for this backfill.
    HeldUntil(&'static str),
}

#[test]
fn repair_never_deletes_a_key_inserted_meanwhile() {
    let t0 = Instant::now();
    let c = setup("verify_race");
    replicated_t(&c, 3000, "table", r#"{"schema": "replica"}"#, 60);

    let cases: &[(i64, When)] = &[
        (1500, When::After(0)),
        (2500, When::After(0)),
        (9000, When::After(0)), // beyond the last source key: the open range
        (500, When::After(50)),
        (1200, When::After(200)),
        (2800, When::SameTx),
        (1700, When::HeldUntil("low")),
        (2200, When::HeldUntil("low")),
        (9100, When::HeldUntil("low")),
        (700, When::HeldUntil("high")),
        (9200, When::HeldUntil("high")),
    ];
    let mut places = Vec::new();
    for &(k, when) in cases {
        // K exists at the target only.
        exec(&c, &format!("DELETE FROM t WHERE id = {k}"));
        wait_pipeline(&c, "v", 60);
        exec(
            &c,
            &format!("INSERT INTO replica.t VALUES ({k}, -1, 'ghost')"),
        );
        let v = verify(&c, "'public.t', 'v'");
        assert_eq!(v.differ, 1, "K={k}: the extra key is found:\n{}", v.dump());
        assert_eq!(
            (v.ranges[0].extra, v.ranges[0].missing, v.ranges[0].changed),
            (1, 0, 0)
        );

        let insert_sql = format!("INSERT INTO t VALUES ({k}, 42, 'real')");
        let repair_sql =
            "SELECT ranges_differing, rows_extra, backfill_id FROM tide.repair('public.t', 'v')";
        let mut client = c.client();
        let lsn = |cl: &mut Client| -> String {
            cl.query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
                .unwrap()
                .get(0)
        };
        let (row, lsn_lo, lsn_hi) = match when {
            When::SameTx => {
                let mut tx = client.transaction().unwrap();
                let r = tx.query_one(repair_sql, &[]).unwrap();
                tx.batch_execute(&insert_sql).unwrap();
                let lo: String = tx
                    .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
                    .unwrap()
                    .get(0);
                tx.commit().unwrap();
                let hi = lsn(&mut client);
                (r, lo, hi)
            }
            When::After(ms) => {
                let r = client.query_one(repair_sql, &[]).unwrap();
                if ms > 0 {
                    std::thread::sleep(Duration::from_millis(ms));
                }
                let lo = lsn(&mut client);
                client.batch_execute(&insert_sql).unwrap();
                let hi = lsn(&mut client);
                (r, lo, hi)
            }
            When::HeldUntil(kind) => {
                let mut holder = c.client();
                holder.batch_execute("BEGIN").unwrap();
                holder.batch_execute(&insert_sql).unwrap();
                let r = client.query_one(repair_sql, &[]).unwrap();
                let bf: Option<i64> = r.get(2);
                let bf = bf.unwrap_or(-1);
                let q = format!(
                    "SELECT EXISTS (SELECT 1 FROM tide.signal WHERE pipeline = 'v' AND backfill_id = {bf} AND kind = '{kind}')
                         OR EXISTS (SELECT 1 FROM tide.backfill WHERE id = {bf} AND state NOT IN ('queued', 'running'))"
                );
                if let Err(msg) =
                    poll_every(Duration::from_secs(30), Duration::from_millis(1), || {
                        Ok(client.query_one(q.as_str(), &[])?.get::<_, bool>(0))
                    })
                {
                    panic!(
                        "K={k}: the repair backfill never wrote its {kind} watermark: {msg}\n{}",
                        diag(&c)
                    );
                }
                let lo = lsn(&mut client);
                holder.batch_execute("COMMIT").unwrap();
                let hi = lsn(&mut client);
                (r, lo, hi)
            }
        };
        let rep: (i32, i64, Option<i64>) = (row.get(0), row.get(1), row.get(2));
        assert_eq!(
            (rep.0, rep.1),
            (1, 1),
            "K={k}: repair of one range with one extra key: {rep:?}"
        );
        let bf = rep.2.expect("a backfill id");
        wait_backfill(&c, "public.t", "v", 60);
        wait_pipeline(&c, "v", 60);
        // Where did the insert's commit land relative to the repair chunks' watermarks?
        let place: String = c.query_scalar(&format!(
            "SELECT coalesce(string_agg(
                 CASE WHEN '{lsn_hi}'::pg_lsn <= low_lsn THEN 'before LW'
                      WHEN '{lsn_lo}'::pg_lsn >= high_lsn THEN 'after HW'
                      WHEN '{lsn_lo}'::pg_lsn >= low_lsn AND '{lsn_hi}'::pg_lsn <= high_lsn THEN 'between LW and HW'
                      ELSE 'around a watermark' END
                 || format(' (chunk %s: %s rows read, %s dropped, %s emitted)', chunk, rows_read, rows_dropped, rows_emitted), '; ' ORDER BY chunk), '?')
               FROM tide.chunks WHERE backfill_id = {bf}"
        ));
        let target_row: Option<String> = c.query_scalar(&format!(
            "SELECT (SELECT row({COLS})::text FROM replica.t WHERE id = {k})"
        ));
        eprintln!("[race] K={k} {when:?}: insert {place}; target row {target_row:?}");
        places.push(format!("{when:?}: {place}"));
        assert_eq!(
            target_row.as_deref(),
            Some(format!("({k},42,real)").as_str()),
            "K={k} ({when:?}): the key inserted during the repair must be at the target with the source's values\n{}",
            diag(&c)
        );
        assert_same_rows(&format!("K={k}"), &c, "t", &c, "replica.t", COLS);
    }
    let v = verify(&c, "'public.t', 'v'");
    assert_eq!(v.differ, 0, "{}", v.dump());
    eprintln!("[race] total {:.1?}", t0.elapsed());
}
