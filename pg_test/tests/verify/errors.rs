//! Bad inputs have SQLSTATEs (and hints); a valid `ranges` means about that many ranges.

use crate::common::*;

/// [`pg_test::expect_fail`], with `sql` run as a query (extended protocol).
#[track_caller]
fn expect_fail(c: &Cluster, sql: &str, code: &str, hint: Option<&str>) {
    expect_fail_with(sql, c.try_query(sql).map(|r| r.len()), code, hint);
}

/// The latest backfill of `public.t` is `state` (not done yet): `tide.verify` and `repair` (a
/// call of `tide.repair`) refuse with 55000 and a hint naming wait_for_backfill.
#[track_caller]
fn refused_while_backfilling(c: &Cluster, state: &str, repair: &str) {
    let now: String = c.query_scalar(
        "SELECT state FROM tide.backfills WHERE relation = 'public.t' ORDER BY id DESC LIMIT 1",
    );
    assert_eq!(now, state);
    expect_fail(
        c,
        "SELECT * FROM tide.verify('public.t', 'v')",
        "55000",
        Some("wait_for_backfill"),
    );
    expect_fail(c, repair, "55000", Some("wait_for_backfill"));
}

#[test]
fn bad_inputs() {
    let c = setup("verify_bad");
    exec(
        &c,
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
         INSERT INTO t SELECT g, g, 'n' FROM generate_series(1, 2000) g;
         CREATE TABLE u (id int PRIMARY KEY);
         CREATE TABLE o (id int PRIMARY KEY);",
    );
    create_pipeline(&c, "v", "table", r#"{"schema": "replica"}"#);
    create_pipeline(&c, "ob", "outbox", "{}");
    exec(&c, "SELECT tide.add_table('v', 'public.t')");
    exec(
        &c,
        "SELECT tide.add_table('ob', 'public.o', backfill => false)",
    );
    wait_backfill(&c, "public.t", "v", 60);

    // An outbox pipeline has no target table.
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.o', 'ob')",
        "55000",
        Some("outbox"),
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.o')",
        "55000",
        Some("table targets"),
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.repair('public.o', 'ob')",
        "55000",
        Some("outbox"),
    );

    // A table the pipeline does not capture.
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.u', 'v')",
        "55000",
        None,
    );
    expect_fail(&c, "SELECT * FROM tide.verify('public.u')", "55000", None);
    expect_fail(
        &c,
        "SELECT * FROM tide.repair('public.u', 'v')",
        "55000",
        None,
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.o', 'v')",
        "55000",
        None,
    );

    // ranges <= 0, sample < 0.
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.t', 'v', ranges => 0)",
        "22023",
        None,
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.t', 'v', ranges => -3)",
        "22023",
        None,
    );
    expect_fail(
        &c,
        "SELECT * FROM tide.verify('public.t', 'v', sample => -1)",
        "22023",
        None,
    );

    // A valid `ranges`: the table in about that many ranges (reltuples after ANALYZE).
    exec(&c, "ANALYZE t");
    let v = verify(&c, "'public.t', 'v', ranges => 4");
    eprintln!("  ranges => 4 on 2000 analyzed rows: {}", v.summary.kind);
    assert_eq!(v.differ, 0);
    assert!(
        (4..=5).contains(&v.checked),
        "ranges => 4: about 4 ranges checked, got {}",
        v.checked
    );

    // A backfill still paused / queued for the table.
    exec(
        &c,
        "BEGIN; SELECT tide.start_backfill('public.t', 'v'); SELECT tide.pause_backfill('public.t', 'v'); COMMIT;",
    );
    refused_while_backfilling(&c, "paused", "SELECT * FROM tide.repair('public.t', 'v')");
    exec(&c, "SELECT tide.cancel_backfill('public.t', 'v')");

    exec(&c, "SELECT tide.pause_pipeline('v')");
    exec(&c, "SELECT tide.start_backfill('public.t', 'v')");
    refused_while_backfilling(&c, "queued", "SELECT * FROM tide.repair('public.t')");
    exec(&c, "SELECT tide.resume_pipeline('v')");
    wait_backfill(&c, "public.t", "v", 60);

    // Fine again, with the pipeline defaulted.
    let v = verify(&c, "'public.t'");
    assert_eq!(v.differ, 0, "{}", v.dump());
    let r = repair(&c, "'public.t'");
    assert_eq!(r.ranges_differing, 0);
    assert!(r.action.starts_with("nothing to repair"), "{r:?}");

    // Never analyzed: `ranges => 4` must still mean about 4 ranges.
    exec(
        &c,
        "CREATE TABLE w (id int PRIMARY KEY, v int);
         INSERT INTO w SELECT g, g FROM generate_series(1, 3000) g;
         ALTER TABLE w SET (autovacuum_enabled = false);",
    );
    exec(&c, "SELECT tide.add_table('v', 'public.w')");
    wait_backfill(&c, "public.w", "v", 60);
    let reltuples: f32 = c.query_scalar("SELECT reltuples FROM pg_class WHERE oid = 'w'::regclass");
    let v = verify(&c, "'public.w', 'v', ranges => 4");
    eprintln!(
        "  ranges => 4 on 3000 never-analyzed rows (reltuples {reltuples}): {} in {:.2?}",
        v.summary.kind, v.took
    );
    assert_eq!(v.differ, 0);
    assert!(
        (4..=5).contains(&v.checked),
        "ranges => 4 on a never-analyzed table: about 4 ranges checked, got {}",
        v.checked
    );
}
