//! Tests of the worker loop's state machine: the rules of the module header, one by one, and
//! exhaustive checks over every phase and every combination of facts.

use super::*;

const S: Settings = Settings {
    poll: Duration::from_millis(200),
    max_retry_delay: Duration::from_secs(60),
    paused_recheck: PAUSED_RECHECK,
};

fn facts() -> Facts {
    Facts {
        sighup: false,
        since_iteration: Duration::from_millis(10),
        chunk_waiting: false,
        chunk_in_flight: false,
        decoder_open: true,
        wal_ahead: false,
    }
}

fn applied(drained: bool, chunk_written: bool, chunk_read: bool) -> Phase {
    Phase::Applied {
        drained,
        chunk_written,
        chunk_read,
    }
}

const QUIET_SLEEP: Action = Action::Sleep {
    wait: Duration::from_millis(200),
    wake_on_commit: true,
};

#[test]
fn after_an_iteration_a_chunk_is_read_unless_one_was_just_written() {
    let f = facts();
    assert_eq!(decide(applied(true, false, false), f, S), Action::ReadChunk);
    // The stream goes first after a chunk was written: no read, and more WAL may be there.
    assert_eq!(decide(applied(true, true, false), f, S), Action::Iterate);
    assert_eq!(decide(applied(false, true, false), f, S), Action::Iterate);
    // A chunk still waits for its high watermark: nothing to read.
    let waiting = Facts {
        chunk_waiting: true,
        chunk_in_flight: false,
        ..f
    };
    assert_ne!(
        decide(applied(true, false, false), waiting, S),
        Action::ReadChunk
    );
}

#[test]
fn drained_and_nothing_read_sleeps_then_is_quiet() {
    let f = facts();
    let p = applied(true, false, true);
    assert_eq!(decide(p, f, S), QUIET_SLEEP);
    assert_eq!(p.after_sleep(true), Phase::Quiet { chunk_tried: false });
    // Not drained: more WAL, iterate at once.
    assert_eq!(decide(applied(false, false, true), f, S), Action::Iterate);
    // A chunk was read: its high watermark is in the WAL, iterate at once.
    let read = Facts {
        chunk_waiting: true,
        chunk_in_flight: false,
        ..f
    };
    assert_eq!(decide(applied(true, false, true), read, S), Action::Iterate);
}

#[test]
fn a_waiting_chunk_is_polled_for_not_slept_on_commit() {
    // A chunk waits (its high watermark not yet decoded) and the WAL was drained: the worker
    // polls without counting on a commit to wake it.
    let f = Facts {
        chunk_waiting: true,
        chunk_in_flight: false,
        ..facts()
    };
    let a = decide(applied(true, false, false), f, S);
    assert_eq!(
        a,
        Action::Sleep {
            wait: S.poll,
            wake_on_commit: false
        }
    );
    assert_eq!(
        applied(true, false, false).after_sleep(false),
        Phase::Iterate
    );
}

#[test]
fn quiet_polls_cheaply_and_iterates_when_something_is_new() {
    let q = Phase::Quiet { chunk_tried: false };
    assert_eq!(decide(q, facts(), S), Action::ReadChunk);
    let tried = q.after_read_chunk();
    assert_eq!(tried, Phase::Quiet { chunk_tried: true });
    assert_eq!(decide(tried, facts(), S), QUIET_SLEEP);
    for f in [
        Facts {
            wal_ahead: true,
            ..facts()
        },
        Facts {
            chunk_waiting: true,
            chunk_in_flight: false,
            ..facts()
        },
        Facts {
            sighup: true,
            ..facts()
        },
        Facts {
            decoder_open: false,
            ..facts()
        },
        Facts {
            since_iteration: FULL_ITERATION_EVERY,
            ..facts()
        },
    ] {
        assert_eq!(decide(tried, f, S), Action::Iterate, "{f:?}");
    }
}

#[test]
fn paused_failing_and_gone() {
    assert_eq!(
        decide(Phase::Paused, facts(), S),
        Action::Sleep {
            wait: PAUSED_RECHECK,
            wake_on_commit: false
        }
    );
    assert_eq!(Phase::Paused.after_sleep(false), Phase::Iterate);
    // A remote target's paused worker looks (and renews its lease) as often as it is told.
    let lease_bound = Settings {
        paused_recheck: Duration::from_secs(3),
        ..S
    };
    assert_eq!(
        decide(Phase::Paused, facts(), lease_bound),
        Action::Sleep {
            wait: Duration::from_secs(3),
            wake_on_commit: false
        }
    );
    assert_eq!(decide(Phase::Gone, facts(), S), Action::Exit);
    let mut failures = 0;
    let mut waits = Vec::new();
    for _ in 0..14 {
        let p = Phase::after_iteration(Iteration::Failed, false, false, failures);
        failures = p.failures();
        match decide(p, facts(), S) {
            Action::Sleep { wait, .. } => waits.push(wait.as_millis()),
            other => panic!("a failure must back off, not {other:?}"),
        }
        assert_eq!(p.after_sleep(false), Phase::Iterate);
    }
    assert_eq!(&waits[..4], &[500, 1000, 2000, 4000]);
    assert_eq!(
        *waits.last().unwrap_or(&0),
        60_000,
        "capped by tide.max_retry_delay"
    );
    let ok = Phase::after_iteration(Iteration::Done { drained: true }, false, false, failures);
    assert_eq!(ok.failures(), 0, "a success resets the back-off");
}

#[test]
fn a_written_chunk_is_seen_from_before_and_after() {
    assert_eq!(
        Phase::after_iteration(Iteration::Done { drained: true }, true, false, 0),
        applied(true, true, false)
    );
    assert_eq!(
        Phase::after_iteration(Iteration::Done { drained: true }, true, true, 0),
        applied(true, false, false),
        "still waiting: not written"
    );
}

fn all_phases() -> Vec<Phase> {
    let b = [false, true];
    let mut v = vec![
        Phase::Iterate,
        Phase::Paused,
        Phase::Gone,
        Phase::Failing { failures: 3 },
    ];
    for d in b {
        for w in b {
            for r in b {
                v.push(applied(d, w, r));
            }
        }
        v.push(Phase::Quiet { chunk_tried: d });
    }
    v
}

fn all_facts() -> Vec<Facts> {
    let b = [false, true];
    let mut v = Vec::new();
    for sighup in b {
        for late in b {
            for chunk_waiting in b {
                for chunk_in_flight in b {
                    for decoder_open in b {
                        for wal_ahead in b {
                            v.push(Facts {
                                sighup,
                                since_iteration: if late {
                                    FULL_ITERATION_EVERY
                                } else {
                                    Duration::ZERO
                                },
                                chunk_waiting,
                                chunk_in_flight,
                                decoder_open,
                                wal_ahead,
                            });
                        }
                    }
                }
            }
        }
    }
    v
}

/// From every phase, with facts that do not change, the loop reaches an iteration, a sleep or
/// the exit within two decisions: it never spins reading chunks.
#[test]
fn no_phase_spins() {
    for p in all_phases() {
        for f0 in all_facts() {
            let (mut phase, mut f) = (p, f0);
            let mut reads = 0;
            while let Action::ReadChunk = decide(phase, f, S) {
                reads += 1;
                // Receiving the chunk in flight is one read; it may be followed by one more (the
                // next chunk, read by the worker itself).
                let most = if f0.chunk_in_flight { 2 } else { 1 };
                assert!(reads <= most, "{p:?} with {f0:?} reads {reads} times");
                phase = phase.after_read_chunk();
                f.chunk_in_flight = false;
            }
        }
    }
}

/// A chunk asked of the reader is received before any iteration (it must be registered before
/// the stream reaches its low watermark), and before any sleep of a running pipeline; a paused,
/// failing or dropped pipeline does not wait for it.
#[test]
fn a_chunk_in_flight_comes_before_any_iteration() {
    for p in all_phases() {
        for mut f in all_facts() {
            f.chunk_in_flight = true;
            let a = decide(p, f, S);
            match p {
                Phase::Paused | Phase::Failing { .. } | Phase::Gone => {
                    assert_ne!(a, Action::ReadChunk, "{p:?}")
                }
                _ => assert_eq!(a, Action::ReadChunk, "{p:?} {f:?}"),
            }
        }
    }
}

/// A quiet sleep (one a commit cuts short) happens only when nothing waits: no chunk, no WAL
/// past the decoder (when the worker was already quiet), and an open decoder.
#[test]
fn quiet_sleeps_only_when_nothing_waits() {
    for p in all_phases() {
        for f in all_facts() {
            if let Action::Sleep {
                wake_on_commit: true,
                ..
            } = decide(p, f, S)
            {
                assert!(!f.chunk_waiting && f.decoder_open, "{p:?} {f:?}");
                if matches!(p, Phase::Quiet { .. }) {
                    assert!(!f.wal_ahead && !f.sighup, "{p:?} {f:?}");
                }
            }
        }
    }
}

/// A chunk the target refuses fails its backfill; a passing failure is tried again.
#[test]
fn chunk_refusals_and_passing_failures() {
    for refused in [
        "23514", "23505", "23502", "22003", "22P02", "42501", "42703", "P0001", "HV000", "XX000",
    ] {
        assert!(chunk_refused(refused), "{refused}");
    }
    for passing in [
        "08006", "08000", "40001", "40P01", "53100", "53300", "57014", "57P01", "58030", "55P03",
        "55006", "25P03",
    ] {
        assert!(!chunk_refused(passing), "{passing}");
    }
}
