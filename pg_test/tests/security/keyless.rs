//! Tables without a key (`REPLICA IDENTITY FULL`): an update or a delete at a table target finds
//! its row by every column, in SQL that pg_tide writes from the table's column names and types.
//! A table whose column names are SQL (a quote, a comment, a boolean that is always true) is
//! applied exactly: one row changes, the others stay. And a keyless table of mallory's,
//! captured by mallory's pipeline into mallory's schema: only her own table and target move.

use super::*;

#[test]
fn keyless_column_names_are_identifiers_not_sql() {
    let c = secured("sec_keyless");
    // The names would turn "x IS NOT DISTINCT FROM v" into a match of every row if spliced.
    ok_as(
        &c,
        "mallory",
        r#"SELECT tide.create_pipeline('mk', 'table', '{"schema": "mallory"}');"#,
    );
    ok_as(
        &c,
        "mallory",
        r#"CREATE TABLE mallory.h ("a"" IS NOT NULL OR true OR ""b" int, "--" text, "t; DELETE FROM victim.secret; --" json);
           ALTER TABLE mallory.h REPLICA IDENTITY FULL;
           INSERT INTO mallory.h VALUES (1, 'x', '{"k": 1}'), (1, 'x', '{"k": 1}'), (2, 'y', '[1]'), (NULL, NULL, NULL);
           SELECT tide.add_table('mk', 'mallory.h', backfill => false, target_table => 'mallory.h_copy');
           INSERT INTO mallory.h_copy SELECT * FROM mallory.h;"#,
    );
    ok_as(
        &c,
        "mallory",
        r#"DELETE FROM mallory.h WHERE ctid = (SELECT ctid FROM mallory.h WHERE "--" = 'x' LIMIT 1);
           UPDATE mallory.h SET "--" = 'z' WHERE "--" = 'y';
           DELETE FROM mallory.h WHERE "--" IS NULL;"#,
    );
    wait_pipeline(&c, "mk", 60);
    let cols =
        r#""a"" IS NOT NULL OR true OR ""b", "--", "t; DELETE FROM victim.secret; --"::text"#;
    assert_same_rows("h", &c, "mallory.h", &c, "mallory.h_copy", cols);
    let n: i64 = c.query_scalar("SELECT count(*) FROM mallory.h_copy");
    assert_eq!(
        n, 2,
        "one of the two equal rows deleted, the NULL row deleted"
    );
    let secret: i64 = c.query_scalar("SELECT count(*) FROM victim.secret");
    assert_eq!(secret, 1, "nothing ran but the apply");
    // mallory cannot lift the FULL identity of her captured table behind the pipeline's back
    // (the event trigger runs as pg_tide, and refuses it whoever asks).
    let e = exec_as(
        &c,
        "mallory",
        "ALTER TABLE mallory.h REPLICA IDENTITY NOTHING",
    )
    .expect_err("the identity change is refused");
    assert_db_error(&e, "55000", Some("tide.remove_table('mk', 'mallory.h')"));
}

/// The backfill of a table without a key is one copy read in a statement pg_tide writes from the
/// table's column names and its row filter, as the pipeline's owner: names written as SQL are
/// identifiers, the row filter applies, and nothing else runs.
#[test]
fn keyless_copy_names_are_identifiers_and_read_as_the_owner() {
    let c = secured("sec_keyless_copy");
    ok_as(
        &c,
        "mallory",
        r#"SELECT tide.create_pipeline('mc', 'table', '{"schema": "mallory"}');
           CREATE TABLE mallory.g ("a"" IS NOT NULL OR true OR ""b" int, "--" text, "t; DELETE FROM victim.secret; --" json, "r.*" int);
           ALTER TABLE mallory.g REPLICA IDENTITY FULL;
           INSERT INTO mallory.g VALUES (1, 'x', '{"k": 1}', 1), (1, 'x', '{"k": 1}', 1), (2, 'skip', '[1]', 2), (NULL, NULL, NULL, NULL);
           SELECT tide.add_table('mc', 'mallory.g', target_table => 'mallory.g_copy', row_filter => '"--" IS DISTINCT FROM ''skip''');"#,
    );
    wait_backfill(&c, "mallory.g", "mc", 60);
    ok_as(
        &c,
        "mallory",
        r#"INSERT INTO mallory.g VALUES (3, 'y', NULL, 3);
           DELETE FROM mallory.g WHERE ctid = (SELECT ctid FROM mallory.g WHERE "--" = 'x' LIMIT 1);"#,
    );
    wait_pipeline(&c, "mc", 60);
    let cols = r#""a"" IS NOT NULL OR true OR ""b", "--", "t; DELETE FROM victim.secret; --"::text, "r.*""#;
    let mut rows = texts(
        &c,
        &format!(r#"SELECT row({cols})::text FROM mallory.g_copy"#),
    );
    rows.sort();
    let mut want = vec![
        r#"(1,x,"{""k"": 1}",1)"#.to_string(),
        "(3,y,,3)".to_string(),
        "(,,,)".to_string(),
    ];
    want.sort();
    assert_eq!(rows, want, "the copy (row filter applied), then the stream");
    let secret: i64 = c.query_scalar("SELECT count(*) FROM victim.secret");
    assert_eq!(secret, 1, "nothing ran but the copy and the apply");
}
