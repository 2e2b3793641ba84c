//! `tide.alter_pipeline`: change the options of a pipeline that can change without a new slot
//! and without breaking what its target already holds.
//!
//! What may change, per target kind ([`alterable`]):
//! - `table`, `postgres`: `schema_changes` (what the next schema change does) and
//!   `session_replication_role` (which of the target's triggers fire: checked at the remote as
//!   `create_pipeline` checks it, with the owner's user mapping). Not `schema`
//!   (the target tables made so far stay where they are) nor `server` (the remote target keeps
//!   its tables and its applied position on that server; its connection settings change with
//!   `ALTER SERVER` / `ALTER USER MAPPING`, which the worker picks up on its own).
//! - `kafka`: `producer` (librdkafka tuning, checked against the allow-list) and `tombstones`.
//!   Not the topics (consumers read them, and the position topic holds where the pipeline
//!   stands), nor the server, the formats or the settings of topics already created.
//! - `outbox`: nothing (it has no options).
//!
//! The pipeline's name cannot change (0A000): it is in its slot's name (PostgreSQL 15 cannot
//! rename a slot), its replication origin's, its outbox events, its consumers and its locks.
//!
//! The worker builds its target from the options once and keeps it: the change stops the worker
//! and holds the pipeline's lock until commit, so the next worker (the launcher starts it) builds
//! its target from the new options.

use super::*;

/// Change a pipeline's options (the keys given replace the stored ones; a key set to JSON
/// `null` goes back to its default). `new_name` is refused: a pipeline cannot be renamed.
#[pg_extern]
pub(super) fn alter_pipeline(
    name: Option<&str>,
    new_name: default!(Option<&str>, "NULL"),
    options: default!(Option<JsonbArg>, "NULL"),
) {
    (|| {
        let options = match options {
            None => None,
            Some(o) => Some(json_arg(Some(o), "options")?),
        };
        alter_pipeline_impl(required(name, "name")?, new_name, options)
    })()
    .or_raise()
}

/// The options of each target kind that [`alter_pipeline`] may change (each kind's module says).
fn alterable(kind: TargetKind) -> &'static [&'static str] {
    crate::target::kind(kind).alterable
}

fn alter_pipeline_impl(
    name: &str,
    new_name: Option<&str>,
    options: Option<serde_json::Value>,
) -> TideResult<()> {
    let owner = require_pipeline(name)?;
    if new_name.is_some_and(|n| n != name) {
        return Err(TideError::new(
            pg_sys::errcodes::PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("pipeline \"{}\" cannot be renamed", shown(name)),
        )
        .hint("Rename is not supported: the name is in the pipeline's replication slot (tide_<database oid>_<name>), which PostgreSQL cannot rename, and in its origin, outbox events and consumers. Drop it and create a pipeline of the new name (tide.drop_pipeline, tide.create_pipeline, tide.add_table, tide.start_backfill)."));
    }
    let Some(given) = options else {
        pgrx::notice!("nothing to change in pipeline \"{}\"", shown(name));
        return Ok(());
    };
    let Some(given) = given.as_object() else {
        return Err(TideError::invalid(format!(
            "options must be a JSON object, not {}",
            shown(&given.to_string())
        ))
        .hint(
            "Pass the options to change as a jsonb object, e.g. '{\"schema_changes\": \"pause\"}'.",
        ));
    };
    let (kind, stored) = catalog::pipelines::target(name)?;
    let allowed = alterable(kind);
    if let Some(key) = given.keys().find(|k| !allowed.contains(&k.as_str())) {
        let can = if allowed.is_empty() {
            format!(
                "A pipeline of target \"{}\" has no option that can change",
                kind.as_str()
            )
        } else {
            format!(
                "Of a pipeline of target \"{}\" only {} can change",
                kind.as_str(),
                allowed.join(", ")
            )
        };
        return Err(TideError::invalid(format!(
            "option \"{}\" of pipeline \"{}\" cannot be changed",
            shown(key),
            shown(name)
        ))
        .hint(format!("{can}: the options that say where changes go (schema, server, topics) stay as created. To change them, drop the pipeline and create it again (a new slot; its tables are added and backfilled anew).")));
    }
    let mut merged = match &stored {
        serde_json::Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    for (k, v) in given {
        if v.is_null() {
            merged.remove(k);
        } else {
            merged.insert(k.clone(), v.clone());
        }
    }
    let parsed = crate::target::options::Options::parse(kind, &serde_json::Value::Object(merged))?;
    if let crate::target::options::Options::Kafka(o) = &parsed {
        // As create_pipeline: the settings together with the server's and the owner's mapping,
        // and a broker that answers (the worker connects as the owner).
        kafka::check_kafka(name, o, &owner)?;
    }
    if let (Some(server), crate::target::options::ReplicationRole::Replica) =
        (parsed.server(), parsed.replication_role())
    {
        // As create_pipeline: the owner's remote user must be allowed to set it.
        super::targets::check_remote(server, &owner, true)?;
    }
    let options = parsed.to_json()?;
    if options == stored {
        pgrx::notice!(
            "pipeline \"{}\" already has these options: nothing to change",
            shown(name)
        );
        return Ok(());
    }
    crate::security::as_tide(|| {
        // The worker keeps the target it built from the old options: stop it, and keep the
        // next one out until this transaction ends (it then builds its target anew).
        let stopped = pipelines::stop_worker(name, "tide.alter_pipeline")?;
        // Under the lock: another alter_pipeline may have changed them since they were read.
        if catalog::pipelines::target(name)?.1 != stored {
            return Err(TideError::new(
                pg_sys::errcodes::PgSqlErrorCode::ERRCODE_T_R_SERIALIZATION_FAILURE,
                format!(
                    "the options of pipeline \"{}\" changed meanwhile",
                    shown(name)
                ),
            )
            .hint(
                "Another tide.alter_pipeline changed them: see tide.pipelines and call it again.",
            ));
        }
        catalog::pipelines::set_options(name, JsonB(options))?;
        for pid in stopped {
            pipelines::wait_for_exit(pid, 30, "tide.alter_pipeline")?;
        }
        crate::quota::want_launcher_at_end();
        Ok(())
    })
}
