//! Pipeline definitions across `pg_dump`/`pg_restore` (issue 43, item 6; README, Upgrading >
//! Dump and restore).
//!
//! A database with three pipelines (a local table target with a row filter, a column list and a
//! mask, owned by a `tide_admin` member; a remote target; a paused outbox pipeline following a
//! schema, one of whose tables was removed) is dumped with `pg_dump` while writers run, and
//! restored with `pg_restore` into a new database of the same server, and of another server.
//! What must hold:
//! - the dump carries each pipeline's definition, and no runtime state: the restored database
//!   has no pipeline, no slot, no outbox event until `CALL tide.restore_pipelines()`;
//! - that call re-creates each pipeline as it was defined (target, options, tables by name,
//!   filter, columns, masks, followed schema and the table that was removed from it, paused or
//!   not), owned by the same role, each table backfilled anew: the restored local target equals
//!   the restored source under the filter and column list;
//! - the restored remote pipeline never writes into production's remote target (a restore is a
//!   new writer: fenced with 55006 while production renews its lease), and production's pipelines
//!   run on untouched;
//! - a `tide_admin` member who does not own a definition can neither see it nor restore it, and
//!   cannot write `tide.pipeline_definition`;
//! - a `pg_dump` by a role that is not a superuser works: with `pg_read_all_data` as it is, and
//!   for a role that may read only the application's tables with the documented
//!   `--exclude-table-data=tide.pipeline_definition` (it fails without it).

use pg_test::*;
use std::process::Command;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(100);

fn pg_tool(c: &Cluster, tool: &str, args: &[&str]) -> std::process::Output {
    let mut cmd: Command = command_as_postgres(pg_bin().join(tool));
    cmd.args(["-h", "127.0.0.1", "-p", &c.port().to_string()])
        .args(args);
    cmd.output().unwrap_or_else(|e| panic!("run {tool}: {e}"))
}

fn ok(out: std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

fn scalar<T>(cl: &mut Client, sql: &str) -> T
where
    T: for<'a> postgres::types::FromSql<'a>,
{
    cl.query_one(sql, &[])
        .unwrap_or_else(|e| panic!("{sql}: {}", describe_error(&e)))
        .get(0)
}

/// Into a new database of the same server (production's slot and origin names are taken there:
/// the restored pipelines must not need them).
#[test]
fn pipelines_survive_dump_and_restore_into_the_same_server() {
    let (c, t) = setup_remote("dump");
    dump_and_restore(&c, &t, None);
}

/// Into another server (a copy of the roles first, as `pg_dumpall --globals-only` would).
#[test]
fn pipelines_survive_dump_and_restore_into_another_server() {
    let (c, t) = setup_remote("dump_x");
    let other = setup("dump_x_into");
    other.execute("CREATE ROLE alice LOGIN IN ROLE tide_admin");
    dump_and_restore(&c, &t, Some(&other));
}

/// The scenario on production `c` (remote target `t`), restored into database `restored` of
/// `into` (`c` itself when `None`).
fn dump_and_restore(c: &Cluster, t: &Cluster, into: Option<&Cluster>) {
    let r_cluster = into.unwrap_or(c);
    c.execute(
        "CREATE ROLE alice LOGIN IN ROLE tide_admin;
         CREATE TABLE orders (id int PRIMARY KEY, total int NOT NULL, note text, secret text);
         INSERT INTO orders SELECT g, g * 10, 'n' || g, 's' || g FROM generate_series(1, 2000) g;
         ALTER TABLE orders OWNER TO alice;
         CREATE SCHEMA copy AUTHORIZATION alice;
         CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL);
         INSERT INTO items SELECT g, g FROM generate_series(1, 500) g;
         CREATE SCHEMA sch;
         CREATE TABLE sch.a (id int PRIMARY KEY);
         CREATE TABLE sch.b (id int PRIMARY KEY);
         INSERT INTO sch.a SELECT generate_series(1, 10);
         INSERT INTO sch.b SELECT generate_series(1, 10);",
    );
    let mut alice = connect_as(c, "alice");
    alice
        .batch_execute("SELECT tide.create_pipeline('lt', 'table', '{\"schema\": \"copy\"}');")
        .unwrap_or_else(|e| panic!("{}", describe_error(&e)));
    alice
        .batch_execute(
            "SELECT tide.add_table('lt', 'orders', row_filter => 'id % 2 = 0',
                                   columns => ARRAY['id', 'total', 'note'],
                                   masks => '{\"note\": \"null\"}');",
        )
        .unwrap_or_else(|e| panic!("{}", describe_error(&e)));
    create_pipeline(c, "rt", "postgres", r#"{"server": "tgt"}"#);
    exec(c, "SELECT tide.add_table('rt', 'items')");
    create_pipeline(c, "ob", "outbox", "{}");
    exec(
        c,
        "SELECT tide.add_tables_in_schema('ob', 'sch', follow => true)",
    );
    exec(c, "SELECT tide.remove_table('ob', 'sch.b')");
    exec(c, "SELECT tide.pause_pipeline('ob')");
    wait_backfill(c, "orders", "lt", 120);
    wait_backfill(c, "items", "rt", 120);
    // A column renamed after: the definition follows it (by name).
    exec(c, "ALTER TABLE orders RENAME COLUMN note TO remark");

    // The launcher saves the definitions within a few rounds.
    let saved = "SELECT count(*) FROM tide.pipeline_definition
                  WHERE definition @? '$.tables[*].columns ? (@ == \"remark\")'
                     OR name IN ('rt', 'ob')";
    c.wait_until(
        "the pipeline definitions saved",
        Duration::from_secs(30),
        POLL,
        || Ok(c.try_query_scalar::<i64>(saved)? == 3),
    );
    let ob_def: String =
        c.query_scalar("SELECT definition::text FROM tide.pipeline_definition WHERE name = 'ob'");
    assert!(
        ob_def.contains("\"enabled\": false")
            && ob_def.contains("\"not_followed\": [\"sch.b\"]")
            && ob_def.contains("\"schema\": \"sch\""),
        "ob's definition: {ob_def}"
    );

    // Dump while writers run; restore into a new database of the same server.
    let script = write_script(
        "dump_writes",
        "\\set id random(1, 2000)\nUPDATE orders SET total = total + 1 WHERE id = :id;\nUPDATE items SET v = v + 1 WHERE id = :id % 500 + 1;\n",
    );
    let bench = spawn_pgbench(c, &script, 1, 20, Some(50));
    let file = format!("/tmp/pg_tide_dump_{}.dump", std::process::id());
    ok(
        pg_tool(
            c,
            "pg_dump",
            &["-U", "postgres", "-Fc", "-f", &file, "postgres"],
        ),
        "pg_dump",
    );
    r_cluster.execute("CREATE DATABASE restored");
    ok(
        pg_tool(
            r_cluster,
            "pg_restore",
            &["-U", "postgres", "-d", "restored", &file],
        ),
        "pg_restore",
    );
    let mut r = r_cluster.connect_db("restored");
    assert_eq!(
        scalar::<i64>(&mut r, "SELECT count(*) FROM tide.pipeline"),
        0,
        "no pipeline restored by itself"
    );
    assert_eq!(
        scalar::<i64>(&mut r, "SELECT count(*) FROM tide.pipeline_definition"),
        3
    );
    assert_eq!(
        scalar::<i64>(&mut r, "SELECT count(*) FROM tide.outbox"),
        0,
        "no runtime state"
    );
    let restored_oid: u32 = r_cluster.query_scalar::<postgres::types::Oid>(
        "SELECT oid FROM pg_database WHERE datname = 'restored'",
    );
    let slots_of_restored =
        format!("SELECT count(*) FROM pg_replication_slots WHERE datoid = {restored_oid}");
    assert_eq!(r_cluster.query_scalar::<i64>(&slots_of_restored), 0);

    // Another member sees no definition and restores none.
    r_cluster.execute("CREATE ROLE mallory LOGIN IN ROLE tide_admin");
    let mut cfg = r_cluster.config("restored");
    cfg.user("mallory");
    let mut m = cfg.connect(NoTls).expect("connect as mallory");
    assert_eq!(
        scalar::<i64>(&mut m, "SELECT count(*) FROM tide.restorable_pipelines()"),
        0
    );
    for (sql, state) in [
        ("SELECT tide.restore_pipeline('lt')", "42704"),
        ("SELECT tide.restore_pipeline('nosuch')", "42704"),
        ("SELECT count(*) FROM tide.pipeline_definition", "42501"),
        (
            "INSERT INTO tide.pipeline_definition VALUES ('x', 'mallory', '{}')",
            "42501",
        ),
    ] {
        let e = m.batch_execute(sql).expect_err(sql);
        assert_eq!(
            e.code().map(|s| s.code()),
            Some(state),
            "{sql}: {}",
            describe_error(&e)
        );
    }
    let mut cfg = r_cluster.config("restored");
    cfg.user("alice");
    let mut ra = cfg.connect(NoTls).expect("connect as alice");
    let mine: Vec<String> = ra
        .query("SELECT name FROM tide.restorable_pipelines()", &[])
        .expect("restorable_pipelines")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        mine,
        vec!["lt".to_string()],
        "alice may restore her own pipeline only"
    );

    // Restore them all.
    r.batch_execute("CALL tide.restore_pipelines()")
        .unwrap_or_else(|e| panic!("CALL tide.restore_pipelines(): {}", describe_error(&e)));
    let listing: Vec<String> = r
        .query(
            "SELECT p.name || ' ' || p.owner || ' ' || p.target || ' ' || p.enabled
               FROM tide.pipeline p ORDER BY p.name",
            &[],
        )
        .expect("pipelines")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        listing,
        vec![
            "lt alice table true",
            "ob postgres outbox false",
            "rt postgres postgres true"
        ]
    );
    let tables: Vec<String> = r
        .query(
            "SELECT t.pipeline || ' ' || t.relid::regclass || ' ' || coalesce(t.row_filter, '-') || ' '
                    || coalesce(t.columns::text, '-') || ' ' || coalesce(t.masks::text, '-')
               FROM tide.pipeline_table t ORDER BY 1",
            &[],
        )
        .expect("tables")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        tables,
        vec![
            "lt orders id % 2 = 0 {1,2,3} {\"3\": \"null\"}",
            "ob sch.a - - -",
            "rt items - - -"
        ],
        "restored tables"
    );
    assert_eq!(
        scalar::<String>(
            &mut r,
            "SELECT string_agg(f.pipeline || ' ' || f.nspid::regnamespace || ' ' || f.backfill, ',') FROM tide.followed_schema f"
        ),
        "ob sch true"
    );
    assert_eq!(
        scalar::<String>(&mut r, "SELECT string_agg(pipeline || ' ' || relation || ' ' || kind, ',') FROM tide.follow_skip"),
        "ob sch.b removed"
    );
    // sch.a is captured through the follow (it leaves the pipeline if it leaves the schema),
    // the others by name.
    assert_eq!(
        scalar::<String>(
            &mut r,
            "SELECT string_agg(relid::regclass || ' ' || (followed_nspid IS NOT NULL), ',' ORDER BY relid::regclass::text) FROM tide.pipeline_table"
        ),
        "items false,orders false,sch.a true"
    );

    // The local target is backfilled anew from the restored source (the dump's copy replaced).
    r.batch_execute("UPDATE orders SET total = -1 WHERE id = 4; DELETE FROM orders WHERE id = 6")
        .expect("writes in restored");
    let ok_lt: bool = scalar(
        &mut r,
        "SELECT tide.wait_for_backfill('orders', 'lt', interval '120 seconds') AND tide.wait_for_pipeline('lt', interval '60 seconds')",
    );
    assert!(ok_lt, "lt's backfill in the restored database");
    let diff: i64 = scalar(
        &mut r,
        "SELECT count(*) FROM ((SELECT id, total, NULL::text FROM orders WHERE id % 2 = 0
                                EXCEPT ALL SELECT id, total, remark FROM copy.orders)
                               UNION ALL
                               (SELECT id, total, remark FROM copy.orders
                                EXCEPT ALL SELECT id, total, NULL::text FROM orders WHERE id % 2 = 0)) d",
    );
    assert_eq!(
        diff, 0,
        "the restored local target equals its filtered, masked source"
    );

    // The restored remote pipeline is a new writer: fenced, production's target untouched.
    r.batch_execute("INSERT INTO items VALUES (100001, 1)")
        .expect("insert in restored");
    let (n, okb, summary) = bench.finish_summary();
    assert!(okb && n > 0, "pgbench failed: {summary}");
    let fenced = poll_every(Duration::from_secs(60), POLL, || {
        let mut r = r_cluster.connect_db("restored");
        Ok(r.query_one(
            "SELECT coalesce((SELECT last_error_sqlstate = '55006' FROM tide.pipelines WHERE name = 'rt'), false)",
            &[],
        )?
        .get::<_, bool>(0))
    });
    assert!(
        fenced.is_ok(),
        "the restored rt was not fenced: {}",
        pipeline_row_in(r_cluster, "restored", "rt")
    );
    wait_pipeline(c, "rt", 60);
    assert_same_rows("items", c, "public.items", t, "public.items", "id, v");
    assert_eq!(
        t.query_scalar::<i64>("SELECT count(*) FROM public.items WHERE id = 100001"),
        0,
        "the restored database wrote into production's target"
    );
    assert_eq!(
        c.query_scalar::<String>("SELECT state FROM tide.pipelines WHERE name = 'rt'"),
        "streaming",
        "production's pipeline goes on"
    );

    // A pg_dump by a role that is not a superuser: as documented. One that may read every
    // table (pg_read_all_data) dumps the definitions too; one that may read the application's
    // tables only is refused tide.pipeline_definition, and passes without its data.
    c.execute(
        "CREATE ROLE dumper LOGIN IN ROLE pg_read_all_data;
         CREATE ROLE reader LOGIN;
         GRANT USAGE ON SCHEMA copy, sch TO reader;
         GRANT SELECT ON ALL TABLES IN SCHEMA public, copy, sch TO reader;",
    );
    ok(
        pg_tool(
            c,
            "pg_dump",
            &["-U", "dumper", "-f", "/dev/null", "postgres"],
        ),
        "pg_dump by a role with pg_read_all_data",
    );
    let refused = pg_tool(
        c,
        "pg_dump",
        &["-U", "reader", "-f", "/dev/null", "postgres"],
    );
    let err = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(
        !refused.status.success() && err.contains("pipeline_definition"),
        "pg_dump by a role that may not read tide.pipeline_definition: {err}"
    );
    ok(
        pg_tool(
            c,
            "pg_dump",
            &[
                "-U",
                "reader",
                "--exclude-table-data=tide.pipeline_definition",
                "-f",
                "/dev/null",
                "postgres",
            ],
        ),
        "pg_dump --exclude-table-data=tide.pipeline_definition by a role without pg_tide rights",
    );
    let _ = std::fs::remove_file(&file);
}

/// `tide.pipelines`'s row of `name` in database `db`, for a failure message.
fn pipeline_row_in(c: &Cluster, db: &str, name: &str) -> String {
    c.connect_db(db)
        .query_one(
            "SELECT coalesce((SELECT row_to_json(p)::text FROM tide.pipelines p WHERE name = $1), 'none')",
            &[&name],
        )
        .map(|r| r.get(0))
        .unwrap_or_else(|e| describe_error(&e))
}
