//! Schema events: an `ALTER TABLE` of a captured table reaches the target at the position where
//! it takes effect (README, Concepts > Schema changes; Outbox format).
//!
//! - `replay_with_schema_events_equals_the_source`: writers run the whole time; during a
//!   throttled backfill an `ADD COLUMN ... DEFAULT`, a widening without a rewrite (varchar(10) →
//!   varchar(40)), a widening with one (integer → bigint), a `DROP COLUMN`, a transaction with
//!   DML around an `ADD COLUMN`, and one `ALTER TABLE` with two subcommands. A consumer that
//!   replays the outbox following the README's procedure (schema events applied) ends equal to
//!   the source; the same consumer ignoring schema events (adding columns lazily when a row
//!   shows them, as a consumer without them would) differs, which shows the check can fail. No
//!   row event before a schema event carries the added column, and none after it lacks it (an
//!   old-shape chunk cannot be emitted after the change). A table target of the same table gets
//!   the same shape (the dropped column dropped) and the same rows.
//! - `key_change_and_incompatible_type_pause`: a type change that is no widening pauses a table
//!   target with the reason and resumes once the target is fixed; a primary-key change pauses
//!   both an outbox and a table pipeline before the change with the reason and the remedy, and
//!   the remedy (remove, resume, add again) brings the outbox pipeline back, capturing with the
//!   new key.
//! - `owner_ddl_and_uncaptured_ddl`: a non-superuser table owner (a `tide_admin` member) alters
//!   (adds a column, renames one) the table they capture and the schema events reach their
//!   outbox; they cannot write a marker themselves; another role's
//!   `ALTER TABLE` of a table nobody captures works, writes no marker and is not measurably
//!   slower than with the event trigger disabled.

use pg_test::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const ROWS: i64 = 6000;

/// Writers on `src` until `stop`: updates of v, upserts, deletes; and once `note` exists, updates
/// of it (a statement that fails on the current shape is skipped).
fn spawn_writer(c: &Cluster, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    let mut cl = c.client();
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let sql = format!(
                "UPDATE src SET v = v + 1 WHERE id = (SELECT 1 + (random() * {ROWS})::int);
                 INSERT INTO src (id, v) VALUES ((SELECT 1 + (random() * {ROWS} * 1.2)::int), -1)
                        ON CONFLICT (id) DO UPDATE SET v = excluded.v;
                 DELETE FROM src WHERE id = (SELECT 1 + (random() * {ROWS})::int);"
            );
            if cl.batch_execute(&sql).is_ok() {
                n += 1;
            }
            let _ = cl.batch_execute(&format!(
                "UPDATE src SET note = 'w' || v WHERE id = (SELECT 1 + (random() * {ROWS})::int)"
            ));
            std::thread::sleep(Duration::from_millis(10));
        }
        n
    })
}

/// The consumer of the README's "Outbox format" procedure, in SQL: replays pipeline `p`'s
/// events in `id` order onto table `copy` (created with the source's shape when the pipeline
/// started). With `schema_events`, each schema event is applied as documented (renames, drops,
/// type changes, added columns with their existing-row value); without, they are ignored and a
/// column is added (NULL for the rows there) when a row first shows it, as a consumer that does
/// not know of schema events would.
const REPLAY_FN: &str = r#"
CREATE FUNCTION replay(p text, copy text, schema_events boolean) RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE
    e record; x record; n bigint := 0; k text;
BEGIN
    FOR e IN SELECT * FROM tide.outbox WHERE pipeline = p ORDER BY id LOOP
        n := n + 1;
        IF e.op = 'schema' THEN
            CONTINUE WHEN NOT schema_events;
            FOR x IN SELECT * FROM jsonb_to_recordset(e."row"->'renamed') AS r("from" text, "to" text) LOOP
                EXECUTE format('ALTER TABLE %I RENAME COLUMN %I TO %I', copy, x."from", x."to");
            END LOOP;
            FOR x IN SELECT value AS name FROM jsonb_array_elements_text(e."row"->'dropped') LOOP
                EXECUTE format('ALTER TABLE %I DROP COLUMN IF EXISTS %I', copy, x.name);
            END LOOP;
            FOR x IN SELECT * FROM jsonb_to_recordset(e."row"->'changed') AS r(name text, "to" text) LOOP
                EXECUTE format('ALTER TABLE %I ALTER COLUMN %I TYPE %s USING %I::%s', copy, x.name, x."to", x.name, x."to");
            END LOOP;
            FOR x IN SELECT * FROM jsonb_to_recordset(e."row"->'added') AS r(name text, type text, value text) LOOP
                IF x.value IS NULL THEN
                    EXECUTE format('ALTER TABLE %I ADD COLUMN %I %s', copy, x.name, x.type);
                ELSE
                    EXECUTE format('ALTER TABLE %I ADD COLUMN %I %s DEFAULT %L::%s', copy, x.name, x.type, x.value, x.type);
                    EXECUTE format('ALTER TABLE %I ALTER COLUMN %I DROP DEFAULT', copy, x.name);
                END IF;
            END LOOP;
        ELSIF e.op = 'truncate' THEN
            EXECUTE format('TRUNCATE %I', copy);
        ELSIF e.op = 'delete' THEN
            EXECUTE format('DELETE FROM %I WHERE id = ($1->>''id'')::int', copy) USING e.key;
        ELSE
            IF NOT schema_events THEN
                FOR k IN SELECT jsonb_object_keys(e."row") LOOP
                    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = copy::regclass AND attname = k AND NOT attisdropped) THEN
                        EXECUTE format('ALTER TABLE %I ADD COLUMN %I %s', copy, k,
                            (SELECT format_type(atttypid, atttypmod) FROM pg_attribute
                              WHERE attrelid = 'src'::regclass AND attname = k AND NOT attisdropped));
                    END IF;
                END LOOP;
            END IF;
            BEGIN
                EXECUTE format('DELETE FROM %I WHERE id = ($1->>''id'')::int', copy) USING e.key;
                EXECUTE format('INSERT INTO %I SELECT * FROM jsonb_populate_record(NULL::%I, $1)', copy, copy) USING e."row";
            EXCEPTION WHEN others THEN
                -- (a value the unwidened copy cannot hold: lost, as such a consumer would lose it)
                IF schema_events THEN RAISE; END IF;
            END;
        END IF;
    END LOOP;
    RETURN n;
END
$f$;
"#;

/// Rows of `a` not in `b` and of `b` not in `a`, over `cols`.
fn difference(c: &Cluster, a: &str, b: &str, cols: &str) -> (i64, i64) {
    let r = c.query_one(&format!(
        "SELECT (SELECT count(*) FROM (SELECT {cols} FROM {a} EXCEPT ALL SELECT {cols} FROM {b}) x),
                (SELECT count(*) FROM (SELECT {cols} FROM {b} EXCEPT ALL SELECT {cols} FROM {a}) y)"
    ));
    (r.get(0), r.get(1))
}

fn columns_of(c: &Cluster, table: &str) -> Vec<String> {
    texts(
        c,
        &format!(
            "SELECT attname || ' ' || format_type(atttypid, atttypmod) FROM pg_attribute
              WHERE attrelid = '{table}'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ),
    )
}

/// Everything committed so far is at pipeline `p`'s target: `tide.wait_for_pipeline`, which also
/// waits for the backfill a table rewrite queued (the slot's confirmed position passes the
/// rewrite long before its rows arrive: issue 30).
fn wait_caught_up(c: &Cluster, p: &str) {
    wait_for_pipeline(c, p, 120, || diag(c));
}

fn wait_backfills_done(c: &Cluster) {
    if let Err(m) = poll_every(Duration::from_secs(180), Duration::from_millis(200), || {
        Ok(c.try_query_scalar::<i64>(
            "SELECT count(*) FROM tide.backfills WHERE state IN ('queued', 'running', 'paused')",
        )? == 0)
    }) {
        panic!("backfills did not finish: {m}\n{}", diag(c));
    }
}

fn wait_chunks(c: &Cluster, n: i64) {
    if let Err(m) = poll_every(Duration::from_secs(60), Duration::from_millis(50), || {
        Ok(c.try_query_scalar::<i64>(
            "SELECT coalesce(min(chunks_done), 0)::int8 FROM tide.backfills WHERE state = 'running'",
        )? >= n)
    }) {
        panic!("backfills did not reach {n} chunks: {m}\n{}", diag(c));
    }
}

#[test]
fn replay_with_schema_events_equals_the_source() {
    let t0 = Instant::now();
    let c = setup("schema_events_replay");
    c.execute(&format!(
        "CREATE TABLE src (id int PRIMARY KEY, v integer NOT NULL, code varchar(10), pad text);
         INSERT INTO src SELECT g, g % 1000, 'c' || (g % 100), repeat('p', 20) FROM generate_series(1, {ROWS}) g;
         ANALYZE src;
         CREATE TABLE copy_with (LIKE src INCLUDING ALL);
         CREATE TABLE copy_without (LIKE src INCLUDING ALL);"
    ));
    c.execute(REPLAY_FN);
    create_pipeline(&c, "ob", "outbox", "{}");
    create_pipeline(&c, "tt", "table", r#"{"schema": "rep"}"#);
    exec(&c, "SELECT tide.add_table('ob', 'src', backfill => false)");
    exec(&c, "SELECT tide.add_table('tt', 'src', backfill => false)");
    wait_pipeline(&c, "ob", 30);
    wait_pipeline(&c, "tt", 30);

    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&c, stop.clone());
    // About 6 s per backfill: the DDL lands in the middle of it.
    exec(
        &c,
        "BEGIN;
         SELECT tide.start_backfill('src', 'ob', chunk_size => 200);
         SELECT tide.alter_backfill('src', 'ob', rows_per_second => 1000);
         SELECT tide.start_backfill('src', 'tt', chunk_size => 200);
         SELECT tide.alter_backfill('src', 'tt', rows_per_second => 1000);
         COMMIT;",
    );
    wait_chunks(&c, 3);
    let pause = || std::thread::sleep(Duration::from_millis(700));
    exec(&c, "ALTER TABLE src ADD COLUMN note text DEFAULT 'x'");
    pause();
    exec(&c, "ALTER TABLE src ALTER COLUMN code TYPE varchar(40)");
    pause();
    exec(&c, "ALTER TABLE src DROP COLUMN pad");
    pause();
    // DML before and after the DDL in one transaction: each lands on its side of the change.
    exec(
        &c,
        "BEGIN;
         UPDATE src SET v = v + 100000 WHERE id <= 20;
         ALTER TABLE src ADD COLUMN flag int DEFAULT 7;
         UPDATE src SET flag = 8 WHERE id <= 10;
         -- a second ALTER TABLE that changes no column: no schema event
         ALTER TABLE src ALTER COLUMN flag SET DEFAULT 9;
         COMMIT;",
    );
    pause();
    // Two subcommands in one statement: one schema event.
    exec(
        &c,
        "ALTER TABLE src ADD COLUMN a2 int DEFAULT 1, ADD COLUMN b2 text",
    );
    pause();
    // A widening that rewrites the table: it is read again.
    exec(&c, "ALTER TABLE src ALTER COLUMN v TYPE bigint");
    pause();
    exec(
        &c,
        "UPDATE src SET code = repeat('z', 30) WHERE id % 500 = 0",
    );
    pause();
    stop.store(true, Ordering::SeqCst);
    let writes = writer.join().expect("writer");
    assert!(writes > 50, "the writer ran only {writes} rounds");
    wait_backfills_done(&c);
    wait_caught_up(&c, "ob");
    wait_caught_up(&c, "tt");

    let cols = "id, v, code, note, flag, a2, b2";
    c.query_scalar::<i64>("SELECT replay('ob', 'copy_with', true)");
    c.query_scalar::<i64>("SELECT replay('ob', 'copy_without', false)");
    let (missing, extra) = difference(&c, "src", "copy_with", cols);
    assert_eq!(
        (missing, extra),
        (0, 0),
        "the replay that applies schema events differs from the source\n{}",
        diag(&c)
    );
    assert_eq!(columns_of(&c, "copy_with"), columns_of(&c, "src"));
    let (missing, extra) = difference(&c, "src", "copy_without", cols);
    assert!(
        missing > 0 && extra > 0,
        "a replay that ignores schema events should differ from the source (missing {missing}, extra {extra})"
    );

    // The schema events: one per ALTER TABLE statement, with what it changed.
    let events = texts(
        &c,
        "SELECT jsonb_build_object('added', \"row\"->'added', 'dropped', \"row\"->'dropped',
                                   'changed', \"row\"->'changed', 'rewrite', \"row\"->'rewrite',
                                   'key', \"row\"->'key')::text
           FROM tide.outbox WHERE pipeline = 'ob' AND op = 'schema' ORDER BY id",
    );
    let expected = [
        r#"{"key": ["id"], "added": [{"name": "note", "type": "text", "value": "x"}], "changed": [], "dropped": [], "rewrite": false}"#,
        r#"{"key": ["id"], "added": [], "changed": [{"to": "character varying(40)", "from": "character varying(10)", "name": "code"}], "dropped": [], "rewrite": false}"#,
        r#"{"key": ["id"], "added": [], "changed": [], "dropped": ["pad"], "rewrite": false}"#,
        r#"{"key": ["id"], "added": [{"name": "flag", "type": "integer", "value": "7"}], "changed": [], "dropped": [], "rewrite": false}"#,
        r#"{"key": ["id"], "added": [{"name": "a2", "type": "integer", "value": "1"}, {"name": "b2", "type": "text", "value": null}], "changed": [], "dropped": [], "rewrite": false}"#,
        r#"{"key": ["id"], "added": [], "changed": [{"to": "bigint", "from": "integer", "name": "v"}], "dropped": [], "rewrite": true}"#,
    ];
    assert_eq!(events, expected, "{}", diag(&c));
    // Position: no row event before the ADD COLUMN note carries note, none after lacks it.
    let misplaced: i64 = c.query_scalar(
        "WITH s AS (SELECT min(id) AS id FROM tide.outbox WHERE pipeline = 'ob' AND op = 'schema')
         SELECT count(*) FROM tide.outbox o, s
          WHERE o.pipeline = 'ob' AND o.op IN ('insert', 'update', 'read')
            AND ((o.id < s.id AND o.\"row\" ? 'note') OR (o.id > s.id AND NOT o.\"row\" ? 'note'))",
    );
    assert_eq!(
        misplaced,
        0,
        "row events on the wrong side of the schema event\n{}",
        diag(&c)
    );
    let reads_after: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE pipeline = 'ob' AND op = 'read'
            AND id > (SELECT min(id) FROM tide.outbox WHERE pipeline = 'ob' AND op = 'schema')",
    );
    assert!(
        reads_after > 0,
        "no backfill row was emitted after the first schema event"
    );

    // The table target: same shape (pad dropped, types widened), same rows.
    assert_eq!(
        columns_of(&c, "rep.src"),
        columns_of(&c, "src"),
        "{}",
        diag(&c)
    );
    let (missing, extra) = difference(&c, "src", "rep.src", cols);
    assert_eq!(
        (missing, extra),
        (0, 0),
        "the table target differs\n{}",
        diag(&c)
    );
    eprintln!(
        "replay_with_schema_events_equals_the_source: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

fn pipeline_state(c: &Cluster, p: &str) -> (bool, Option<String>, Option<String>) {
    let r = c.query_one(&format!(
        "SELECT enabled, last_error, remedy FROM tide.pipelines WHERE name = '{p}'"
    ));
    (r.get(0), r.get(1), r.get(2))
}

fn wait_paused(c: &Cluster, p: &str) -> (Option<String>, Option<String>) {
    if let Err(m) = poll_every(Duration::from_secs(60), Duration::from_millis(100), || {
        Ok(c.try_query_scalar::<bool>(&format!(
            "SELECT NOT enabled AND last_error IS NOT NULL FROM tide.pipelines WHERE name = '{p}'"
        ))?)
    }) {
        panic!("pipeline {p} did not pause: {m}\n{}", diag(c));
    }
    let (_, e, r) = pipeline_state(c, p);
    (e, r)
}

#[test]
fn key_change_and_incompatible_type_pause() {
    let c = setup("schema_events_pause");
    c.execute(
        "CREATE TABLE t2 (id int PRIMARY KEY, v int NOT NULL, w int);
         INSERT INTO t2 SELECT g, g, g FROM generate_series(1, 500) g;",
    );
    create_pipeline(&c, "ob", "outbox", "{}");
    create_pipeline(&c, "tt", "table", r#"{"schema": "rep"}"#);
    exec(&c, "SELECT tide.add_table('ob', 't2')");
    exec(&c, "SELECT tide.add_table('tt', 't2')");
    wait_backfill(&c, "t2", "ob", 60);
    wait_backfill(&c, "t2", "tt", 60);

    // A type change that is no widening: the table target pauses before it; the outbox
    // describes it and goes on.
    exec(&c, "ALTER TABLE t2 ALTER COLUMN w TYPE text USING 'w' || w");
    exec(&c, "UPDATE t2 SET w = 'new' WHERE id <= 5");
    let (err, remedy) = wait_paused(&c, "tt");
    let err = err.unwrap_or_default();
    assert!(err.contains("not a safe widening"), "reason: {err}");
    assert!(
        remedy.unwrap_or_default().contains("resume_pipeline"),
        "{}",
        diag(&c)
    );
    wait_caught_up(&c, "ob");
    assert!(
        pipeline_state(&c, "ob").0,
        "the outbox pipeline paused\n{}",
        diag(&c)
    );
    // Fixed by hand, resumed: it goes on from the same place.
    exec(&c, "ALTER TABLE rep.t2 ALTER COLUMN w TYPE text");
    exec(&c, "SELECT tide.resume_pipeline('tt')");
    // (Issue 30: waiting for no active backfill and for the slot's confirmed position was not
    // enough: the rewrite's backfill may not be queued yet when the first check runs, and the
    // slot passes the rewrite long before its rows arrive. wait_for_pipeline waits for that
    // backfill, wait_for_backfill for everything committed before it was called.)
    wait_for_pipeline(&c, "tt", 120, || diag(&c));
    wait_for_backfill(&c, "t2", Some("tt"), 120, || diag(&c));
    let (m, x) = difference(&c, "t2", "rep.t2", "id, v, w");
    assert_eq!((m, x), (0, 0), "{}", diag(&c));

    // A primary-key change pauses both, before the change, with the reason and the remedy.
    exec(
        &c,
        "ALTER TABLE t2 DROP CONSTRAINT t2_pkey, ADD PRIMARY KEY (id, v)",
    );
    exec(&c, "UPDATE t2 SET w = 'after key' WHERE id <= 3");
    for p in ["ob", "tt"] {
        let (err, remedy) = wait_paused(&c, p);
        let err = err.unwrap_or_default();
        assert!(
            err.contains("key of public.t2 changed from (id) to (id, v)"),
            "{p}: {err}"
        );
        let remedy = remedy.unwrap_or_default();
        assert!(
            remedy.contains("tide.remove_table('") && remedy.contains("tide.add_table('"),
            "{p}: {remedy}"
        );
    }
    let after_key: i64 = c.query_scalar(
        "SELECT count(*) FROM tide.outbox WHERE pipeline = 'ob' AND (\"row\"->>'w') = 'after key'",
    );
    assert_eq!(after_key, 0, "an event after the key change was written");
    // Resuming alone pauses again at the same place (never a crash loop, never past it).
    exec(&c, "SELECT tide.resume_pipeline('ob')");
    std::thread::sleep(Duration::from_secs(2));
    wait_paused(&c, "ob");
    // The remedy: remove, resume, add again. The schema event is written, the table's changes
    // stop at it, and it is captured and backfilled again with its new key.
    exec(&c, "SELECT tide.remove_table('ob', 't2')");
    exec(&c, "SELECT tide.resume_pipeline('ob')");
    if let Err(m) = poll_every(Duration::from_secs(60), Duration::from_millis(100), || {
        Ok(
            c.try_query_scalar::<i64>("SELECT count(*) FROM tide.tables WHERE pipeline = 'ob'")?
                == 0,
        )
    }) {
        panic!("t2 was not removed: {m}\n{}", diag(&c));
    }
    let key_event: String = c.query_scalar(
        "SELECT (\"row\"->'key')::text FROM tide.outbox WHERE pipeline = 'ob' AND op = 'schema' ORDER BY id DESC LIMIT 1",
    );
    assert_eq!(key_event, r#"["id", "v"]"#);
    exec(&c, "SELECT tide.add_table('ob', 't2')");
    wait_backfill(&c, "t2", "ob", 60);
    exec(&c, "UPDATE t2 SET w = 'readded' WHERE id = 1");
    wait_caught_up(&c, "ob");
    let key: String = c.query_scalar(
        "SELECT key::text FROM tide.outbox WHERE pipeline = 'ob' AND (\"row\"->>'w') = 'readded'",
    );
    assert_eq!(key, r#"{"v": 1, "id": 1}"#, "{}", diag(&c));
    assert!(pipeline_state(&c, "ob").0);
}

#[test]
fn owner_ddl_and_uncaptured_ddl() {
    let c = setup("schema_events_roles");
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice; GRANT CREATE ON SCHEMA public TO alice;
         CREATE ROLE bob LOGIN; GRANT CREATE ON SCHEMA public TO bob;",
    );
    let mut alice = connect_as(&c, "alice");
    alice
        .batch_execute(
            "CREATE TABLE alice_t (id int PRIMARY KEY, v int);
             INSERT INTO alice_t SELECT g, g FROM generate_series(1, 100) g;",
        )
        .unwrap_or_else(|e| panic!("{}", describe_error(&e)));
    alice
        .batch_execute("SELECT tide.create_pipeline('ap', 'outbox', '{}')")
        .unwrap_or_else(|e| panic!("{}", describe_error(&e)));
    wait_streaming(&c, "ap", Duration::from_secs(30));
    alice
        .batch_execute("SELECT tide.add_table('ap', 'alice_t')")
        .unwrap_or_else(|e| panic!("{}", describe_error(&e)));
    wait_backfill(&c, "alice_t", "ap", 60);
    alice
        .batch_execute("ALTER TABLE alice_t ADD COLUMN note text DEFAULT 'hello'")
        .unwrap_or_else(|e| panic!("alice's ALTER TABLE failed: {}", describe_error(&e)));
    wait_caught_up(&c, "ap");
    let added: String = alice
        .query_one(
            "SELECT (\"row\"->'added')::text FROM tide.outbox WHERE pipeline = 'ap' AND op = 'schema'",
            &[],
        )
        .unwrap_or_else(|e| panic!("{}", describe_error(&e)))
        .get(0);
    assert_eq!(
        added,
        r#"[{"name": "note", "type": "text", "value": "hello"}]"#
    );
    alice
        .batch_execute("ALTER TABLE alice_t RENAME COLUMN v TO value")
        .unwrap_or_else(|e| panic!("alice's RENAME failed: {}", describe_error(&e)));
    wait_caught_up(&c, "ap");
    let renamed: String = alice
        .query_one(
            "SELECT (\"row\"->'renamed')::text FROM tide.outbox WHERE pipeline = 'ap' AND op = 'schema' ORDER BY id DESC LIMIT 1",
            &[],
        )
        .unwrap_or_else(|e| panic!("{}", describe_error(&e)))
        .get(0);
    assert_eq!(renamed, r#"[{"to": "value", "from": "v"}]"#);
    // alice cannot write a marker herself.
    let e = alice
        .batch_execute("INSERT INTO tide.marker (pipeline, op, relid, payload) VALUES ('ap', 'schema', 'alice_t'::regclass, '{}')")
        .expect_err("alice wrote a marker");
    assert_db_error(&e, "42501", None);

    // bob's table is captured by nobody: his DDL works, writes no marker, and costs about what
    // it costs without the event trigger.
    let mut bob = connect_as(&c, "bob");
    bob.batch_execute("CREATE TABLE bob_t (id int PRIMARY KEY)")
        .unwrap_or_else(|e| panic!("{}", describe_error(&e)));
    let run = |bob: &mut postgres::Client| {
        let t = Instant::now();
        for i in 0..100 {
            bob.batch_execute(&format!(
                "ALTER TABLE bob_t ADD COLUMN c{i} int DEFAULT {i}; ALTER TABLE bob_t DROP COLUMN c{i}"
            ))
            .unwrap_or_else(|e| panic!("bob's ALTER TABLE failed: {}", describe_error(&e)));
        }
        t.elapsed()
    };
    let with = run(&mut bob);
    c.execute("ALTER EVENT TRIGGER tide_schema_changes DISABLE");
    let without = run(&mut bob);
    c.execute("ALTER EVENT TRIGGER tide_schema_changes ENABLE");
    let with2 = run(&mut bob);
    let best = with.min(with2);
    eprintln!("200 ALTER TABLE of an uncaptured table: {with:?} / {with2:?} with the event trigger, {without:?} without");
    assert!(
        best.as_secs_f64() <= without.as_secs_f64() * 1.5 + 0.5,
        "DDL on an uncaptured table is slower with the event trigger: {best:?} against {without:?}"
    );
    // No schema event but alice's two: nothing was written for bob's table.
    let schema_events: i64 = c.query_scalar("SELECT count(*) FROM tide.outbox WHERE op = 'schema'");
    assert_eq!(schema_events, 2, "{}", diag(&c));
}
