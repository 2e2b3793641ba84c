//! Small SPI helpers that do not assign a transaction id.
//!
//! pgrx's `Spi::get_one*` and `Spi::run*` run every statement in read-write mode, which makes
//! pgrx call `GetCurrentTransactionId()`: the transaction gets an xid and writes a commit
//! record even when it only read. That breaks `pg_create_logical_replication_slot` (refused in a
//! transaction with an xid) and would make an idle worker write WAL on every poll. Reads go
//! through [`one`]/[`two`] (read-only unless the transaction already wrote); [`exec`] is for
//! statements that write.

use crate::error::TideResult;
use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::prelude::*;

/// First column of the first row of a read-only query.
pub fn one<A: FromDatum + IntoDatum>(
    query: &str,
    args: &[DatumWithOid<'_>],
) -> TideResult<Option<A>> {
    Ok(Spi::connect(|c| {
        c.select(query, Some(1), args)?.first().get_one::<A>()
    })?)
}

/// First two columns of the first row of a read-only query.
pub fn two<A: FromDatum + IntoDatum, B: FromDatum + IntoDatum>(
    query: &str,
    args: &[DatumWithOid<'_>],
) -> TideResult<(Option<A>, Option<B>)> {
    Ok(Spi::connect(|c| {
        c.select(query, Some(1), args)?.first().get_two::<A, B>()
    })?)
}

/// Run a statement that writes.
pub fn exec(query: &str, args: &[DatumWithOid<'_>]) -> TideResult<()> {
    Spi::run_with_args(query, args)?;
    Ok(())
}
