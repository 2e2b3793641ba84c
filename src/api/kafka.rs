//! SQL-side checks of the `kafka` target: the foreign-data wrapper `tide_kafka`'s option
//! validator, reading a server's settings with the owner's user mapping, and create_pipeline's
//! checks (server, wrapper, USAGE, settings, a broker that answers).
//!
//! Where secrets live: brokers and non-secret settings in the foreign server's options (which
//! every role can read in `pg_foreign_server`), credentials (`sasl.password`, key passwords) only
//! in a user mapping (whose options only the mapped role, the server's owner and superusers can
//! read). The validator refuses a secret anywhere else, and any setting the target's guarantees
//! rest on everywhere (22023, with a hint).

use crate::error::{OrRaise, TideError, TideResult};
use crate::sink::kafka::{client, kafka_err, properties, resolve};
use crate::sink::options::{check_property, KafkaOptions};
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
        FOREIGN_SERVER => "a foreign server's options",
        USER_MAPPING => "a user mapping",
        _ => "the foreign-data wrapper's options",
    };
    if catalog != FOREIGN_SERVER && catalog != USER_MAPPING {
        if let Some(o) = options.into_iter().flatten().next() {
            return Err(TideError::invalid(format!("the wrapper {WRAPPER} takes no options, not \"{o}\""))
                .hint("Put the brokers and settings on the server: CREATE SERVER events FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers 'host:9092')."));
        }
        return Ok(());
    }
    let mut brokers = false;
    for o in options.into_iter().flatten() {
        let (name, value) = o.split_once('=').unwrap_or((o.as_str(), ""));
        if name == "brokers" {
            if catalog != FOREIGN_SERVER {
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
        check_property(&property, place)?;
        // librdkafka knows every property and its values: refuse what it would refuse later.
        let mut c = rdkafka::ClientConfig::new();
        c.set(&property, value);
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
    if catalog == FOREIGN_SERVER && !brokers {
        return Err(TideError::invalid("a tide_kafka server needs the option \"brokers\"")
            .hint("CREATE SERVER events FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers 'host:9092');"));
    }
    Ok(())
}

/// The options of `server` and then of the user mapping of `role` (or PUBLIC), as (name,
/// value); read as pg_tide (user mappings' options are hidden from other roles).
pub fn kafka_server_options(server: &str, role: &str) -> TideResult<Vec<(String, String)>> {
    let rows = crate::security::as_tide(|| {
        sql::text_rows(
            "SELECT o.k, o.v FROM (
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
        )
    })?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            let mut r = r.into_iter();
            Some((r.next().flatten()?, r.next().flatten().unwrap_or_default()))
        })
        .collect())
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
