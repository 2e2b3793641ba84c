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
}

/// A pipeline's options, checked.
#[derive(Debug)]
pub enum Options {
    Outbox(OutboxOptions),
    Table(TableOptions),
    Postgres(PostgresOptions),
}

/// The options each kind takes, for hints.
fn names(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::Outbox => "none",
        TargetKind::Table => "schema (required), schema_changes",
        TargetKind::Postgres => "server (required), schema, schema_changes",
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
                _ => format!(
                    "Options of target \"{}\": {}. schema_changes is 'propagate' (the default: new columns and safe type widenings are applied to the target) or 'pause' (the pipeline stops with the reason).",
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
        };
        Ok(opts)
    }

    /// The normalised options, as stored in `tide.pipeline.options`.
    pub fn to_json(&self) -> TideResult<serde_json::Value> {
        let v = match self {
            Options::Outbox(o) => serde_json::to_value(o),
            Options::Table(o) => serde_json::to_value(o),
            Options::Postgres(o) => serde_json::to_value(o),
        };
        v.map_err(|e| TideError::internal(format!("cannot render options: {e}")))
    }

    /// The schema target tables live in (`public` where the kind has no schema).
    pub fn schema(&self) -> &str {
        match self {
            Options::Outbox(_) => "public",
            Options::Table(o) => o.schema.as_deref().unwrap_or("public"),
            Options::Postgres(o) => o.schema.as_deref().unwrap_or("public"),
        }
    }

    /// The foreign server of a remote target.
    pub fn server(&self) -> Option<&str> {
        match self {
            Options::Postgres(o) => o.server.as_deref(),
            _ => None,
        }
    }

    /// What to do on a schema change (table targets).
    pub fn schema_changes(&self) -> SchemaPolicy {
        match self {
            Options::Outbox(_) => SchemaPolicy::default(),
            Options::Table(o) => o.schema_changes.unwrap_or_default(),
            Options::Postgres(o) => o.schema_changes.unwrap_or_default(),
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
