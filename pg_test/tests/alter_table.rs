//! Changing a captured table's row filter, column list or masks (`tide.alter_table`, issue 36) while
//! it streams, as a DBA does it: every pipeline call by `alice`, a member of `tide_admin` with no
//! other attribute (plus USAGE on the foreign server and a passwordless user mapping for the
//! remote target).
//!
//! - `filter_changed_mid_stream`: one table, three pipelines (outbox, local table, remote
//!   PostgreSQL) filtered by `region = 'eu'`, then changed to `status <> 'draft'` while a writer
//!   moves rows into and out of both filters. The pipelines are paused around the change, so the
//!   rows written just before and just after it are decoded in one go: a row only the old filter
//!   passes, written before, is delivered, one only the new filter passes is not (and the other
//!   way round after it; rows written in the call's own transaction are shaped the old way), and
//!   the outbox's schema event sits between them with both filters.
//!   Every stream event before the schema event passes the old filter, every one after it the
//!   new one. Then each target equals `SELECT ... FROM source WHERE <new filter>` (the outbox
//!   replayed onto a copy by a consumer that, at the schema event, deletes the rows the new
//!   filter does not pass, as the README says).
//! - `column_list_changed_mid_stream`: the list `(id, name)` changed to `(id, email)`: the table
//!   targets drop `name` and add `email` at the schema event and hold `SELECT id, email FROM
//!   source` afterwards; outbox events before the schema event carry `id, name`, after it
//!   `id, email`.
//! - `masks_changed_mid_stream`: masks `(email: hash)` changed to `(email: truncate 2, name:
//!   hash)` while paused: the row written just before keeps the old masking, the one just after
//!   has the new one, the schema event names both (kinds, never the salt); every target (local,
//!   remote, outbox replayed) ends masked the new way; no clear email anywhere. Before that, the
//!   masks refusals (a mask on a column the list leaves out, an int column newly hashed at a
//!   table target, ...).
//! - `alter_table_refusals`: bad calls and states, each with its SQLSTATE and hint; an unchanged
//!   shaping is a NOTICE that writes nothing.
//! - `alter_pending_when_the_slot_is_lost`: a change whose marker was in the lost WAL is in effect
//!   after the resync.
//!
//! Attacks (other roles, planted functions) are in `security/alter_table.rs`.

use pg_test::*;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const OLD: &str = "region = 'eu'";
const NEW: &str = "status <> 'draft'";

fn diag_alter(c: &Cluster) -> String {
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
                "SELECT t.pipeline, t.relation, t.state, t.row_filter, t.columns, t.masks, p.shaping_before FROM tide.tables t JOIN tide.pipeline_table p USING (pipeline, relation) ORDER BY 1",
                20,
            ),
            (
                "backfills",
                "SELECT id, pipeline, relation, state, resync, rows_read, error FROM tide.backfill ORDER BY id",
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
            diag_alter(c)
        );
    }
}

/// alice, her schemas `app` and `copy`, the remote server `tgt` she may use; her connection.
fn alice(c: &Cluster) -> Client {
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA app AUTHORIZATION alice;
         CREATE SCHEMA copy AUTHORIZATION alice;
         GRANT USAGE ON FOREIGN SERVER tgt TO alice;
         CREATE USER MAPPING FOR alice SERVER tgt OPTIONS (user 'postgres', password_required 'false');",
    );
    connect_as(c, "alice")
}

const PIPELINES: [&str; 3] = ["po", "pt", "pr"];

fn create_pipelines(alice: &mut Client, c: &Cluster) {
    for sql in [
        "SELECT tide.create_pipeline('po', 'outbox')",
        r#"SELECT tide.create_pipeline('pt', 'table', '{"schema": "copy"}')"#,
        r#"SELECT tide.create_pipeline('pr', 'postgres', '{"server": "tgt"}')"#,
    ] {
        ok(alice, c, sql);
    }
}

/// One round of writes that move rows of `app.orders` into and out of both filters, all over
/// the key range (updates of region and status both ways, key changes, inserts and deletes);
/// never the rows from 900000 on, which the test writes itself.
fn churn_sql(r: i64) -> String {
    format!(
        "UPDATE app.orders SET region = CASE WHEN region = 'eu' THEN 'us' ELSE 'eu' END WHERE id % 7 = {m7} AND id < 900000;
         UPDATE app.orders SET status = CASE WHEN status = 'draft' THEN 'paid' ELSE 'draft' END WHERE id % 11 = {m11} AND id < 900000;
         UPDATE app.orders SET note = note || '+' WHERE id % 5 = {m5} AND id < 900000;
         UPDATE app.orders SET id = id + 100000, status = CASE WHEN status = 'draft' THEN 'paid' ELSE 'draft' END
          WHERE id % 29 = {m29} AND id < 100000;
         INSERT INTO app.orders SELECT 300000 + {r} * 100 + g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END,
                CASE WHEN g % 3 = 0 THEN 'draft' ELSE 'paid' END, 'new' || g
           FROM generate_series(1, 40) g;
         DELETE FROM app.orders WHERE id % 31 = {m31} AND id < 900000;",
        m7 = r % 7,
        m11 = r % 11,
        m5 = r % 5,
        m29 = r % 29,
        m31 = r % 31,
    )
}

/// A writer running [`churn_sql`] rounds until `stop`; counts its rounds in `rounds`.
fn spawn_writer(
    c: &Cluster,
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicI64>,
) -> std::thread::JoinHandle<()> {
    let mut cl = connect_as(c, "alice");
    std::thread::spawn(move || {
        let mut r = 0;
        while !stop.load(Ordering::SeqCst) {
            r += 1;
            if let Err(e) = cl.batch_execute(&churn_sql(r)) {
                panic!("writer round {r}: {}", describe_error(&e));
            }
            rounds.store(r, Ordering::SeqCst);
        }
    })
}

fn wait_rounds(c: &Cluster, rounds: &AtomicI64, at_least: i64) {
    c.wait_until(
        "the writer's rounds",
        Duration::from_secs(60),
        Duration::from_millis(10),
        || Ok(rounds.load(Ordering::SeqCst) >= at_least),
    );
}

/// A copy of `app.orders` and its replay of pipeline `po`'s events, as a consumer keeping a copy
/// does it: upserts and deletes by key, and at a schema event of `tide.alter_table` (`"altered":
/// true`) the rows its new `row_filter` does not pass are deleted (the copy holds the rows as of
/// that position).
fn outbox_consumer(c: &Cluster) {
    c.execute(
        r#"
CREATE TABLE app.orders_replayed (LIKE app.orders INCLUDING ALL);
CREATE FUNCTION app.orders_replayed_replay(p_pipeline text) RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE
    e record;
    n bigint := 0;
BEGIN
    FOR e IN SELECT o.id, o.op, o.key, o."row" FROM tide.outbox o
              WHERE o.pipeline = p_pipeline AND o.relation = 'app.orders' ORDER BY o.id
    LOOP
        n := n + 1;
        IF e.op IN ('read', 'insert', 'update') THEN
            DELETE FROM app.orders_replayed c USING jsonb_populate_record(NULL::app.orders_replayed, e.key) k WHERE c.id = k.id;
            INSERT INTO app.orders_replayed SELECT * FROM jsonb_populate_record(NULL::app.orders_replayed, e."row");
        ELSIF e.op = 'delete' THEN
            DELETE FROM app.orders_replayed c USING jsonb_populate_record(NULL::app.orders_replayed, e.key) k WHERE c.id = k.id;
        ELSIF e.op = 'schema' AND (e."row"->>'altered')::boolean AND e."row"->>'row_filter' IS NOT NULL THEN
            EXECUTE format('DELETE FROM app.orders_replayed WHERE NOT (%s)', e."row"->>'row_filter');
        ELSIF e.op <> 'schema' THEN
            RAISE EXCEPTION 'event % has unknown op %', e.id, e.op;
        END IF;
    END LOOP;
    RETURN n;
END
$f$;
"#,
    );
}

#[test]
fn filter_changed_mid_stream() {
    let (c, t) = setup_remote("alter_filter");
    let mut alice = alice(&c);
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.orders (id int PRIMARY KEY, region text NOT NULL, status text NOT NULL, note text);
         ALTER TABLE app.orders REPLICA IDENTITY FULL;
         INSERT INTO app.orders SELECT g, (ARRAY['eu', 'us', 'eu'])[g % 3 + 1],
                (ARRAY['paid', 'draft', 'shipped', 'paid'])[g % 4 + 1], 'n' || g
           FROM generate_series(1, 3000) g;",
    );
    create_pipelines(&mut alice, &c);
    for p in PIPELINES {
        ok(
            &mut alice,
            &c,
            &format!(
                "SELECT tide.add_table('{p}', 'app.orders', row_filter => $f${OLD}$f$, backfill => true)"
            ),
        );
    }
    for p in PIPELINES {
        wait_for_pipeline(&c, p, 60, || diag_alter(&c));
        wait_for_backfill(&c, "app.orders", Some(p), 60, || diag_alter(&c));
    }
    outbox_consumer(&c);
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicI64::new(0));
    let writer = spawn_writer(&c, stop.clone(), rounds.clone());
    wait_rounds(&c, &rounds, 3);
    // Paused: what is written from here is decoded after the resume, in commit order, so the
    // rows written just before and just after the change are exactly on either side of it.
    for p in PIPELINES {
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.pause_pipeline('{p}')"),
        );
    }
    wait_rounds(&c, &rounds, rounds.load(Ordering::SeqCst) + 2);
    ok(
        &mut alice,
        &c,
        "INSERT INTO app.orders VALUES (900001, 'us', 'paid', 'before, new filter only'),
                                       (900002, 'eu', 'draft', 'before, old filter only');",
    );
    for p in ["pt", "pr"] {
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.alter_table('{p}', 'app.orders', row_filter => $f${NEW}$f$)"),
        );
    }
    // The outbox pipeline's change, with rows written in its own transaction after the call:
    // they are shaped the old way, before the schema event (which comes at the commit).
    ok(
        &mut alice,
        &c,
        &format!(
            "BEGIN;
             SELECT tide.alter_table('po', 'app.orders', row_filter => $f${NEW}$f$);
             INSERT INTO app.orders VALUES (900005, 'us', 'paid', 'same transaction, new filter only'),
                                           (900006, 'eu', 'draft', 'same transaction, old filter only');
             COMMIT;"
        ),
    );
    ok(
        &mut alice,
        &c,
        "INSERT INTO app.orders VALUES (900003, 'us', 'paid', 'after, new filter only'),
                                       (900004, 'eu', 'draft', 'after, old filter only');",
    );
    assert_eq!(
        c.query_scalar::<String>(
            "SELECT string_agg(DISTINCT t.row_filter || ' / ' || (p.shaping_before->>'row_filter'), ';')
               FROM tide.tables t JOIN tide.pipeline_table p USING (pipeline, relation)"
        ),
        format!("{NEW} / {OLD}"),
        "tide.tables shows the new filter; the old one stays in effect until the marker"
    );
    let at_alter = rounds.load(Ordering::SeqCst);
    wait_rounds(&c, &rounds, at_alter + 2);
    for p in PIPELINES {
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.resume_pipeline('{p}')"),
        );
    }
    wait_rounds(&c, &rounds, at_alter + 6);
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("the writer panicked");
    for p in PIPELINES {
        wait_for_pipeline(&c, p, 120, || diag_alter(&c));
        wait_for_backfill(&c, "app.orders", Some(p), 120, || diag_alter(&c));
    }
    // The outbox: the schema event between the rows written just before and just after.
    let schema_id: i64 = c.query_scalar(
        "SELECT id FROM tide.outbox WHERE pipeline = 'po' AND op = 'schema' AND (\"row\"->>'altered')::boolean",
    );
    let announced: String = c.query_scalar(&format!(
        "SELECT (\"row\"->>'previous_row_filter') || ' -> ' || (\"row\"->>'row_filter') FROM tide.outbox WHERE id = {schema_id}"
    ));
    assert_eq!(announced, format!("{OLD} -> {NEW}"), "the schema event");
    let stream_of = |id: i64| -> String {
        c.query_scalar(&format!(
            "SELECT coalesce(string_agg(op || CASE WHEN id < {schema_id} THEN '<' ELSE '>' END, ',' ORDER BY id), '')
               FROM tide.outbox WHERE pipeline = 'po' AND backfill_id IS NULL AND key->>'id' = '{id}'"
        ))
    };
    assert_eq!(
        stream_of(900001),
        "",
        "written before, only the new filter passes it: not streamed"
    );
    assert_eq!(
        stream_of(900002),
        "insert<",
        "written before, the old filter passes it: streamed before the schema event"
    );
    assert_eq!(
        stream_of(900003),
        "insert>",
        "written after, the new filter passes it: streamed after the schema event"
    );
    assert_eq!(
        stream_of(900004),
        "",
        "written after, only the old filter passes it: not streamed"
    );
    assert_eq!(
        stream_of(900005),
        "",
        "written in the call's transaction, only the new filter passes it: not streamed"
    );
    assert_eq!(stream_of(900006), "insert<", "written in the call's transaction, the old filter passes it: streamed before the schema event");
    // Every streamed row before the schema event passes the old filter, every one after it the
    // new one (a delete carries its old key only; an update's new row is the one decided on).
    assert_no_rows(
        &c,
        "stream events before the change outside the old filter",
        &format!(
            "SELECT id, op, \"row\" FROM tide.outbox WHERE pipeline = 'po' AND backfill_id IS NULL AND id < {schema_id}
                AND op IN ('insert', 'update') AND \"row\"->>'region' <> 'eu'"
        ),
    );
    assert_no_rows(
        &c,
        "events after the change outside the new filter",
        &format!(
            "SELECT id, op, \"row\" FROM tide.outbox WHERE pipeline = 'po' AND id > {schema_id}
                AND op IN ('insert', 'update', 'read') AND \"row\"->>'status' = 'draft'"
        ),
    );
    let moved: i64 = c.query_scalar(&format!(
        "SELECT count(*) FROM tide.outbox WHERE pipeline = 'po' AND backfill_id IS NULL AND id > {schema_id} AND op IN ('insert', 'update')
            AND \"row\"->>'region' <> 'eu'"
    ));
    assert!(
        moved > 0,
        "rows outside the old filter were streamed after the change"
    );

    let expected = format!("(SELECT * FROM app.orders WHERE {NEW}) f");
    let n: i64 = c.query_scalar(&format!("SELECT count(*) FROM {expected}"));
    let total: i64 = c.query_scalar("SELECT count(*) FROM app.orders");
    assert!(
        n > 500 && n < total,
        "the new filter keeps some rows and leaves out others ({n} of {total})"
    );
    let cols = "id, region, status, note";
    assert_same_rows("local table", &c, &expected, &c, "copy.orders", cols);
    assert_same_rows("remote", &c, &expected, &t, "public.orders", cols);
    c.query_scalar::<i64>("SELECT app.orders_replayed_replay('po')");
    assert_same_rows(
        "outbox replayed",
        &c,
        &expected,
        &c,
        "app.orders_replayed",
        cols,
    );
    // The re-seed: a resync backfill of the table per pipeline, done.
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(DISTINCT pipeline) FROM tide.backfill WHERE resync AND state = 'done'"
        ),
        3,
        "one re-seed per pipeline\n{}",
        diag_alter(&c)
    );
}

#[test]
fn column_list_changed_mid_stream() {
    let (c, t) = setup_remote("alter_columns");
    let mut alice = alice(&c);
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.people (id int PRIMARY KEY, name text NOT NULL, email text, notes text);
         INSERT INTO app.people SELECT g, 'name ' || g, 'p' || g || '@example.com', 'note ' || g
           FROM generate_series(1, 1500) g;",
    );
    create_pipelines(&mut alice, &c);
    for p in PIPELINES {
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.add_table('{p}', 'app.people', columns => ARRAY['id', 'name'])"),
        );
    }
    for p in PIPELINES {
        wait_for_pipeline(&c, p, 60, || diag_alter(&c));
        wait_for_backfill(&c, "app.people", Some(p), 60, || diag_alter(&c));
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.pause_pipeline('{p}')"),
        );
    }
    ok(
        &mut alice,
        &c,
        "UPDATE app.people SET name = name || ' (before)', email = 'before-' || email WHERE id % 10 = 1;",
    );
    for p in PIPELINES {
        ok(
            &mut alice,
            &c,
            &format!(
                "SELECT tide.alter_table('{p}', 'app.people', columns => ARRAY['email', 'id'])"
            ),
        );
    }
    ok(
        &mut alice,
        &c,
        "UPDATE app.people SET name = name || ' (after)', email = 'after-' || email WHERE id % 10 = 2;
         INSERT INTO app.people VALUES (5000, 'new', 'new@example.com', 'n');
         DELETE FROM app.people WHERE id % 10 = 3;",
    );
    assert_eq!(
        c.query_scalar::<String>("SELECT string_agg(DISTINCT columns::text, ';') FROM tide.tables"),
        "{id,email}",
        "tide.tables shows the new column list"
    );
    for p in PIPELINES {
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.resume_pipeline('{p}')"),
        );
    }
    for p in PIPELINES {
        wait_for_pipeline(&c, p, 120, || diag_alter(&c));
        wait_for_backfill(&c, "app.people", Some(p), 120, || diag_alter(&c));
    }
    // The table targets follow the list: `name` dropped, `email` added, every row re-seeded.
    let columns_of = |cl: &Cluster, table: &str| -> String {
        cl.query_scalar(&format!(
            "SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
              WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped"
        ))
    };
    assert_eq!(
        columns_of(&c, "copy.people"),
        "id,email",
        "local target's columns"
    );
    assert_eq!(
        columns_of(&t, "public.people"),
        "id,email",
        "remote target's columns"
    );
    assert_same_rows(
        "local table",
        &c,
        "app.people",
        &c,
        "copy.people",
        "id, email",
    );
    assert_same_rows("remote", &c, "app.people", &t, "public.people", "id, email");
    // The outbox: before the schema event the events carry (id, name), after it (id, email).
    let schema_id: i64 = c.query_scalar(
        "SELECT id FROM tide.outbox WHERE pipeline = 'po' AND op = 'schema' AND (\"row\"->>'altered')::boolean",
    );
    assert_eq!(
        c.query_scalar::<String>(&format!(
            "SELECT (\"row\"->'added'->0->>'name') || ' ' || (\"row\"->>'dropped') || ' ' || (\"row\"->>'listed_columns')
               FROM tide.outbox WHERE id = {schema_id}"
        )),
        r#"email ["name"] ["id", "email"]"#,
        "the schema event"
    );
    let shapes = |cmp: &str| -> String {
        c.query_scalar(&format!(
            "SELECT string_agg(DISTINCT (SELECT string_agg(k, ',' ORDER BY k) FROM jsonb_object_keys(\"row\") k), ';')
               FROM tide.outbox WHERE pipeline = 'po' AND op IN ('insert', 'update', 'read') AND id {cmp} {schema_id}"
        ))
    };
    assert_eq!(shapes("<"), "id,name", "events before the change");
    assert_eq!(shapes(">"), "email,id", "events after the change");
    let before_after: String = c.query_scalar(&format!(
        "SELECT string_agg(DISTINCT CASE WHEN id < {schema_id} THEN 'before:' || (\"row\"->>'name' LIKE '%(before)') ELSE 'after:' || (\"row\"->>'email' LIKE 'after-%') END, ',')
           FROM tide.outbox WHERE pipeline = 'po' AND op = 'update' AND backfill_id IS NULL"
    ));
    assert_eq!(
        before_after, "after:true,before:true",
        "the updates on either side of the change"
    );
}

#[test]
fn alter_table_refusals() {
    let c = setup("alter_refusals");
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA app AUTHORIZATION alice;",
    );
    let mut alice = connect_as(&c, "alice");
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.t (id int PRIMARY KEY, region text, v int);
         CREATE TABLE app.u (id int PRIMARY KEY, v int);
         CREATE TABLE app.w (id int PRIMARY KEY, v int);
         INSERT INTO app.t SELECT g, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END, g FROM generate_series(1, 200) g;",
    );
    ok(&mut alice, &c, "SELECT tide.create_pipeline('p', 'outbox')");
    ok(
        &mut alice,
        &c,
        "SELECT tide.add_table('p', 'app.t', backfill => false, row_filter => 'id > 10')",
    );
    ok(
        &mut alice,
        &c,
        "SELECT tide.add_table('p', 'app.w', backfill => false)",
    );
    wait_for_pipeline(&c, "p", 30, || diag_alter(&c));
    for (what, sql, code, hint) in [
        ("nothing to change", "SELECT tide.alter_table('p', 'app.t')", "22023", "Pass row_filter"),
        (
            "a filter and its clearing",
            "SELECT tide.alter_table('p', 'app.t', row_filter => 'id > 1', clear_row_filter => true)",
            "22023",
            "not both",
        ),
        (
            "columns and their clearing",
            "SELECT tide.alter_table('p', 'app.t', columns => ARRAY['id'], clear_columns => true)",
            "22023",
            "not both",
        ),
        (
            "an empty filter",
            "SELECT tide.alter_table('p', 'app.t', row_filter => '  ')",
            "22023",
            "clear_row_filter => true",
        ),
        (
            "a NULL clear flag",
            "SELECT tide.alter_table('p', 'app.t', row_filter => 'id > 1', clear_row_filter => NULL)",
            "22004",
            "",
        ),
        (
            "a filter on a column outside the replica identity",
            "SELECT tide.alter_table('p', 'app.t', row_filter => $$region = 'eu'$$)",
            "42P10",
            "REPLICA IDENTITY FULL",
        ),
        (
            "a volatile function",
            "SELECT tide.alter_table('p', 'app.t', row_filter => 'id > random() * 10')",
            "0A000",
            "immutable built-in",
        ),
        (
            "an unknown column",
            "SELECT tide.alter_table('p', 'app.t', row_filter => 'nope > 1')",
            "42703",
            "",
        ),
        (
            "a column list without the key",
            "SELECT tide.alter_table('p', 'app.t', columns => ARRAY['v'])",
            "22023",
            "clear_columns => true for every column",
        ),
        (
            "an unknown listed column",
            "SELECT tide.alter_table('p', 'app.t', columns => ARRAY['id', 'nope'])",
            "42703",
            "pg_attribute",
        ),
        (
            "a table the pipeline does not capture",
            "SELECT tide.alter_table('p', 'app.u', row_filter => 'id > 1')",
            "42704",
            "tide.add_table",
        ),
        (
            "an unknown pipeline",
            "SELECT tide.alter_table('nope', 'app.t', row_filter => 'id > 1')",
            "42704",
            "tide.create_pipeline",
        ),
    ] {
        expect_fail_with(what, alice.batch_execute(sql), code, (!hint.is_empty()).then_some(hint));
    }
    let untouched = |c: &Cluster| -> String {
        c.query_scalar(
            "SELECT coalesce(row_filter, '-') || ' ' || coalesce(columns::text, '-') || ' ' || (shaping_before IS NULL)::text
               FROM tide.pipeline_table WHERE relid = 'app.t'::regclass",
        )
    };
    assert_eq!(untouched(&c), "id > 10 - true", "refusals changed nothing");
    // The same filter again: a NOTICE, nothing written.
    let notices = notices_of(
        &c,
        "SELECT tide.alter_table('p', 'app.t', row_filter => 'id > 10')",
    );
    assert!(
        notices.iter().any(|n| n.contains("nothing changed")),
        "a NOTICE for an unchanged filter: {notices:?}"
    );
    assert_eq!(
        untouched(&c),
        "id > 10 - true",
        "an unchanged filter changed something"
    );
    // Paused: an alteration is on its way until the worker reaches it; a second one waits.
    ok(&mut alice, &c, "SELECT tide.pause_pipeline('p')");
    ok(
        &mut alice,
        &c,
        "SELECT tide.alter_table('p', 'app.t', clear_row_filter => true)",
    );
    assert_eq!(
        untouched(&c),
        "- - false",
        "the cleared filter, the old one kept until the marker"
    );
    expect_fail_with(
        "a second alteration before the first took effect",
        alice.batch_execute("SELECT tide.alter_table('p', 'app.t', row_filter => 'id > 5')"),
        "55000",
        Some("tide.wait_for_pipeline"),
    );
    // A table still pending (its add marker not reached) or being removed.
    ok(
        &mut alice,
        &c,
        "SELECT tide.add_table('p', 'app.u', backfill => false)",
    );
    expect_fail_with(
        "a pending table",
        alice.batch_execute("SELECT tide.alter_table('p', 'app.u', row_filter => 'id > 1')"),
        "55000",
        Some("capturing"),
    );
    ok(&mut alice, &c, "SELECT tide.remove_table('p', 'app.w')");
    expect_fail_with(
        "a table being removed",
        alice.batch_execute("SELECT tide.alter_table('p', 'app.w', row_filter => 'id > 1')"),
        "55000",
        Some("tide.add_table"),
    );
    ok(&mut alice, &c, "SELECT tide.resume_pipeline('p')");
    wait_for_pipeline(&c, "p", 30, || diag_alter(&c));
    assert_eq!(untouched(&c), "- - true", "the worker passed the marker");
    ok(
        &mut alice,
        &c,
        "SELECT tide.alter_table('p', 'app.t', row_filter => 'id > 5')",
    );
}

/// The NOTICEs `sql` raises, run as alice on a connection of its own.
fn notices_of(c: &Cluster, sql: &str) -> Vec<String> {
    let notices = Arc::new(Mutex::new(Vec::new()));
    let sink = notices.clone();
    let mut cfg = c.config("postgres");
    cfg.user("alice");
    cfg.notice_callback(move |n| sink.lock().expect("notices").push(n.message().to_string()));
    let mut cl = cfg
        .connect(NoTls)
        .unwrap_or_else(|e| panic!("connect as alice: {}", describe_error(&e)));
    if let Err(e) = cl.batch_execute(sql) {
        panic!("{sql}: {}", describe_error(&e));
    }
    let seen = notices.lock().expect("notices").clone();
    seen
}

/// A change whose marker was in the WAL of a lost slot (paused, the slot dropped): the resync
/// after the loss puts it in effect (from the new slot's start, with the tables read again under
/// it) instead of leaving the stream with the old filter for good.
#[test]
fn alter_pending_when_the_slot_is_lost() {
    let c = setup("alter_slot_lost");
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA app AUTHORIZATION alice;",
    );
    let mut alice = connect_as(&c, "alice");
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.orders (id int PRIMARY KEY, region text NOT NULL, status text NOT NULL);
         ALTER TABLE app.orders REPLICA IDENTITY FULL;
         INSERT INTO app.orders SELECT g, (ARRAY['eu', 'us'])[g % 2 + 1], (ARRAY['paid', 'draft'])[g % 3 % 2 + 1]
           FROM generate_series(1, 300) g;",
    );
    ok(
        &mut alice,
        &c,
        "SELECT tide.create_pipeline('po', 'outbox')",
    );
    ok(
        &mut alice,
        &c,
        &format!("SELECT tide.add_table('po', 'app.orders', row_filter => $f${OLD}$f$)"),
    );
    wait_for_pipeline(&c, "po", 60, || diag_alter(&c));
    ok(&mut alice, &c, "SELECT tide.pause_pipeline('po')");
    ok(
        &mut alice,
        &c,
        &format!("SELECT tide.alter_table('po', 'app.orders', row_filter => $f${NEW}$f$)"),
    );
    c.wait_until(
        "the paused worker to let go of its slot",
        Duration::from_secs(30),
        Duration::from_millis(50),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT NOT active FROM pg_replication_slots WHERE slot_name = 'tide_5_po'",
            )?)
        },
    );
    c.execute("SELECT pg_drop_replication_slot('tide_5_po')");
    ok(&mut alice, &c, "SELECT tide.resume_pipeline('po')");
    c.wait_until(
        "the resync to be over",
        Duration::from_secs(120),
        Duration::from_millis(100),
        || {
            Ok(c.try_query_scalar::<bool>(
                "SELECT coalesce((SELECT resync IS NULL AND slot_lost_at IS NOT NULL AND state = 'streaming'
                                    FROM tide.pipelines WHERE name = 'po'), false)",
            )?)
        },
    );
    ok(
        &mut alice,
        &c,
        "INSERT INTO app.orders VALUES (900001, 'us', 'paid'), (900002, 'eu', 'draft');",
    );
    wait_for_pipeline(&c, "po", 60, || diag_alter(&c));
    assert_eq!(
        c.query_scalar::<String>(
            "SELECT coalesce(string_agg(key->>'id', ',' ORDER BY id), '') FROM tide.outbox
              WHERE pipeline = 'po' AND backfill_id IS NULL AND op = 'insert'"
        ),
        "900001",
        "after the resync the stream passes the new filter\n{}",
        diag_alter(&c)
    );
    assert_no_rows(
        &c,
        "rows the resync read outside the new filter",
        "SELECT o.id FROM tide.outbox o JOIN tide.backfill b ON b.id = o.backfill_id
          WHERE o.pipeline = 'po' AND b.resync AND o.\"row\"->>'status' = 'draft'",
    );
    assert!(
        c.query_scalar::<bool>(
            "SELECT shaping_before IS NULL FROM tide.pipeline_table WHERE relid = 'app.orders'::regclass"
        ),
        "the change is in effect"
    );
}

/// The masks `(email: hash)` changed to `(email: truncate 2, name: hash)` while three
/// pipelines (outbox, local table, remote) are paused: a row written just before the change
/// keeps the old masking in the stream, one written just after has the new one, the schema event
/// between them names both (kinds only, never the salt), and every target ends with every row
/// masked the new way (the re-seed), the outbox replayed included. No clear email reaches any
/// target at any time; no clear name is in any table target.
#[test]
fn masks_changed_mid_stream() {
    let (c, t) = setup_remote("alter_masks");
    let mut alice = alice(&c);
    ok(
        &mut alice,
        &c,
        "CREATE TABLE app.users (id int PRIMARY KEY, email text, name text NOT NULL, age int);
         INSERT INTO app.users SELECT g, 'u' || g || '@clear.example', 'Clearname' || g, g % 90
           FROM generate_series(1, 800) g;",
    );
    create_pipelines(&mut alice, &c);
    for p in PIPELINES {
        ok(
            &mut alice,
            &c,
            &format!(
                r#"SELECT tide.add_table('{p}', 'app.users', masks => '{{"email": "hash"}}')"#
            ),
        );
    }
    for p in PIPELINES {
        wait_for_pipeline(&c, p, 60, || diag_alter(&c));
        wait_for_backfill(&c, "app.users", Some(p), 60, || diag_alter(&c));
    }
    // Refusals of masks that do not fit (a table target: types matter).
    for (what, sql, code, hint) in [
        (
            "masks and their clearing",
            r#"SELECT tide.alter_table('pt', 'app.users', masks => '{"name": "null"}', clear_masks => true)"#,
            "22023",
            "not both",
        ),
        (
            "a masked key",
            r#"SELECT tide.alter_table('pt', 'app.users', masks => '{"id": "null"}')"#,
            "22023",
            "key",
        ),
        (
            "a mask on a column the same call leaves out of the list",
            r#"SELECT tide.alter_table('pt', 'app.users', columns => ARRAY['id', 'email'], masks => '{"name": "hash"}')"#,
            "22023",
            "add it to columns",
        ),
        (
            "a list that leaves out a column masked now",
            "SELECT tide.alter_table('pt', 'app.users', columns => ARRAY['id', 'name'])",
            "22023",
            "leaves out a masked column",
        ),
        (
            "an int column newly hashed at a table target",
            r#"SELECT tide.alter_table('pt', 'app.users', masks => '{"email": "hash", "age": "hash"}')"#,
            "0A000",
            "add it again",
        ),
        (
            "a NOT NULL column newly masked with null at a table target",
            r#"SELECT tide.alter_table('pt', 'app.users', masks => '{"email": "hash", "name": "null"}')"#,
            "0A000",
            "constant instead",
        ),
        (
            "an unknown mask",
            r#"SELECT tide.alter_table('pt', 'app.users', masks => '{"name": "rot13"}')"#,
            "22023",
            "masks =>",
        ),
    ] {
        expect_fail_with(what, alice.batch_execute(sql), code, Some(hint));
    }
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(*) FROM tide.tables t JOIN tide.pipeline_table p USING (pipeline, relation)
              WHERE t.masks = '{\"email\": \"hash\"}' AND p.shaping_before IS NULL"
        ),
        3,
        "the refusals changed nothing"
    );
    for p in PIPELINES {
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.pause_pipeline('{p}')"),
        );
    }
    ok(
        &mut alice,
        &c,
        "INSERT INTO app.users VALUES (900001, 'before@clear.example', 'Clearbefore', 1);",
    );
    let new = r#"{"email": {"truncate": 2}, "name": "hash"}"#;
    for p in PIPELINES {
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.alter_table('{p}', 'app.users', masks => '{new}')"),
        );
    }
    ok(
        &mut alice,
        &c,
        "INSERT INTO app.users VALUES (900002, 'after@clear.example', 'Clearafter', 2);
         UPDATE app.users SET email = 'upd' || email, name = name || 'x' WHERE id % 10 = 3;",
    );
    for p in PIPELINES {
        ok(
            &mut alice,
            &c,
            &format!("SELECT tide.resume_pipeline('{p}')"),
        );
    }
    for p in PIPELINES {
        wait_for_pipeline(&c, p, 120, || diag_alter(&c));
        wait_for_backfill(&c, "app.users", Some(p), 120, || diag_alter(&c));
    }
    // Each pipeline's salt (alice owns them all).
    let mut salt = |p: &str| -> String {
        alice
            .query_one(&format!("SELECT encode(tide.mask_salt('{p}'), 'hex')"), &[])
            .expect("mask_salt")
            .get(0)
    };
    let (so, st, sr) = (salt("po"), salt("pt"), salt("pr"));
    let hash = |v: &str| -> String {
        c.query_scalar(&format!(
            "SELECT encode(sha256('\\x{so}'::bytea || convert_to('{v}', 'UTF8')), 'hex')"
        ))
    };
    // The outbox: the schema event, and the rows on either side of it.
    let schema_id: i64 = c.query_scalar(
        "SELECT id FROM tide.outbox WHERE pipeline = 'po' AND op = 'schema' AND (\"row\"->>'altered')::boolean",
    );
    assert_eq!(
        c.query_scalar::<String>(&format!(
            "SELECT (\"row\"->'previous_masks')::text || ' -> ' || (\"row\"->'masks')::text FROM tide.outbox WHERE id = {schema_id}"
        )),
        r#"{"email": "hash"} -> {"name": "hash", "email": "truncate"}"#,
        "the schema event names the masks, by kind"
    );
    let event = |id: i64| -> String {
        c.query_scalar(&format!(
            "SELECT string_agg(CASE WHEN id < {schema_id} THEN '<' ELSE '>' END || (\"row\"->>'email') || ' ' || (\"row\"->>'name'), ',' ORDER BY id)
               FROM tide.outbox WHERE pipeline = 'po' AND backfill_id IS NULL AND key->>'id' = '{id}'"
        ))
    };
    assert_eq!(
        event(900001),
        format!("<{} Clearbefore", hash("before@clear.example")),
        "written before the change: the old masking"
    );
    assert_eq!(
        event(900002),
        format!(">af {}", hash("Clearafter")),
        "written after the change: the new masking"
    );
    // Masked the new way: what every target holds after the re-seed.
    let expected = |salt: &str| {
        format!(
            "(SELECT id, left(email, 2) AS email, encode(sha256('\\x{salt}'::bytea || convert_to(name, 'UTF8')), 'hex') AS name, age FROM app.users) m"
        )
    };
    let cols = "id, email, name, age";
    assert_same_rows("local table", &c, &expected(&st), &c, "copy.users", cols);
    assert_same_rows("remote", &c, &expected(&sr), &t, "public.users", cols);
    c.execute(
        r#"CREATE TABLE app.users_replayed (id int PRIMARY KEY, email text, name text, age int);
           DO $$ DECLARE e record; BEGIN
             FOR e IN SELECT o.op, o.key, o."row" FROM tide.outbox o WHERE o.pipeline = 'po' AND o.relation = 'app.users' ORDER BY o.id LOOP
               IF e.op IN ('read', 'insert', 'update', 'delete') THEN
                 DELETE FROM app.users_replayed WHERE id = (e.key->>'id')::int;
               END IF;
               IF e.op IN ('read', 'insert', 'update') THEN
                 INSERT INTO app.users_replayed SELECT * FROM jsonb_populate_record(NULL::app.users_replayed, e."row");
               END IF;
             END LOOP; END $$;"#,
    );
    assert_same_rows(
        "outbox replayed",
        &c,
        &expected(&so),
        &c,
        "app.users_replayed",
        cols,
    );
    // No clear email anywhere, ever; no clear name in a table target; never the salt.
    let hex_salt = &so;
    assert_no_rows(
        &c,
        "clear emails or the salt in the outbox",
        &format!(
            "SELECT id FROM tide.outbox WHERE pipeline = 'po' AND (\"row\"::text LIKE '%clear.example%' OR \"row\"::text LIKE '%{hex_salt}%')"
        ),
    );
    for (cl, table) in [(&c, "copy.users"), (&t, "public.users")] {
        assert_no_rows(
            cl,
            &format!("clear values in {table}"),
            &format!(
                "SELECT id FROM {table} WHERE email LIKE '%clear.example%' OR name LIKE 'Clear%'"
            ),
        );
    }
    assert_eq!(
        c.query_scalar::<i64>(
            "SELECT count(DISTINCT pipeline) FROM tide.backfill WHERE resync AND state = 'done'"
        ),
        3,
        "one re-seed per pipeline\n{}",
        diag_alter(&c)
    );
}
