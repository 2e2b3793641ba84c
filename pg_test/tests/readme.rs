//! The README's tutorial, run as written: every ```sql block between `<!-- tutorial -->` and
//! `<!-- /tutorial -->` goes through psql in one session (so its `SET ROLE` holds), in order,
//! stopping at the first error. The tutorial runs as a role with only the documented grant
//! (`GRANT tide_admin`), after a superuser's set-up in its first block. What it claims is then
//! checked: the waits returned true, the outbox has the update, the copy equals the source, the
//! verification after the repair finds nothing, the copy is ready; then the clean-up block drops
//! the pipelines and their slots.

use pg_test::*;
use std::io::Write;
use std::process::Stdio;

/// The SQL blocks of the README's tutorial, in order.
fn tutorial_blocks() -> Vec<String> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("read README.md");
    let start = readme
        .find("<!-- tutorial -->")
        .expect("the README has a tutorial");
    let end = readme
        .find("<!-- /tutorial -->")
        .expect("the tutorial ends");
    let mut blocks = Vec::new();
    let mut rest = &readme[start..end];
    while let Some(i) = rest.find("```sql\n") {
        let body = &rest[i + 7..];
        let j = body.find("```").expect("a closed sql block");
        blocks.push(body[..j].to_string());
        rest = &body[j + 3..];
    }
    blocks
}

/// `sql` through psql as postgres against `c`, unaligned and tuples only, stopping at the first
/// error; its output (stdout and stderr).
fn psql(c: &Cluster, sql: &str) -> String {
    let mut child = command_as_postgres(pg_bin().join("psql"))
        .current_dir("/")
        .args([
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .arg("-p")
        .arg(c.port().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run psql");
    child
        .stdin
        .take()
        .expect("psql stdin")
        .write_all(sql.as_bytes())
        .expect("write to psql");
    let out = child.wait_with_output().expect("wait for psql");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the tutorial's SQL failed (psql {}):\n{text}\n--- the SQL:\n{sql}",
        out.status
    );
    text
}

#[test]
fn the_readme_tutorial_runs_as_written() {
    let blocks = tutorial_blocks();
    assert!(
        blocks.len() >= 5,
        "the tutorial has {} sql blocks",
        blocks.len()
    );
    let (cleanup, body) = blocks.split_last().expect("blocks");
    assert!(
        cleanup.contains("drop_pipeline"),
        "the last block cleans up"
    );
    let c = setup("readme_tutorial");
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let out = psql(&c, &body.concat());
        // Every tide.wait_for_* returned true (it is the only boolean the blocks print).
        assert!(
            !out.lines().any(|l| l.trim() == "f"),
            "a wait of the tutorial returned false:\n{out}"
        );
        // The outbox block's update, with its new total.
        assert!(
            out.lines().any(|l| l == r#"update|{"id": 1}|2.50"#),
            "no update event of id 1 in:\n{out}"
        );
        // The copy equals the source, and the last verification found nothing.
        let differ: i64 = c.query_scalar(
            "SELECT count(*)::int8 FROM ((TABLE shop.orders EXCEPT TABLE replica.orders)
                                          UNION ALL (TABLE replica.orders EXCEPT TABLE shop.orders)) d",
        );
        assert_eq!(
            differ, 0,
            "rows differ between shop.orders and replica.orders"
        );
        let rows: i64 = c.query_scalar("SELECT count(*)::int8 FROM replica.orders");
        assert_eq!(rows, 9991);
        let summary: String = c.query_scalar(
            "SELECT string_agg(kind, '; ') FROM tide.verify('shop.orders', 'orders_copy')",
        );
        assert_eq!(
            summary, "summary: 10 ranges checked, 0 differ",
            "a verification after the tutorial"
        );
        let ready: String =
            c.query_scalar("SELECT readiness FROM tide.readiness WHERE pipeline = 'orders_copy'");
        assert_eq!(ready, "ready");
        // The verification after the planted change reported it, and the last one nothing.
        assert!(
            out.lines().any(|l| l == "changed values|0|0|1"),
            "the verification after the planted change reported no changed row:\n{out}"
        );
        assert_eq!(
            out.lines()
                .filter(|l| *l == "summary: 10 ranges checked, 0 differ|0|0|0")
                .count(),
            2,
            "the first and the last verification of the tutorial found differences:\n{out}"
        );
        psql(&c, cleanup);
        let left: i64 = c.query_scalar(
            "SELECT (SELECT count(*) FROM tide.pipeline) + (SELECT count(*) FROM pg_replication_slots)",
        );
        assert_eq!(left, 0, "pipelines or slots left after the clean-up");
    }));
    if let Err(e) = run {
        eprintln!("{}", diag(&c));
        std::panic::resume_unwind(e);
    }
}
