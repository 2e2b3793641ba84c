//! Bulk loading rows into a table of this database (a backfill chunk into a local target table;
//! outbox events into `tide.outbox`), as PostgreSQL's own COPY FROM and logical replication's
//! initial sync do: tuples go to the table access method's
//! `multi_insert` (one WAL record per page instead of one per row, a bulk-insert buffer ring)
//! and then to the indexes, with no `ON CONFLICT` machinery (speculative insertion takes a
//! lock, a second WAL record and an index probe per row).
//!
//! Owns: the decision whether a chunk may be loaded this way ([`eligible`]), the load itself
//! ([`load`] for row values of a source table, [`insert`] for values given column by column). The caller ([`super::local::Local`]) runs both as the pipeline's owner,
//! in a security-restricted operation, after checking that none of the chunk's keys exists at
//! the target (a plain insert of an existing key would fail, where the upsert updates it).
//!
//! Guarantees:
//! - The same rows reach the table as through the upsert of row values
//!   (`tide_core::plan::upsert_rows`): the source columns' values, binary, unchanged; target
//!   columns the source does not have get their defaults, as an `INSERT` naming the source's
//!   columns gives them; NOT NULL and CHECK constraints are checked (`ExecConstraints`); every
//!   index is maintained (`ExecInsertIndexTuples`), unique ones checked.
//! - Only where nothing else would happen through SQL: a plain table (`relkind` `r`, heap
//!   access method, not a partition: its constraint would go unchecked), no rules, no triggers
//!   of any kind (so no foreign key either way), no row-level
//!   security that applies to the owner, no stored generated columns, no `GENERATED ALWAYS`
//!   identity among the columns written, the owner holding `INSERT` on the table, and each
//!   column of the chunk with the source's exact type (OID and typmod) and, for key columns,
//!   collation (the emptiness check compares keys in the source's order). Anything else:
//!   [`eligible`] says why not, and the caller takes the upsert.
//! - Runs in the caller's transaction; an error (a unique violation from a concurrent writer
//!   of the target, say) aborts it like any statement's, and everything it allocated or
//!   locked is released by the abort.

use crate::error::{TideError, TideResult};
use pgrx::pg_sys;

/// Rows per `multi_insert` call. COPY FROM buffers up to 1000 rows or 64 kB, whichever comes
/// first (`MAX_BUFFERED_TUPLES`, `MAX_BUFFERED_BYTES`): about 300 rows of the benchmark's shape.
/// Each call fills whole pages with one WAL record each; fewer slots cost less to set up.
const BATCH: usize = 256;

/// What a load needs to know about the chunk.
pub struct Chunk<'a> {
    /// The source table's row type (each row is a composite datum of it).
    pub row_type: pg_sys::Oid,
    /// The source columns to write, by name.
    pub columns: &'a [String],
    /// The source's key columns, by name.
    pub key: &'a [String],
    /// The source table (for its key columns' collations).
    pub source: pg_sys::Oid,
}

/// Why a chunk cannot be loaded into `target` in bulk (`None`: it can). Run as the owner.
pub fn eligible(target: pg_sys::Oid, chunk: &Chunk<'_>) -> TideResult<Option<String>> {
    // SAFETY: opening a relation by OID (ereports if it is gone: the caller's statement would
    // fail the same way) with the lock an INSERT takes, kept to the end of the transaction;
    // every pointer read below belongs to the open relation's relcache entry or to a palloc'd
    // copy of the row type's descriptor.
    unsafe {
        let rel = pg_sys::table_open(target, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        let why = why_not(rel, target, chunk);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        why
    }
}

/// What an `INSERT` into `target` would run that [`insert`] bypasses (`None`: nothing): its
/// triggers, its rules, a partition's constraint, another kind of relation. For a table of
/// pg_tide's own (`tide.outbox`), which a user may still give a trigger.
pub fn bypasses(target: pg_sys::Oid) -> Option<&'static str> {
    // SAFETY: opening a relation by OID with the lock an INSERT takes (kept to the end of the
    // transaction) and reading its relcache entry while it is open.
    unsafe {
        let rel = pg_sys::table_open(target, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        let why = bypassed(rel);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        why
    }
}

/// See [`bypasses`]; `rel` is open.
unsafe fn bypassed(rel: pg_sys::Relation) -> Option<&'static str> {
    let form = &*(*rel).rd_rel;
    if form.relkind as u8 != pg_sys::RELKIND_RELATION || form.relam != pg_sys::HEAP_TABLE_AM_OID {
        Some("not a plain heap table")
    } else if form.relispartition {
        // A partition's constraint is checked by an INSERT into it (ExecPartitionCheck), not
        // by a multi-insert.
        Some("it is a partition")
    } else if !(*rel).trigdesc.is_null() {
        Some("it has triggers")
    } else if form.relhasrules {
        // An INSERT rule rewrites the statement; a multi-insert would bypass it.
        Some("it has rules")
    } else {
        None
    }
}

/// See [`eligible`]; `rel` is open.
unsafe fn why_not(
    rel: pg_sys::Relation,
    target: pg_sys::Oid,
    chunk: &Chunk<'_>,
) -> TideResult<Option<String>> {
    if let Some(why) = bypassed(rel) {
        return Ok(Some(why.into()));
    }
    if pg_sys::check_enable_rls(target, pg_sys::InvalidOid, true)
        != pg_sys::CheckEnableRlsResult::RLS_NONE as i32
    {
        return Ok(Some("it has row-level security".into()));
    }
    if pg_sys::pg_class_aclcheck(
        target,
        pg_sys::GetUserId(),
        pg_sys::ACL_INSERT as pg_sys::AclMode,
    ) != pg_sys::AclResult::ACLCHECK_OK
    {
        return Ok(Some("the owner lacks INSERT on the table".into()));
    }
    let tdesc = (*rel).rd_att;
    let constr = (*tdesc).constr;
    if !constr.is_null() && (*constr).has_generated_stored {
        return Ok(Some("it has generated columns".into()));
    }
    let src = pg_sys::lookup_rowtype_tupdesc_copy(chunk.row_type, -1);
    let why = why_not_columns(src, tdesc, chunk);
    pg_sys::FreeTupleDesc(src);
    why
}

/// The column checks of [`why_not`]: `src` is the row type's descriptor, `tdesc` the target's.
unsafe fn why_not_columns(
    src: pg_sys::TupleDesc,
    tdesc: pg_sys::TupleDesc,
    chunk: &Chunk<'_>,
) -> TideResult<Option<String>> {
    let src_attrs = crate::pgver::tupdesc_attrs(src);
    let tgt_attrs = crate::pgver::tupdesc_attrs(tdesc);
    for name in chunk.columns {
        let find = |attrs: &[pg_sys::FormData_pg_attribute]| {
            attrs
                .iter()
                .find(|a| !a.attisdropped && name_of(a) == name.as_str())
                .copied()
        };
        let (Some(s), Some(t)) = (find(src_attrs), find(tgt_attrs)) else {
            return Ok(Some(format!("column \"{name}\" is missing")));
        };
        if s.atttypid != t.atttypid || s.atttypmod != t.atttypmod {
            return Ok(Some(format!("column \"{name}\" has another type")));
        }
        if t.attidentity as u8 == pg_sys::ATTRIBUTE_IDENTITY_ALWAYS {
            return Ok(Some(format!("column \"{name}\" is GENERATED ALWAYS")));
        }
        if chunk.key.contains(name) {
            // The source's collation, from its catalog (its row type's descriptor has none).
            let cname = std::ffi::CString::new(name.as_str())
                .map_err(|_| TideError::internal("a column name with a NUL byte"))?;
            let attnum = pg_sys::get_attnum(chunk.source, cname.as_ptr());
            let (mut typ, mut typmod, mut coll) = (pg_sys::InvalidOid, 0, pg_sys::InvalidOid);
            pg_sys::get_atttypetypmodcoll(chunk.source, attnum, &mut typ, &mut typmod, &mut coll);
            if coll != t.attcollation {
                return Ok(Some(format!("key column \"{name}\" has another collation")));
            }
        }
    }
    Ok(None)
}

fn name_of(a: &pg_sys::FormData_pg_attribute) -> &str {
    // SAFETY: NameData is a NUL-terminated C string within its fixed buffer.
    unsafe { std::ffi::CStr::from_ptr(a.attname.data.as_ptr()) }
        .to_str()
        .unwrap_or("")
}

/// Fills row `i`'s values and nulls (the columns written, in order): see [`insert`].
pub type RowFill<'a> = dyn FnMut(usize, &mut [pg_sys::Datum], &mut [bool]) -> TideResult<()> + 'a;

/// Where a target column's value comes from.
#[derive(Clone, Copy)]
enum Fill {
    /// Value `i` of the row's values (the columns written, in order).
    Given(usize),
    /// Default expression `i` of the load's defaults.
    Default(usize),
    /// NULL (no default, or a dropped column).
    Null,
}

/// Insert `rows` (composite datums of `chunk.row_type`, alive for the call) into `target` in
/// bulk. The caller checked [`eligible`] in this transaction and that no key of `rows` exists
/// at the target; runs as the caller's current user. Returns the rows inserted.
pub fn load(target: pg_sys::Oid, chunk: &Chunk<'_>, rows: &[pg_sys::Datum]) -> TideResult<usize> {
    if rows.is_empty() {
        return Ok(0);
    }
    // SAFETY: the row type's descriptor (a palloc'd copy) deforms each composite datum, which
    // lives as long as `rows` do; the values copied out point into it, and `insert` copies
    // them into its slots before the next row is deformed.
    unsafe {
        let src = pg_sys::lookup_rowtype_tupdesc_copy(chunk.row_type, -1);
        let src_natts = (*src).natts as usize;
        let src_attrs = crate::pgver::tupdesc_attrs(src);
        let mut from = Vec::with_capacity(chunk.columns.len());
        for c in chunk.columns {
            let j = src_attrs
                .iter()
                .position(|s| !s.attisdropped && name_of(s) == c.as_str())
                .ok_or_else(|| {
                    TideError::internal(format!("the row type has no column \"{c}\""))
                })?;
            from.push(j);
        }
        let mut src_values = vec![pg_sys::Datum::from(0usize); src_natts];
        let mut src_nulls = vec![false; src_natts];
        let n = insert(
            target,
            chunk.columns,
            rows.len(),
            &mut |i, values, nulls| {
                let td = pg_sys::pg_detoast_datum(rows[i].cast_mut_ptr::<pg_sys::varlena>())
                    as pg_sys::HeapTupleHeader;
                let mut tuple: pg_sys::HeapTupleData = std::mem::zeroed();
                tuple.t_len = pgrx::varlena::varsize_any(td as *const pg_sys::varlena) as u32;
                tuple.t_data = td;
                pg_sys::heap_deform_tuple(
                    &mut tuple,
                    src,
                    src_values.as_mut_ptr(),
                    src_nulls.as_mut_ptr(),
                );
                for (k, &j) in from.iter().enumerate() {
                    values[k] = src_values[j];
                    nulls[k] = src_nulls[j];
                }
                Ok(())
            },
        );
        pg_sys::FreeTupleDesc(src);
        n
    }
}

/// Insert `n` rows into `target` in bulk: row `i` gives the values of `columns` (by name, in
/// that order) through `row(i, values, nulls)`, called in a short-lived memory context (what it
/// allocates lives until the row is stored); the other columns get their defaults, as an
/// `INSERT` naming `columns` gives them. Constraints and indexes as for an `INSERT`; no
/// triggers, no row security (the caller makes sure there is nothing of either to bypass).
/// Runs as the caller's current user, in its transaction. Returns the rows inserted.
pub fn insert(
    target: pg_sys::Oid,
    columns: &[String],
    n: usize,
    row: &mut RowFill<'_>,
) -> TideResult<usize> {
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: PostgreSQL's executor API as COPY FROM (copyfrom.c) and the apply worker
    // (worker.c) use it. Everything is allocated in memory contexts of the current
    // transaction and released on abort; slots are filled with `natts` values and nulls, as
    // their descriptor says.
    unsafe {
        let rel = pg_sys::table_open(target, pg_sys::RowExclusiveLock as pg_sys::LOCKMODE);
        let tdesc = (*rel).rd_att;
        let natts = (*tdesc).natts as usize;
        // Everything the load sets up lives in the executor state's memory, freed with it.
        let estate = pg_sys::CreateExecutorState();
        let caller_cxt = pg_sys::MemoryContextSwitchTo((*estate).es_query_cxt);
        let tgt_attrs = crate::pgver::tupdesc_attrs(tdesc);

        let rri = pg_sys::palloc0(std::mem::size_of::<pg_sys::ResultRelInfo>())
            as *mut pg_sys::ResultRelInfo;
        pg_sys::InitResultRelInfo(rri, rel, 0, std::ptr::null_mut(), 0);
        pg_sys::ExecOpenIndices(rri, false);
        let cid = pg_sys::GetCurrentCommandId(true);
        (*estate).es_output_cid = cid;
        let econtext = per_tuple_context(estate);

        // Where each target column's value comes from; defaults as INSERT would evaluate them.
        let mut defaults: Vec<*mut pg_sys::ExprState> = Vec::new();
        let mut fill = Vec::with_capacity(natts);
        for (i, t) in tgt_attrs.iter().enumerate() {
            if t.attisdropped {
                fill.push(Fill::Null);
                continue;
            }
            let name = name_of(t);
            match columns.iter().position(|c| c == name) {
                Some(k) => fill.push(Fill::Given(k)),
                None => {
                    let expr = pg_sys::build_column_default(rel, (i + 1) as i32);
                    if expr.is_null() {
                        fill.push(Fill::Null);
                    } else {
                        let planned = pg_sys::expression_planner(expr as *mut pg_sys::Expr);
                        defaults.push(pg_sys::ExecInitExpr(planned, std::ptr::null_mut()));
                        fill.push(Fill::Default(defaults.len() - 1));
                    }
                }
            }
        }
        let has_constraints = !(*tdesc).constr.is_null();
        let bistate = pg_sys::GetBulkInsertState();
        let nslots = n.min(BATCH);
        let mut slots: Vec<*mut pg_sys::TupleTableSlot> = (0..nslots)
            .map(|_| pg_sys::table_slot_create(rel, &mut (*estate).es_tupleTable))
            .collect();
        pg_sys::MemoryContextSwitchTo(caller_cxt);
        let mut given = vec![pg_sys::Datum::from(0usize); columns.len()];
        let mut given_nulls = vec![true; columns.len()];
        let mut used = 0usize;
        for r in 0..n {
            let slot = slots[used];
            pg_sys::ExecClearTuple(slot);
            let old = pg_sys::MemoryContextSwitchTo((*econtext).ecxt_per_tuple_memory);
            let filled = row(r, &mut given, &mut given_nulls);
            pg_sys::MemoryContextSwitchTo(old);
            filled?;
            let values = std::slice::from_raw_parts_mut((*slot).tts_values, natts);
            let nulls = std::slice::from_raw_parts_mut((*slot).tts_isnull, natts);
            for (i, f) in fill.iter().enumerate() {
                match *f {
                    Fill::Given(k) => {
                        values[i] = given[k];
                        nulls[i] = given_nulls[k];
                    }
                    Fill::Default(d) => {
                        let mut isnull = false;
                        values[i] =
                            pg_sys::ExecEvalExprSwitchContext(defaults[d], econtext, &mut isnull);
                        nulls[i] = isnull;
                    }
                    Fill::Null => {
                        values[i] = pg_sys::Datum::from(0usize);
                        nulls[i] = true;
                    }
                }
            }
            pg_sys::ExecStoreVirtualTuple(slot);
            if has_constraints {
                pg_sys::ExecConstraints(rri, slot, estate);
            }
            // The slot keeps its own copy: the per-tuple memory (the row's values, defaults)
            // is reset below.
            pg_sys::ExecMaterializeSlot(slot);
            pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
            used += 1;
            if used == slots.len() {
                flush(rel, rri, estate, &mut slots[..used], cid, bistate);
                used = 0;
            }
        }
        if used > 0 {
            flush(rel, rri, estate, &mut slots[..used], cid, bistate);
        }
        pg_sys::table_finish_bulk_insert(rel, 0);
        pg_sys::FreeBulkInsertState(bistate);
        pg_sys::ExecCloseIndices(rri);
        pg_sys::ExecResetTupleTable((*estate).es_tupleTable, false);
        pg_sys::FreeExecutorState(estate);
        pg_sys::table_close(rel, pg_sys::NoLock as pg_sys::LOCKMODE);
        // Later statements of the transaction see the rows.
        pg_sys::CommandCounterIncrement();
        slots.clear();
    }
    Ok(n)
}

/// Insert the filled `slots` (COPY FROM's `CopyMultiInsertBufferFlush`): the table first, then
/// each row's index entries; the slots are cleared.
unsafe fn flush(
    rel: pg_sys::Relation,
    rri: *mut pg_sys::ResultRelInfo,
    estate: *mut pg_sys::EState,
    slots: &mut [*mut pg_sys::TupleTableSlot],
    cid: pg_sys::CommandId,
    bistate: pg_sys::BulkInsertState,
) {
    let econtext = per_tuple_context(estate);
    let old = pg_sys::MemoryContextSwitchTo((*econtext).ecxt_per_tuple_memory);
    pg_sys::table_multi_insert(rel, slots.as_mut_ptr(), slots.len() as i32, cid, 0, bistate);
    for &slot in slots.iter() {
        if (*rri).ri_NumIndices > 0 {
            let recheck = crate::pgver::insert_index_tuples(rri, slot, estate);
            pg_sys::list_free(recheck);
        }
        pg_sys::ExecClearTuple(slot);
        pg_sys::MemoryContextReset((*econtext).ecxt_per_tuple_memory);
    }
    pg_sys::MemoryContextSwitchTo(old);
}

/// `GetPerTupleExprContext(estate)`.
unsafe fn per_tuple_context(estate: *mut pg_sys::EState) -> *mut pg_sys::ExprContext {
    if (*estate).es_per_tuple_exprcontext.is_null() {
        pg_sys::MakePerTupleExprContext(estate)
    } else {
        (*estate).es_per_tuple_exprcontext
    }
}
