//! Server errors: one line describing a `postgres::Error`, and assertions on a statement's
//! SQLSTATE and HINT.

use crate::{Cluster, DbError};
use std::fmt::Debug;

/// One line describing a `postgres::Error`: SQLSTATE, severity, message, detail, hint.
pub fn describe_error(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "{} SQLSTATE {}: {}{}{}",
            db.severity(),
            db.code().code(),
            db.message(),
            db.detail()
                .map(|d| format!("\nDETAIL: {d}"))
                .unwrap_or_default(),
            db.hint()
                .map(|h| format!("\nHINT: {h}"))
                .unwrap_or_default()
        ),
        None => format!("(not a server error) {e}"),
    }
}

/// The `DbError` of an `Err`, panicking if the result is `Ok` or not a server error.
#[track_caller]
pub fn expect_db_error<T: Debug>(res: Result<T, postgres::Error>) -> DbError {
    match res {
        Ok(v) => panic!("expected a server error, got Ok({v:?})"),
        Err(e) => match e.as_db_error() {
            Some(db) => db.clone(),
            None => panic!("expected a server error, got: {e}"),
        },
    }
}

/// Assert that `err` is a server error with SQLSTATE `code` (e.g. `"55000"`) and,
/// if `hint_contains` is given, a HINT containing that substring.
#[track_caller]
pub fn assert_db_error(err: &postgres::Error, code: &str, hint_contains: Option<&str>) {
    let db = err
        .as_db_error()
        .unwrap_or_else(|| panic!("expected SQLSTATE {code}, got a non-server error: {err}"));
    assert_eq!(
        db.code().code(),
        code,
        "expected SQLSTATE {code}, got {}",
        describe_error(err)
    );
    if let Some(needle) = hint_contains {
        match db.hint() {
            Some(hint) => assert!(
                hint.contains(needle),
                "expected a HINT containing {needle:?}, got {}",
                describe_error(err)
            ),
            None => panic!(
                "expected a HINT containing {needle:?}, got no hint: {}",
                describe_error(err)
            ),
        }
    }
}

/// Assert that `res` failed with SQLSTATE `code` (and a hint containing `hint_contains`).
#[track_caller]
pub fn assert_sql_fails<T: Debug>(
    res: Result<T, postgres::Error>,
    code: &str,
    hint_contains: Option<&str>,
) {
    match res {
        Ok(v) => panic!("expected SQLSTATE {code}, but the statement succeeded: {v:?}"),
        Err(e) => assert_db_error(&e, code, hint_contains),
    }
}

/// Run `sql` (simple protocol), which must fail with SQLSTATE `code` and, if `hint` is given, a
/// HINT containing it; see [`expect_fail_with`]. Returns the error.
#[track_caller]
pub fn expect_fail(c: &Cluster, sql: &str, code: &str, hint: Option<&str>) -> DbError {
    expect_fail_with(sql, c.try_execute(sql), code, hint)
}

/// `res`, the outcome of running `sql`, must be a server error with SQLSTATE `code` and, if
/// `hint` is given, a HINT containing it; the error is printed (message and hint) either way.
/// Returns it.
#[track_caller]
pub fn expect_fail_with<T: Debug>(
    sql: &str,
    res: Result<T, postgres::Error>,
    code: &str,
    hint: Option<&str>,
) -> DbError {
    let db = match res {
        Ok(v) => panic!("{sql}: expected SQLSTATE {code}, but it succeeded: {v:?}"),
        Err(e) => {
            eprintln!(
                "  {sql}\n    -> {}",
                describe_error(&e).replace('\n', "\n       ")
            );
            match e.as_db_error() {
                Some(db) => db.clone(),
                None => panic!("{sql}: expected SQLSTATE {code}, got a non-server error: {e}"),
            }
        }
    };
    assert_eq!(
        db.code().code(),
        code,
        "{sql}: expected SQLSTATE {code}, got {} {} (hint {:?})",
        db.code().code(),
        db.message(),
        db.hint()
    );
    if let Some(h) = hint {
        let got = db.hint().unwrap_or("");
        assert!(
            got.contains(h),
            "{sql}: expected a HINT containing {h:?}, got {got:?}"
        );
    }
    db
}
