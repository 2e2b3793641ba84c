//! Tests of backfill scheduling: the rules of the module header, one by one. The whole
//! algorithm, with the database around it and crashes, is checked by `tests/reconcile_model.rs`,
//! which drives this module.

use super::*;

type S = Schedule<i64, u32, i64, &'static str, &'static str>;

fn rows(keys: &[i64]) -> Vec<(i64, &'static str)> {
    keys.iter().map(|k| (*k, "row")).collect()
}

/// Backfill 1 with chunks 1 (watermark 10) and 2 (watermark 20) of table 0, both windows open.
fn two_chunks() -> S {
    let mut s = S::new();
    s.add(1, 1, 10, 0, rows(&[1, 2]), "first");
    s.add(1, 2, 20, 0, rows(&[3, 4]), "second");
    assert!(s.on_low_watermark(10));
    assert!(s.on_low_watermark(20));
    s
}

#[test]
fn watermarks_of_chunks_not_in_memory_are_ignored() {
    let mut s = S::new();
    assert_eq!(s.decide(Signal::Low(7)), Action::Ignore);
    assert_eq!(s.decide(Signal::High(7)), Action::Ignore);
    assert!(!s.on_low_watermark(7));
    assert_eq!(s.on_high_watermark(7), Action::Ignore);
    assert!(s.next_ready(1).is_none());
    // Expected, not read: no watermark known.
    s.expect(1, 1);
    assert_eq!(s.decide(Signal::High(7)), Action::Ignore);
    assert!(!s.has_chunks());
}

#[test]
fn the_first_chunk_of_a_backfill_is_emitted_at_its_high_watermark() {
    let mut s = two_chunks();
    assert_eq!(s.decide(Signal::Low(10)), Action::Open);
    assert_eq!(s.decide(Signal::High(10)), Action::Emit);
    assert_eq!(s.on_high_watermark(10), Action::Emit);
    let r = s.next_ready(1).unwrap();
    assert_eq!((r.watermark, r.chunk), (10, "first"));
    assert_eq!(r.result.unwrap().rows, rows(&[1, 2]));
    // The next one's high watermark has not passed: it stays.
    assert!(s.next_ready(1).is_none());
    assert_eq!(s.count_of(1), 1);
}

#[test]
fn a_later_chunk_is_held_with_its_window_open_and_written_after_the_earlier() {
    let mut s = two_chunks();
    assert_eq!(s.on_high_watermark(20), Action::Hold);
    assert!(s.next_ready(1).is_none(), "not before the earlier chunk");
    // Held: a change to one of its keys still drops it.
    s.on_change(&0, &3);
    assert_eq!(s.on_high_watermark(10), Action::Emit);
    let first = s.next_ready(1).unwrap();
    assert_eq!(first.chunk, "first");
    let second = s.next_ready(1).unwrap();
    assert_eq!(second.chunk, "second");
    let second = second.result.unwrap();
    assert_eq!((second.rows, second.dropped), (rows(&[4]), 1));
    assert!(s.next_ready(1).is_none());
    assert_eq!((s.pending(), s.has_chunks()), (0, false));
}

#[test]
fn an_expected_chunk_holds_the_later_ones() {
    let mut s = S::new();
    s.expect(1, 1);
    s.add(1, 2, 20, 0, rows(&[3]), "second");
    assert!(s.on_low_watermark(20));
    assert_eq!(s.on_high_watermark(20), Action::Hold);
    assert!(s.next_ready(1).is_none());
    // The expected one read, then reached: both, in key order.
    s.add(1, 1, 10, 0, rows(&[1]), "first");
    assert!(s.on_low_watermark(10));
    assert_eq!(s.on_high_watermark(10), Action::Emit);
    assert_eq!(s.next_ready(1).unwrap().chunk, "first");
    assert_eq!(s.next_ready(1).unwrap().chunk, "second");
}

#[test]
fn a_chunk_whose_window_never_opened_has_no_result() {
    let mut s = S::new();
    s.add(1, 1, 10, 0, rows(&[1]), "first");
    assert_eq!(s.on_high_watermark(10), Action::Emit);
    let r = s.next_ready(1).unwrap();
    assert!(r.result.is_none());
}

#[test]
fn forgetting_a_backfill_takes_its_later_chunks_and_closes_their_windows() {
    let mut s = two_chunks();
    s.add(2, 1, 30, 1, rows(&[1]), "other");
    assert_eq!(s.on_high_watermark(20), Action::Hold);
    assert_eq!(s.on_high_watermark(10), Action::Emit);
    let _ = s.next_ready(1).unwrap();
    // The first was not written: the held one goes too, and its window is closed.
    let mut gone = s.forget_backfill(1);
    gone.sort_unstable();
    assert_eq!(gone, ["second"]);
    assert_eq!(s.decide(Signal::High(20)), Action::Ignore);
    assert_eq!((s.pending(), s.backfills()), (1, vec![2]));
    s.forget_all();
    assert_eq!((s.pending(), s.has_chunks()), (0, false));
}

#[test]
fn backfills_are_independent() {
    let mut s = S::new();
    s.add(1, 5, 10, 0, rows(&[1]), "a5");
    s.add(2, 1, 20, 0, rows(&[2]), "b1");
    s.add(1, 6, 30, 0, rows(&[3]), "a6");
    assert_eq!(s.decide(Signal::High(20)), Action::Emit);
    assert_eq!(s.decide(Signal::High(30)), Action::Hold);
    assert_eq!(s.last_of(1), Some(&"a6"));
    assert_eq!((s.count_of(1), s.count_of(2)), (2, 1));
    assert_eq!(s.backfills(), vec![1, 2]);
    assert_eq!(
        s.chunks().map(|(wm, _)| wm).collect::<Vec<_>>(),
        [10, 20, 30]
    );
    *s.chunk_mut(20).unwrap() = "b1'";
    assert_eq!(s.chunks().nth(1), Some((20, &"b1'")));
}

#[test]
fn the_chunk_cap_applies_only_while_the_stream_is_busy() {
    let recent = Some(Duration::from_millis(300));
    assert_eq!(chunk_cap(500, recent), Some(500));
    assert_eq!(chunk_cap(500, Some(Duration::from_secs(1))), None);
    assert_eq!(chunk_cap(500, None), None);
    assert_eq!(chunk_cap(0, recent), None);
}

#[test]
fn read_ahead_tops_up_to_twice_the_readers() {
    // Four idle readers, three bounds: four chunks (three ranges, one after the last bound).
    assert_eq!(read_ahead_count(4, 3, 4, 0), 4);
    // No plan: one chunk.
    assert_eq!(read_ahead_count(4, 0, 4, 0), 1);
    // Seven of the backfill's chunks in memory with four readers: one more.
    assert_eq!(read_ahead_count(4, 3, 4, 7), 1);
    assert_eq!(read_ahead_count(4, 3, 4, 9), 0);
    assert_eq!(read_ahead_count(0, 3, 4, 0), 0);
}

#[test]
fn plans_are_used_only_from_where_and_with_the_cap_they_were_made() {
    let mut p: Plans<i64, i64> = Plans::default();
    assert!(!p.begin(1, None), "one reader: no plans");
    assert!(p.begin(2, None));
    assert!(p.wanted(1, &Some(5)));
    p.insert(1, Some(5), vec![10, 20]);
    assert!(!p.wanted(1, &Some(5)));
    assert!(p.wanted(1, &Some(6)));
    assert_eq!(p.take(1, &Some(5), None), [10, 20]);
    assert!(p.take(1, &Some(5), None).is_empty(), "taken");
    p.insert(1, Some(5), vec![10]);
    assert!(p.take(1, &Some(6), None).is_empty(), "another start");
    p.insert(1, Some(5), vec![10]);
    assert!(p.take(1, &Some(5), Some(100)).is_empty(), "another cap");
    p.insert(1, Some(5), vec![10]);
    assert!(p.begin(2, Some(100)));
    assert!(p.wanted(1, &Some(5)), "a new cap drops the plans");
    p.insert(2, None, vec![1]);
    p.retain(|b| b != 2);
    assert!(p.wanted(2, &None));
}

#[test]
fn holds_lapse_in_time_and_a_throttle_with_its_removal() {
    let now = Instant::now();
    let later = now + Duration::from_secs(5);
    let mut h: Holds<i64> = Holds::default();
    h.hold(1, later, false);
    h.hold(2, later, true);
    assert!(h.holds(1, false, now) && h.holds(2, true, now));
    // A throttle the backfill no longer has does not hold it; another hold does.
    assert!(!h.holds(2, false, now) && h.until_passed(2, now));
    assert!(!h.holds(1, false, later));
    assert_eq!(h.soonest(), Some(later));
    h.expire(later);
    assert!(h.is_empty());
    h.hold(3, later, false);
    h.release(3);
    assert!(!h.holds(3, false, now));
}
