//! Log sequence numbers.
//!
//! Owns [`Lsn`], a WAL position, and its text form. Display prints exactly
//! what PostgreSQL's `pg_lsn` type prints (`0/16B3748`: upper-case hex, no
//! leading zeros in either half) and parsing accepts exactly what `pg_lsn`
//! input accepts (1 to 8 hex digits of either case on each side of `/`), so
//! `parse(display(x)) == x` for every value.

use std::fmt;
use std::str::FromStr;

/// A position in the write-ahead log, as PostgreSQL's `XLogRecPtr`/`pg_lsn`.
///
/// Ordering is WAL order; the default is `0/0` (PostgreSQL's invalid LSN).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// Error returned when a string is not a valid `X/Y` LSN.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseLsnError;

impl fmt::Display for ParseLsnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid LSN: expected X/Y with 1 to 8 hex digits on each side")
    }
}

impl std::error::Error for ParseLsnError {}

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (hi, lo) = s.split_once('/').ok_or(ParseLsnError)?;
        Ok(Lsn((u64::from(half(hi)?) << 32) | u64::from(half(lo)?)))
    }
}

/// Parses one half: 1..=8 hex digits, nothing else (no sign, no spaces).
fn half(s: &str) -> Result<u32, ParseLsnError> {
    if s.is_empty() || s.len() > 8 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ParseLsnError);
    }
    u32::from_str_radix(s, 16).map_err(|_| ParseLsnError)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn display_matches_pg_lsn() {
        assert_eq!(Lsn(0).to_string(), "0/0");
        assert_eq!(Lsn(0x16B3748).to_string(), "0/16B3748");
        assert_eq!(Lsn(0x1_0000_00AB).to_string(), "1/AB");
        assert_eq!(Lsn(u64::MAX).to_string(), "FFFFFFFF/FFFFFFFF");
    }

    #[test]
    fn parse_accepts_pg_lsn_input() {
        assert_eq!("0/16B3748".parse(), Ok(Lsn(0x16B3748)));
        assert_eq!("0/16b3748".parse(), Ok(Lsn(0x16B3748)));
        assert_eq!("00000001/000000AB".parse(), Ok(Lsn(0x1_0000_00AB)));
    }

    #[test]
    fn parse_rejects_garbage() {
        for bad in [
            "",
            "/",
            "0/",
            "/0",
            "0",
            "0/0/0",
            "+1/0",
            "0/-1",
            " 0/0",
            "0/0 ",
            "123456789/0",
            "0/G",
            "0/ÿ",
        ] {
            assert_eq!(bad.parse::<Lsn>(), Err(ParseLsnError), "{bad:?}");
        }
    }

    #[test]
    fn order_is_wal_order() {
        assert!(Lsn(0xFFFF_FFFF) < "1/0".parse().unwrap());
    }

    proptest! {
        #[test]
        fn display_parse_roundtrip(x: u64) {
            let s = Lsn(x).to_string();
            prop_assert_eq!(s.parse::<Lsn>(), Ok(Lsn(x)));
            // pg_lsn's form: no leading zeros, upper case.
            for h in s.split('/') {
                prop_assert!(h == "0" || !h.starts_with('0'));
                prop_assert!(!h.bytes().any(|b| b.is_ascii_lowercase()));
            }
        }
    }
}
