//! The local backend of a table target: statements run through SPI in the worker's
//! transaction, as the pipeline's owner in a security-restricted operation.
//!
//! Guarantees: every statement runs as the owner (`security::as_owner_writing`, or
//! `security::as_owner` for a bulk load, which fires no trigger), so a target is only ever
//! written as its owner could by hand, and a right revoked after `add_table` fails the pipeline
//! with the permission error; the applied position is the pipeline row's, written by the
//! worker in the same transaction, so this backend keeps none of its own. A deferrable
//! constraint between target tables (a `DEFERRABLE INITIALLY DEFERRED` foreign key) is checked
//! at the target transaction's commit ([`Backend::commit`]: `security::fire_deferred`), its
//! triggers fired as the owner, as PostgreSQL's apply worker checks it at its commit.

use super::Backend;
use crate::bulk;
use crate::catalog::pipelines::PipelineRow;
use crate::error::TideResult;
use crate::sql;
use crate::target::{CommitPoint, RowBatch};
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys;
use pgrx::spi::SpiClient;
use tide_core::lsn::Lsn;
use tide_core::plan::{range_has_rows, Statement, TableRef};

/// Runs a table target's statements in this database.
pub struct Local {
    /// The pipeline's owner.
    pub owner: pgrx::pg_sys::Oid,
    /// The pipeline's name.
    pub pipeline: String,
    /// The option `session_replication_role` is `replica`: statements run with it (see
    /// [`Local::check_replica`]).
    pub replica: bool,
}

impl Local {
    /// With `session_replication_role = replica`, a foreign key's triggers do not fire: the
    /// owner's writes — pg_tide's statement and whatever the target's `ENABLE ALWAYS` or
    /// `ENABLE REPLICA` triggers write in turn — would skip a foreign key the owner could not
    /// drop or disable by hand, one that links a table with a table of a role whose privileges
    /// the owner does not have (that role's rows could be left referencing nothing, or could
    /// reference rows that are not there). So after each statement, every table this
    /// transaction has written (it holds their `ROW EXCLUSIVE` locks: `pg_locks`), pg_tide's
    /// own aside, is looked at: such a foreign key on one of them is refused (42501), while the
    /// statement's locks are held (a foreign key added later waits for this transaction), and
    /// the transaction rolls back with whatever the statement did.
    fn check_replica(&self) -> TideResult<()> {
        if !self.replica {
            return Ok(());
        }
        let found = crate::sql::one::<String>(
            "SELECT pg_catalog.format('%I of %s (to %s)', c.conname, c.conrelid::pg_catalog.regclass, c.confrelid::pg_catalog.regclass)
               FROM pg_catalog.pg_locks l
               JOIN pg_catalog.pg_constraint c ON c.contype OPERATOR(pg_catalog.=) 'f'
                                              AND (c.conrelid OPERATOR(pg_catalog.=) l.relation
                                                   OR c.confrelid OPERATOR(pg_catalog.=) l.relation)
               JOIN pg_catalog.pg_class w ON w.oid OPERATOR(pg_catalog.=) l.relation
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) w.relnamespace
               JOIN pg_catalog.pg_class a ON a.oid OPERATOR(pg_catalog.=) c.conrelid
               JOIN pg_catalog.pg_class b ON b.oid OPERATOR(pg_catalog.=) c.confrelid
              WHERE l.locktype OPERATOR(pg_catalog.=) 'relation'
                AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
                AND l.mode OPERATOR(pg_catalog.=) 'RowExclusiveLock' AND l.granted
                AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                                      WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
                AND n.nspname OPERATOR(pg_catalog.<>) 'tide'
                AND NOT (pg_catalog.pg_has_role($1, a.relowner, 'USAGE')
                         AND pg_catalog.pg_has_role($1, b.relowner, 'USAGE'))
              LIMIT 1",
            &[self.owner.into()],
        )?;
        match found {
            None => Ok(()),
            Some(fk) => Err(crate::error::TideError::privilege(format!(
                "pipeline \"{}\" writes with session_replication_role 'replica', which would skip the foreign key {fk}: a table of it belongs to a role whose privileges the pipeline's owner does not have",
                self.pipeline
            ))
            .hint(format!(
                "Under 'replica' foreign keys are not checked, and the owner may not skip another role's: drop that foreign key, or SELECT tide.alter_pipeline('{}', options => '{{\"session_replication_role\": \"origin\"}}'). The worker retries.",
                self.pipeline.replace('\'', "''")
            ))),
        }
    }
}

impl Backend for Local {
    fn prepare(&mut self, _p: &PipelineRow) -> TideResult<bool> {
        Ok(false)
    }

    /// A fixed catalog query (the target's shape), with type names as the source's shape
    /// query renders them (see `security::with_type_names`: the query is written with
    /// `pg_catalog.` functions and operators).
    fn query(&mut self, sql_text: &str, params: &[&str]) -> TideResult<Vec<Vec<Option<String>>>> {
        let args: Vec<Option<&str>> = params.iter().map(|p| Some(*p)).collect();
        crate::security::with_type_names(|| sql::text_rows(sql_text, &args, 0, true))
    }

    fn exec(&mut self, c: &mut SpiClient<'_>, st: Statement) -> TideResult<()> {
        // The arguments' datums and whatever the statement leaves in the current context are
        // freed after each statement (see `sql::scratch`): memory stays flat however many
        // statements one source transaction takes.
        crate::sql::scratch(|| {
            crate::security::as_owner_writing(self.owner, self.replica, || {
                let args: Vec<DatumWithOid> = st.params.into_iter().map(Into::into).collect();
                crate::sql::update(c, st.sql.as_str(), None, &args)?;
                Ok(())
            })
        })?;
        self.check_replica()
    }

    /// The deferred constraints of what this batch wrote are checked now, as the owner (the
    /// worker's transaction commits next).
    fn commit(
        &mut self,
        _pipeline: &str,
        _applied: Option<Lsn>,
        _at: CommitPoint,
    ) -> TideResult<()> {
        crate::security::fire_deferred()
    }

    fn applied(&mut self) -> TideResult<Option<Lsn>> {
        Ok(None)
    }

    fn reset(&mut self) {}

    fn in_this_database(&self) -> bool {
        true
    }

    fn exec_rows(
        &mut self,
        c: &mut SpiClient<'_>,
        sql_text: &str,
        rows: pgrx::pg_sys::Datum,
        array_type: pgrx::pg_sys::Oid,
    ) -> TideResult<()> {
        // SAFETY: `rows` is an array datum of type `array_type`, alive in the current memory
        // context for the statement's duration.
        let arg = unsafe { DatumWithOid::new(rows, array_type) };
        crate::security::as_owner_writing(self.owner, self.replica, || {
            crate::sql::update(c, sql_text, None, &[arg])?;
            Ok(())
        })?;
        self.check_replica()
    }

    fn load_rows(
        &mut self,
        c: &mut SpiClient<'_>,
        target: &TableRef,
        batch: &RowBatch<'_>,
    ) -> TideResult<bool> {
        let (Some(first), Some(last)) = (batch.rows.first(), batch.rows.last()) else {
            return Ok(false);
        };
        let Some(oid) = relation_oid(target) else {
            return Ok(false);
        };
        let columns: Vec<String> = batch.columns.iter().map(|(n, _)| n.clone()).collect();
        let chunk = bulk::Chunk {
            row_type: batch.row_type,
            columns: &columns,
            key: &target.key,
            source: pg_sys::Oid::from(batch.relid),
        };
        crate::security::as_owner(self.owner, || {
            if bulk::eligible(oid, &chunk)?.is_some() {
                return Ok(false);
            }
            // The rows are in key order: none of their keys is at the target when nothing lies
            // between the first and the last.
            // SAFETY: both are composite datums of `row_type`, alive while the batch is.
            let args = unsafe {
                [
                    DatumWithOid::new(*first, batch.row_type),
                    DatumWithOid::new(*last, batch.row_type),
                ]
            };
            let taken = c
                .select(&range_has_rows(target), Some(1), &args)?
                .first()
                .get_one::<bool>()?
                .unwrap_or(true);
            if taken {
                return Ok(false);
            }
            bulk::load(oid, &chunk, &batch.rows)?;
            Ok(true)
        })
    }
}

/// The OID of `target` in this database (`None`: there is no such table).
fn relation_oid(target: &TableRef) -> Option<pg_sys::Oid> {
    let schema = std::ffi::CString::new(target.schema.as_str()).ok()?;
    let name = std::ffi::CString::new(target.name.as_str()).ok()?;
    // SAFETY: catalog lookups by name; with missing_ok they return InvalidOid, not an error.
    let oid = unsafe {
        let ns = pg_sys::get_namespace_oid(schema.as_ptr(), true);
        if ns == pg_sys::InvalidOid {
            return None;
        }
        pg_sys::get_relname_relid(name.as_ptr(), ns)
    };
    (oid != pg_sys::InvalidOid).then_some(oid)
}
