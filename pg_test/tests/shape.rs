//! Shaping what a pipeline delivers (issue 36): row filters
//! (`tide.add_table(..., row_filter => ...)`), column lists and masks, as a DBA uses them: every pipeline call is made by
//! `alice`, a member of `tide_admin` with no other attribute (plus, for the remote target, USAGE
//! on the foreign server and a user mapping a superuser made passwordless with
//! `password_required 'false'`, as the README says).
//!
//! - one filtered table, three pipelines (outbox, local table, remote PostgreSQL), each with a
//!   paced backfill that is paused twice in the middle while writes move rows into and out of
//!   the filter (inserts, updates of the filtered columns both ways, key changes, deletes of rows
//!   in and out); then each target equals `SELECT ... FROM source WHERE <filter>` (the outbox
//!   replayed onto a copy), and no event of the outbox is of a row outside the filter;
//! - refusals: a filter on columns outside a REPLICA IDENTITY DEFAULT table's key (42P10), not
//!   one expression (42601), a volatile function (0A000), an unknown column (42703), an empty
//!   filter (22023); `tide.tables` shows the stored filter;
//! - the same filter on the key alone works under REPLICA IDENTITY DEFAULT (key changes moving
//!   rows in and out).
//!
//! - column masks in every target with a row filter and a paused backfill: each target equals
//!   the masks computed in SQL; no clear value in a target, the outbox, a log or
//!   `pg_stat_activity`; `tide.verify`/`tide.repair` under the masks; the refusals
//!   (`masked_table_in_every_target`; the Kafka target's is `kafka/masks.rs`).
//!
//! Attacks (other roles, functions the owner may not execute, reading another's filter, the
//! mask salt, hostile mask options) are in `security/`.

use pg_test::*;
use std::time::Duration;

const FILTER: &str = "region = 'eu' AND status <> 'draft'";

fn diag_shape(c: &Cluster) -> String {
    diag_of(
        c,
        &[
            (
                "pipelines",
                "SELECT name, state, enabled, last_error FROM tide.pipelines",
                10,
            ),
            (
                "tables",
                "SELECT pipeline, relation, state, row_filter FROM tide.tables ORDER BY 1",
                20,
            ),
            (
                "backfills",
                "SELECT id, pipeline, relation, state, rows_read, error FROM tide.backfill ORDER BY id",
                20,
            ),
        ],
        40,
    )
}

#[track_caller]
fn ok(cl: &mut Client, c: &Cluster, sql: &str) {
    if let Err(e) = cl.batch_execute(sql) {
        panic!(
            "as alice: {sql}\nfailed: {}\n{}",
            describe_error(&e),
            diag_shape(c)
        );
    }
}

fn wait_capturing(c: &Cluster, pipeline: &str, table: &str) {
    c.wait_until(
        "the table is captured",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<bool>(&format!(
                "SELECT coalesce((SELECT state = 'capturing' FROM tide.tables
                                   WHERE pipeline = '{pipeline}' AND source = '{table}'::regclass), false)"
            ))?)
        },
    );
}

/// Rows read so far by the latest backfill of `table` for `pipeline`.
fn rows_read(c: &Cluster, pipeline: &str) -> i64 {
    c.query_scalar(&format!(
        "SELECT coalesce(max(rows_read), 0)::int8 FROM tide.backfill WHERE pipeline = '{pipeline}'"
    ))
}

/// Writes that move rows of `app.orders` into and out of FILTER, one batch per `round`: each
/// round touches ids all over the key range (before and after any backfill's cursor).
fn churn(cl: &mut Client, c: &Cluster, round: i32) {
    ok(
        cl,
        c,
        &format!(
            "-- out -> in: region or status flips into the filter
             UPDATE app.orders SET region = 'eu' WHERE id % 10 = {r} AND region = 'us';
             UPDATE app.orders SET status = 'paid' WHERE id % 10 = {r2} AND status = 'draft';
             -- in -> out
             UPDATE app.orders SET region = 'us' WHERE id % 13 = {r} AND region = 'eu';
             UPDATE app.orders SET status = 'draft' WHERE id % 17 = {r} AND status <> 'draft';
             -- in -> in, out -> out (values only)
             UPDATE app.orders SET note = note || '+' WHERE id % 11 = {r};
             -- key changes (an update with the old key in the WAL), both ways
             UPDATE app.orders SET id = id + 100000, region = CASE WHEN region = 'eu' THEN 'us' ELSE 'eu' END
              WHERE id % 29 = {r} AND id < 100000;
             -- inserts in and out, deletes in and out
             INSERT INTO app.orders SELECT 200000 + {r} * 1000 + g,
                    CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END,
                    CASE WHEN g % 3 = 0 THEN 'draft' ELSE 'paid' END, 'new' || g
               FROM generate_series(1, 60) g;
             DELETE FROM app.orders WHERE id % 31 = {r};",
            r = round,
            r2 = (round + 5) % 10
        ),
    );
}

#[test]
fn filtered_table_in_every_target() {
    let (c, t) = setup_remote("shape_filter");
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA app AUTHORIZATION alice;
         CREATE SCHEMA copy AUTHORIZATION alice;
         GRANT USAGE ON FOREIGN SERVER tgt TO alice;
         CREATE USER MAPPING FOR alice SERVER tgt OPTIONS (user 'postgres', password_required 'false');",
    );
    let mut alice = connect_as(&c, "alice");
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.orders (id int PRIMARY KEY, region text NOT NULL, status text NOT NULL, note text);
         ALTER TABLE app.orders REPLICA IDENTITY FULL;
         INSERT INTO app.orders SELECT g, (ARRAY['eu', 'us', 'eu'])[g % 3 + 1],
                (ARRAY['paid', 'draft', 'shipped', 'paid'])[g % 4 + 1], 'n' || g
           FROM generate_series(1, 3000) g;",
    );
    for sql in [
        "SELECT tide.create_pipeline('po', 'outbox')",
        r#"SELECT tide.create_pipeline('pt', 'table', '{"schema": "copy"}')"#,
        r#"SELECT tide.create_pipeline('pr', 'postgres', '{"server": "tgt"}')"#,
    ] {
        ok(&mut alice, &c, sql);
    }
    for p in ["po", "pt", "pr"] {
        ok(
            &mut alice,
            &c,
            &format!(
                "SELECT tide.add_table('{p}', 'app.orders', backfill => false, row_filter => $f${FILTER}$f$)"
            ),
        );
        wait_capturing(&c, p, "app.orders");
    }
    assert_eq!(
        c.query_scalar::<i64>(&format!(
            "SELECT count(*) FROM tide.tables WHERE row_filter = $f${FILTER}$f$"
        )),
        3,
        "tide.tables shows each pipeline's filter\n{}",
        diag_shape(&c)
    );
    // Paced backfills of 100-row chunks, paused in the middle while rows move.
    for p in ["po", "pt", "pr"] {
        ok(
            &mut alice,
            &c,
            &format!(
                "SELECT tide.start_backfill('app.orders', '{p}', chunk_size => 100);
                 SELECT tide.alter_backfill('app.orders', '{p}', rows_per_second => 400);"
            ),
        );
    }
    let in_filter: i64 = c.query_scalar(&format!("SELECT count(*) FROM app.orders WHERE {FILTER}"));
    for (round, after) in [(1, 100), (2, 300)] {
        for p in ["po", "pt", "pr"] {
            c.wait_until(
                "the backfill reads some chunks",
                Duration::from_secs(60),
                Duration::from_millis(20),
                || Ok(rows_read(&c, p) >= after),
            );
            ok(
                &mut alice,
                &c,
                &format!("SELECT tide.pause_backfill('app.orders', '{p}')"),
            );
        }
        for p in ["po", "pt", "pr"] {
            let read = rows_read(&c, p);
            assert!(
                read < in_filter,
                "pipeline {p}: the backfill read {read} of {in_filter} rows before round {round}: the writes would not happen in its middle\n{}",
                diag_shape(&c)
            );
        }
        churn(&mut alice, &c, round);
        for p in ["po", "pt", "pr"] {
            ok(
                &mut alice,
                &c,
                &format!("SELECT tide.resume_backfill('app.orders', '{p}')"),
            );
        }
    }
    for p in ["po", "pt", "pr"] {
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.alter_backfill('app.orders', '{p}', rows_per_second => 0)"),
        );
        wait_for_backfill(&c, "app.orders", Some(p), 120, || diag_shape(&c));
    }
    // After the backfill: more moves, then every target caught up.
    churn(&mut alice, &c, 3);
    for p in ["po", "pt", "pr"] {
        wait_for_pipeline(&c, p, 60, || diag_shape(&c));
    }
    let expected = format!("(SELECT * FROM app.orders WHERE {FILTER}) f");
    let n: i64 = c.query_scalar(&format!("SELECT count(*) FROM {expected}"));
    let total: i64 = c.query_scalar("SELECT count(*) FROM app.orders");
    assert!(
        n > 500 && n < total,
        "the filter keeps some rows and leaves out others ({n} of {total})"
    );
    let cols = "id, region, status, note";
    assert_same_rows("local table", &c, &expected, &c, "copy.orders", cols);
    assert_same_rows("remote", &c, &expected, &t, "public.orders", cols);
    outbox_copy(&c, "app.orders", "app.orders", "app.orders_replayed");
    c.query_scalar::<i64>("SELECT app.orders_replayed_replay('po')");
    assert_same_rows(
        "outbox replayed",
        &c,
        &expected,
        &c,
        "app.orders_replayed",
        cols,
    );
    // No event carries a row outside the filter (a delete carries the old row, which was in).
    assert_no_rows(
        &c,
        "outbox events of rows outside the filter",
        "SELECT id, op, \"row\" FROM tide.outbox
          WHERE pipeline = 'po' AND op IN ('read', 'insert', 'update', 'delete')
            AND NOT (coalesce(\"row\"->>'region', 'eu') = 'eu' AND coalesce(\"row\"->>'status', '') <> 'draft')",
    );
    // Moves out became deletes and moves in became inserts (the stream did filter).
    let ops: String = c.query_scalar(
        "SELECT string_agg(DISTINCT op, ',' ORDER BY op) FROM tide.outbox WHERE pipeline = 'po' AND backfill_id IS NULL",
    );
    assert_eq!(
        ops, "delete,insert,update",
        "stream events of the filtered table"
    );

    // tide.verify compares with what the target should hold under the filter: clean...
    let differences = |alice: &mut Client, p: &str| -> (i64, i64, i64) {
        let r = alice
            .query_one(
                &format!(
                    "SELECT missing::int8, extra::int8, changed::int8 FROM tide.verify('app.orders', '{p}', sample => 300)
                      WHERE kind LIKE 'summary%'"
                ),
                &[],
            )
            .unwrap_or_else(|e| panic!("verify {p}: {}", describe_error(&e)));
        (r.get(0), r.get(1), r.get(2))
    };
    for p in ["pt", "pr"] {
        assert_eq!(
            differences(&mut alice, p),
            (0, 0, 0),
            "pipeline {p} verifies clean"
        );
    }
    // ...and a row the filter leaves out, planted at the target, is extra; a row it passes,
    // taken away, is missing; tide.repair deletes the one and re-seeds the other.
    c.execute(&format!(
        "INSERT INTO copy.orders SELECT * FROM app.orders WHERE NOT ({FILTER}) ORDER BY id LIMIT 1;
         DELETE FROM copy.orders WHERE id = (SELECT min(id) FROM app.orders WHERE {FILTER});"
    ));
    assert_eq!(
        differences(&mut alice, "pt"),
        (1, 1, 0),
        "planted: one missing, one extra"
    );
    ok(
        &mut alice,
        &c,
        "SELECT * FROM tide.repair('app.orders', 'pt')",
    );
    wait_for_backfill(&c, "app.orders", Some("pt"), 60, || diag_shape(&c));
    wait_for_pipeline(&c, "pt", 60, || diag_shape(&c));
    assert_same_rows(
        "local table, repaired",
        &c,
        &expected,
        &c,
        "copy.orders",
        cols,
    );
    assert_eq!(differences(&mut alice, "pt"), (0, 0, 0), "repaired");
}

#[test]
fn row_filter_refusals_and_key_filters() {
    let c = setup("shape_refusals");
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA app AUTHORIZATION alice;",
    );
    let mut alice = connect_as(&c, "alice");
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.t (id int PRIMARY KEY, region text, v int);
         INSERT INTO app.t SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g FROM generate_series(1, 200) g;",
    );
    ok(&mut alice, &c, "SELECT tide.create_pipeline('p', 'outbox')");
    for (what, filter, code, hint) in [
        (
            "a column outside the replica identity (DEFAULT)",
            "region = 'eu'",
            "42P10",
            "REPLICA IDENTITY FULL",
        ),
        (
            "two expressions",
            "id > 1; SELECT 1",
            "42601",
            "boolean expression",
        ),
        ("an alias", "id > 1 AS x", "42601", "boolean expression"),
        (
            "a volatile function",
            "id > random() * 10",
            "0A000",
            "immutable built-in",
        ),
        (
            "now()",
            "v > extract(epoch FROM now())",
            "0A000",
            "immutable built-in",
        ),
        (
            "a subquery",
            "id IN (SELECT 1)",
            "0A000",
            "immutable built-in",
        ),
        (
            "a system column",
            "xmin::text::int > 1",
            "42P10",
            "immutable built-in",
        ),
        (
            "an unknown column",
            "nope = 1",
            "42703",
            "boolean expression",
        ),
        ("not boolean", "id + 1", "42804", "boolean expression"),
        ("empty", "  ", "22023", "omit row_filter"),
    ] {
        expect_fail_with(
            what,
            alice.batch_execute(&format!(
                "SELECT tide.add_table('p', 'app.t', row_filter => $f${filter}$f$)"
            )),
            code,
            Some(hint),
        );
    }
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.pipeline_table"),
        0,
        "a refused filter added the table"
    );
    // On the key alone, REPLICA IDENTITY DEFAULT is enough: key changes move rows in and out.
    ok(
        &mut alice,
        &c,
        "SELECT tide.add_table('p', 'app.t', row_filter => 'id % 2 = 0')",
    );
    wait_capturing(&c, "p", "app.t");
    ok(
        &mut alice,
        &c,
        "UPDATE app.t SET id = id + 1001 WHERE id <= 20;   -- even -> odd: out; odd -> even: in
         UPDATE app.t SET v = -v WHERE id BETWEEN 21 AND 40; -- no key change: old row not logged
         DELETE FROM app.t WHERE id BETWEEN 41 AND 50;
         INSERT INTO app.t SELECT g, 'x', g FROM generate_series(5000, 5009) g;",
    );
    wait_for_backfill(&c, "app.t", Some("p"), 60, || diag_shape(&c));
    wait_for_pipeline(&c, "p", 60, || diag_shape(&c));
    outbox_copy(&c, "app.t", "app.t", "app.t_replayed");
    c.query_scalar::<i64>("SELECT app.t_replayed_replay('p')");
    assert_same_rows(
        "key filter, outbox replayed",
        &c,
        "(SELECT * FROM app.t WHERE id % 2 = 0) f",
        &c,
        "app.t_replayed",
        "id, region, v",
    );
    assert_no_rows(
        &c,
        "events of odd keys",
        "SELECT id, op, key FROM tide.outbox WHERE (key->>'id')::int % 2 <> 0",
    );
}

/// The output plugin alone, driven by hand (`pg_logical_slot_peek_binary_changes` with the
/// `row_filter.<oid>` option the worker passes): each change becomes what PostgreSQL 15's
/// pgoutput makes of it (the first byte of each message is its kind: I, U, D), and a decoding
/// session that compiled a filter ends cleanly (its filter's slot and descriptor are released
/// under the resource owner current at shutdown, which is not the one that made them).
#[test]
fn plugin_filters_each_transition() {
    let c = setup("shape_plugin");
    c.execute(
        "CREATE TABLE o (id int PRIMARY KEY, region text NOT NULL, n int);
         ALTER TABLE o REPLICA IDENTITY FULL;
         INSERT INTO o SELECT g, CASE WHEN g <= 5 THEN 'eu' ELSE 'us' END, 0 FROM generate_series(1, 10) g;",
    );
    let mut cl = c.connect_db("postgres");
    cl.batch_execute(
        "SET output_plugin_libraries = 'pg_tide';
         SELECT 1 FROM pg_create_logical_replication_slot('by_hand', 'pg_tide');",
    )
    .expect("slot");
    // One transaction per case, in this order.
    for sql in [
        "INSERT INTO o VALUES (11, 'eu', 0), (12, 'us', 0)", // I ; nothing
        "UPDATE o SET n = 1 WHERE id IN (1, 6)",             // U ; nothing
        "UPDATE o SET region = 'us' WHERE id = 2",           // out: D
        "UPDATE o SET region = 'eu' WHERE id = 7",           // in: I
        "DELETE FROM o WHERE id IN (3, 8)",                  // D ; nothing
        "UPDATE o SET id = 100 WHERE id = 4",                // key change, in and in: U
        "UPDATE o SET id = 101, region = 'us' WHERE id = 5", // key change, out: D
    ] {
        c.execute(sql);
    }
    let oid: i64 = c.query_scalar("SELECT 'o'::regclass::oid::int8");
    let kinds = |cl: &mut Client, filter: Option<&str>| -> String {
        let extra = filter
            .map(|f| format!(", 'row_filter.{oid}', $f${f}$f$, 'row_filter_owner', '10'"))
            .unwrap_or_default();
        let sql = format!(
            "SELECT coalesce(string_agg(chr(get_byte(data, 0)), '' ORDER BY lsn), '')
               FROM pg_logical_slot_peek_binary_changes('by_hand', NULL, NULL,
                    'proto_version', '4', 'tables', '{oid}' {extra})
              WHERE get_byte(data, 0) IN (ascii('I'), ascii('U'), ascii('D'))"
        );
        match cl.query_one(&sql, &[]) {
            Ok(r) => r.get(0),
            Err(e) => panic!("peek ({filter:?}): {}", describe_error(&e)),
        }
    };
    assert_eq!(kinds(&mut cl, None), "IIUUUUDDUU", "unfiltered");
    // Twice: the first session's shutdown must not fail, and a new session compiles again.
    for _ in 0..2 {
        assert_eq!(kinds(&mut cl, Some("region = 'eu'")), "IUDIDUD", "filtered");
    }
}

/// Column lists (`tide.add_table(..., columns => ...)`): a table with personal columns left out,
/// captured by an outbox, a local table and a remote pipeline, backfilled while its rows change
/// (listed and unlisted columns); a column added later is not delivered either. Every target has
/// exactly the listed columns and equals `SELECT <columns> FROM source`; no outbox event carries
/// an unlisted column's value; tide.verify compares the listed columns. Refusals: the key left
/// out, an unknown, repeated, NULL or generated column, an empty list.
#[test]
fn column_list_in_every_target() {
    let (c, t) = setup_remote("shape_columns");
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA app AUTHORIZATION alice;
         CREATE SCHEMA copy AUTHORIZATION alice;
         GRANT USAGE ON FOREIGN SERVER tgt TO alice;
         CREATE USER MAPPING FOR alice SERVER tgt OPTIONS (user 'postgres', password_required 'false');",
    );
    let mut alice = connect_as(&c, "alice");
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.people (id int PRIMARY KEY, ssn text, name text NOT NULL, email text,
                                  twice int GENERATED ALWAYS AS (id * 2) STORED, notes text);
         INSERT INTO app.people (id, ssn, name, email, notes)
              SELECT g, 'SSN-' || g || '-SECRET', 'name ' || g, 'p' || g || '@example.com', 'note ' || g
                FROM generate_series(1, 1500) g;",
    );
    for sql in [
        "SELECT tide.create_pipeline('po', 'outbox')",
        r#"SELECT tide.create_pipeline('pt', 'table', '{"schema": "copy"}')"#,
        r#"SELECT tide.create_pipeline('pr', 'postgres', '{"server": "tgt"}')"#,
    ] {
        ok(&mut alice, &c, sql);
    }
    for (what, list, code, hint) in [
        ("the key left out", "ARRAY['name']", "22023", "the key (id)"),
        (
            "an unknown column",
            "ARRAY['id', 'nope']",
            "42703",
            "pg_attribute",
        ),
        (
            "a repeated column",
            "ARRAY['id', 'name', 'name']",
            "22023",
            "once",
        ),
        ("a NULL", "ARRAY['id', NULL]", "22023", "the key (id)"),
        (
            "a generated column",
            "ARRAY['id', 'twice']",
            "22023",
            "Leave it out",
        ),
        ("an empty list", "'{}'::text[]", "22023", "the key (id)"),
    ] {
        expect_fail_with(
            what,
            alice.batch_execute(&format!(
                "SELECT tide.add_table('po', 'app.people', columns => {list})"
            )),
            code,
            Some(hint),
        );
    }
    // Listed out of order: delivered in attribute order.
    for p in ["po", "pt", "pr"] {
        ok(
            &mut alice,
            &c,
            &format!(
                "SELECT tide.add_table('{p}', 'app.people', backfill => false, columns => ARRAY['email', 'id', 'name'])"
            ),
        );
        wait_capturing(&c, p, "app.people");
        ok(
            &mut alice,
            &c,
            &format!(
                "SELECT tide.start_backfill('app.people', '{p}', chunk_size => 100);
                 SELECT tide.alter_backfill('app.people', '{p}', rows_per_second => 500);"
            ),
        );
    }
    assert_eq!(
        c.query_scalar::<String>("SELECT string_agg(DISTINCT columns::text, ';') FROM tide.tables"),
        "{id,name,email}",
        "tide.tables shows the column list by name, in attribute order"
    );
    for p in ["po", "pt", "pr"] {
        c.wait_until(
            "the backfill reads some chunks",
            Duration::from_secs(60),
            Duration::from_millis(20),
            || Ok(rows_read(&c, p) >= 100),
        );
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.pause_backfill('app.people', '{p}')"),
        );
    }
    ok(
        &mut alice,
        &c,
        "UPDATE app.people SET ssn = ssn || '-NEW' WHERE id % 3 = 0;          -- unlisted only
         UPDATE app.people SET email = 'changed' || id WHERE id % 5 = 0;       -- listed
         UPDATE app.people SET id = id + 10000, notes = 'moved' WHERE id % 7 = 0;
         DELETE FROM app.people WHERE id % 11 = 0;
         INSERT INTO app.people (id, ssn, name, email) SELECT g, 'SSN-' || g || '-SECRET', 'new', NULL FROM generate_series(20001, 20050) g;
         ALTER TABLE app.people ADD COLUMN card text DEFAULT 'CARD-SECRET';   -- not listed",
    );
    for p in ["po", "pt", "pr"] {
        ok(
            &mut alice,
            &c,
            &format!(
                "SELECT tide.resume_backfill('app.people', '{p}');
                 SELECT tide.alter_backfill('app.people', '{p}', rows_per_second => 0);"
            ),
        );
    }
    ok(
        &mut alice,
        &c,
        "UPDATE app.people SET name = name || '!', card = 'CARD-SECRET-2' WHERE id % 13 = 0",
    );
    for p in ["po", "pt", "pr"] {
        wait_for_backfill(&c, "app.people", Some(p), 120, || diag_shape(&c));
        wait_for_pipeline(&c, p, 60, || diag_shape(&c));
    }
    let columns_of = |cl: &Cluster, table: &str| -> String {
        cl.query_scalar(&format!(
            "SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
              WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped"
        ))
    };
    assert_eq!(
        columns_of(&c, "copy.people"),
        "id,name,email",
        "local target's columns"
    );
    assert_eq!(
        columns_of(&t, "public.people"),
        "id,name,email",
        "remote target's columns"
    );
    let cols = "id, name, email";
    assert_same_rows("local table", &c, "app.people", &c, "copy.people", cols);
    assert_same_rows("remote", &c, "app.people", &t, "public.people", cols);
    c.execute(
        "CREATE TABLE app.people_listed AS SELECT id, name, email FROM app.people WHERE false;
               ALTER TABLE app.people_listed ADD PRIMARY KEY (id);",
    );
    outbox_copy(&c, "app.people_listed", "app.people", "app.people_replayed");
    c.query_scalar::<i64>("SELECT app.people_replayed_replay('po')");
    assert_same_rows(
        "outbox replayed",
        &c,
        "app.people",
        &c,
        "app.people_replayed",
        cols,
    );
    assert_no_rows(
        &c,
        "outbox events with columns outside the list",
        "SELECT id, op, \"row\" FROM tide.outbox
          WHERE pipeline = 'po' AND \"row\" IS NOT NULL AND EXISTS (
                SELECT 1 FROM jsonb_object_keys(\"row\") k WHERE k NOT IN ('id', 'name', 'email'))",
    );
    assert_no_rows(
        &c,
        "outbox events holding an unlisted column's value",
        "SELECT o.id FROM tide.outbox o WHERE o::text LIKE '%SECRET%' OR o::text LIKE '%moved%'",
    );
    for p in ["pt", "pr"] {
        let r = alice
            .query_one(
                &format!(
                    "SELECT missing::int8 + extra::int8 + changed::int8 FROM tide.verify('app.people', '{p}', sample => 200)
                      WHERE kind LIKE 'summary%'"
                ),
                &[],
            )
            .unwrap_or_else(|e| panic!("verify {p}: {}", describe_error(&e)));
        assert_eq!(
            r.get::<_, i64>(0),
            0,
            "pipeline {p} verifies clean on the listed columns"
        );
    }
}

/// The plugin checks the owner's right to execute the filter's functions again from the
/// position of a REVOKE on: one decoding session (a by-hand peek) over an insert that passes,
/// the REVOKE, and another insert stops at the second insert with the permission error,
/// although the table itself did not change (what recompiles the filter is the function's
/// catalog change, not the relation's).
#[test]
fn plugin_rechecks_rights_at_a_revoke() {
    let c = setup("shape_revoke");
    c.execute(
        "CREATE ROLE alice LOGIN;
         CREATE TABLE o (id int PRIMARY KEY, v text NOT NULL);
         ALTER TABLE o REPLICA IDENTITY FULL;",
    );
    let mut cl = c.connect_db("postgres");
    cl.batch_execute(
        "SET output_plugin_libraries = 'pg_tide';
         SELECT 1 FROM pg_create_logical_replication_slot('by_hand', 'pg_tide');",
    )
    .expect("slot");
    c.execute("INSERT INTO o VALUES (1, 'a')");
    c.execute("REVOKE EXECUTE ON FUNCTION pg_catalog.md5(text) FROM PUBLIC");
    c.execute("INSERT INTO o VALUES (2, 'b')");
    let oid: i64 = c.query_scalar("SELECT 'o'::regclass::oid::int8");
    let alice: i64 = c.query_scalar("SELECT 'alice'::regrole::oid::int8");
    let peek = |cl: &mut Client| {
        cl.query_one(
            &format!(
                "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('by_hand', NULL, NULL,
                        'proto_version', '4', 'tables', '{oid}',
                        'row_filter.{oid}', 'md5(v) <> ''x''', 'row_filter_owner', '{alice}')
                  WHERE get_byte(data, 0) = ascii('I')"
            ),
            &[],
        )
        .map(|r| r.get::<_, i64>(0))
    };
    let e = expect_fail_with("a session over the REVOKE", peek(&mut cl), "42501", None);
    assert!(
        e.message().contains("md5"),
        "the error names the function: {}",
        e.message()
    );
}

/// The masked columns of `app.people` as pipeline `p` delivers them, computed here in SQL from
/// the source and the pipeline's salt (independently of pg_tide's Rust): what every target must
/// hold, for the rows of the filter.
fn masked_expected(c: &Cluster, p: &str) -> String {
    let view = format!("app.expect_{p}");
    c.execute(&format!(
        "CREATE OR REPLACE VIEW {view} AS
         SELECT id,
                encode(sha256((SELECT salt FROM tide.mask_salt WHERE pipeline = '{p}') || convert_to(email, 'UTF8')), 'hex') AS email,
                left(name, 3) AS name, NULL::text AS ssn, 'x''y' AS note,
                encode(sha256((SELECT salt FROM tide.mask_salt WHERE pipeline = '{p}') || convert_to(age::text, 'UTF8')), 'hex') AS age,
                -1 AS score, region
           FROM app.people WHERE region = 'eu'"
    ));
    view
}

/// Writes to `app.people`, round `r`: masked columns changed (to values holding the marker
/// SECRET, built by concatenation so that no statement's text holds it), rows moved into and out
/// of the filter, key changes, inserts and deletes.
fn churn_people(cl: &mut Client, c: &Cluster, r: i32) {
    ok(
        cl,
        c,
        &format!(
            "UPDATE app.people SET email = 'u' || 'SEC' || 'RET' || id || '@x' WHERE id % 5 = {r};
             UPDATE app.people SET name = 'Bob' || 'SEC' || 'RET' || id, age = age + 1, score = score + 1 WHERE id % 7 = {r};
             UPDATE app.people SET region = CASE WHEN region = 'eu' THEN 'us' ELSE 'eu' END WHERE id % 13 = {r};
             UPDATE app.people SET ssn = 'S' || 'EC' || 'RET-' || id, note = 'N' || 'SEC' || 'RET' WHERE id % 11 = {r};
             UPDATE app.people SET id = id + 100000 WHERE id % 29 = {r} AND id < 100000;
             UPDATE app.people SET email = NULL WHERE id % 37 = {r};
             INSERT INTO app.people SELECT 200000 + {r} * 1000 + g, 'n' || 'SEC' || 'RET' || g || '@x',
                    'New' || 'SEC' || 'RET', 'S' || 'ECRET', 'N' || 'ECRET', g, g,
                    CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END
               FROM generate_series(1, 60) g;
             DELETE FROM app.people WHERE id % 31 = {r};"
        ),
    );
}

/// Column masks in every target (`tide.add_table(..., masks => ...)`), with a row filter: a
/// paced backfill paused in the middle while writes change masked columns and move rows in and
/// out; then each target (local, remote, the outbox replayed) equals the masks computed in SQL
/// from the source and the pipeline's salt; the marker of every clear value (`SECRET`) is in no
/// target, outbox event, server log (source and remote) or `pg_stat_activity` row, and neither
/// is the salt; `tide.verify` is clean, finds a changed masked value, and `tide.repair` fixes it.
/// Refusals: a key column (22023), an unknown column (42703), a masked column outside the column
/// list (22023), a constant that is not of the column's type (22P02), a malformed mask (22023).
#[test]
fn masked_table_in_every_target() {
    let (c, t) = setup_remote("shape_masks");
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA app AUTHORIZATION alice;
         CREATE SCHEMA copy AUTHORIZATION alice;
         GRANT USAGE ON FOREIGN SERVER tgt TO alice;
         CREATE USER MAPPING FOR alice SERVER tgt OPTIONS (user 'postgres', password_required 'false');",
    );
    let mut alice = connect_as(&c, "alice");
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.people (id int PRIMARY KEY, email text, name text NOT NULL, ssn text NOT NULL,
                                  note text, age int, score int NOT NULL, region text NOT NULL);
         ALTER TABLE app.people REPLICA IDENTITY FULL;
         INSERT INTO app.people SELECT g, 'p' || g || '@' || 'SEC' || 'RET.example', 'Nam' || 'SEC' || 'RET' || g,
                'SSN-' || 'SEC' || 'RET-' || g, 'note ' || 'SEC' || 'RET', 20 + g % 50, g,
                (ARRAY['eu', 'us', 'eu'])[g % 3 + 1]
           FROM generate_series(1, 2000) g;",
    );
    for sql in [
        "SELECT tide.create_pipeline('po', 'outbox')",
        r#"SELECT tide.create_pipeline('pt', 'table', '{"schema": "copy"}')"#,
        r#"SELECT tide.create_pipeline('pr', 'postgres', '{"server": "tgt"}')"#,
    ] {
        ok(&mut alice, &c, sql);
    }
    for (what, args, code, hint) in [
        (
            "a key column",
            r#"masks => '{"id": "hash"}'"#,
            "22023",
            "key (id)",
        ),
        (
            "an unknown column",
            r#"masks => '{"nope": "hash"}'"#,
            "42703",
            "pg_attribute",
        ),
        (
            "a column outside the column list",
            r#"columns => ARRAY['id', 'name'], masks => '{"email": "hash"}'"#,
            "22023",
            "column list",
        ),
        (
            "a constant that is not an int",
            r#"masks => '{"score": {"constant": "x"}}'"#,
            "22P02",
            "column's type",
        ),
        (
            "an unknown mask",
            r#"masks => '{"email": "md5"}'"#,
            "22023",
            "JSON object",
        ),
        (
            "a negative truncate",
            r#"masks => '{"name": {"truncate": -1}}'"#,
            "22023",
            "JSON object",
        ),
        (
            "not an object",
            r#"masks => '["email"]'"#,
            "22023",
            "JSON object",
        ),
        ("empty", r#"masks => '{}'"#, "22023", "omit masks"),
    ] {
        expect_fail_with(
            what,
            alice.batch_execute(&format!(
                "SELECT tide.add_table('po', 'app.people', {args})"
            )),
            code,
            Some(hint),
        );
    }
    let masks = r#"{"email": "hash", "name": {"truncate": 3}, "ssn": "null", "note": {"constant": "x'y"}, "age": {"hash": true}, "score": {"constant": "-1"}}"#;
    for p in ["po", "pt", "pr"] {
        ok(
            &mut alice,
            &c,
            &format!(
                "SELECT tide.add_table('{p}', 'app.people', backfill => false, row_filter => 'region = ''eu''',
                                       masks => $m${masks}$m$)"
            ),
        );
        wait_capturing(&c, p, "app.people");
        ok(
            &mut alice,
            &c,
            &format!(
                "SELECT tide.start_backfill('app.people', '{p}', chunk_size => 100);
                 SELECT tide.alter_backfill('app.people', '{p}', rows_per_second => 500);"
            ),
        );
    }
    assert_eq!(
        c.query_scalar::<String>("SELECT string_agg(DISTINCT masks::text, ';') FROM tide.tables"),
        r#"{"age": "hash", "ssn": "null", "name": {"truncate": 3}, "note": {"constant": "x'y"}, "email": "hash", "score": {"constant": "-1"}}"#,
        "tide.tables shows the masks by column name"
    );
    let salts: i64 =
        c.query_scalar("SELECT count(DISTINCT salt) FROM tide.mask_salt WHERE length(salt) = 32");
    assert_eq!(salts, 3, "one 32-byte salt per pipeline");
    for p in ["po", "pt", "pr"] {
        c.wait_until(
            "the backfill reads some chunks",
            Duration::from_secs(60),
            Duration::from_millis(20),
            || Ok(rows_read(&c, p) >= 100),
        );
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.pause_backfill('app.people', '{p}')"),
        );
    }
    churn_people(&mut alice, &c, 1);
    for p in ["po", "pt", "pr"] {
        ok(
            &mut alice,
            &c,
            &format!(
                "SELECT tide.resume_backfill('app.people', '{p}');
                 SELECT tide.alter_backfill('app.people', '{p}', rows_per_second => 0);"
            ),
        );
    }
    for p in ["po", "pt", "pr"] {
        wait_for_backfill(&c, "app.people", Some(p), 120, || diag_shape(&c));
    }
    churn_people(&mut alice, &c, 2);
    for p in ["po", "pt", "pr"] {
        wait_for_pipeline(&c, p, 60, || diag_shape(&c));
    }
    let columns_of = |cl: &Cluster, table: &str| -> String {
        cl.query_scalar(&format!(
            "SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY attnum)
               FROM pg_attribute WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped"
        ))
    };
    let shape = "id integer not null, email text, name text not null, ssn text, note text, age text, score integer not null, region text not null";
    assert_eq!(
        columns_of(&c, "copy.people"),
        shape,
        "local target: hash and truncate columns are text, a null-masked one nullable"
    );
    assert_eq!(
        columns_of(&t, "public.people"),
        shape,
        "remote target's columns"
    );
    let cols = "id, email, name, ssn, note, age, score, region";
    let n: i64 = c.query_scalar("SELECT count(*) FROM app.people WHERE region = 'eu'");
    assert!(n > 500, "the filter keeps rows ({n})");
    assert_same_rows(
        "local table",
        &c,
        &masked_expected(&c, "pt"),
        &c,
        "copy.people",
        cols,
    );
    assert_same_rows(
        "remote",
        &c,
        &masked_expected(&c, "pr"),
        &t,
        "public.people",
        cols,
    );
    c.execute(
        "CREATE TABLE app.people_masked (id int PRIMARY KEY, email text, name text, ssn text, note text, age text, score int, region text)",
    );
    outbox_copy(&c, "app.people_masked", "app.people", "app.people_replayed");
    c.query_scalar::<i64>("SELECT app.people_replayed_replay('po')");
    assert_same_rows(
        "outbox replayed",
        &c,
        &masked_expected(&c, "po"),
        &c,
        "app.people_replayed",
        cols,
    );

    // The clear values are nowhere: not at a target, not in an outbox event (old rows of
    // deletes included), not in a log, not in what a backend shows; nor is the salt.
    assert_no_rows(
        &c,
        "outbox events holding a clear value",
        "SELECT o.id FROM tide.outbox o WHERE o::text LIKE '%' || 'SEC' || 'RET%'",
    );
    assert_no_rows(
        &c,
        "local target rows holding a clear value",
        "SELECT p.id FROM copy.people p WHERE p::text LIKE '%' || 'SEC' || 'RET%'",
    );
    let remote_leaks: i64 = t.query_scalar(
        "SELECT count(*) FROM public.people p WHERE p::text LIKE '%' || 'SEC' || 'RET%'",
    );
    assert_eq!(remote_leaks, 0, "remote target rows holding a clear value");
    let events: i64 = c.query_scalar("SELECT count(*) FROM tide.outbox WHERE pipeline = 'po' AND op = 'delete' AND \"row\" IS NOT NULL");
    eprintln!("  outbox: {events} delete events carrying the (masked) old row");
    let salt_hexes: Vec<String> = c
        .client()
        .query("SELECT encode(salt, 'hex') FROM tide.mask_salt", &[])
        .expect("salts")
        .iter()
        .map(|r| r.get(0))
        .collect();
    for (name, cl) in [("source", &c), ("remote target", &t)] {
        let log = cl.log();
        assert!(
            !log.contains("SECRET"),
            "the {name} server log holds a clear value"
        );
        for s in &salt_hexes {
            assert!(
                !log.contains(s.as_str()),
                "the {name} server log holds a salt"
            );
        }
        let shown: i64 = cl.query_scalar(&format!(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()
                AND (query LIKE '%' || 'SEC' || 'RET%' OR query ~ ('(' || '{}' || ')'))",
            salt_hexes.join("|")
        ));
        assert_eq!(
            shown, 0,
            "pg_stat_activity of the {name} shows a clear value or a salt"
        );
    }

    // tide.verify compares with the masked values: clean; a changed masked value is found and
    // repaired.
    let differences = |alice: &mut Client, p: &str| -> (i64, i64, i64) {
        let r = alice
            .query_one(
                &format!(
                    "SELECT missing::int8, extra::int8, changed::int8 FROM tide.verify('app.people', '{p}', sample => 300)
                      WHERE kind LIKE 'summary%'"
                ),
                &[],
            )
            .unwrap_or_else(|e| panic!("verify {p}: {}", describe_error(&e)));
        (r.get(0), r.get(1), r.get(2))
    };
    for p in ["pt", "pr"] {
        assert_eq!(
            differences(&mut alice, p),
            (0, 0, 0),
            "pipeline {p} verifies clean under the masks"
        );
    }
    c.execute("UPDATE copy.people SET email = 'tampered' WHERE id = (SELECT min(id) FROM copy.people WHERE email IS NOT NULL)");
    assert_eq!(
        differences(&mut alice, "pt"),
        (0, 0, 1),
        "a changed masked value"
    );
    ok(
        &mut alice,
        &c,
        "SELECT * FROM tide.repair('app.people', 'pt')",
    );
    wait_for_backfill(&c, "app.people", Some("pt"), 60, || diag_shape(&c));
    wait_for_pipeline(&c, "pt", 60, || diag_shape(&c));
    assert_same_rows(
        "local table, repaired",
        &c,
        &masked_expected(&c, "pt"),
        &c,
        "copy.people",
        cols,
    );
    assert_eq!(differences(&mut alice, "pt"), (0, 0, 0), "repaired");
}
