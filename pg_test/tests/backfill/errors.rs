//! Bad input and wrong states have clear SQLSTATEs.

use crate::common::*;
use std::time::{Duration, Instant};

/// Check that `res` failed with `code` (and a hint / message prefix); record a problem if not.
fn check_err<T: std::fmt::Debug>(
    problems: &mut Vec<String>,
    label: &str,
    res: Result<T, postgres::Error>,
    code: &str,
    hint: Option<&str>,
    message_prefix: Option<&str>,
) {
    let e = match res {
        Ok(v) => {
            problems.push(format!(
                "{label}: expected SQLSTATE {code}, but it succeeded: {v:?}"
            ));
            return;
        }
        Err(e) => e,
    };
    let Some(db) = e.as_db_error() else {
        problems.push(format!(
            "{label}: expected SQLSTATE {code}, got a non-server error: {e}"
        ));
        return;
    };
    let mut bad = Vec::new();
    if db.code().code() != code {
        bad.push(format!("SQLSTATE {} instead of {code}", db.code().code()));
    }
    if let Some(h) = hint {
        if !db.hint().is_some_and(|x| x.contains(h)) {
            bad.push(format!("no hint containing {h:?}"));
        }
    }
    if let Some(m) = message_prefix {
        if !db.message().starts_with(m) {
            bad.push(format!("message does not start with {m:?}"));
        }
    }
    if bad.is_empty() {
        eprintln!("bad input: {label}: {} {}", db.code().code(), db.message());
    } else {
        let first_line = describe_error(&e)
            .lines()
            .take(3)
            .collect::<Vec<_>>()
            .join(" / ");
        problems.push(format!("{label}: {}: {first_line}", bad.join(", ")));
    }
}

/// One check of [`check_calls`]: (label, call, SQLSTATE, hint, message prefix).
type Case<'a> = (&'a str, &'a str, &'a str, Option<&'a str>, Option<&'a str>);

/// [`check_err`] of each case in turn, its call run as `SELECT (call)::text`.
fn check_calls(problems: &mut Vec<String>, c: &Cluster, cases: &[Case]) {
    for (label, call, code, hint, prefix) in cases {
        let res = c.try_query_scalar::<Option<String>>(&format!("SELECT ({call})::text"));
        check_err(problems, label, res, code, *hint, *prefix);
    }
}

#[test]
fn bad_inputs_have_sqlstates() {
    let c = setup("bf_bad_inputs");
    c.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t SELECT g, g FROM generate_series(1, 1000) g;
         CREATE TABLE nc (id int PRIMARY KEY, v int);
         CREATE TABLE free (id int PRIMARY KEY, v int);
         CREATE TABLE amb (id int PRIMARY KEY, v int);
         CREATE TABLE kc (a int PRIMARY KEY, b int NOT NULL); INSERT INTO kc SELECT g, g FROM generate_series(1, 10) g;
         CREATE TABLE kf (id int PRIMARY KEY, v int); INSERT INTO kf SELECT g, g FROM generate_series(1, 10) g;",
    );
    create_pipeline(&c, "bi");
    create_pipeline(&c, "bi2");
    for t in ["t", "amb", "kc", "kf"] {
        add_table(&c, "bi", t, false);
    }
    add_table(&c, "bi2", "nc", false);
    add_table(&c, "bi2", "amb", false);
    let mut p: Vec<String> = Vec::new();
    const COND: Option<&str> = Some("invalid backfill condition");

    // Which pipeline.
    check_calls(
        &mut p,
        &c,
        &[
            (
                "start: table not captured by the named pipeline",
                "tide.start_backfill('nc', 'bi')",
                "55000",
                Some("tide.add_table"),
                None,
            ),
            (
                "start: table captured by no pipeline",
                "tide.start_backfill('free')",
                "55000",
                Some("tide.add_table"),
                None,
            ),
            (
                "start: several pipelines, none named",
                "tide.start_backfill('amb')",
                "42P08",
                Some("pipeline"),
                None,
            ),
            (
                "pause: several pipelines, none named",
                "tide.pause_backfill('amb')",
                "42P08",
                Some("pipeline"),
                None,
            ),
            (
                "wait: several pipelines, none named",
                "tide.wait_for_backfill('amb')",
                "42P08",
                Some("pipeline"),
                None,
            ),
        ],
    );

    // Chunk size and condition.
    check_calls(
        &mut p,
        &c,
        &[
            (
                "start: chunk_size 0",
                "tide.start_backfill('t', chunk_size => 0)",
                "22023",
                None,
                None,
            ),
            (
                "start: chunk_size -5",
                "tide.start_backfill('t', chunk_size => -5)",
                "22023",
                None,
                None,
            ),
            (
                "start: condition that does not parse",
                "tide.start_backfill('t', condition => 'v = = 1')",
                "42601",
                None,
                COND,
            ),
            (
                "start: condition on an unknown column",
                "tide.start_backfill('t', condition => 'nosuch > 1')",
                "42703",
                None,
                COND,
            ),
            (
                "start: condition that is not boolean",
                "tide.start_backfill('t', condition => 'v + 1')",
                "42804",
                None,
                COND,
            ),
            (
                "start: condition with a statement separator",
                "tide.start_backfill('t', condition => 'true; DROP TABLE t')",
                "42601",
                None,
                None,
            ),
        ],
    );
    {
        // Not an expression on its own: it closes the parenthesis the worker puts around it, and
        // would OR away the keyset predicate. Called after a write, as an application would.
        let mut cl = c.client();
        let mut tx = cl.transaction().unwrap();
        tx.batch_execute("INSERT INTO free VALUES (1, 1)").unwrap();
        let res = tx
            .query_one(
                "SELECT tide.start_backfill('t', chunk_size => 10, condition => 'v > 0) OR (true')",
                &[],
            )
            .map(|r| r.get::<_, i64>(0));
        check_err(
            &mut p,
            "start: condition that escapes its parentheses",
            res,
            "42601",
            None,
            COND,
        );
        let _ = tx.rollback();
    }
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.backfill"),
        0,
        "a failed call left a backfill behind"
    );

    // Nothing active.
    check_calls(
        &mut p,
        &c,
        &[
            (
                "pause: nothing active",
                "tide.pause_backfill('t')",
                "55000",
                None,
                None,
            ),
            (
                "resume: nothing active",
                "tide.resume_backfill('t')",
                "55000",
                None,
                None,
            ),
            (
                "cancel: nothing active",
                "tide.cancel_backfill('t')",
                "55000",
                None,
                None,
            ),
        ],
    );

    // Wrong states. Throttled hard so that it stays active. (Pausing a paused backfill and
    // resuming a running one are no-ops with a NOTICE: pg_test/tests/operations.rs.)
    let id = start_backfill_then(
        &c,
        "SELECT tide.start_backfill('t', chunk_size => 10)",
        "SELECT tide.alter_backfill('t', rows_per_second => 10); SELECT tide.pause_backfill('t')",
    );
    check_calls(
        &mut p,
        &c,
        &[(
            "start: while paused",
            "tide.start_backfill('t')",
            "55006",
            None,
            None,
        )],
    );
    c.execute("SELECT tide.resume_backfill('t')");
    check_calls(
        &mut p,
        &c,
        &[
            (
                "start: while queued/running",
                "tide.start_backfill('t', 'bi')",
                "55006",
                None,
                None,
            ),
            (
                "alter: chunk_size 0",
                "tide.alter_backfill('t', chunk_size => 0)",
                "22023",
                None,
                None,
            ),
            (
                "alter: rows_per_second -1",
                "tide.alter_backfill('t', rows_per_second => -1)",
                "22023",
                None,
                None,
            ),
        ],
    );
    let t = Instant::now();
    let timed_out: bool = c.query_scalar("SELECT tide.wait_for_backfill('t', timeout => '300 ms')");
    assert!(
        !timed_out,
        "wait_for_backfill returned true for an unfinished, throttled backfill"
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "wait_for_backfill ignored its timeout"
    );
    c.execute("SELECT tide.cancel_backfill('t')");
    assert_eq!(bf_state(&c, id), "cancelled");
    check_calls(
        &mut p,
        &c,
        &[
            (
                "wait: cancelled",
                "tide.wait_for_backfill('t', timeout => '5 s')",
                "55000",
                None,
                None,
            ),
            (
                "pause: cancelled",
                "tide.pause_backfill('t')",
                "55000",
                None,
                None,
            ),
        ],
    );
    eprintln!(
        "bad input: readiness of a table whose latest backfill was cancelled: {}",
        sample(
            &c,
            "SELECT backfill_state, readiness FROM tide.readiness WHERE source = 't'::regclass",
            1
        )
    );

    // Two concurrent starts: the second waits for the first, then fails like any start of an
    // active backfill.
    {
        let mut a = c.client();
        let mut tx = a.transaction().unwrap();
        tx.query_one("SELECT tide.start_backfill('t', chunk_size => 10)", &[])
            .unwrap();
        let cfg = c.config("postgres");
        let other = std::thread::spawn(move || {
            let mut b = cfg.connect(NoTls).expect("connect");
            b.query_one("SELECT tide.start_backfill('t', chunk_size => 10)", &[])
                .map(|r| r.get::<_, i64>(0))
        });
        c.wait_until("the second start_backfill to wait for the first", Duration::from_secs(30), Duration::from_millis(20), || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%start_backfill%'",
            )? >= 1)
        });
        tx.commit().unwrap();
        let res = other.join().expect("second session");
        check_err(
            &mut p,
            "start: concurrently with another start",
            res,
            "55006",
            None,
            None,
        );
        c.execute("SELECT tide.cancel_backfill('t')");
    }

    // A backfill that fails in the worker: its condition divides by zero at the row v = 5,
    // which only reading the chunk finds. (Renaming the key column, as this test did before
    // schema events, now pauses the pipeline at the key change instead: schema_events.rs.)
    c.execute("SELECT tide.start_backfill('kf', condition => '10 / (v - 5) > 0')");
    c.wait_until(
        "the kf backfill to fail",
        Duration::from_secs(30),
        POLL,
        || {
            Ok(c.try_query_scalar::<String>(
                "SELECT state FROM tide.backfills WHERE source = 'kf'::regclass",
            )? == "failed")
        },
    );
    let (err, remedy): (Option<String>, Option<String>) = {
        let r =
            c.query_one("SELECT error, remedy FROM tide.backfills WHERE source = 'kf'::regclass");
        (r.get(0), r.get(1))
    };
    eprintln!("bad input: failed backfill: error {err:?}; remedy {remedy:?}");
    assert!(
        err.is_some() && remedy.is_some(),
        "a failed backfill must say why and what to do"
    );
    check_calls(
        &mut p,
        &c,
        &[(
            "wait: failed",
            "tide.wait_for_backfill('kf', timeout => '5 s')",
            "55000",
            None,
            None,
        )],
    );

    // The key changed since the table was added.
    c.execute("ALTER TABLE kc DROP CONSTRAINT kc_pkey, ADD PRIMARY KEY (b)");
    check_calls(
        &mut p,
        &c,
        &[(
            "start: key changed since add_table",
            "tide.start_backfill('kc')",
            "55000",
            None,
            None,
        )],
    );

    assert!(p.is_empty(), "{} problems:\n{}", p.len(), p.join("\n"));
}
