//! Golden-file tests of the SQL API, in the manner of `pg_regress`: each
//! `pg_test/regress/sql/NAME.sql` runs through `psql -X -a -q` (input echoed, errors with their
//! SQLSTATE: `VERBOSITY verbose`) against a fresh cluster with pg_tide, and its output must
//! equal `pg_test/regress/expected/NAME.out` verbatim, apart from `LOCATION:` lines (they name
//! lines of pg_tide's source). On a difference the test fails with the diff and leaves the
//! output in `target/regress/NAME.out`; to accept a change, copy it over the expected file
//! (and read the diff first: it is the API's behaviour).

use pg_test::*;
use std::io::Write;
use std::path::PathBuf;
use std::process::Stdio;

fn regress_dir() -> PathBuf {
    repo_root().join("pg_test").join("regress")
}

/// The output of `sql` through psql against `c`, `LOCATION:` lines left out.
fn run_psql(c: &Cluster, sql: &str) -> String {
    // As pg_regress does: stdout and stderr into one file, so that each error follows the
    // statement it belongs to (psql flushes its output before writing an error).
    let psql = pg_bin().join("psql");
    let mut child = command_as_postgres("sh")
        .current_dir("/")
        .args(["-c", "exec \"$0\" \"$@\" 2>&1"])
        .arg(&psql)
        .args([
            "-X",
            "-a",
            "-q",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .arg("-p")
        .arg(c.port().to_string())
        .env("PGAPPNAME", "pg_regress")
        .env("PGTZ", "UTC")
        .env("PGDATESTYLE", "ISO, YMD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run psql");
    child
        .stdin
        .take()
        .expect("psql stdin")
        .write_all(sql.as_bytes())
        .expect("write to psql");
    let out = child.wait_with_output().expect("wait for psql");
    assert!(out.status.success(), "psql failed: {}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    stdout
        .lines()
        .filter(|l| !l.starts_with("LOCATION:"))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn check(name: &str) {
    let sql = std::fs::read_to_string(regress_dir().join("sql").join(format!("{name}.sql")))
        .expect("read the sql file");
    let expected_path = regress_dir().join("expected").join(format!("{name}.out"));
    let c = setup(&format!("regress_{name}"));
    let got = run_psql(&c, &sql);
    let results = repo_root().join("target").join("regress");
    std::fs::create_dir_all(&results).expect("create target/regress");
    let got_path = results.join(format!("{name}.out"));
    std::fs::write(&got_path, &got).expect("write the output");
    let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
    if got != expected {
        let diff = std::process::Command::new("diff")
            .arg("-u")
            .arg(&expected_path)
            .arg(&got_path)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default();
        panic!(
            "{name}: the output differs from {}:\n{diff}\n(the output is in {})",
            expected_path.display(),
            got_path.display()
        );
    }
}

#[test]
fn api_errors() {
    check("api_errors");
}
