//! Backfill chunks reach a remote (`postgres`) target by COPY: the chunk's columns as their text
//! output, `COPY ... FROM STDIN` straight into the table when it holds none of the chunk's keys,
//! else into a temporary staging table and one upsert from it, in the batch's remote
//! transaction; when the target table has the chunk's columns with the source's types. Values
//! arrive exactly (no JSON in between), a crash between the COPY and the remote commit of a
//! chunk loses and duplicates nothing (either way), and it works as ordinary roles on both
//! sides (the remote role needs the TEMPORARY privilege for the staging table only). A table
//! added while the worker's iteration is under way gets COPY too, not text events.

use crate::common::*;
use std::time::{Duration, Instant};

/// Values that JSON cannot carry to a table target, and values that need COPY's escapes, reach
/// a remote target exactly through the backfill. A JSON path fails this test: a JSON `null` in
/// a json or jsonb column arrives as SQL NULL (`json_populate_recordset`), and a top-level JSON
/// string in a json column arrives re-escaped (`"str\u00e9"` as `"stré"`). Stream writes during
/// the backfill touch other rows, so the rows that carry the tricky values are the backfill's.
#[test]
fn chunks_reach_remote_targets_exactly_by_copy() {
    let (c, t) = setup_remote("tt_rcopy");
    // Each tricky value once per row kind, in every text-like column; the rest of the rows plain.
    let texts = [
        "tab\there",
        "new\nline",
        "cr\r\nlf",
        "back\\slash",
        "\\N",
        "\\.",
        "",
        "\\",
        "\\t literally",
        "trailing tab\t",
        "é ünïcode ✓",
    ];
    let jsons = [
        "null",
        r#"{"b": 1,  "a": [1, 2.50]}"#,
        r#"{"a":1,"a":2}"#,
        r#""str\u00e9""#,
        "[1, 2.50,\n\t 3e2]",
        r#"{"s": "tab\tnew\nline \\ back"}"#,
        r#""\\N""#,
    ];
    c.execute(
        "CREATE TABLE rc (id int PRIMARY KEY, j jsonb, k json, s text, v varchar(40), b bytea,
                          a text[], n numeric(12,3), ts timestamptz, i interval, note text)",
    );
    let lit = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let mut id = 0;
    for s in texts.iter().map(|s| Some(*s)).chain([None]) {
        for j in jsons.iter().map(|j| Some(*j)).chain([None]) {
            id += 1;
            let sv = s.map_or("NULL".to_string(), lit);
            let jv = j.map_or("NULL".to_string(), lit);
            c.execute(&format!(
                "INSERT INTO rc VALUES ({id}, {jv}::jsonb, {jv}::json, {sv}, left({sv}, 40),
                                        convert_to(coalesce({sv}, ''), 'UTF8'),
                                        ARRAY[{sv}, 'x,y', NULL, '\"q\"'], {id} / 7.0,
                                        timestamptz '2024-02-29 23:59:59.123456+05:30' + {id} * interval '1 s',
                                        interval '1 day 02:03:04.5' * {id}, 'plain')"
            ));
        }
    }
    let tricky = id;
    c.execute(
        "INSERT INTO rc (id, s, note) SELECT g, 'row ' || g, 'plain' FROM generate_series(1000, 4999) g",
    );
    create_pipeline(&c, "rc", "postgres", r#"{"server": "tgt"}"#);
    exec(&c, "SELECT tide.add_table('rc', 'rc', backfill => false)");
    exec(
        &c,
        "SELECT tide.start_backfill('rc', 'rc', chunk_size => 500)",
    );
    // Stream writes on the plain rows while the chunks are read.
    for round in 0..5 {
        c.execute(&format!(
            "UPDATE rc SET note = 'upd {round}' WHERE id >= 1000 AND id % 37 = {round};
             DELETE FROM rc WHERE id >= 1000 AND id % 41 = {round};
             INSERT INTO rc (id, s, note) VALUES (6000 + {round}, E'stream\\t{round}', 'ins')"
        ));
    }
    wait_backfill(&c, "rc", "rc", 120);
    wait_pipeline(&c, "rc", 60);

    // Every column's text exactly, both ways.
    let all = "id, j::text, k::text, s, v, b, a, n, ts, i, note";
    assert_same_rows("remote copy", &c, "public.rc", &t, "public.rc", all);
    // What only the COPY path gets right (the JSON path fails each of these).
    let count = |cl: &Cluster, cond: &str| -> i64 {
        cl.query_scalar(&format!(
            "SELECT count(*) FROM public.rc WHERE id <= {tricky} AND {cond}"
        ))
    };
    let json_nulls = count(&c, "j = 'null'::jsonb");
    assert_eq!(
        json_nulls,
        texts.len() as i64 + 1,
        "the source's JSON nulls"
    );
    assert_eq!(
        count(&t, "j = 'null'::jsonb"),
        json_nulls,
        "jsonb null arrives as JSON null\n{}",
        sample(
            &t,
            &format!("SELECT id, j, k FROM rc WHERE id <= {tricky} AND j IS NULL"),
            5
        )
    );
    assert_eq!(
        count(&t, "k::text = 'null'"),
        json_nulls,
        "json null arrives as JSON null"
    );
    assert_eq!(
        count(&t, r#"k::text = '"str\u00e9"'"#),
        texts.len() as i64 + 1,
        "a top-level json string keeps its text"
    );
    assert_eq!(count(&t, "s = '\\N'"), 1 + jsons.len() as i64);
    assert_eq!(count(&t, "s = ''"), 1 + jsons.len() as i64);
    assert_eq!(count(&t, "s IS NULL"), 1 + jsons.len() as i64);
    let backfilled: i64 = c.query_scalar(
        "SELECT rows_emitted::int8 FROM tide.backfills WHERE pipeline = 'rc' AND source = 'rc'::regclass",
    );
    assert!(
        backfilled >= tricky as i64,
        "the backfill emitted {backfilled} rows"
    );
}

/// kill -9 of the worker while a chunk's rows are at the remote, loaded by COPY and not yet
/// committed: the remote transaction rolls back (its client is gone), the chunk is read again
/// under new watermarks, and every row is written exactly once in what the target committed
/// (an audit trigger on the target counts the writes). Once with the target empty (the chunk
/// goes straight into the table: the stall is in the COPY's statement trigger), once with a row
/// of the chunk's range already there (through the staging table: the stall is in the upsert
/// from it). The window is made deterministic: a statement trigger on the target sleeps 8 s the
/// first time a statement inserts the chunk's rows (a sequence, which rollback does not undo,
/// says which time), and the test waits until pg_stat_activity on the target shows the
/// statement sleeping in that trigger.
fn kill_between_copy_and_remote_commit(straight: bool) {
    const ROWS: i64 = 30_000;
    let p = if straight { "rk" } else { "rks" };
    let (c, t) = setup_remote(if straight {
        "tt_rcopy_kill"
    } else {
        "tt_rcopy_kills"
    });
    c.execute(&format!(
        "CREATE TABLE big (id int PRIMARY KEY, v text NOT NULL, pad text);
         INSERT INTO big SELECT g, md5(g::text), repeat(E'p\\t', 20) FROM generate_series(1, {ROWS}) g;"
    ));
    t.execute("CREATE TABLE big (id int PRIMARY KEY, v text NOT NULL, pad text)");
    if !straight {
        // Before the audit trigger: a stale row in the chunk's range, which the upsert updates.
        t.execute("INSERT INTO big VALUES (15000, 'stale', NULL)");
    }
    t.execute(
        "CREATE TABLE write_log (seq bigserial PRIMARY KEY, id int NOT NULL);
         CREATE SEQUENCE stalls;
         CREATE FUNCTION log_write() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO write_log (id) VALUES (NEW.id); RETURN NULL; END $$;
         CREATE FUNCTION stall_once() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF (SELECT count(*) FROM new_rows) > 1000 AND nextval('stalls') = 1 THEN
                 PERFORM pg_sleep(8);
             END IF;
             RETURN NULL;
         END $$;
         CREATE TRIGGER big_log AFTER INSERT OR UPDATE ON big FOR EACH ROW EXECUTE FUNCTION log_write();
         CREATE TRIGGER big_stall AFTER INSERT ON big REFERENCING NEW TABLE AS new_rows
             FOR EACH STATEMENT EXECUTE FUNCTION stall_once();",
    );
    create_pipeline(&c, p, "postgres", r#"{"server": "tgt"}"#);
    exec(
        &c,
        &format!("SELECT tide.add_table('{p}', 'big', backfill => false)"),
    );
    exec(
        &c,
        &format!("SELECT tide.start_backfill('big', '{p}', chunk_size => {ROWS})"),
    );
    // The chunk's load, stalled in the trigger (the rows are in, uncommitted).
    let statement = if straight {
        "COPY public.big %"
    } else {
        "INSERT INTO public.big %FROM pg_temp.tide_stage%"
    };
    let started = Instant::now();
    let in_window = format!(
        "SELECT count(*) FROM pg_stat_activity
          WHERE application_name = 'pg_tide {p}' AND state = 'active'
            AND query LIKE '{statement}' AND wait_event = 'PgSleep'"
    );
    if let Err(msg) = poll_every(Duration::from_secs(60), Duration::from_millis(20), || {
        Ok(t.try_query_scalar::<i64>(&in_window)? == 1)
    }) {
        panic!(
            "the chunk's load never stalled: {msg}\n{}\ntarget activity:\n{}",
            diag(&c),
            sample(&t, "SELECT application_name, state, wait_event, left(query, 120) FROM pg_stat_activity", 20)
        );
    }
    let staged: i64 = t.query_scalar("SELECT count(*) FROM write_log");
    let victim = worker_pid(&c, p).unwrap_or_else(|| panic!("no worker\n{}", diag(&c)));
    kill9(victim);
    eprintln!(
        "remote copy kill ({}): worker {victim} killed {:.1?} after the backfill started, while the chunk's load ran at the target ({staged} rows logged, uncommitted)",
        if straight { "straight" } else { "staged" },
        started.elapsed()
    );
    // Nothing of the chunk was committed.
    assert_eq!(
        t.query_scalar::<i64>("SELECT count(*) FROM big"),
        if straight { 0 } else { 1 },
        "the target committed rows of the chunk before its remote commit"
    );
    wait_recovered(&c, p, Some(victim), Duration::from_secs(60), || diag(&c));
    wait_backfill(&c, "big", p, 120);
    wait_pipeline(&c, p, 60);
    assert_same_rows(
        "after the kill",
        &c,
        "public.big",
        &t,
        "public.big",
        "id, v, pad",
    );
    let (writes, keys, max_per_key): (i64, i64, i64) = {
        let r = t.query_one(
            "SELECT count(*), count(DISTINCT id), coalesce(max(n), 0)
               FROM (SELECT id, count(*) OVER (PARTITION BY id) AS n FROM write_log) w",
        );
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(keys, ROWS, "every row reached the target");
    assert_eq!(
        (writes, max_per_key),
        (ROWS, 1),
        "each row was written exactly once in what the target committed"
    );
    assert_eq!(
        t.query_scalar::<i64>("SELECT last_value FROM stalls"),
        2,
        "the chunk's load ran twice (the first, rolled back, stalled)"
    );
    let (chunks, emitted): (i64, i64) = {
        let r = c.query_one(&format!(
            "SELECT chunks_done::int8, rows_emitted::int8 FROM tide.backfills WHERE pipeline = '{p}'"
        ));
        (r.get(0), r.get(1))
    };
    assert_eq!(
        (chunks, emitted),
        (2, ROWS),
        "one full chunk and the empty last one"
    );
}

#[test]
fn kill_between_copy_and_remote_commit_straight() {
    kill_between_copy_and_remote_commit(true);
}

#[test]
fn kill_between_copy_and_remote_commit_staged() {
    kill_between_copy_and_remote_commit(false);
}

/// As ordinary roles on both sides: the pipeline is owned by `alice` (a member of `tide_admin`
/// only) and reaches the target as `rem` (LOGIN, no other attribute; the target trusts it, so
/// the superuser's mapping for alice waives the password: `password_required 'false'`), which may not create
/// temporary tables. A chunk whose key range is empty at the target goes straight into the
/// table and needs no temporary table. One whose range holds a row (streamed before the
/// backfill) needs the staging table: without `rem`'s TEMPORARY privilege on the target
/// database it fails with the remote's permission error, shown in `tide.pipelines`, and nothing
/// of it is written; once it is granted the worker retries by itself and the backfill arrives
/// by COPY (JSON nulls kept).
#[test]
fn ordinary_roles_and_the_staging_tables_temporary_privilege() {
    let (c, t) = setup_remote("tt_rcopy_roles");
    t.execute(
        "CREATE ROLE rem LOGIN;
         CREATE SCHEMA rem_s AUTHORIZATION rem;
         GRANT CREATE ON DATABASE postgres TO rem;
         REVOKE TEMPORARY ON DATABASE postgres FROM PUBLIC;",
    );
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE SCHEMA alice AUTHORIZATION alice;
         GRANT USAGE ON FOREIGN SERVER tgt TO alice;
         CREATE USER MAPPING FOR alice SERVER tgt OPTIONS (user 'rem', password_required 'false');",
    );
    let mut alice = connect_as(&c, "alice");
    let mut as_alice = |sql: &str| {
        alice
            .batch_execute(sql)
            .unwrap_or_else(|e| panic!("as alice: {}", describe_error(&e)))
    };
    as_alice(
        "CREATE TABLE alice.d (id int PRIMARY KEY, j jsonb, s text);
         INSERT INTO alice.d SELECT g, CASE WHEN g % 2 = 0 THEN 'null'::jsonb END, E'a\\tb' || g
           FROM generate_series(1, 3000) g;
         CREATE TABLE alice.e (id int PRIMARY KEY, s text);
         INSERT INTO alice.e SELECT g, 'e' || g FROM generate_series(1, 2000) g;",
    );
    as_alice(
        r#"SELECT tide.create_pipeline('ap', 'postgres', '{"server": "tgt", "schema": "rem_s"}')"#,
    );
    wait_streaming(&c, "ap", Duration::from_secs(30));
    // An empty target: straight in, no temporary table needed.
    as_alice("SELECT tide.add_table('ap', 'alice.e')");
    wait_backfill(&c, "alice.e", "ap", 120);
    assert_same_rows("straight", &c, "alice.e", &t, "rem_s.e", "id, s");
    // A row streamed before the backfill: the first chunk needs the staging table.
    as_alice("SELECT tide.add_table('ap', 'alice.d', backfill => false)");
    as_alice("UPDATE alice.d SET s = 'streamed' WHERE id = 10");
    wait_pipeline(&c, "ap", 60);
    assert_eq!(t.query_scalar::<i64>("SELECT count(*) FROM rem_s.d"), 1);
    as_alice("SELECT tide.start_backfill('alice.d', 'ap')");
    if let Err(msg) = poll_every(Duration::from_secs(60), Duration::from_millis(100), || {
        Ok(c.try_query_scalar::<bool>(
            "SELECT coalesce((SELECT state = 'failed' AND error LIKE '%permission denied%'
                                FROM tide.backfills WHERE source = 'alice.d'::regclass), false)",
        )?)
    }) {
        panic!(
            "the backfill did not fail with the remote's permission error: {msg}\n{}",
            diag(&c)
        );
    }
    assert_eq!(
        t.query_scalar::<i64>("SELECT count(*) FROM rem_s.d"),
        1,
        "nothing of the failed chunk was written"
    );
    let who: Vec<String> = texts(
        &t,
        "SELECT DISTINCT usename::text FROM pg_stat_activity WHERE application_name = 'pg_tide ap'",
    );
    assert_eq!(who, vec!["rem".to_string()], "the target is reached as rem");
    t.execute("GRANT TEMPORARY ON DATABASE postgres TO rem");
    as_alice("SELECT tide.resume_backfill('alice.d', 'ap')");
    wait_backfill(&c, "alice.d", "ap", 120);
    wait_pipeline(&c, "ap", 60);
    assert_same_rows(
        "as ordinary roles",
        &c,
        "alice.d",
        &t,
        "rem_s.d",
        "id, j::text, s",
    );
    assert_eq!(
        t.query_scalar::<i64>("SELECT count(*) FROM rem_s.d WHERE j = 'null'::jsonb"),
        1500,
        "the JSON nulls arrived by COPY"
    );
    assert_eq!(
        texts(
            &c,
            "SELECT DISTINCT written_as FROM tide.chunks WHERE pipeline = 'ap' AND written_as IS NOT NULL"
        ),
        vec!["copy".to_string()]
    );
}

/// A table added while the worker's iteration is under way is backfilled by COPY, every chunk
/// (issue 35: B1's remote target ran at half speed in some runs). The iteration reads its target
/// tables first, then decodes up to the WAL's end: an `add_table` that commits in between is
/// decoded in that iteration (its backfill becomes due) while the target did not yet know the
/// table, and the first chunk is read before the next iteration. Asked then, the target answered
/// "text" for it; the next chunks, read ahead in the form of the one before, followed: every
/// chunk was written as text events (`written_as = 'events'`, twice the time and WAL of COPY).
/// The window is made deterministic: a lock on the target's `tide_applied` holds the worker's
/// first iteration in its `begin` (reading its applied position, after its target tables were
/// read) while the table is added; the test waits until the target shows the worker waiting.
#[test]
fn a_table_added_during_an_iteration_is_backfilled_by_copy() {
    let (c, t) = setup_remote("tt_rlate");
    c.execute(
        "CREATE TABLE late (id int PRIMARY KEY, s text);
         INSERT INTO late SELECT g, 'row ' || g FROM generate_series(1, 3000) g;",
    );
    let mut lock = hold_applied(&t, "public");
    exec(
        &c,
        r#"SELECT tide.create_pipeline('late', 'postgres', '{"server": "tgt"}')"#,
    );
    wait_worker_held(&t, "public");
    exec(
        &c,
        "SELECT tide.add_table('late', 'late', backfill => false)",
    );
    exec(
        &c,
        "SELECT tide.start_backfill('late', 'late', chunk_size => 500)",
    );
    lock.batch_execute("ROLLBACK").expect("release the lock");
    wait_backfill(&c, "late", "late", 120);
    wait_pipeline(&c, "late", 60);
    assert_same_rows("late table", &c, "public.late", &t, "public.late", "id, s");
    let how = texts(
        &c,
        "SELECT coalesce(written_as, '-') FROM tide.chunks
          WHERE pipeline = 'late' AND relation = 'public.late' ORDER BY chunk",
    );
    let mut want = vec!["copy"; 6];
    want.push("-"); // the last chunk reads nothing
    assert_eq!(how, want, "how each chunk was written");
}
