//! A text key whose remote target database has another default collation: no false alarm, and
//! a repair loses no row.

use crate::common::*;

/// The source sorts its text key with its own collation (here "C.UTF-8", the scratch clusters'
/// default); the remote target lives in a database whose default collation is en-US (ICU's, or
/// the C library's where the server has no ICU), as
/// happens whenever two servers were initialized with different locales. The target is an exact
/// copy, so `tide.verify` must report 0 differing ranges, and `tide.repair` must not lose a row.
#[test]
fn text_key_target_with_another_collation() {
    let c = setup("verify_coll");
    let tgt = target_cluster("verify_coll_tgt");
    // ICU en-US where the server has ICU, else the C library's en_US.UTF-8: both interleave
    // upper and lower case.
    let create = if interleaving_collation(&tgt) == "en-US-x-icu" {
        "CREATE DATABASE tdb TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
    } else {
        "CREATE DATABASE tdb TEMPLATE template0 LOCALE_PROVIDER libc LOCALE 'en_US.UTF-8'"
    };
    tgt.execute(create);
    let interleaved: bool = tgt
        .connect_db("tdb")
        .query_one("SELECT 'a' < 'B'", &[])
        .unwrap()
        .get(0);
    assert!(
        interleaved,
        "the target database does not sort a before B: {create}"
    );
    c.execute(&format!(
        "CREATE EXTENSION postgres_fdw;
         CREATE SERVER tgt FOREIGN DATA WRAPPER postgres_fdw
                OPTIONS (host '127.0.0.1', port '{}', dbname 'tdb');
         CREATE USER MAPPING FOR postgres SERVER tgt OPTIONS (user 'postgres');",
        tgt.port()
    ));
    // Mixed-case keys: "C" puts every upper-case letter before every lower-case one, en-US
    // interleaves them (a A b B ...).
    exec(
        &c,
        "CREATE TABLE k (id text PRIMARY KEY, v int NOT NULL, note text);
         INSERT INTO k SELECT chr(65 + (g % 2) * 32 + (g / 2) % 26) || g, g, 'n' || g
           FROM generate_series(1, 3000) g;",
    );
    create_pipeline(&c, "r", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('r', 'public.k')");
    wait_backfill(&c, "public.k", "r", 60);
    let tdb = || tgt.connect_db("tdb");
    let count: i64 = tdb()
        .query_one("SELECT count(*) FROM public.k", &[])
        .unwrap()
        .get(0);
    assert_eq!(count, 3000, "the backfill copied every row");

    let v = verify(&c, "'public.k', 'r'");
    eprintln!("[collation] verify of an exact copy:\n{}", v.dump());
    // Whatever verify says, a repair must never lose a row.
    let rep = repair(&c, "'public.k', 'r'");
    eprintln!("[collation] repair: {rep:?}");
    if rep.backfill_id.is_some() {
        wait_backfill(&c, "public.k", "r", 60);
    }
    wait_pipeline(&c, "r", 60);
    let src = texts(&c, &format!("SELECT row({COLS})::text FROM k"));
    let dst: Vec<String> = tdb()
        .query(&format!("SELECT row({COLS})::text FROM public.k"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (only_src, only_dst) = multiset_diff(&src, &dst);
    assert!(
        only_src.is_empty() && only_dst.is_empty(),
        "after the repair: {} rows only at the source, {} only at the target",
        only_src.len(),
        only_dst.len()
    );
    assert_eq!(
        v.differ,
        0,
        "false alarm: an exact copy in a database with another collation is reported as differing \
         (source_rows {} vs target_rows {} in the summary: the target's key ranges are evaluated in \
         the target's collation):\n{}",
        v.summary.source_rows,
        v.summary.target_rows,
        v.dump()
    );
    assert_eq!(rep.ranges_differing, 0, "{rep:?}");
}
