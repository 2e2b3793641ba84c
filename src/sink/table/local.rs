//! The local backend of a table target: statements run through SPI in the worker's
//! transaction, as the pipeline's owner in a security-restricted operation.
//!
//! Guarantees: every statement runs as the owner (`security::as_owner`), so a target is only
//! ever written as its owner could by hand, and a right revoked after `add_table` fails the
//! pipeline with the permission error; the applied position is the pipeline row's, written by
//! the worker in the same transaction, so this backend keeps none of its own.

use super::Backend;
use crate::error::TideResult;
use crate::sql;
use pgrx::datum::DatumWithOid;
use pgrx::spi::SpiClient;
use tide_core::lsn::Lsn;
use tide_core::plan::Statement;

/// Runs a table target's statements in this database.
pub struct Local {
    /// The pipeline's owner.
    pub owner: pgrx::pg_sys::Oid,
}

impl Backend for Local {
    fn prepare(&mut self) -> TideResult<()> {
        Ok(())
    }

    fn query(&mut self, sql_text: &str, params: &[&str]) -> TideResult<Vec<Vec<Option<String>>>> {
        let args: Vec<Option<&str>> = params.iter().map(|p| Some(*p)).collect();
        sql::text_rows(sql_text, &args, 0, true)
    }

    fn exec(&mut self, c: &mut SpiClient<'_>, st: Statement) -> TideResult<()> {
        crate::security::as_owner(self.owner, || {
            match st.param {
                Some(p) => crate::sql::update(c, st.sql.as_str(), None, &[p.into()])?,
                None => crate::sql::update(c, st.sql.as_str(), None, &[])?,
            };
            Ok(())
        })
    }

    fn commit(&mut self, _pipeline: &str, _applied: Option<Lsn>) -> TideResult<()> {
        Ok(())
    }

    fn applied(&mut self) -> TideResult<Option<Lsn>> {
        Ok(None)
    }

    fn commits_on_its_own(&self) -> bool {
        false
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
        crate::security::as_owner(self.owner, || {
            crate::sql::update(c, sql_text, None, &[arg])?;
            Ok(())
        })
    }
}
