//! A kafka target's foreign server: the `tide_kafka` wrapper's servers and user mappings, where
//! a pipeline's brokers and producer settings live.
//!
//! Owns: reading a server's and its user mapping's options for a pipeline's owner, and checking
//! the server may be used. Guarantees: every setting read is checked against the allow-list as
//! the validator checks it; one that names a file, a program or a library is taken from the
//! server only while a superuser owns it (42501 otherwise); the owner needs USAGE on the server
//! (42501, [`crate::security::require_server_usage`]).

use crate::error::{TideError, TideResult};
use crate::sql;
use crate::target::options::{check_property, Place};

/// The foreign-data wrapper of kafka targets.
pub const WRAPPER: &str = "tide_kafka";

/// The options of `server` and then of the user mapping of `role` (or PUBLIC), as (name,
/// value); read as pg_tide (user mappings' options are hidden from other roles). Each is checked
/// against the allow-list as the validator checks it (so an option written before a rule
/// existed is refused here too), and a property that names a file, a program or a library is
/// taken from the server only if the server's owner is a superuser now, and from the user
/// mapping always (the validator lets only a superuser write it there). The catalog does not
/// record who wrote a server's option; its owner is who may change them, so after ALTER SERVER
/// ... OWNER TO a non-superuser such a property is refused here (42501), as it is for a server
/// a dump restored with a non-superuser owner.
pub fn kafka_server_options(server: &str, role: &str) -> TideResult<Vec<(String, String)>> {
    let (rows, owner) = crate::security::as_tide(|| {
        let rows = sql::text_rows(
            "SELECT o.n::text, o.k, o.v FROM (
                 SELECT 1 AS n, split_part(x, '=', 1) AS k, substr(x, length(split_part(x, '=', 1)) + 2) AS v
                   FROM pg_foreign_server s, unnest(s.srvoptions) x WHERE s.srvname = $1
                 UNION ALL
                 SELECT 2, split_part(x, '=', 1), substr(x, length(split_part(x, '=', 1)) + 2)
                   FROM pg_user_mappings m, unnest(m.umoptions) x
                  WHERE m.srvname = $1 AND m.umid = (
                        SELECT m2.umid FROM pg_user_mappings m2
                         WHERE m2.srvname = $1 AND (m2.usename = $2 OR m2.usename = 'public')
                         ORDER BY m2.usename = 'public' LIMIT 1)
             ) o ORDER BY o.n",
            &[Some(server), Some(role)],
            0,
            false,
        )?;
        let owner = sql::text_rows(
            "SELECT r.rolname::text, r.rolsuper::text FROM pg_foreign_server s
               JOIN pg_roles r ON r.oid = s.srvowner WHERE s.srvname = $1",
            &[Some(server)],
            1,
            false,
        )?;
        Ok((rows, owner))
    })?;
    let (owner, owner_super) = owner
        .into_iter()
        .next()
        .map(|r| {
            let mut r = r.into_iter();
            (
                r.next().flatten().unwrap_or_default(),
                r.next().flatten().as_deref() == Some("true"),
            )
        })
        .unwrap_or_default();
    let q = pgrx::spi::quote_identifier;
    let mut out = Vec::new();
    for r in rows {
        let mut r = r.into_iter();
        let (Some(n), Some(k)) = (r.next().flatten(), r.next().flatten()) else {
            continue;
        };
        let v = r.next().flatten().unwrap_or_default();
        let from_server = n == "1";
        if from_server && k == "brokers" {
            out.push((k, v));
            continue;
        }
        let property = tide_core::kafka::property_name(&k);
        if from_server && !owner_super {
            if let tide_core::kafka::Access::Superuser(what) =
                tide_core::kafka::access(&property, &v)
            {
                return Err(TideError::privilege(format!(
                    "foreign server \"{server}\" sets the Kafka setting \"{property}\", which is superuser-only ({what}), but its owner \"{owner}\" is not a superuser"
                ))
                .hint(format!(
                    "Only a server a superuser owns may name files, programs and libraries (its owner may change its options). Give it back to a superuser (ALTER SERVER {} OWNER TO <superuser>), or have a superuser move the setting to the user mapping.",
                    q(server)
                )));
            }
        }
        let (place, whose) = if from_server {
            (Place::Server, format!("foreign server \"{server}\""))
        } else {
            (
                Place::UserMapping,
                format!("the user mapping of server \"{server}\" that role \"{role}\" uses"),
            )
        };
        check_property(&property, &v, place, true)
            .map_err(|e| e.detail(format!("The setting is in the options of {whose}.")))?;
        out.push((k, v));
    }
    Ok(out)
}

/// The server exists, is a `tide_kafka` server, and `owner` may use it (42704, 22023, 42501).
pub fn check_server_usage(server: &str, owner: &str) -> TideResult<()> {
    let fdw = sql::one::<String>(
        "SELECT w.fdwname::text FROM pg_foreign_server s JOIN pg_foreign_data_wrapper w ON w.oid = s.srvfdw WHERE s.srvname = $1",
        &[server.into()],
    )?;
    let q = pgrx::spi::quote_identifier;
    match fdw.as_deref() {
        None => {
            return Err(TideError::undefined(format!("foreign server \"{server}\" does not exist"))
                .hint(format!("CREATE SERVER {} FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers 'host:9092'); GRANT USAGE ON FOREIGN SERVER {} TO {};", q(server), q(server), q(owner))))
        }
        Some(WRAPPER) => {}
        Some(other) => {
            return Err(TideError::invalid(format!(
                "foreign server \"{server}\" uses the wrapper {other}, not {WRAPPER}"
            ))
            .hint("A kafka pipeline reads its brokers and settings from a tide_kafka server and the owner's user mapping."))
        }
    }
    crate::security::require_server_usage(server, owner)
}
