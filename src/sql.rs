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

/// First column of the first row of a read-only query (`None` when there is no row).
pub fn one<A: FromDatum + IntoDatum>(
    query: &str,
    args: &[DatumWithOid<'_>],
) -> TideResult<Option<A>> {
    Ok(Spi::connect(|c| first(c.select(query, Some(1), args)?))?)
}

/// First two columns of the first row of a read-only query.
pub fn two<A: FromDatum + IntoDatum, B: FromDatum + IntoDatum>(
    query: &str,
    args: &[DatumWithOid<'_>],
) -> TideResult<(Option<A>, Option<B>)> {
    Ok(Spi::connect(|c| {
        let t = c.select(query, Some(1), args)?;
        if t.is_empty() {
            Ok((None, None))
        } else {
            t.first().get_two::<A, B>()
        }
    })?)
}

/// First column of the first row of a result, `None` when there is no row (pgrx's `first()`
/// errors on an empty result).
pub fn first<A: FromDatum + IntoDatum>(
    t: pgrx::spi::SpiTupleTable<'_>,
) -> pgrx::spi::SpiResult<Option<A>> {
    if t.is_empty() {
        Ok(None)
    } else {
        t.first().get_one::<A>()
    }
}

/// Run a statement that writes and return the first column of its first row (RETURNING).
pub fn write_one<A: FromDatum + IntoDatum>(
    query: &str,
    args: &[DatumWithOid<'_>],
) -> TideResult<Option<A>> {
    Ok(Spi::connect_mut(|c| {
        first(c.update(query, Some(1), args)?)
    })?)
}

/// Run a statement that writes; returns the number of rows it processed.
pub fn exec_count(query: &str, args: &[DatumWithOid<'_>]) -> TideResult<u64> {
    Ok(Spi::connect_mut(|c| {
        c.update(query, None, args).map(|t| t.len() as u64)
    })?)
}

/// Run a statement that writes.
pub fn exec(query: &str, args: &[DatumWithOid<'_>]) -> TideResult<()> {
    Spi::run_with_args(query, args)?;
    Ok(())
}

/// Run a query with text parameters (`$n` are `text`; cast them in SQL) and return every value
/// as the type's text output (`SPI_getvalue`, i.e. the output function, the same text the output
/// plugin sends), NULL as `None`.
///
/// `fresh` runs it in read-write SPI mode *without* assigning a transaction id: under READ
/// COMMITTED each such statement takes a new snapshot, which is what polling loops need.
pub fn text_rows(
    query: &str,
    args: &[Option<&str>],
    limit: i64,
    fresh: bool,
) -> TideResult<Vec<Vec<Option<String>>>> {
    use std::ffi::{CStr, CString};
    let cquery = CString::new(query)
        .map_err(|_| crate::error::TideError::internal("query contains a NUL byte"))?;
    Spi::connect(|_c| -> TideResult<Vec<Vec<Option<String>>>> {
        unsafe {
            let n = args.len();
            let mut types = vec![pg_sys::TEXTOID; n];
            let mut values = Vec::with_capacity(n);
            let mut nulls = Vec::with_capacity(n);
            for a in args {
                match a {
                    Some(s) => {
                        values.push(s.into_datum().unwrap_or(pg_sys::Datum::from(0)));
                        nulls.push(b' ' as std::ffi::c_char);
                    }
                    None => {
                        values.push(pg_sys::Datum::from(0));
                        nulls.push(b'n' as std::ffi::c_char);
                    }
                }
            }
            let read_only =
                !fresh && pg_sys::GetCurrentTransactionIdIfAny() == pg_sys::InvalidTransactionId;
            let rc = pg_sys::SPI_execute_with_args(
                cquery.as_ptr(),
                n as i32,
                types.as_mut_ptr(),
                values.as_mut_ptr(),
                nulls.as_ptr(),
                read_only,
                limit,
            );
            if rc < 0 {
                return Err(crate::error::TideError::internal(format!(
                    "SPI_execute failed with code {rc}"
                )));
            }
            let tt = pg_sys::SPI_tuptable;
            if tt.is_null() {
                return Ok(Vec::new());
            }
            let desc = (*tt).tupdesc;
            let natts = (*desc).natts;
            let nrows = pg_sys::SPI_processed as usize;
            let mut out = Vec::with_capacity(nrows);
            for i in 0..nrows {
                let tup = *(*tt).vals.add(i);
                let mut row = Vec::with_capacity(natts as usize);
                for col in 1..=natts {
                    let v = pg_sys::SPI_getvalue(tup, desc, col);
                    if v.is_null() {
                        row.push(None);
                    } else {
                        row.push(Some(CStr::from_ptr(v).to_string_lossy().into_owned()));
                        pg_sys::pfree(v as *mut std::ffi::c_void);
                    }
                }
                out.push(row);
            }
            Ok(out)
        }
    })
}
