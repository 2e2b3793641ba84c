//! What pg_tide made for a database that no longer exists: found and released by the launchers.
//!
//! Replication origins are the server's (`pg_replication_origin` is a shared catalog) and
//! `DROP DATABASE` leaves them, each holding one of the server's `max_replication_slots` origin
//! states once it was used: a role with `CREATEDB` that made databases with pipelines and dropped
//! them filled every state, and no pipeline of the server could start (issue 44). Slots
//! `DROP DATABASE` drops itself (it refuses while one is active), but a slot whose database is
//! gone is released here too, whatever left it.
//!
//! Owns: finding and dropping, at every launcher tick ([`Sweeper::sweep`], called by every
//! database's launcher; one at a time on the server, under [`crate::locks::Lock::Leaks`]):
//! - an origin named `pg_tide_<oid>_<pipeline>` (the name `worker::origin` gives) whose database
//!   `<oid>` is not in `pg_database`, or is invalid (a `DROP DATABASE` interrupted half way,
//!   which only a new `DROP DATABASE` can end);
//! - an origin named `pg_tide_<pipeline>` (a pipeline made before 0.3.0, whose origin carried no
//!   database) once no slot `tide_<pipeline>` (the slot of that time, which such a pipeline keeps
//!   as long as it uses that origin) exists on the server, and every pg_tide slot has read past
//!   the last transaction committed with it (so no decoding still to come looks it up by its
//!   id, which a new origin may take);
//! - an inactive logical slot of plugin `pg_tide` named `tide_*` whose database is gone or
//!   invalid.
//!
//! Guarantees: only names pg_tide makes are ever dropped (PostgreSQL reserves the `pg_` prefix
//! of origin names for C code: no SQL caller can make one), never one of a database that exists
//! and is valid, nor one in use (PostgreSQL refuses that drop; the error is logged once). Each
//! drop re-checks its condition in its own transaction, under the lock; each is logged with the
//! name and the database's OID.

use crate::error::{TideError, TideResult};
use crate::worker::tx;
use pgrx::prelude::*;
use std::collections::HashSet;

/// An origin of pg_tide's whose database no longer exists (or is invalid): `o` is
/// `pg_replication_origin`.
const GONE_ORIGIN: &str = "o.roname ~ '^pg_tide_[1-9][0-9]{0,9}_[a-z_][a-z0-9_]*$'
    AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_database d
                     WHERE d.oid::text = pg_catalog.substring(o.roname, '^pg_tide_([0-9]+)_')
                       AND d.datconnlimit <> -2)";

/// An origin named before 0.3.0 whose slot of that time is gone, and which no pg_tide slot has
/// still to read past.
const LEGACY_ORIGIN: &str = "o.roname ~ '^pg_tide_[a-z_][a-z0-9_]*$'
    AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots s
                     WHERE s.slot_name::text = 'tide_' || pg_catalog.substr(o.roname, 9))
    AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots s
                      JOIN pg_catalog.pg_replication_origin_status st ON st.local_id = o.roident
                     WHERE s.plugin = 'pg_tide' AND s.slot_type = 'logical'
                       AND (s.confirmed_flush_lsn IS NULL OR s.confirmed_flush_lsn < st.local_lsn))";

/// A slot of pg_tide's whose database no longer exists (or is invalid): `s` is
/// `pg_replication_slots`.
const GONE_SLOT: &str = "s.slot_type = 'logical' AND s.plugin = 'pg_tide' AND NOT s.active
    AND NOT s.temporary AND s.slot_name::text ~ '^tide_'
    AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_database d
                     WHERE d.oid = s.datoid AND d.datconnlimit <> -2)";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Origin,
    LegacyOrigin,
    Slot,
}

/// One thing to release: its kind, name and (as text) the OID of its database, when known.
struct Leak {
    kind: Kind,
    name: String,
    database: Option<String>,
}

/// A launcher's sweeps: remembers what it could not release, to log each failure once.
#[derive(Default)]
pub struct Sweeper {
    failed: HashSet<String>,
}

impl Sweeper {
    /// Find and release what dropped databases left (see the module comment). Each release is
    /// a transaction of its own; a failure is logged (once per name) and tried again next time.
    pub fn sweep(&mut self) {
        let leaks = match tx::run(find) {
            Ok(l) => l,
            Err(e) => {
                if self.failed.insert(String::new()) {
                    log!("pg_tide launcher: could not look for what dropped databases left: {e}");
                }
                return;
            }
        };
        for leak in leaks {
            match tx::run(|| release(&leak)) {
                Ok(true) => {
                    self.failed.remove(&leak.name);
                    log!("pg_tide launcher: {}", released(&leak));
                }
                Ok(false) => {}
                Err(e) => {
                    if self.failed.insert(leak.name.clone()) {
                        log!("pg_tide launcher: could not release {}: {e}", what(&leak));
                    }
                }
            }
        }
    }
}

/// "replication origin "x" of database N", for the log.
fn what(leak: &Leak) -> String {
    let kind = match leak.kind {
        Kind::Slot => "replication slot",
        Kind::Origin | Kind::LegacyOrigin => "replication origin",
    };
    match &leak.database {
        Some(db) => format!("{kind} \"{}\" of database {db}", leak.name),
        None => format!("{kind} \"{}\"", leak.name),
    }
}

/// The log line of a release.
fn released(leak: &Leak) -> String {
    match leak.kind {
        Kind::Origin | Kind::Slot => format!(
            "released {}, which no longer exists (or was dropped half way)",
            what(leak)
        ),
        Kind::LegacyOrigin => format!(
            "released {} (named before pg_tide 0.3.0, with no database), whose pipeline's slot \"tide_{}\" no longer exists",
            what(leak),
            leak.name.trim_start_matches(crate::worker::origin::PREFIX)
        ),
    }
}

/// Everything to release now. In the launcher's transaction (a read of shared catalogs).
fn find() -> TideResult<Vec<Leak>> {
    let rows = crate::sql::text_rows(
        &format!(
            "SELECT 'origin', o.roname, pg_catalog.substring(o.roname, '^pg_tide_([0-9]+)_')
               FROM pg_catalog.pg_replication_origin o WHERE {GONE_ORIGIN}
             UNION ALL
             SELECT 'legacy', o.roname, NULL
               FROM pg_catalog.pg_replication_origin o WHERE {LEGACY_ORIGIN}
             UNION ALL
             SELECT 'slot', s.slot_name::text, s.datoid::text
               FROM pg_catalog.pg_replication_slots s WHERE {GONE_SLOT}"
        ),
        &[],
        0,
        false,
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let mut r = r.into_iter();
        let kind = match r.next().flatten().as_deref() {
            Some("origin") => Kind::Origin,
            Some("legacy") => Kind::LegacyOrigin,
            Some("slot") => Kind::Slot,
            other => {
                return Err(TideError::internal(format!(
                    "unexpected kind {other:?} of a leak"
                )))
            }
        };
        let Some(name) = r.next().flatten() else {
            continue;
        };
        out.push(Leak {
            kind,
            name,
            database: r.next().flatten(),
        });
    }
    Ok(out)
}

/// Release `leak` if it still is one (re-checked after taking the server-wide lock, with a
/// snapshot taken after it). False when another launcher holds the lock or it is gone. In a
/// transaction of its own.
fn release(leak: &Leak) -> TideResult<bool> {
    if !crate::locks::try_lock(crate::locks::Lock::Leaks, crate::locks::Mode::Exclusive)? {
        return Ok(false);
    }
    let sql = match leak.kind {
        Kind::Origin => format!(
            "SELECT pg_catalog.pg_replication_origin_drop(o.roname)
               FROM pg_catalog.pg_replication_origin o WHERE o.roname = $1 AND {GONE_ORIGIN}"
        ),
        Kind::LegacyOrigin => format!(
            "SELECT pg_catalog.pg_replication_origin_drop(o.roname)
               FROM pg_catalog.pg_replication_origin o WHERE o.roname = $1 AND {LEGACY_ORIGIN}"
        ),
        Kind::Slot => format!(
            "SELECT pg_catalog.pg_drop_replication_slot(s.slot_name)
               FROM pg_catalog.pg_replication_slots s WHERE s.slot_name = $1::name AND {GONE_SLOT}"
        ),
    };
    Ok(crate::sql::exec_count(&sql, &[leak.name.as_str().into()])? > 0)
}
