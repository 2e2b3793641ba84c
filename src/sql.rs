//! Small SPI helpers that do not assign a transaction id, run **as the current role**: the
//! caller in the SQL API, the worker's own role in a worker, the pipeline's owner inside
//! `security::as_owner`. Their twins in [`crate::sql_as_tide`] (same names) run as pg_tide
//! itself: the module a call site names says who runs the statement.
//!
//! pgrx's `Spi::get_one*` and `Spi::run*` run every statement in read-write mode, which makes
//! pgrx call `GetCurrentTransactionId()`: the transaction gets an xid and writes a commit
//! record even when it only read. That breaks `pg_create_logical_replication_slot` (refused in a
//! transaction with an xid) and would make an idle worker write WAL on every poll. Reads go
//! through [`one`]/[`two`] (read-only unless the transaction already wrote); [`exec`] is for
//! statements that write.
//!
//! Plan cache: in a pipeline worker ([`cache_plans`]), every statement that goes through these
//! helpers (and [`select`]/[`update`], which the worker's catalog code uses instead of
//! `SpiClient::select`/`update`) is prepared once, kept (`SPI_keepplan`) and executed from its
//! plan afterwards: a backfilling worker spent about a quarter of its CPU parsing, analysing
//! and planning the same few dozen statements again for every chunk. PostgreSQL's plan cache
//! re-plans a kept statement when a table or function it uses changes, or the search path
//! does; privileges are checked at each execution, as the statement's current user. The cache
//! is keyed by the statement's text and its parameter types, holds at most [`MAX_PLANS`]
//! statements (then it starts again), and is emptied after a failed iteration
//! ([`forget_plans`]). SQL API calls (ordinary backends) do not cache.

use crate::error::TideResult;
use pgrx::datum::{DatumWithOid, FromDatum, IntoDatum};
use pgrx::pg_sys::PgOid;
use pgrx::prelude::*;
use pgrx::spi::{OwnedPreparedStatement, SpiClient, SpiResult, SpiTupleTable};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// Kept plans at most (the worker's statements are a few dozen; a chunk query per backfill).
pub const MAX_PLANS: usize = 256;

/// A raw SPI plan kept by [`with_rows`] (text parameters), freed when forgotten.
struct RawPlan(pg_sys::SPIPlanPtr);

impl Drop for RawPlan {
    fn drop(&mut self) {
        // SAFETY: a plan this module kept with SPI_keepplan, freed once.
        unsafe {
            pg_sys::SPI_freeplan(self.0);
        }
    }
}

/// Statement text, parameter type OIDs, and whether it may write.
type PlanKey = (String, Vec<u32>, bool);

#[derive(Default)]
struct Plans {
    prepared: HashMap<PlanKey, Rc<OwnedPreparedStatement>>,
    raw: HashMap<PlanKey, Rc<RawPlan>>,
}

impl Plans {
    fn make_room(&mut self) {
        if self.prepared.len() + self.raw.len() >= MAX_PLANS {
            self.prepared.clear();
            self.raw.clear();
        }
    }
}

thread_local! {
    static CACHING: Cell<bool> = const { Cell::new(false) };
    static PLANS: RefCell<Plans> = RefCell::new(Plans::default());
}

/// Cache the plans of this process's statements from now on (pipeline workers).
pub fn cache_plans() {
    CACHING.with(|c| c.set(true));
}

/// Forget every kept plan (after a failed iteration: a plan may refer to what was rolled back).
pub fn forget_plans() {
    PLANS.with(|p| {
        let mut p = p.borrow_mut();
        p.prepared.clear();
        p.raw.clear();
    });
}

fn caching() -> bool {
    CACHING.with(|c| c.get())
}

/// The kept plan of `query` for `args`' types, prepared now if need be (`None`: not caching).
fn prepared(
    c: &SpiClient<'_>,
    query: &str,
    args: &[DatumWithOid<'_>],
    mutating: bool,
) -> SpiResult<Option<Rc<OwnedPreparedStatement>>> {
    if !caching() {
        return Ok(None);
    }
    let key: PlanKey = (
        query.to_string(),
        args.iter().map(|a| a.oid().to_u32()).collect(),
        mutating,
    );
    if let Some(p) = PLANS.with(|p| p.borrow().prepared.get(&key).cloned()) {
        return Ok(Some(p));
    }
    let oids: Vec<PgOid> = args.iter().map(|a| PgOid::from(a.oid())).collect();
    let stmt = if mutating {
        c.prepare_mut(query, &oids)?
    } else {
        c.prepare(query, &oids)?
    };
    let kept = Rc::new(stmt.keep());
    PLANS.with(|p| {
        let mut p = p.borrow_mut();
        p.make_room();
        p.prepared.insert(key, kept.clone());
    });
    Ok(Some(kept))
}

/// `SpiClient::select`, from a kept plan in a worker.
pub fn select<'c>(
    c: &SpiClient<'c>,
    query: &str,
    limit: Option<i64>,
    args: &[DatumWithOid<'_>],
) -> SpiResult<SpiTupleTable<'c>> {
    match prepared(c, query, args, false)? {
        Some(p) => c.select(&*p, limit, args),
        None => c.select(query, limit, args),
    }
}

/// `SpiClient::update`, from a kept plan in a worker.
pub fn update<'c>(
    c: &mut SpiClient<'c>,
    query: &str,
    limit: Option<i64>,
    args: &[DatumWithOid<'_>],
) -> SpiResult<SpiTupleTable<'c>> {
    match prepared(c, query, args, true)? {
        Some(p) => c.update(&*p, limit, args),
        None => c.update(query, limit, args),
    }
}

/// First column of the first row of a read-only query (`None` when there is no row).
pub fn one<A: FromDatum + IntoDatum>(
    query: &str,
    args: &[DatumWithOid<'_>],
) -> TideResult<Option<A>> {
    Ok(Spi::connect(|c| first(select(c, query, Some(1), args)?))?)
}

/// First two columns of the first row of a read-only query.
pub fn two<A: FromDatum + IntoDatum, B: FromDatum + IntoDatum>(
    query: &str,
    args: &[DatumWithOid<'_>],
) -> TideResult<(Option<A>, Option<B>)> {
    Ok(Spi::connect(|c| {
        let t = select(c, query, Some(1), args)?;
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
        first(update(c, query, Some(1), args)?)
    })?)
}

/// Run a statement that writes; returns the number of rows it processed.
pub fn exec_count(query: &str, args: &[DatumWithOid<'_>]) -> TideResult<u64> {
    Ok(Spi::connect_mut(|c| {
        update(c, query, None, args).map(|t| t.len() as u64)
    })?)
}

/// Run a statement that writes.
pub fn exec(query: &str, args: &[DatumWithOid<'_>]) -> TideResult<()> {
    Spi::connect_mut(|c| update(c, query, None, args).map(|_| ()))?;
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
    with_rows(query, args, limit, fresh, |result| {
        let mut out = Vec::with_capacity(result.len());
        for i in 0..result.len() {
            out.push(
                (1..=result.columns())
                    .map(|col| result.text(i, col))
                    .collect(),
            );
        }
        Ok(out)
    })
}

/// The result of a query run by [`with_rows`], valid inside its closure only (the tuples live
/// in SPI's memory, freed when the connection ends).
pub struct RawRows {
    table: *mut pg_sys::SPITupleTable,
    rows: usize,
}

impl RawRows {
    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Number of columns.
    pub fn columns(&self) -> i32 {
        if self.table.is_null() {
            0
        } else {
            // SAFETY: a non-null SPI_tuptable of the last statement, read before SPI_finish.
            unsafe { (*(*self.table).tupdesc).natts }
        }
    }

    /// Row `row`'s column `col` (1-based) as its type's text output, NULL as `None`.
    pub fn text(&self, row: usize, col: i32) -> Option<String> {
        if row >= self.rows || col < 1 || col > self.columns() {
            return None;
        }
        // SAFETY: row and column are in range of the SPI result, read before SPI_finish; the
        // text is copied and the palloc'd string freed.
        unsafe {
            let tup = *(*self.table).vals.add(row);
            let v = pg_sys::SPI_getvalue(tup, (*self.table).tupdesc, col);
            if v.is_null() {
                None
            } else {
                let s = std::ffi::CStr::from_ptr(v).to_string_lossy().into_owned();
                pg_sys::pfree(v as *mut std::ffi::c_void);
                Some(s)
            }
        }
    }

    /// Row `row`'s column `col` (1-based) as a datum (`None` for NULL), pointing into SPI's
    /// memory: copy it (e.g. into an array) before the closure of [`with_rows`] returns.
    pub fn datum(&self, row: usize, col: i32) -> Option<pg_sys::Datum> {
        if row >= self.rows || col < 1 || col > self.columns() {
            return None;
        }
        // SAFETY: as in `text`.
        unsafe {
            let tup = *(*self.table).vals.add(row);
            let mut isnull = false;
            let d = pg_sys::SPI_getbinval(tup, (*self.table).tupdesc, col, &mut isnull);
            (!isnull).then_some(d)
        }
    }
}

/// The kept plan of `query` with `types.len()` text parameters (`None`: not caching).
///
/// # Safety
/// SPI must be connected.
unsafe fn raw_plan(
    cquery: &std::ffi::CStr,
    query: &str,
    types: &mut [pg_sys::Oid],
) -> TideResult<Option<Rc<RawPlan>>> {
    if !caching() {
        return Ok(None);
    }
    let key: PlanKey = (
        query.to_string(),
        types.iter().map(|t| t.to_u32()).collect(),
        false,
    );
    if let Some(p) = PLANS.with(|p| p.borrow().raw.get(&key).cloned()) {
        return Ok(Some(p));
    }
    let plan = pg_sys::SPI_prepare(cquery.as_ptr(), types.len() as i32, types.as_mut_ptr());
    if plan.is_null() || pg_sys::SPI_keepplan(plan) != 0 {
        let code: i32 = pg_sys::SPI_result;
        return Err(crate::error::TideError::internal(format!(
            "SPI_prepare failed with code {code}"
        )));
    }
    let kept = Rc::new(RawPlan(plan));
    PLANS.with(|p| {
        let mut p = p.borrow_mut();
        p.make_room();
        p.raw.insert(key, kept.clone());
    });
    Ok(Some(kept))
}

/// Run a query with text parameters (as [`text_rows`]) and hand its result to `f` inside the
/// SPI connection.
pub fn with_rows<R>(
    query: &str,
    args: &[Option<&str>],
    limit: i64,
    fresh: bool,
    f: impl FnOnce(&RawRows) -> TideResult<R>,
) -> TideResult<R> {
    use std::ffi::CString;
    let cquery = CString::new(query)
        .map_err(|_| crate::error::TideError::internal("query contains a NUL byte"))?;
    Spi::connect(|_c| -> TideResult<R> {
        // SAFETY: SPI is connected; the argument arrays outlive the call; the result is read
        // only inside `f`, before SPI_finish.
        let rows = unsafe {
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
            let rc = match raw_plan(&cquery, query, &mut types)? {
                Some(plan) => pg_sys::SPI_execute_plan(
                    plan.0,
                    values.as_mut_ptr(),
                    nulls.as_ptr(),
                    read_only,
                    limit,
                ),
                None => pg_sys::SPI_execute_with_args(
                    cquery.as_ptr(),
                    n as i32,
                    types.as_mut_ptr(),
                    values.as_mut_ptr(),
                    nulls.as_ptr(),
                    read_only,
                    limit,
                ),
            };
            if rc < 0 {
                return Err(crate::error::TideError::internal(format!(
                    "SPI_execute failed with code {rc}"
                )));
            }
            let table = pg_sys::SPI_tuptable;
            RawRows {
                table,
                rows: if table.is_null() {
                    0
                } else {
                    pg_sys::SPI_processed as usize
                },
            }
        };
        f(&rows)
    })
}

/// A memory context made current for one call of [`scratch`], deleted when it ends (also when
/// an error unwinds through it).
struct Scratch {
    cx: pg_sys::MemoryContext,
    old: pg_sys::MemoryContext,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: `cx` is ours and still alive (a child of `old`, which outlives this call);
        // switching back before deleting it leaves no dangling current context.
        unsafe {
            pg_sys::MemoryContextSwitchTo(self.old);
            pg_sys::MemoryContextDelete(self.cx);
        }
    }
}

/// Run `f` with a memory context of its own current, deleted when `f` returns: what `f`
/// allocates in the current context (the datums of a statement's arguments, pgrx's
/// conversions) is freed at once. Inside `Spi::connect` the current context is the SPI
/// connection's, which lives as long as the connection: the worker's whole iteration, so a
/// statement per 1000 rows of one huge source transaction used to keep every row's arguments
/// until the iteration ended (238 MiB for 1M rows of 220 bytes, issue 34). `f` must return
/// nothing allocated in that context (owned Rust values only).
pub fn scratch<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: creates a child of the current context (never NULL: ereports on failure) with a
    // static name, as AllocSetContextCreate requires; `Scratch` switches back and deletes it.
    let _guard = unsafe {
        let cx = pg_sys::AllocSetContextCreateExtended(
            pg_sys::CurrentMemoryContext,
            c"pg_tide statement".as_ptr(),
            pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        );
        Scratch {
            cx,
            old: pg_sys::MemoryContextSwitchTo(cx),
        }
    };
    f()
}
