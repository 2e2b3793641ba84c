//! What a target that keeps its applied position itself (a remote table target: its
//! `tide_applied` row; a kafka target: its position topic) knows of that position, and the one
//! way a sink thread's commit outcome changes it.
//!
//! Owns: the cache. Guarantees: a position is remembered only once the sink thread said the
//! commit that recorded it succeeded; any failed commit (or a failed part of one) forgets it,
//! so the next iteration reads it from the target again instead of trusting a position the
//! target may not hold.

use crate::lsn::Lsn;

/// The target's applied position, once read: `None` unknown (read it), `Some(None)` the target
/// holds none, `Some(Some(lsn))` it holds `lsn`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KnownApplied(Option<Option<Lsn>>);

impl KnownApplied {
    /// The position, if known.
    pub fn get(&self) -> Option<Option<Lsn>> {
        self.0
    }

    /// The position as the target says it now (read or taken over with a lease).
    pub fn set(&mut self, applied: Option<Lsn>) {
        self.0 = Some(applied);
    }

    /// Forget it: the next [`KnownApplied::read_once`] reads it again.
    pub fn forget(&mut self) {
        self.0 = None;
    }

    /// The position, read with `read` when not known, then kept.
    pub fn read_once<E>(
        &mut self,
        read: impl FnOnce() -> Result<Option<Lsn>, E>,
    ) -> Result<Option<Lsn>, E> {
        if let Some(a) = self.0 {
            return Ok(a);
        }
        let a = read()?;
        self.0 = Some(a);
        Ok(a)
    }

    /// The outcome `sent` of a sink thread's commit that recorded `applied` (or no position):
    /// a success remembers `applied`, a failure forgets what was known. Returns `sent`.
    pub fn committed<T, E>(&mut self, applied: Option<Lsn>, sent: Result<T, E>) -> Result<T, E> {
        match &sent {
            Ok(_) => {
                if let Some(a) = applied {
                    self.0 = Some(Some(a));
                }
            }
            Err(_) => self.0 = None,
        }
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::KnownApplied;
    use crate::lsn::Lsn;

    #[test]
    fn a_failed_commit_forgets_and_a_success_remembers() {
        let mut k = KnownApplied::default();
        assert_eq!(k.read_once(|| Ok::<_, ()>(Some(Lsn(5)))), Ok(Some(Lsn(5))));
        // Known: not read again.
        assert_eq!(k.read_once(|| Ok::<_, ()>(None)), Ok(Some(Lsn(5))));
        // A commit without a position keeps what was known.
        assert!(k.committed::<(), ()>(None, Ok(())).is_ok());
        assert_eq!(k.get(), Some(Some(Lsn(5))));
        assert!(k.committed::<(), ()>(Some(Lsn(9)), Ok(())).is_ok());
        assert_eq!(k.get(), Some(Some(Lsn(9))));
        // A failure forgets: the position is read again.
        assert!(k.committed::<(), ()>(Some(Lsn(12)), Err(())).is_err());
        assert_eq!(k.get(), None);
        assert_eq!(k.read_once(|| Ok::<_, ()>(Some(Lsn(9)))), Ok(Some(Lsn(9))));
    }
}
