//! Tests of the parent module.
use super::*;
use crate::wire::{Tuple, Value};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tide_streams_{name}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn insert(relid: u32, v: &str) -> Vec<u8> {
    let mut b = Vec::new();
    wire::encode(
        &Message::Insert {
            relid,
            new: Tuple {
                values: vec![Value::Text(v)],
            },
        },
        &mut b,
    );
    b
}

fn wrap(sub: u32, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    wire::put_stream_change_header(&mut b, sub);
    b.extend_from_slice(body);
    b
}

fn start(xid: u32, first: bool) -> Vec<u8> {
    let mut b = Vec::new();
    wire::put_stream_start(&mut b, xid, first);
    b
}

fn stop() -> Vec<u8> {
    vec![b'E']
}

fn abort(xid: u32, sub: u32) -> Vec<u8> {
    let mut b = Vec::new();
    wire::put_stream_abort(&mut b, xid, sub);
    b
}

fn commit(xid: u32, lsn: u64) -> Vec<u8> {
    let mut b = Vec::new();
    wire::put_stream_commit(&mut b, xid, Lsn(lsn), Lsn(lsn + 8), 42);
    b
}

fn begin_of(xid: u32, lsn: u64) -> Vec<u8> {
    let mut b = Vec::new();
    wire::put_begin(&mut b, xid, Lsn(lsn), 42);
    b
}

fn commit_of(xid: u32, lsn: u64) -> Vec<u8> {
    let mut b = Vec::new();
    wire::put_commit(&mut b, xid, Lsn(lsn), Lsn(lsn + 8), 42);
    b
}

fn drain_all(b: &mut SpillBuffer) -> Vec<Vec<u8>> {
    let mut d = b.drain();
    let mut out = Vec::new();
    while let Some(m) = d.next_message().unwrap() {
        out.push(m.to_vec());
    }
    out
}

fn route_all(s: &mut Streams, out: &mut SpillBuffer, msgs: &[Vec<u8>]) {
    for m in msgs {
        s.route(m, out).unwrap();
    }
}

/// Two streamed transactions interleaved with a committed one: each comes out whole at its
/// commit, in commit order, with its messages in the order they were streamed.
#[test]
fn interleaved_transactions_come_out_whole_in_commit_order() {
    let d = dir("interleaved");
    let mut s = Streams::new(&d, "t", 64);
    let mut out = SpillBuffer::new(&d, "out", 1 << 20);
    let mut msgs = vec![start(10, true)];
    for i in 0..50 {
        msgs.push(wrap(10, &insert(1, &format!("a{i}"))));
    }
    msgs.extend([stop(), start(11, true), wrap(11, &insert(1, "b0")), stop()]);
    // A transaction committed meanwhile passes straight through.
    msgs.extend([begin_of(12, 100), insert(2, "c"), commit_of(12, 100)]);
    msgs.extend([start(10, false), wrap(10, &insert(1, "a50")), stop()]);
    msgs.extend([start(11, false), wrap(11, &insert(1, "b1")), stop()]);
    // 11 commits first although 10 started first.
    msgs.extend([commit(11, 200), commit(10, 300)]);
    route_all(&mut s, &mut out, &msgs);
    assert_eq!(s.in_progress(), 0);
    let mut want = vec![begin_of(12, 100), insert(2, "c"), commit_of(12, 100)];
    want.extend([
        begin_of(11, 200),
        insert(1, "b0"),
        insert(1, "b1"),
        commit_of(11, 200),
    ]);
    want.push(begin_of(10, 300));
    for i in 0..51 {
        want.push(insert(1, &format!("a{i}")));
    }
    want.push(commit_of(10, 300));
    assert_eq!(drain_all(&mut out), want);
    assert_eq!((s.committed, s.aborted), (2, 0));
    let _ = std::fs::remove_dir_all(&d);
}

/// An aborted subtransaction's messages are left out at the commit (a nested one's too, which
/// PostgreSQL announces on its own), the rest stays; an aborted transaction leaves nothing,
/// and its file is removed.
#[test]
fn aborts_drop_what_they_abort_and_the_file() {
    let d = dir("aborts");
    let mut s = Streams::new(&d, "t", 16);
    let mut out = SpillBuffer::new(&d, "out", 1 << 20);
    route_all(
        &mut s,
        &mut out,
        &[
            start(20, true),
            wrap(20, &insert(1, "keep1")),
            wrap(21, &insert(1, "sub21")),
            wrap(22, &insert(1, "sub22")),
            wrap(23, &insert(1, "keep23")),
            stop(),
            abort(20, 22),
            abort(20, 21),
            start(30, true),
            wrap(30, &insert(1, "gone")),
            wrap(30, &insert(1, "gone too")),
            stop(),
        ],
    );
    let spool_files = || std::fs::read_dir(&d).map(|r| r.count()).unwrap_or(0);
    assert_eq!(spool_files(), 2, "both transactions spilled to a file each");
    route_all(
        &mut s,
        &mut out,
        &[
            abort(30, 30),
            start(20, false),
            wrap(20, &insert(1, "keep2")),
            stop(),
            commit(20, 500),
        ],
    );
    assert_eq!(spool_files(), 0, "spool files left behind");
    assert_eq!(
        drain_all(&mut out),
        vec![
            begin_of(20, 500),
            insert(1, "keep1"),
            insert(1, "keep23"),
            insert(1, "keep2"),
            commit_of(20, 500)
        ]
    );
    assert_eq!((s.committed, s.aborted), (1, 1));
    let _ = std::fs::remove_dir_all(&d);
}

/// Clearing (the decoder reopened) forgets every transaction in progress: a later block of one
/// is then refused (PostgreSQL starts it again with a first block).
#[test]
fn clear_forgets_and_out_of_place_messages_are_errors() {
    let d = dir("errors");
    let mut s = Streams::new(&d, "t", 1 << 20);
    let mut out = SpillBuffer::new(&d, "out", 1 << 20);
    route_all(
        &mut s,
        &mut out,
        &[start(40, true), wrap(40, &insert(1, "x")), stop()],
    );
    s.clear();
    assert_eq!(s.in_progress(), 0);
    let err = |s: &mut Streams, out: &mut SpillBuffer, m: Vec<u8>| {
        s.route(&m, out).unwrap_err().to_string()
    };
    assert!(err(&mut s, &mut out, start(40, false)).contains("first block was not received"));
    assert!(err(&mut s, &mut out, commit(40, 1)).contains("none of whose blocks"));
    assert!(err(&mut s, &mut out, wrap(40, &insert(1, "x"))).contains("outside a stream block"));
    assert!(err(&mut s, &mut out, stop()).contains("outside a block"));
    s.route(&start(41, true), &mut out).unwrap();
    assert!(err(&mut s, &mut out, insert(1, "x")).contains("inside the block of transaction 41"));
    assert!(err(&mut s, &mut out, start(42, true)).contains("inside the block"));
    assert!(err(&mut s, &mut out, commit(41, 1)).contains("inside the block"));
    assert!(err(&mut s, &mut out, abort(41, 41)).contains("inside the block"));
    assert!(err(&mut s, &mut out, vec![b'X', 0, 0, 0, 1, b'B']).contains("invalid message"));
    assert!(out.is_empty(), "nothing reached the output");
    let _ = std::fs::remove_dir_all(&d);
}

/// With `pass_through`, the stream messages but the commit also reach the output, in order and
/// where they came; the commit still comes as Begin ... Commit from the spool.
#[test]
fn pass_through_forwards_blocks_and_aborts_in_order() {
    let d = dir("pass");
    let mut s = Streams::new(&d, "p", 1 << 20);
    s.pass_through = true;
    let mut out = SpillBuffer::new(&d, "o", 1 << 20);
    let before = begin_of(5, 10);
    let msgs = vec![
        start(7, true),
        wrap(7, &insert(1, "a")),
        wrap(8, &insert(1, "sub")),
        stop(),
        before.clone(),
        abort(7, 8),
        commit(7, 100),
    ];
    route_all(&mut s, &mut out, &msgs);
    let mut want = msgs[..6].to_vec();
    want.push(begin_of(7, 100));
    want.push(insert(1, "a"));
    want.push(commit_of(7, 100));
    assert_eq!(drain_all(&mut out), want);
    // Off (the default): only the whole transaction.
    let mut s = Streams::new(&d, "q", 1 << 20);
    route_all(&mut s, &mut out, &msgs);
    assert_eq!(
        drain_all(&mut out),
        vec![before, begin_of(7, 100), insert(1, "a"), commit_of(7, 100)]
    );
    let _ = std::fs::remove_dir_all(&d);
}

// ------------------------------------------------------- damaged streams (issue 42)

mod damaged {
    use super::*;
    use proptest::prelude::*;

    /// A valid stream: committed transactions and two streamed ones (one of which aborts a
    /// subtransaction), in several blocks.
    fn valid(values: &[String]) -> Vec<Vec<u8>> {
        let v = |i: usize| values[i % values.len()].as_str();
        vec![
            begin_of(1, 10),
            insert(5, v(0)),
            commit_of(1, 10),
            start(20, true),
            wrap(20, &insert(5, v(1))),
            wrap(21, &insert(5, v(2))),
            stop(),
            start(30, true),
            wrap(30, &insert(5, v(3))),
            stop(),
            abort(20, 21),
            start(20, false),
            wrap(20, &insert(5, v(4))),
            stop(),
            begin_of(2, 20),
            insert(5, v(5)),
            commit_of(2, 20),
            commit(30, 30),
            abort(20, 20),
        ]
    }

    #[derive(Clone, Debug)]
    enum Damage {
        /// Frame i cut to its first n bytes.
        Truncate(usize, usize),
        /// Frame i's first n bytes glued before frame i + 1 (what a half-written message and
        /// the next one would look like written as one).
        Glue(usize, usize),
        Duplicate(usize),
        Drop(usize),
        Swap(usize),
    }

    fn damage() -> impl Strategy<Value = Damage> {
        let i = 0usize..19;
        let n = 0usize..64;
        prop_oneof![
            (i.clone(), n.clone()).prop_map(|(i, n)| Damage::Truncate(i, n)),
            (i.clone(), n).prop_map(|(i, n)| Damage::Glue(i, n)),
            i.clone().prop_map(Damage::Duplicate),
            i.clone().prop_map(Damage::Drop),
            i.prop_map(Damage::Swap),
        ]
    }

    fn apply(mut frames: Vec<Vec<u8>>, d: &Damage) -> Vec<Vec<u8>> {
        let last = frames.len() - 1;
        match *d {
            Damage::Truncate(i, n) => {
                let len = frames[i].len();
                frames[i].truncate(n % len);
            }
            Damage::Glue(i, n) => {
                let i = i.min(last - 1);
                let mut glued = frames[i][..n % frames[i].len()].to_vec();
                glued.extend_from_slice(&frames[i + 1]);
                frames.splice(i..=i + 1, [glued]);
            }
            Damage::Duplicate(i) => {
                let f = frames[i].clone();
                frames.insert(i, f);
            }
            Damage::Drop(i) => {
                frames.remove(i);
            }
            Damage::Swap(i) => frames.swap(i.min(last - 1), i.min(last - 1) + 1),
        }
        frames
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Whatever the damage, routing never panics, and every message that comes out is a
        /// frame that went in (or a spooled change's body, or a Begin/Commit made for a
        /// streamed commit), byte for byte: a damaged frame is refused or passed on as it is,
        /// for the applier's strict decoding to refuse, never turned into another message.
        /// A truncated stream frame is refused on the spot.
        #[test]
        fn damaged_streams_are_refused_never_misread(
            values in prop::collection::vec("[a-z]{0,6}", 6),
            d in damage(),
        ) {
            let original = valid(&values);
            let frames = apply(original.clone(), &d);
            let dirp = dir(&format!("damaged_{:?}", std::thread::current().id()));
            let mut s = Streams::new(&dirp, "d", 48);
            let mut out = SpillBuffer::new(&dirp, "o", 1 << 20);
            let mut refused = None;
            for (i, f) in frames.iter().enumerate() {
                if let Err(e) = s.route(f, &mut out) {
                    refused = Some((i, e.to_string()));
                    break;
                }
            }
            let mut known: Vec<Vec<u8>> = frames.clone();
            for f in &frames {
                if let Ok(Message::StreamChange { body, .. }) = wire::decode(f) {
                    known.push(body.to_vec());
                }
            }
            for m in drain_all(&mut out) {
                let made = matches!(wire::decode(&m), Ok(Message::Begin { .. } | Message::Commit { .. }));
                prop_assert!(made || known.contains(&m), "a message that did not go in came out: {:?}", m);
            }
            if let Damage::Truncate(i, n) = d {
                let f = &original[i];
                let stream_frame = matches!(f[0], b'S' | b'E' | b'X' | b'A' | b'F');
                if stream_frame && n % f.len() > 0 {
                    prop_assert!(
                        refused.as_ref().is_some_and(|(at, _)| *at == i),
                        "a truncated stream frame {} was not refused: {:?}", i, refused
                    );
                }
            }
            // The undamaged stream routes cleanly.
            let mut s = Streams::new(&dirp, "ok", 48);
            for f in &original {
                prop_assert!(s.route(f, &mut out).is_ok());
            }
            drop(s);
            drop(out);
            let _ = std::fs::remove_dir_all(&dirp);
        }
    }
}
