//! The helpers of [`crate::sql`], run **as pg_tide itself** ([`crate::security::as_tide`]): the only
//! way the SQL API reads or writes pg_tide's own tables, which no other role may touch. Only
//! `catalog`'s functions use them (see its header).
//! Pass only fixed statements on pg_tide's tables and the system catalogs, with values as `$n`
//! parameters: nothing that runs user-defined code.

use crate::error::TideResult;
use crate::security::as_tide;
use crate::sql;
use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};

pub fn one<A: FromDatum + IntoDatum>(
    query: &str,
    args: &[DatumWithOid<'_>],
) -> TideResult<Option<A>> {
    as_tide(|| sql::one(query, args))
}

pub fn two<A: FromDatum + IntoDatum, B: FromDatum + IntoDatum>(
    query: &str,
    args: &[DatumWithOid<'_>],
) -> TideResult<(Option<A>, Option<B>)> {
    as_tide(|| sql::two(query, args))
}

pub fn write_one<A: FromDatum + IntoDatum>(
    query: &str,
    args: &[DatumWithOid<'_>],
) -> TideResult<Option<A>> {
    as_tide(|| sql::write_one(query, args))
}

pub fn exec_count(query: &str, args: &[DatumWithOid<'_>]) -> TideResult<u64> {
    as_tide(|| sql::exec_count(query, args))
}

pub fn exec(query: &str, args: &[DatumWithOid<'_>]) -> TideResult<()> {
    as_tide(|| sql::exec(query, args))
}

pub fn text_rows(
    query: &str,
    args: &[Option<&str>],
    limit: i64,
    fresh: bool,
) -> TideResult<Vec<Vec<Option<String>>>> {
    as_tide(|| sql::text_rows(query, args, limit, fresh))
}
