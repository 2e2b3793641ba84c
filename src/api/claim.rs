//! `tide.claim_target`: a DBA moves a pipeline's remote target to this server at once (README,
//! Concepts > One writer per target). The target's owner becomes this server and its epoch moves
//! on, so the pipeline of the same name on the server that wrote it until now commits nothing
//! more there: its next write is refused and it pauses, fenced (`target::table::fence`).

use super::*;
use crate::target::options::Options;
use crate::target::remote::{remote_access, RemoteSink};
use crate::target::table::fence;
use std::time::Duration;

/// How long the claim waits for the remote target.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(30);

/// Make this server the writer of the pipeline's remote target now, whatever server owned it;
/// returns the target's new epoch.
#[pg_extern]
fn claim_target(name: Option<&str>) -> i64 {
    required(name, "name")
        .and_then(claim_target_impl)
        .or_raise()
}

fn claim_target_impl(name: &str) -> TideResult<i64> {
    require_pipeline(name)?;
    let p = security::as_tide(|| {
        pgrx::Spi::connect_mut(|c| catalog::pipelines::lock_pipeline(c, name))
    })?
    .ok_or_else(|| TideError::undefined(format!("pipeline \"{}\" does not exist", shown(name))))?;
    if !crate::target::kind(p.target).remote {
        return Err(TideError::wrong_object(format!(
            "pipeline \"{}\" writes a {} target, which has no owner to claim",
            shown(name),
            p.target.as_str()
        ))
        .hint("Only a remote PostgreSQL target (target 'postgres') is owned by one server; an outbox or table target lives in this database and moves with it."));
    }
    let opts = Options::parse(p.target, &p.options).map_err(|e| {
        TideError::internal(format!(
            "pipeline \"{}\" has options pg_tide cannot read: {}",
            shown(name),
            e.message
        ))
    })?;
    let server = opts.server().ok_or_else(|| {
        TideError::invalid(format!("pipeline \"{}\" has no server option", shown(name)))
    })?;
    // The connection the pipeline's worker makes: the owner's user mapping, its rules.
    let sink = RemoteSink::start_with(remote_access(server, &p.owner)?, "pg_tide claim");
    let table = format!(
        "{}.tide_applied",
        tide_core::plan::quote_ident(opts.schema())
    );
    let schema = tide_core::plan::quote_ident(opts.schema());
    let remote = crate::target::table::remote_err;
    sink.query(
        &format!("CREATE SCHEMA IF NOT EXISTS {schema}"),
        vec![],
        CLAIM_TIMEOUT,
    )
    .map_err(remote)?;
    sink.query(
        &format!("CREATE TABLE IF NOT EXISTS {table} (pipeline text PRIMARY KEY, applied_lsn pg_lsn NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"),
        vec![],
        CLAIM_TIMEOUT,
    )
    .map_err(remote)?;
    sink.query(&fence::add_columns_sql(&table), vec![], CLAIM_TIMEOUT)
        .map_err(remote)?;
    let (before, epoch) = fence::claim(&sink, &table, &p, CLAIM_TIMEOUT)?;
    pgrx::notice!(
        "the remote target of pipeline \"{}\" belongs to this server from now on (epoch {epoch}); it belonged to {before}",
        shown(name)
    );
    // The worker takes it at its next attempt; waking it shortens a poll (not a back-off).
    wake_on_commit(shmem::worker_pid(name));
    Ok(epoch)
}
