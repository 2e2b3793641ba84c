//! What differs between the PostgreSQL versions pg_tide builds for (15, 16, 17, 18; one Cargo
//! feature each), in one place. Each function here means the same on every version; the rest of
//! pg_tide calls these and never looks at the version itself.

use pgrx::pg_sys;

/// A decoded change's old or new tuple as `ReorderBufferChange` holds it: a tuple buffer up to
/// 16, the heap tuple itself from 17.
#[cfg(any(feature = "pg15", feature = "pg16"))]
pub type ChangeTuple = *mut pg_sys::ReorderBufferTupleBuf;
#[cfg(any(feature = "pg17", feature = "pg18"))]
pub type ChangeTuple = pg_sys::HeapTuple;

/// The heap tuple of a change's (non-NULL) old or new tuple.
///
/// # Safety
/// `t` is a non-NULL tuple of a change decoding handed to the output plugin.
pub unsafe fn change_heap_tuple(t: ChangeTuple) -> pg_sys::HeapTuple {
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    {
        // SAFETY: the caller's; the buffer holds its HeapTupleData inline.
        unsafe { &mut (*t).tuple }
    }
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    {
        t
    }
}

/// Whether `role` may execute function `funcid` (`pg_proc_aclcheck` up to 15,
/// `object_aclcheck` from 16).
///
/// # Safety
/// In a transaction (reads the catalog).
pub unsafe fn proc_aclcheck(
    funcid: pg_sys::Oid,
    role: pg_sys::Oid,
    mode: pg_sys::AclMode,
) -> pg_sys::AclResult::Type {
    #[cfg(feature = "pg15")]
    {
        // SAFETY: the caller's.
        unsafe { pg_sys::pg_proc_aclcheck(funcid, role, mode) }
    }
    #[cfg(not(feature = "pg15"))]
    {
        // SAFETY: the caller's.
        unsafe { pg_sys::object_aclcheck(pg_sys::ProcedureRelationId, funcid, role, mode) }
    }
}

/// `ExecInsertIndexTuples` for a plain insert (no update, no conflict handling; from 16 also not
/// only the summarizing indexes): the index entries of `slot`'s tuple, and the list of indexes
/// needing a recheck.
///
/// # Safety
/// As `ExecInsertIndexTuples`: `rri`'s indexes open, `slot` holding the inserted tuple.
pub unsafe fn insert_index_tuples(
    rri: *mut pg_sys::ResultRelInfo,
    slot: *mut pg_sys::TupleTableSlot,
    estate: *mut pg_sys::EState,
) -> *mut pg_sys::List {
    #[cfg(feature = "pg15")]
    {
        // SAFETY: the caller's.
        unsafe {
            pg_sys::ExecInsertIndexTuples(
                rri,
                slot,
                estate,
                false,
                false,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    }
    #[cfg(not(feature = "pg15"))]
    {
        // SAFETY: the caller's.
        unsafe {
            pg_sys::ExecInsertIndexTuples(
                rri,
                slot,
                estate,
                false,
                false,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                false,
            )
        }
    }
}

/// This process's number among the server's processes (`ProcGlobal->allProcs`), or -1 for a
/// process without one.
pub fn my_procno() -> i32 {
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    {
        // SAFETY: MyProc is this process's PGPROC (or NULL), set before any pg_tide code runs.
        unsafe { pg_sys::MyProc.as_ref().map_or(-1, |p| p.pgprocno) }
    }
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    {
        // SAFETY: set once when the process gets its PGPROC (INVALID_PROC_NUMBER, -1, before).
        unsafe { pg_sys::MyProcNumber }
    }
}

/// Take replication origin `id` for this session (`replorigin_session_setup`; from 16 with no
/// other process to share it with).
///
/// # Safety
/// In a transaction or not, as `replorigin_session_setup`: the origin exists.
pub unsafe fn replorigin_session_setup(id: pg_sys::RepOriginId) {
    #[cfg(feature = "pg15")]
    {
        // SAFETY: the caller's.
        unsafe { pg_sys::replorigin_session_setup(id) }
    }
    #[cfg(not(feature = "pg15"))]
    {
        // SAFETY: the caller's.
        unsafe { pg_sys::replorigin_session_setup(id, 0) }
    }
}

/// The attributes of tuple descriptor `desc`, in order (`natts` of them): the array after the
/// descriptor's header up to 17; from 18 it follows the `CompactAttribute` array.
///
/// # Safety
/// `desc` is a valid tuple descriptor that outlives the slice.
pub unsafe fn tupdesc_attrs<'a>(desc: pg_sys::TupleDesc) -> &'a [pg_sys::FormData_pg_attribute] {
    // SAFETY: the caller's; `natts` attributes follow the header (after the compact ones in 18).
    unsafe {
        let natts = (*desc).natts.max(0) as usize;
        std::slice::from_raw_parts(tupdesc_attr(desc, 0), natts)
    }
}

/// Attribute `i` (0-based) of tuple descriptor `desc` (PostgreSQL's `TupleDescAttr`).
///
/// # Safety
/// `desc` is a valid tuple descriptor; `i` is below its `natts` (or 0, for the array's start).
pub unsafe fn tupdesc_attr(
    desc: pg_sys::TupleDesc,
    i: usize,
) -> *mut pg_sys::FormData_pg_attribute {
    #[cfg(not(feature = "pg18"))]
    {
        // SAFETY: the caller's.
        unsafe { (*desc).attrs.as_mut_ptr().add(i) }
    }
    #[cfg(feature = "pg18")]
    {
        // SAFETY: the caller's; in 18 the FormData_pg_attribute array follows the natts
        // CompactAttribute entries (tupdesc.h, TupleDescAttr).
        unsafe {
            let natts = (*desc).natts.max(0) as usize;
            (*desc)
                .compact_attrs
                .as_mut_ptr()
                .add(natts)
                .cast::<pg_sys::FormData_pg_attribute>()
                .add(i)
        }
    }
}

/// Install `handler` for signal `signo` in this (backend) process (`pqsignal`; `pqsignal_be`
/// from 18).
///
/// # Safety
/// As `pqsignal`: `handler` is async-signal-safe.
pub unsafe fn set_signal_handler(signo: i32, handler: pg_sys::pqsigfunc) {
    #[cfg(not(feature = "pg18"))]
    {
        // SAFETY: the caller's.
        unsafe {
            pg_sys::pqsignal(signo, handler);
        }
    }
    #[cfg(feature = "pg18")]
    {
        // SAFETY: the caller's.
        unsafe { pg_sys::pqsignal_be(signo, handler) }
    }
}

/// Acquire replication slot `name` for this process (`ReplicationSlotAcquire`), waiting for no
/// one (`nowait`); an invalidated slot is acquired all the same, as up to 17 (18's
/// `error_if_invalid` off): pg_tide finds out and says why itself.
///
/// # Safety
/// As `ReplicationSlotAcquire`: no slot acquired by this process yet.
pub unsafe fn slot_acquire(name: &std::ffi::CStr, nowait: bool) {
    #[cfg(not(feature = "pg18"))]
    {
        // SAFETY: the caller's.
        unsafe { pg_sys::ReplicationSlotAcquire(name.as_ptr(), nowait) }
    }
    #[cfg(feature = "pg18")]
    {
        // SAFETY: the caller's.
        unsafe { pg_sys::ReplicationSlotAcquire(name.as_ptr(), nowait, false) }
    }
}

/// End this process with exit code `code` (`proc_exit`, which never returns; 18's bindings do
/// not say so).
pub fn exit_process(code: i32) -> ! {
    // SAFETY: PostgreSQL's orderly process exit, from the process's main thread.
    unsafe { pg_sys::proc_exit(code) };
    #[cfg(feature = "pg18")]
    unreachable!("proc_exit returned")
}

/// Whether this server has failover slots (`pg_create_logical_replication_slot`'s `failover`,
/// `pg_replication_slots.failover` and `synced`, slot synchronisation to standbys): 17 and later.
pub const HAS_FAILOVER_SLOTS: bool = cfg!(any(feature = "pg17", feature = "pg18"));

/// Whether the slot this process has acquired (`MyReplicationSlot`) is a failover slot; false
/// before 17, and when none is acquired.
pub fn acquired_slot_is_failover() -> bool {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    {
        // SAFETY: MyReplicationSlot is this process's acquired slot (or NULL); its `data` is
        // written only by its holder, this process.
        unsafe {
            pg_sys::MyReplicationSlot
                .as_ref()
                .is_some_and(|s| s.data.failover)
        }
    }
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    {
        false
    }
}

/// Whether every physical slot `synchronized_standby_slots` names (17 and later) has confirmed
/// WAL up to `lsn` (PostgreSQL's `StandbySlotsHaveCaughtup`, what a walsender and
/// `pg_logical_slot_get_changes` wait for before handing out a failover slot's changes); true
/// when the setting is empty, on a standby, and before 17. A named slot that is missing,
/// logical or invalidated counts as not caught up (logged at DEBUG1).
pub fn standbys_caught_up(lsn: u64) -> bool {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    {
        // SAFETY: reads slot state under PostgreSQL's own locks; elevel DEBUG1 never raises.
        unsafe { pg_sys::StandbySlotsHaveCaughtup(lsn, pg_sys::DEBUG1 as i32) }
    }
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    {
        let _ = lsn;
        true
    }
}

/// `synchronized_standby_slots` (17 and later; empty before).
pub fn synchronized_standby_slots() -> String {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    {
        // SAFETY: a GUC string variable of this process (NULL or a valid C string).
        unsafe {
            let p = pg_sys::synchronized_standby_slots;
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    {
        String::new()
    }
}

/// Wait until the standbys of `synchronized_standby_slots` confirmed WAL up to `lsn`
/// (`WaitForStandbyConfirmation`, 17 and later: only for the acquired slot when it is a
/// failover slot; interruptible); nothing before 17.
pub fn wait_for_standbys(lsn: u64) {
    #[cfg(any(feature = "pg17", feature = "pg18"))]
    {
        // SAFETY: a slot is acquired (the decoder's); the wait checks for interrupts.
        unsafe { pg_sys::WaitForStandbyConfirmation(lsn) }
    }
    #[cfg(any(feature = "pg15", feature = "pg16"))]
    {
        let _ = lsn;
    }
}
