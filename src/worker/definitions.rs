//! Pipeline definitions for `pg_dump` (README, Upgrading > Dump and restore): the launcher
//! keeps `tide.pipeline_definition` equal to its database's pipelines (`tide._save_definitions`,
//! `schema/objects.sql`), at most every [`EVERY`] (a change is in the next `pg_dump` about that long after
//! its commit).
//!
//! Guarantees: a round that finds nothing changed writes nothing (no xid, no WAL: see [`save`]);
//! otherwise it writes only the rows that changed, in a transaction of its own that
//! waits at most [`LOCK_TIMEOUT`] for a row lock (a `tide.drop_pipeline` still open holds its
//! row): no role's open transaction can stall the launcher, and the launcher holds no lock a
//! role's statement waits for beyond one short transaction. A round that fails is logged and
//! tried again on the next.

use super::tx;
use crate::sql;
use pgrx::prelude::*;
use std::cell::Cell;
use std::time::{Duration, Instant};

/// How long a round waits for a row lock before leaving the rest to the next round.
pub const LOCK_TIMEOUT: &str = "100ms";

/// How often a launcher saves the definitions: each save builds every pipeline's definition
/// from the catalogs, work not worth doing on every one-second round.
pub const EVERY: Duration = Duration::from_secs(5);

thread_local! {
    /// When this launcher last saved (`None`: not yet).
    static LAST: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// One round: save the definitions that changed, at most every [`EVERY`].
pub fn save() {
    let due = LAST.with(|l| l.get().is_none_or(|t| t.elapsed() >= EVERY));
    if !due {
        return;
    }
    LAST.with(|l| l.set(Some(Instant::now())));
    let r = tx::run(|| {
        // Looked at read-only first: a write gives the round's transaction an xid and a commit
        // record even when no row changes, and an idle server must write no WAL (every
        // pipeline worker of the database wakes for it; `pg_upgrade` refuses a slot with any
        // transaction after its confirmed position).
        if !crate::catalog::definitions::changed()? {
            return Ok(Some(0));
        }
        sql::one::<String>(
            "SELECT pg_catalog.set_config('lock_timeout', $1, true)",
            &[LOCK_TIMEOUT.into()],
        )?;
        crate::catalog::definitions::save()
    });
    match r {
        Ok(Some(n)) if n > 0 => {
            debug1!("pg_tide launcher: saved {n} pipeline definition(s) for pg_dump")
        }
        Ok(_) => {}
        Err(e) if e.sqlstate() == "55P03" => {
            debug1!("pg_tide launcher: a pipeline definition is locked; saved on a later round")
        }
        Err(e) => log!("pg_tide launcher: could not save the pipeline definitions (tried again on the next round): {e}"),
    }
}
