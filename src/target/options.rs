//! A pipeline's options, typed per target kind.
//!
//! Owns: what each target kind accepts in `tide.create_pipeline(..., options)`, the defaults,
//! and the normalised form stored in `tide.pipeline.options`.
//!
//! Guarantees: options are deserialized with serde into one struct per kind with
//! `deny_unknown_fields`, so an unknown or mistyped option is an error (SQLSTATE 22023 with the
//! options of that kind in the hint), never ignored; required options are non-empty strings.
//! The worker parses the stored options with the same code, so a row it cannot read is an
//! error too, never a default.

use crate::error::{TideError, TideResult};
use serde::{Deserialize, Serialize};
use tide_core::model::TargetKind;

/// What a table target does when the source's shape changes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemaPolicy {
    /// Add new columns and apply safe type widenings to the target; pause on anything else.
    #[default]
    Propagate,
    /// Pause the pipeline on any change, with the reason.
    Pause,
}

/// How a table target is written, as to triggers and rules (the option
/// `session_replication_role`, set while pg_tide writes the target).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicationRole {
    /// pg_tide's behaviour (the default, as before 0.3.0): the target's ordinary triggers and
    /// rules fire (`ENABLE REPLICA` ones do not), and its foreign keys are checked.
    #[default]
    Origin,
    /// PostgreSQL's apply worker's: only `ENABLE REPLICA` and `ENABLE ALWAYS` triggers and
    /// rules fire; ordinary ones, foreign keys included, do not.
    Replica,
}

/// Options of the outbox target: none.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxOptions {}

/// Options of the `table` target (tables in this database).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TableOptions {
    /// Where the target tables live (required).
    pub schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_changes: Option<SchemaPolicy>,
    /// `session_replication_role` while writing the target (default `origin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_replication_role: Option<ReplicationRole>,
}

/// Options of the `postgres` target (tables in another PostgreSQL).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresOptions {
    /// The foreign server (postgres_fdw) to connect to (required).
    pub server: Option<String>,
    /// Where the target tables live on the remote (default `public`).
    pub schema: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_changes: Option<SchemaPolicy>,
    /// `session_replication_role` while writing the target (default `origin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_replication_role: Option<ReplicationRole>,
}

/// Options of the `kafka` target (topics of a Kafka cluster; README "Kafka target").
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaOptions {
    /// The foreign server (wrapper `tide_kafka`) naming the brokers (required).
    pub server: Option<String>,
    /// `{prefix}` of topic names (default: the pipeline's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_prefix: Option<String>,
    /// Topic of a table: a template with `{prefix}`, `{schema}`, `{table}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Topic of the transaction metadata (default `{prefix}.transaction`; `""`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction_topic: Option<String>,
    /// Topic of the pipeline's positions (default `{prefix}.pg_tide.position`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position_topic: Option<String>,
    /// A tombstone (null value) after each delete (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tombstones: Option<bool>,
    /// Format of the key: `json` (the key columns as a JSON object) or `json-schema` (with its
    /// Kafka Connect schema; the default with `value_format` `debezium-schema`, and only with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_format: Option<String>,
    /// Format of the value: `debezium` (the envelope as JSON, the default) or `debezium-schema`
    /// (`{"schema", "payload"}` as Debezium's JsonConverter writes it with `schemas.enable=true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_format: Option<String>,
    /// Partitions of the topics pg_tide creates (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<i32>,
    /// Replication factor of the topics pg_tide creates (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication_factor: Option<i32>,
    /// librdkafka producer settings passed through (no secrets, none the guarantees rest on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<std::collections::BTreeMap<String, serde_json::Value>>,
    /// `exactly-once` (the default: each batch and its position in one Kafka transaction) or
    /// `at-least-once` (the idempotent producer alone, for brokers without transactions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<String>,
}

impl KafkaOptions {
    /// Whether values carry their Kafka Connect schema (`value_format` `debezium-schema`).
    pub fn value_schema(&self) -> bool {
        self.value_format.as_deref() == Some("debezium-schema")
    }

    /// Whether keys carry their Kafka Connect schema: `key_format` `json-schema`, the default
    /// with `value_format` `debezium-schema`.
    pub fn key_schema(&self) -> bool {
        match self.key_format.as_deref() {
            Some(f) => f == "json-schema",
            None => self.value_schema(),
        }
    }

    /// Whether batches go out in Kafka transactions (`delivery` `exactly-once`, the default).
    pub fn transactional(&self) -> bool {
        self.delivery.as_deref() != Some("at-least-once")
    }

    /// The pass-through settings as librdkafka properties (values as text).
    pub fn producer_settings(&self) -> Vec<(String, String)> {
        self.producer
            .iter()
            .flatten()
            .map(|(k, v)| {
                let v = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (tide_core::kafka::property_name(k), v)
            })
            .collect()
    }

    /// Check what serde cannot: required and allowed values, refused settings.
    fn check(&self) -> TideResult<()> {
        if non_empty(&self.server).is_none() {
            return Err(TideError::invalid("target \"kafka\" needs the option \"server\"")
                .hint("Create a foreign server of the wrapper tide_kafka naming the brokers (CREATE SERVER events FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers 'host:9092')), then pass '{\"server\": \"events\"}'."));
        }
        if let Some(t) = &self.topic {
            tide_core::kafka::valid_template(t).map_err(|m| {
                TideError::invalid(m).hint("The topic template may use {prefix}, {schema} and {table}, e.g. '{prefix}.{schema}.{table}' (the default).")
            })?;
        }
        for (name, v) in [
            ("topic_prefix", &self.topic_prefix),
            ("position_topic", &self.position_topic),
        ] {
            if v.is_some() && non_empty(v).is_none() {
                return Err(TideError::invalid(format!(
                    "option \"{name}\" must be a non-empty string"
                ))
                .hint("Leave it out for its default."));
            }
        }
        let value_format = self.value_format.as_deref().unwrap_or("debezium");
        if !matches!(value_format, "debezium" | "debezium-schema") {
            return Err(TideError::invalid(format!(
                "unknown value_format \"{value_format}\""
            ))
            .hint(
                "value_format is 'debezium' (Debezium's envelope as JSON without a schema, the default) or 'debezium-schema' (the envelope with its Kafka Connect schema, as Debezium's JsonConverter writes it with schemas.enable=true).",
            ));
        }
        let key_format = self.key_format.as_deref().unwrap_or("json");
        if !matches!(key_format, "json" | "json-schema") {
            return Err(TideError::invalid(format!(
                "unknown key_format \"{key_format}\""
            ))
            .hint(
                "key_format is 'json' (the key columns as a JSON object) or 'json-schema' (the key with its Kafka Connect schema; the default with value_format 'debezium-schema').",
            ));
        }
        if let Some(d) = self.delivery.as_deref() {
            if !matches!(d, "exactly-once" | "at-least-once") {
                return Err(TideError::invalid(format!("unknown delivery \"{d}\""))
                    .hint("delivery is 'exactly-once' (the default: each batch of changes and the pipeline's position commit in one Kafka transaction, so a read_committed consumer sees every change once) or 'at-least-once' (no Kafka transactions, for brokers without them: after a crash the batch in flight may be sent again)."));
            }
        }
        if key_format == "json-schema" && value_format != "debezium-schema" {
            return Err(TideError::invalid(
                "key_format 'json-schema' needs value_format 'debezium-schema'",
            )
            .hint("Pass '{\"value_format\": \"debezium-schema\"}' (its key has a schema by default), or leave key_format out."));
        }
        for (name, v) in [
            ("partitions", self.partitions),
            ("replication_factor", self.replication_factor),
        ] {
            if v.is_some_and(|n| n < 1) {
                return Err(
                    TideError::invalid(format!("option \"{name}\" must be at least 1")).hint(
                        "It applies to the topics pg_tide creates; existing topics keep theirs.",
                    ),
                );
            }
        }
        for (k, v) in self.producer.iter().flatten() {
            if !(v.is_string() || v.is_number() || v.is_boolean()) {
                return Err(TideError::invalid(format!(
                    "producer setting \"{k}\" must be a string, number or boolean, not {v}"
                ))
                .hint("Pass librdkafka settings as '{\"producer\": {\"linger.ms\": \"5\"}}'."));
            }
        }
        for (property, value) in self.producer_settings() {
            check_property(&property, &value, Place::Producer, false)?;
        }
        Ok(())
    }
}

/// Where a librdkafka property was given.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Place {
    /// A `tide_kafka` foreign server's options (every role can read them).
    Server,
    /// A user mapping (only the mapped role, the server's owner and superusers read it).
    UserMapping,
    /// A pipeline's `producer` option (written by the pipeline's owner).
    Producer,
}

impl Place {
    fn describe(self) -> &'static str {
        match self {
            Place::Server => "a foreign server's options",
            Place::UserMapping => "a user mapping",
            Place::Producer => "the pipeline's producer option",
        }
    }
}

/// Check a librdkafka property against pg_tide's allow-list (`tide_core::kafka::access`) for
/// `place`; `superuser`: whether a superuser wrote it. Refuses a property pg_tide sets itself
/// or that is not on the list (22023), one that names a file, a program or a library from
/// anyone but a superuser, or in `producer` (42501), a connection setting in `producer` and a
/// secret outside a user mapping (22023). Pure: nothing reaches librdkafka here.
pub fn check_property(
    property: &str,
    value: &str,
    place: Place,
    superuser: bool,
) -> TideResult<()> {
    use tide_core::kafka::{access, secret_setting, Access, ALLOW_LIST_DOC};
    let at = place.describe();
    let secret = || {
        TideError::invalid(format!(
            "the Kafka setting \"{property}\" holds a secret and cannot be set in {at}, which other roles can read"
        ))
        .hint("Put it in the user mapping of the pipeline's owner: CREATE USER MAPPING FOR <owner> SERVER <server> OPTIONS (\"sasl.password\" '...'); only that role and superusers can read it.")
    };
    match access(property, value) {
        Access::PgTide(why) => {
            return Err(TideError::invalid(format!(
                "the Kafka setting \"{property}\" cannot be set in {at}"
            ))
            .hint(format!("pg_tide sets it: {why}. Leave it out.")))
        }
        Access::Unknown => {
            return Err(TideError::invalid(format!(
                "the Kafka setting \"{property}\" is not one pg_tide takes"
            ))
            .hint(format!("pg_tide passes librdkafka only the properties of its allow-list: producer tuning (linger.ms, batch.size, compression.type, message.timeout.ms, socket and back-off timeouts, ...) anywhere; how to connect (security.protocol, sasl.mechanism, sasl.username, sasl.password, ssl.ca.pem, ...) in the server or user mapping; files librdkafka reads (ssl.ca.location, ...) only from a superuser. Names are librdkafka's, with '.' or '_'. The allow-list: {ALLOW_LIST_DOC}.")))
        }
        Access::Superuser(what) => {
            if place == Place::Producer {
                return Err(TideError::privilege(format!(
                    "the Kafka setting \"{property}\" cannot be set in {at}: {what}"
                ))
                .hint(format!("Only a superuser decides which files, programs and libraries librdkafka uses, in a foreign server's or user mapping's options: ask one to add it to the server (ALTER SERVER <server> OPTIONS (ADD \"{property}\" '...')).")));
            }
            if !superuser {
                return Err(TideError::privilege(format!(
                    "the Kafka setting \"{property}\" is superuser-only: {what}"
                ))
                .hint(format!("Ask a superuser to put it in the foreign server's options (ALTER SERVER <server> OPTIONS (ADD \"{property}\" '...')) or in your user mapping.")));
            }
        }
        Access::Connection if place == Place::Producer => {
            if secret_setting(property) {
                return Err(secret());
            }
            return Err(TideError::invalid(format!(
                "the Kafka setting \"{property}\" cannot be set in {at}: how to connect belongs to the foreign server or the user mapping"
            ))
            .hint(format!("Connection and authentication settings go with the credentials they protect: ALTER SERVER <server> OPTIONS (ADD \"{property}\" '...') or the user mapping of the pipeline's owner.")));
        }
        Access::Connection | Access::Anywhere => {}
    }
    if secret_setting(property) && place != Place::UserMapping {
        return Err(secret());
    }
    Ok(())
}

/// A pipeline's options, checked.
#[derive(Debug)]
pub enum Options {
    Outbox(OutboxOptions),
    Table(TableOptions),
    Postgres(PostgresOptions),
    Kafka(KafkaOptions),
}

/// The options each kind takes, for hints.
fn names(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::Outbox => "none",
        TargetKind::Table => "schema (required), schema_changes, session_replication_role",
        TargetKind::Postgres => "server (required), schema, schema_changes, session_replication_role",
        TargetKind::Kafka => "server (required), topic_prefix, topic, transaction_topic, position_topic, tombstones, key_format, value_format, partitions, replication_factor, producer, delivery",
    }
}

/// Schemas no local target may be in: the system's and pg_tide's own.
pub fn reserved_schema(schema: &str) -> bool {
    schema == "tide" || schema == "information_schema" || schema.starts_with("pg_")
}

fn non_empty(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.trim().is_empty())
}

impl Options {
    /// Parse and check options for a target kind.
    pub fn parse(kind: TargetKind, value: &serde_json::Value) -> TideResult<Options> {
        if !value.is_object() {
            return Err(
                TideError::invalid(format!("options must be a JSON object, not {value}"))
                    .hint("Pass options as a jsonb object, for example '{}'."),
            );
        }
        let bad = |e: serde_json::Error| {
            let hint = match kind {
                TargetKind::Outbox => "The outbox target takes no options: pass '{}'.".to_string(),
                TargetKind::Kafka => format!("Options of target \"kafka\": {}.", names(kind)),
                _ => format!(
                    "Options of target \"{}\": {}. schema_changes is 'propagate' (the default: new columns and safe type widenings are applied to the target) or 'pause' (the pipeline stops with the reason). session_replication_role is 'origin' (the default: the target's ordinary triggers fire) or 'replica' (as PostgreSQL's apply worker: only ENABLE REPLICA and ENABLE ALWAYS triggers fire).",
                    kind.as_str(),
                    names(kind)
                ),
            };
            TideError::invalid(format!(
                "invalid options for target \"{}\": {e}",
                kind.as_str()
            ))
            .hint(hint)
        };
        let opts = match kind {
            TargetKind::Outbox => Options::Outbox(OutboxOptions::deserialize(value).map_err(bad)?),
            TargetKind::Table => {
                let o = TableOptions::deserialize(value).map_err(bad)?;
                let Some(schema) = non_empty(&o.schema) else {
                    return Err(TideError::invalid("target \"table\" needs the option \"schema\"")
                        .hint("Name the schema where the target tables live, e.g. '{\"schema\": \"replica\"}'. It must not be the source tables' schema."));
                };
                if reserved_schema(schema) {
                    return Err(TideError::invalid(format!(
                        "schema \"{schema}\" cannot hold target tables: pg_tide does not write to it"
                    ))
                    .hint("Targets live in your own schemas: not pg_catalog, information_schema, pg_toast, pg_temp or pg_tide's schema tide."));
                }
                Options::Table(o)
            }
            TargetKind::Postgres => {
                let mut o = PostgresOptions::deserialize(value).map_err(bad)?;
                if non_empty(&o.server).is_none() {
                    return Err(TideError::invalid("target \"postgres\" needs the option \"server\"")
                        .hint("Create a foreign server (CREATE SERVER s FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host ..., dbname ...)) and a user mapping, then pass '{\"server\": \"s\"}'."));
                }
                if o.schema.is_some() && non_empty(&o.schema).is_none() {
                    return Err(
                        TideError::invalid("option \"schema\" must be a non-empty string")
                            .hint("Leave it out for the remote's schema public."),
                    );
                }
                o.schema.get_or_insert_with(|| "public".to_string());
                Options::Postgres(o)
            }
            TargetKind::Kafka => {
                let o = KafkaOptions::deserialize(value).map_err(bad)?;
                o.check()?;
                Options::Kafka(o)
            }
        };
        Ok(opts)
    }

    /// The normalised options, as stored in `tide.pipeline.options`.
    pub fn to_json(&self) -> TideResult<serde_json::Value> {
        let v = match self {
            Options::Outbox(o) => serde_json::to_value(o),
            Options::Table(o) => serde_json::to_value(o),
            Options::Postgres(o) => serde_json::to_value(o),
            Options::Kafka(o) => serde_json::to_value(o),
        };
        v.map_err(|e| TideError::internal(format!("cannot render options: {e}")))
    }

    /// The schema target tables live in (`public` where the kind has no schema).
    pub fn schema(&self) -> &str {
        match self {
            Options::Outbox(_) | Options::Kafka(_) => "public",
            Options::Table(o) => o.schema.as_deref().unwrap_or("public"),
            Options::Postgres(o) => o.schema.as_deref().unwrap_or("public"),
        }
    }

    /// The foreign server of a remote target.
    pub fn server(&self) -> Option<&str> {
        match self {
            Options::Postgres(o) => o.server.as_deref(),
            Options::Kafka(o) => o.server.as_deref(),
            _ => None,
        }
    }

    /// What to do on a schema change (table targets).
    pub fn schema_changes(&self) -> SchemaPolicy {
        match self {
            Options::Outbox(_) | Options::Kafka(_) => SchemaPolicy::default(),
            Options::Table(o) => o.schema_changes.unwrap_or_default(),
            Options::Postgres(o) => o.schema_changes.unwrap_or_default(),
        }
    }

    /// `session_replication_role` of a table target (`origin` for the other kinds).
    pub fn replication_role(&self) -> ReplicationRole {
        match self {
            Options::Outbox(_) | Options::Kafka(_) => ReplicationRole::default(),
            Options::Table(o) => o.session_replication_role.unwrap_or_default(),
            Options::Postgres(o) => o.session_replication_role.unwrap_or_default(),
        }
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use super::*;
    use pgrx::prelude::*;
    use serde_json::json;

    #[pg_test]
    fn typed_options() {
        let t = Options::parse(TargetKind::Table, &json!({"schema": "r"})).unwrap_or_else(|e| {
            panic!("{}", e.message);
        });
        assert_eq!(t.schema(), "r");
        assert_eq!(t.schema_changes(), SchemaPolicy::Propagate);
        let p = Options::parse(
            TargetKind::Postgres,
            &json!({"server": "s", "schema_changes": "pause"}),
        )
        .unwrap_or_else(|e| panic!("{}", e.message));
        assert_eq!(p.schema(), "public");
        assert_eq!(p.server(), Some("s"));
        assert_eq!(p.schema_changes(), SchemaPolicy::Pause);
        assert_eq!(
            p.to_json().ok(),
            Some(json!({"server": "s", "schema": "public", "schema_changes": "pause"}))
        );
        for (kind, bad) in [
            (TargetKind::Outbox, json!({"schema": "r"})),
            (TargetKind::Table, json!({"schema": "r", "scheme": "x"})),
            (TargetKind::Table, json!({"schema": 5})),
            (TargetKind::Table, json!({"schema": " "})),
            (TargetKind::Table, json!({"schema": "tide"})),
            (TargetKind::Table, json!({"schema": "pg_catalog"})),
            (
                TargetKind::Table,
                json!({"schema": "r", "schema_changes": "later"}),
            ),
            (TargetKind::Postgres, json!({"schema": "r"})),
            (TargetKind::Postgres, json!([])),
        ] {
            let e = Options::parse(kind, &bad).err();
            assert_eq!(
                e.map(|e| e.sqlstate()),
                Some("22023".to_string()),
                "{bad} for {kind:?}"
            );
        }
    }
}
