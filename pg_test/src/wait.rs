//! Polling: [`poll_every`] (the outcome as a value) and [`wait_until`] (a panic naming the
//! caller's line on timeout); errors count as "not yet".

use crate::TestResult;
use std::time::{Duration, Instant};

/// Poll `f` every `poll` until it returns `Ok(true)`, without panicking: Ok(how long it took) or
/// Err(what it last saw) after `timeout`. Errors count as "not yet".
pub fn poll_every<F>(timeout: Duration, poll: Duration, f: F) -> Result<Duration, String>
where
    F: FnMut() -> TestResult<bool>,
{
    poll_until(timeout, poll, f)
}

pub(crate) fn poll_until<F>(timeout: Duration, poll: Duration, mut f: F) -> Result<Duration, String>
where
    F: FnMut() -> TestResult<bool>,
{
    let start = Instant::now();
    let mut attempts = 0u64;
    let mut last: String;
    loop {
        attempts += 1;
        match f() {
            Ok(true) => return Ok(start.elapsed()),
            Ok(false) => last = "condition was false".to_string(),
            Err(e) => last = format!("error: {e}"),
        }
        if start.elapsed() >= timeout {
            return Err(format!(
                "not true after {:.1?} ({attempts} attempts, polled every {poll:?}); last: {last}",
                start.elapsed()
            ));
        }
        std::thread::sleep(poll);
    }
}

/// Poll `f` every `poll` until it returns `Ok(true)`; errors count as "not yet".
/// Panics, naming the caller's line, if it is not true within `timeout`.
/// Returns how long it took.
#[track_caller]
pub fn wait_until<F>(timeout: Duration, poll: Duration, f: F) -> Duration
where
    F: FnMut() -> TestResult<bool>,
{
    match poll_until(timeout, poll, f) {
        Ok(elapsed) => elapsed,
        Err(msg) => panic!("wait_until timed out: {msg}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_until_returns_and_times_out() {
        let mut n = 0;
        wait_until(Duration::from_secs(5), Duration::from_millis(1), || {
            n += 1;
            Ok(n >= 3)
        });
        let r = poll_until(Duration::from_millis(20), Duration::from_millis(5), || {
            Err("boom".into())
        });
        assert!(r.unwrap_err().contains("boom"));
    }
}
