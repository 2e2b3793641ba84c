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
//! a server a superuser owns or from a user mapping ([`crate::target::kafka::kafka_server_options`]).

use crate::error::{OrRaise, TideError, TideResult};
use crate::target::kafka::{
    check_server_usage, client, kafka_err, kafka_server_options, properties, resolve, WRAPPER,
};
use crate::target::options::{check_property, KafkaOptions, Place};
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::prelude::*;
use std::time::Duration;

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

/// create_pipeline's checks of a kafka target: the server, the owner's USAGE, the settings
/// (server, user mapping, pipeline options together), and a broker that answers (08001).
pub fn check_kafka(pipeline: &str, o: &KafkaOptions, owner: &str) -> TideResult<()> {
    let r = resolve(pipeline, o);
    check_server_usage(&r.server, owner)?;
    let server_options = kafka_server_options(&r.server, owner)?;
    // The producer is created (so librdkafka checks the settings together, transactional.id
    // and the timeouts included) but its transactions are not initialised: a check fences no one.
    let (props, delivery_timeout, transaction_timeout) = properties(
        pipeline,
        &server_options,
        &r,
        &crate::target::kafka::transactional_id(pipeline),
    );
    let mut sink = client::KafkaSink::start(client::ClientSettings {
        properties: props,
        pipeline: pipeline.to_string(),
        position_topic: r.position_topic.clone(),
        transaction_topic: r.transaction_topic.clone(),
        partitions: r.partitions,
        replication_factor: r.replication_factor,
        delivery_timeout,
        transactional: r.transactional,
        transaction_timeout,
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
