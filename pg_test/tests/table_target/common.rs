//! The table-target suite's prelude: everything of `pg_test` (source and target compared with
//! [`assert_same_rows`]), plus LSNs parsed.

pub use pg_test::*;
use std::time::Duration;

pub const POLL: Duration = Duration::from_millis(100);

/// "X/Y" → u64.
pub fn parse_lsn(s: &str) -> Option<u64> {
    let (hi, lo) = s.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}
