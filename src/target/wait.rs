//! The one way the worker's main thread waits for a sink thread's reply (the remote target's and
//! the Kafka target's threads alike).
//!
//! Owns: the wait. It is cut into slices of at most [`WAIT_SLICE`]; a reply ends a slice at
//! once, and between slices the main thread looks at PostgreSQL's interrupt flags and the
//! postmaster through the installed [`Check`] (`_PG_init` installs `worker::wait_check`), since
//! no channel can be woken by a signal. Guarantees: a wait ends with the reply, at its timeout,
//! when the sink thread is gone, or with an interrupt (a query cancel raises an ERROR, SIGTERM
//! ends the process, a dead postmaster ends it); before an interrupt ends it, the request is
//! abandoned (`abandon`), so the sink thread rolls it back and cancels its statement. A wait
//! that is `graceful` lets a termination request (SIGTERM) wait up to its grace for the reply
//! first (a Kafka commit being acknowledged), so a clean shutdown records what was delivered.
//! Only the main thread calls [`reply`] (the check calls into PostgreSQL).

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The longest the main thread waits for a sink thread without looking at interrupts and the
/// postmaster.
pub const WAIT_SLICE: Duration = Duration::from_millis(100);

/// What the main thread does between slices of a wait: in a backend, process a pending
/// interrupt or exit if the postmaster died, calling `abandon` first when it will not return.
/// With `defer_termination`, a pending termination request (and only that) is left pending and
/// the check returns `true`.
pub type Check = fn(abandon: &mut dyn FnMut(), defer_termination: bool) -> bool;

static CHECK: OnceLock<Check> = OnceLock::new();

/// Install the [`Check`] (once per process; `_PG_init` does it). Without one (unit tests that
/// run outside a backend) a wait ends only on a reply, its timeout or a vanished thread.
pub fn set_check(check: Check) {
    let _ = CHECK.set(check);
}

/// How a wait ended, when not by an interrupt.
#[derive(Debug)]
pub enum Waited<T> {
    Reply(T),
    /// The timeout passed (the request was not abandoned: the caller decides).
    TimedOut,
    /// The sink thread is gone (its end of the channel dropped).
    Gone,
}

/// Wait up to `timeout` for the reply on `rx` that `mine` accepts (it returns `None` for a stale
/// reply to an abandoned request, which is skipped). `grace`: a termination request waits this
/// long for the reply first. A zero `timeout` only takes a reply already there (and never runs
/// the check: a caller may hold a lock).
pub fn reply<M, T>(
    rx: &Receiver<M>,
    timeout: Duration,
    grace: Option<Duration>,
    mut mine: impl FnMut(M) -> Option<T>,
    abandon: &mut dyn FnMut(),
) -> Waited<T> {
    let deadline = Instant::now().checked_add(timeout);
    let mut terminating_since: Option<Instant> = None;
    loop {
        let slice = deadline.map_or(WAIT_SLICE, |d| {
            d.saturating_duration_since(Instant::now()).min(WAIT_SLICE)
        });
        match rx.recv_timeout(slice) {
            Ok(m) => {
                if let Some(r) = mine(m) {
                    return Waited::Reply(r);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return Waited::Gone,
            Err(RecvTimeoutError::Timeout) => {}
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Waited::TimedOut;
        }
        if let Some(check) = CHECK.get() {
            let defer = match (grace, terminating_since) {
                (Some(g), Some(since)) => since.elapsed() < g,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if check(abandon, defer) {
                terminating_since.get_or_insert_with(Instant::now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn stale_replies_are_skipped_and_the_reply_ends_the_wait() {
        let (tx, rx) = mpsc::channel();
        tx.send(1u64).unwrap();
        tx.send(2).unwrap();
        let got = reply(
            &rx,
            Duration::from_secs(5),
            None,
            |m| (m == 2).then_some(m),
            &mut || {},
        );
        assert!(matches!(got, Waited::Reply(2)));
    }

    #[test]
    fn a_timeout_and_a_vanished_thread_end_the_wait() {
        let (tx, rx) = mpsc::channel::<u64>();
        let started = Instant::now();
        let got = reply(&rx, Duration::from_millis(250), None, Some, &mut || {});
        assert!(matches!(got, Waited::TimedOut));
        assert!(started.elapsed() >= Duration::from_millis(250));
        drop(tx);
        assert!(matches!(
            reply(&rx, Duration::from_secs(5), None, Some, &mut || {}),
            Waited::Gone
        ));
        // Zero: only what is already there.
        let (tx, rx) = mpsc::channel::<u64>();
        assert!(matches!(
            reply(&rx, Duration::ZERO, None, Some, &mut || {}),
            Waited::TimedOut
        ));
        tx.send(7).unwrap();
        assert!(matches!(
            reply(&rx, Duration::ZERO, None, Some, &mut || {}),
            Waited::Reply(7)
        ));
    }
}
