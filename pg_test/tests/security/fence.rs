//! One writer per target (issue 43 item 1): `tide.claim_target` fences the server that writes a
//! remote target, so only the pipeline's owner (or a superuser) may call it, and
//! `tide.target_lease` (how soon another server may take a target over) is a server setting.
//!
//! The attack: mallory, a `tide_admin` member, claims the remote target of a pipeline she does
//! not own, to stop its writes (its server is fenced); nobody, with no pg_tide rights, tries the
//! same; both try to shorten or lengthen the lease. Each is refused with a specific SQLSTATE,
//! and the target's owner and epoch are unchanged.

use super::*;

#[test]
fn only_the_owner_claims_a_target_and_nobody_sets_the_lease() {
    let c = secured("sec_claim");
    let t = target_cluster("sec_claim_tgt");
    create_server(&c, "tgt", &t);
    c.execute("CREATE TABLE public.prod (id int PRIMARY KEY, v int)");
    create_pipeline(&c, "prod", "postgres", r#"{"server": "tgt"}"#);
    exec(
        &c,
        "SELECT tide.add_table('prod', 'public.prod', backfill => false)",
    );
    c.execute("INSERT INTO public.prod VALUES (1, 1)");
    wait_for_pipeline(&c, "prod", 60, || diag(&c));
    // Read as a result: the attempts below are checked first.
    let owner = || -> Result<(String, i64), String> {
        t.try_query_one("SELECT writer, epoch FROM public.tide_applied WHERE pipeline = 'prod'")
            .map(|r| (r.get(0), r.get(1)))
            .map_err(|e| describe_error(&e))
    };
    let before = owner();
    for (role, code) in [
        ("mallory", "42501"),
        ("alice", "42501"),
        ("nobody", "42501"),
    ] {
        let e = exec_as(&c, role, "SELECT tide.claim_target('prod')")
            .expect_err("a claim of another role's pipeline");
        assert_db_error(&e, code, None);
        eprintln!("  as {role}: {}", describe_error(&e));
    }
    settings_refused(
        &c,
        &[
            "SET tide.target_lease = 5",
            "ALTER SYSTEM SET tide.target_lease = 3600",
            "ALTER ROLE mallory SET tide.target_lease = 5",
        ],
    );
    // A member's own pipeline with no remote target has nothing to claim (42809).
    ok_as(&c, "mallory", "SELECT tide.create_pipeline('m')");
    let e = exec_as(&c, "mallory", "SELECT tide.claim_target('m')").expect_err("an outbox");
    assert_db_error(&e, "42809", Some("remote PostgreSQL target"));
    let before = before.expect("the target's owner before");
    assert_eq!(
        owner().expect("the target's owner after"),
        before,
        "the target's owner and epoch are unchanged"
    );
    // The owner may: the same server claims what it owns, and the epoch stays.
    let epoch: i64 = c.query_scalar("SELECT tide.claim_target('prod')");
    assert_eq!(
        epoch, before.1,
        "a claim of a target this server owns keeps the epoch"
    );
    c.execute("INSERT INTO public.prod VALUES (2, 2)");
    wait_for_pipeline(&c, "prod", 30, || diag(&c));
    assert_same_rows("prod", &c, "public.prod", &t, "public.prod", "id, v");
}
