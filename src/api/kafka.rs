//! SQL-side checks of the `kafka` target: the foreign-data wrapper `tide_kafka`'s option
//! validator, reading a server's settings with the owner's user mapping, and create_pipeline's
//! checks (server, wrapper, USAGE, settings, a broker that answers).
//!
//! Where secrets live: brokers and non-secret settings in the foreign server's options (which
//! every role can read in `pg_foreign_server`), credentials (`sasl.password`, key passwords) only
//! in a user mapping (whose options only the mapped role, the server's owner and superusers can
//! read). The validator refuses a secret anywhere else, and any setting the target's guarantees
//! rest on everywhere (22023, with a hint).
//!
//! What reaches librdkafka: only the properties of the allow-list (`tide_core::kafka::access`;
//! anything else 22023). A property that names a file, a program or a library (librdkafka
//! reads, runs or loads it inside this process: `plugin.library.paths` is dlopen()ed the moment
//! it is set) is accepted only from a superuser, checked before any librdkafka configuration
//! is built (42501 otherwise, also when the validator is called directly), and used only from
//! a server a superuser owns or from a user mapping ([`kafka_server_options`]).

use crate::error::{OrRaise, TideError, TideResult};
use crate::sink::kafka::{client, kafka_err, properties, resolve};
use crate::sink::options::{check_property, KafkaOptions, Place};
use crate::sql;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::prelude::*;
use std::time::Duration;

/// The foreign-data wrapper of kafka targets.
pub const WRAPPER: &str = "tide_kafka";
const CHECK_TIMEOUT: Duration = Duration::from_secs(15);

/// `pg_foreign_server`, `pg_user_mapping` and `pg_foreign_data_wrapper`'s OIDs (the catalog a
/// validator is called for).
const FOREIGN_SERVER: u32 = 1417;
const USER_MAPPING: u32 = 1418;

/// The validator of the wrapper `tide_kafka`: checks each option of a server or user mapping
/// when it is created or altered.
#[pg_extern]
fn _kafka_fdw_validator(options: Option<Vec<Option<String>>>, catalog: Option<pg_sys::Oid>) {
    validate(
        options.unwrap_or_default(),
        catalog.map_or(0, |c| c.to_u32()),
    )
    .or_raise()
}

fn validate(options: Vec<Option<String>>, catalog: u32) -> TideResult<()> {
    let place = match catalog {
        FOREIGN_SERVER => Place::Server,
        USER_MAPPING => Place::UserMapping,
        _ => {
            if let Some(o) = options.into_iter().flatten().next() {
                return Err(TideError::invalid(format!("the wrapper {WRAPPER} takes no options, not \"{o}\""))
                    .hint("Put the brokers and settings on the server: CREATE SERVER events FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers 'host:9092')."));
            }
            return Ok(());
        }
    };
    // The validator runs as the role executing CREATE/ALTER SERVER or USER MAPPING (or calling
    // it directly): a property naming a file, a program or a library is a superuser's.
    // SAFETY: superuser() only reads the current user's role attributes (from the syscache);
    // a validator always runs in a backend, inside a transaction.
    let superuser = unsafe { pg_sys::superuser() };
    // Every option against the allow-list first: nothing reaches librdkafka (which loads
    // plugin.library.paths the moment it is set) before every option has passed.
    let mut brokers = false;
    let mut checked = Vec::new();
    for o in options.into_iter().flatten() {
        let (name, value) = o.split_once('=').unwrap_or((o.as_str(), ""));
        if name == "brokers" {
            if place != Place::Server {
                return Err(TideError::invalid("option \"brokers\" belongs to the foreign server")
                    .hint("ALTER SERVER ... OPTIONS (SET brokers '...'); the user mapping holds credentials."));
            }
            if value.trim().is_empty() {
                return Err(TideError::invalid("option \"brokers\" is empty")
                    .hint("Name the bootstrap brokers: brokers 'host1:9092,host2:9092'."));
            }
            brokers = true;
            continue;
        }
        let property = tide_core::kafka::property_name(name);
        check_property(&property, value, place, superuser)?;
        checked.push((name.to_string(), property, value.to_string()));
    }
    if place == Place::Server && !brokers {
        return Err(TideError::invalid("a tide_kafka server needs the option \"brokers\"")
            .hint("CREATE SERVER events FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers 'host:9092');"));
    }
    // librdkafka knows every property's values: refuse what it would refuse later.
    for (name, property, value) in checked {
        let mut c = rdkafka::ClientConfig::new();
        c.set(&property, &value);
        if let Err(e) = c.create_native_config() {
            // librdkafka's description only: the value (which may be a secret) is not repeated.
            let why = match e {
                rdkafka::error::KafkaError::ClientConfig(_, desc, _, _) => desc,
                other => other.to_string(),
            };
            return Err(TideError::invalid(format!("invalid Kafka setting \"{name}\": {why}"))
                .hint("Options are librdkafka configuration properties (see its CONFIGURATION.md), written with '.' or '_' (security_protocol for security.protocol)."));
        }
    }
    Ok(())
}

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
    let usage = sql::one::<bool>(
        "SELECT has_server_privilege($1::text::name, $2, 'USAGE')",
        &[owner.into(), server.into()],
    )?
    .unwrap_or(false);
    if !usage {
        return Err(TideError::privilege(format!(
            "role \"{owner}\" may not use foreign server \"{server}\""
        ))
        .hint(format!(
            "GRANT USAGE ON FOREIGN SERVER {} TO {};",
            q(server),
            q(owner)
        )));
    }
    Ok(())
}

/// create_pipeline's checks of a kafka target: the server, the owner's USAGE, the settings
/// (server, user mapping, pipeline options together), and a broker that answers (08001).
pub fn check_kafka(pipeline: &str, o: &KafkaOptions, owner: &str) -> TideResult<()> {
    let r = resolve(pipeline, o);
    check_server_usage(&r.server, owner)?;
    let server_options = kafka_server_options(&r.server, owner)?;
    let (props, delivery_timeout) = properties(pipeline, &server_options, &r);
    let mut sink = client::KafkaSink::start(client::ClientSettings {
        properties: props,
        pipeline: pipeline.to_string(),
        position_topic: r.position_topic.clone(),
        transaction_topic: r.transaction_topic.clone(),
        partitions: r.partitions,
        replication_factor: r.replication_factor,
        delivery_timeout,
    });
    sink.call(client::Work::Check, CHECK_TIMEOUT, false)
        .map_err(|e| {
            if e.config {
                return kafka_err(e);
            }
            TideError::new(
                PgSqlErrorCode::ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
                format!("cannot reach the Kafka brokers of server \"{}\": {}", r.server, e.message),
            )
            .hint("Check the server's brokers option (and security settings) and that a broker runs. (Once the pipeline exists, an outage is not an error to you: the pipeline shows it and catches up.)")
        })?;
    Ok(())
}
