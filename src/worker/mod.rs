//! Background workers: the launcher (and the outbox retention and the pipeline definitions for
//! pg_dump it keeps), the per-pipeline worker, and the one transaction helper both use.

pub mod apply;
mod apply_stream;
pub mod backfill;
pub mod decoder;
mod definitions;
mod handoff;
mod iteration;
pub mod launcher;
pub mod leaks;
mod markers;
pub mod origin;
mod partitions;
pub mod pipeline;
pub mod retention;
mod rows;
pub mod stream_apply;
pub mod tx;

use pgrx::pg_sys;

/// The [`crate::target::wait::Check`] of a backend: while the main thread waits for a sink
/// thread, a pending interrupt is processed (query cancel raises an ERROR, SIGTERM ends the
/// process) and a dead postmaster ends the process, as at any `WaitLatch` of PostgreSQL's own.
/// The request waited for is abandoned first. With `defer_termination`, a pending termination
/// request is left pending (`true`): the wait goes on for its grace.
pub fn wait_check(abandon: &mut dyn FnMut(), defer_termination: bool) -> bool {
    // A zero-timeout WaitLatch only reports whether the postmaster is gone.
    // SAFETY: MyLatch is this backend's latch; a zero-timeout wait only reports the postmaster's
    // death; called on the main thread (sink threads never call it).
    let events = unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            (pg_sys::WL_TIMEOUT | pg_sys::WL_POSTMASTER_DEATH) as i32,
            0,
            pg_sys::PG_WAIT_EXTENSION,
        )
    };
    if events & pg_sys::WL_POSTMASTER_DEATH as i32 != 0 {
        abandon();
        crate::pgver::exit_process(1);
    }
    // SAFETY: reads this backend's interrupt flag, set by its signal handlers (a volatile
    // sig_atomic_t); main thread.
    if unsafe { pg_sys::InterruptPending } != 0 {
        // SAFETY: reads this backend's termination flag, set by its SIGTERM handler (a volatile
        // sig_atomic_t); main thread.
        if defer_termination && unsafe { pg_sys::ProcDiePending } != 0 {
            return true;
        }
        abandon();
        pg_sys::check_for_interrupts!();
    }
    false
}
