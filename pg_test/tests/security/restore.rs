//! Restoring pipeline definitions (issue 43 item 6; README, Upgrading > Dump and restore):
//! `tide.pipeline_definition` comes from a dump, so it is as trusted as whoever restored it (a
//! superuser); what a definition says is re-created only as its owner, through the checks
//! `tide.create_pipeline` and `tide.add_table` make for that role.
//!
//! The attacks: a definition (a tampered dump, say) in which alice's pipeline captures
//! `victim.secret`, which alice may not read: restoring it as alice is refused and leaves no
//! pipeline and, once the launcher has looked, no slot. mallory (a `tide_admin` member) tries
//! to see, restore, or restore for herself alice's definition, to write a definition, and to
//! restore her own for alice; nobody (no pg_tide rights) tries to restore at all. Each is
//! refused with a specific SQLSTATE.

use super::*;

/// A definition as `tide.pipeline_definition` holds it, inserted as a restore would.
fn restored(c: &Cluster, name: &str, owner: &str, table: &str) {
    c.execute(&format!(
        "INSERT INTO tide.pipeline_definition (name, owner, definition) VALUES ('{name}', '{owner}',
           '{{\"target\": \"outbox\", \"options\": {{}}, \"enabled\": true,
              \"tables\": [{{\"relation\": \"{table}\"}}], \"follows\": [], \"not_followed\": []}}')"
    ));
}

#[test]
fn a_definition_is_restored_only_as_its_owner_could_make_it() {
    let c = secured("sec_restore");
    c.execute(
        "CREATE TABLE alice.mine (id int PRIMARY KEY); ALTER TABLE alice.mine OWNER TO alice",
    );
    c.execute(
        "CREATE TABLE mallory.hers (id int PRIMARY KEY); ALTER TABLE mallory.hers OWNER TO mallory",
    );
    restored(&c, "steal", "alice", "victim.secret");
    restored(&c, "ok", "alice", "alice.mine");
    restored(&c, "mal", "mallory", "mallory.hers");

    // alice's tampered definition: the owner may not read victim.secret.
    let e = exec_as(&c, "alice", "SELECT tide.restore_pipeline('steal')")
        .expect_err("restoring a capture of a table the owner may not read");
    assert_db_error(&e, "42501", None);
    assert_eq!(
        c.query_scalar::<i64>("SELECT count(*) FROM tide.pipeline WHERE name = 'steal'"),
        0
    );
    c.wait_until(
        "the slot of the refused restore dropped by the launcher",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            Ok(c.try_query_scalar::<i64>(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE '%steal%'",
            )? == 0)
        },
    );

    // mallory: sees nothing of alice's, restores nothing of hers, writes no definition.
    assert_eq!(
        connect_as(&c, "mallory")
            .query_one(
                "SELECT coalesce(string_agg(name, ','), '') FROM tide.restorable_pipelines()",
                &[]
            )
            .expect("restorable_pipelines as mallory")
            .get::<_, String>(0),
        "mal"
    );
    for (sql, code) in [
        ("SELECT tide.restore_pipeline('ok')", "42704"),
        (
            "SELECT tide.restore_pipeline('ok', owner => 'mallory')",
            "42704",
        ),
        (
            "SELECT tide.restore_pipeline('mal', owner => 'alice')",
            "42501",
        ),
        ("SELECT * FROM tide.pipeline_definition", "42501"),
        (
            "UPDATE tide.pipeline_definition SET owner = 'mallory' WHERE name = 'ok'",
            "42501",
        ),
        ("SELECT tide._save_definitions()", "42501"),
    ] {
        let e = exec_as(&c, "mallory", sql).expect_err(sql);
        assert_db_error(&e, code, None);
    }
    // nobody may not even call it.
    for sql in [
        "SELECT tide.restore_pipeline('ok')",
        "CALL tide.restore_pipelines()",
        "SELECT * FROM tide.restorable_pipelines()",
    ] {
        let e = exec_as(&c, "nobody", sql).expect_err(sql);
        assert_db_error(&e, "42501", None);
    }
    // What may be restored is: alice's own, owned by alice; mallory's, owned by mallory.
    ok_as(&c, "alice", "SELECT tide.restore_pipeline('ok')");
    ok_as(&c, "mallory", "CALL tide.restore_pipelines()");
    assert_eq!(
        c.query_scalar::<String>(
            "SELECT string_agg(name || ':' || owner, ',' ORDER BY name) FROM tide.pipeline"
        ),
        "mal:mallory,ok:alice"
    );
}
