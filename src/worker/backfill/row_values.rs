//! A backfill chunk's rows held as row values of the source table's row type, for targets in
//! this database (local table targets), instead of as JSON text.
//!
//! Owns: the memory of one chunk's rows between its read and its high watermark, and the array
//! of the surviving rows handed to the target then.
//!
//! Why: a local target's upsert can take the rows as they were read, binary: one array of the
//! source's row type as the statement's parameter (`unnest($1)`), with no text output, no JSON
//! rendering and no parsing of every value back. The rows are the same values either way; what
//! it changes is the cost (bench/micro/row_values_vs_json.sql).
//!
//! Guarantees:
//! - The chunk's rows live in a memory context of their own, a child of `TopMemoryContext`, so
//!   they outlive the read's transaction, and are freed when the chunk is emitted or forgotten
//!   (dropping [`RowValues`] deletes the context). At most one chunk per worker, as for JSON.
//! - Only the worker's main thread creates, reads or drops them (they are PostgreSQL memory).
//! - A row value is read with the row type as it was when the chunk was read. The chunk is used
//!   only if the source's columns (names, types, order) are still the same at its high
//!   watermark ([`crate::worker::backfill`] checks, and reads the chunk again otherwise), so no
//!   value is ever read with another row type than the one it was formed with.

use crate::error::{TideError, TideResult};
use crate::sql::RawRows;
use pgrx::pg_sys;

/// A memory context of its own under `TopMemoryContext`, deleted on drop.
struct Memory(pg_sys::MemoryContext);

impl Memory {
    fn new() -> Memory {
        // SAFETY: creates a child of TopMemoryContext (never NULL: ereports on failure); the
        // name is a static string, as AllocSetContextCreate requires.
        Memory(unsafe {
            pg_sys::AllocSetContextCreateExtended(
                pg_sys::TopMemoryContext,
                c"pg_tide chunk rows".as_ptr(),
                pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
                pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
            )
        })
    }

    /// Run `f` with this context current.
    fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        // SAFETY: switching CurrentMemoryContext to a live context and back; `f` does not
        // error out of PostgreSQL code (it calls construct/deconstruct_array, which ereport
        // only on out-of-memory, after which the transaction's abort resets the context).
        unsafe {
            let old = pg_sys::MemoryContextSwitchTo(self.0);
            let r = f();
            pg_sys::MemoryContextSwitchTo(old);
            r
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: the context is ours; should an error have left it current (out of memory
        // inside `run`), the current context moves to the top one first.
        unsafe {
            if std::ptr::eq(pg_sys::CurrentMemoryContext, self.0) {
                pg_sys::CurrentMemoryContext = pg_sys::TopMemoryContext;
            }
            pg_sys::MemoryContextDelete(self.0)
        }
    }
}

/// The rows of one chunk as one array of the source's row type, with a pointer to each row.
pub struct RowValues {
    /// Owns the array (and `elems`' storage); deleted on drop.
    _memory: Memory,
    /// Each row (into the array, which lives in `_memory`).
    elems: Vec<pg_sys::Datum>,
    row_type: pg_sys::Oid,
}

impl RowValues {
    /// Copy column `col` of every row of `result` (a whole-row value of type `row_type`, never
    /// NULL) into a chunk of its own.
    pub fn copy(result: &RawRows, col: i32, row_type: pg_sys::Oid) -> TideResult<RowValues> {
        // SAFETY: catalog lookups by OID; they error (ereport) for an unknown type.
        let (len, byval, align) = unsafe {
            let (mut len, mut byval, mut align) = (0i16, false, 0 as std::ffi::c_char);
            pg_sys::get_typlenbyvalalign(row_type, &mut len, &mut byval, &mut align);
            (i32::from(len), byval, align)
        };
        let mut datums = Vec::with_capacity(result.len());
        for i in 0..result.len() {
            datums.push(result.datum(i, col).ok_or_else(|| {
                TideError::internal("a chunk row came back as NULL instead of its row value")
            })?);
        }
        let memory = Memory::new();
        let nelems = i32::try_from(datums.len())
            .map_err(|_| TideError::internal("a chunk of more than 2^31 rows"))?;
        // SAFETY: `datums` point into SPI's result, still alive (the caller is inside
        // `sql::with_rows`); construct_array copies every element into the new context, and
        // deconstruct_array returns pointers into that copy, allocated there too.
        let elems = memory.run(|| unsafe {
            let array =
                pg_sys::construct_array(datums.as_mut_ptr(), nelems, row_type, len, byval, align);
            let mut out: *mut pg_sys::Datum = std::ptr::null_mut();
            let mut nulls: *mut bool = std::ptr::null_mut();
            let mut n = 0;
            pg_sys::deconstruct_array(
                array, row_type, len, byval, align, &mut out, &mut nulls, &mut n,
            );
            if out.is_null() || n <= 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(out, n as usize).to_vec()
            }
        });
        if elems.len() != datums.len() {
            return Err(TideError::internal(format!(
                "a chunk of {} rows came back as {} row values",
                datums.len(),
                elems.len()
            )));
        }
        Ok(RowValues {
            _memory: memory,
            elems,
            row_type,
        })
    }

    /// Rows (composite datums of `row_type`, each as its bytes: [`RowValues::bytes`] of another
    /// process) copied into a chunk of their own.
    pub fn from_bytes<'a>(
        rows: impl ExactSizeIterator<Item = &'a [u8]>,
        row_type: pg_sys::Oid,
    ) -> TideResult<RowValues> {
        let memory = Memory::new();
        let mut elems = Vec::with_capacity(rows.len());
        for r in rows {
            if r.len() < 4 {
                return Err(TideError::internal("a row value of fewer than 4 bytes"));
            }
            // SAFETY: a fresh allocation of the row's size in the chunk's context (palloc
            // aligns it for any datum), filled with the bytes of one flat composite datum (a
            // 4-byte varlena header and its tuple, no external TOAST pointer: whole-row values
            // are flattened), which another backend of this database formed with `row_type`.
            let datum = memory.run(|| unsafe {
                let p = pg_sys::palloc(r.len()) as *mut u8;
                std::ptr::copy_nonoverlapping(r.as_ptr(), p, r.len());
                pg_sys::Datum::from(p)
            });
            elems.push(datum);
        }
        Ok(RowValues {
            _memory: memory,
            elems,
            row_type,
        })
    }

    /// Each row's bytes (a flat composite datum: varlena header and tuple), in order.
    pub fn bytes(&self) -> impl Iterator<Item = &[u8]> {
        self.elems.iter().map(|d| {
            // SAFETY: each element is a varlena (composite datum) in this chunk's memory, alive
            // while `self` is; its length is in its header.
            unsafe {
                let p = d.cast_mut_ptr::<pg_sys::varlena>();
                std::slice::from_raw_parts(p as *const u8, pgrx::varlena::varsize_any(p))
            }
        })
    }

    /// The rows at `indexes`, in that order (each points into this chunk's memory: alive while
    /// `self` is).
    pub fn rows_at(&self, indexes: &[u32]) -> TideResult<Vec<pg_sys::Datum>> {
        indexes
            .iter()
            .map(|&i| {
                self.elems.get(i as usize).copied().ok_or_else(|| {
                    TideError::internal(format!("chunk row {i} is not in the chunk"))
                })
            })
            .collect()
    }

    /// How many rows it holds.
    pub fn len(&self) -> usize {
        self.elems.len()
    }

    /// The source table's row type the rows were read with.
    pub fn row_type(&self) -> pg_sys::Oid {
        self.row_type
    }
}
