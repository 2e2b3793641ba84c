//! Tests of the parent module.
use super::*;
use proptest::prelude::*;

fn roundtrip(msg: &Message<'_>) -> Vec<u8> {
    let mut buf = Vec::new();
    encode(msg, &mut buf);
    assert_eq!(decode(&buf).as_ref(), Ok(msg));
    buf
}

fn tuple<'a>(values: &[Value<'a>]) -> Tuple<'a> {
    Tuple {
        values: values.to_vec(),
    }
}

#[test]
fn begin_layout() {
    let buf = roundtrip(&Message::Begin {
        xid: 0x0102_0304,
        final_lsn: Lsn(0x0A0B),
        commit_time: -2,
    });
    let mut want = vec![b'B', 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0x0A, 0x0B];
    want.extend_from_slice(&(-2i64).to_be_bytes());
    assert_eq!(buf, want);
}

#[test]
fn commit_layout() {
    let buf = roundtrip(&Message::Commit {
        xid: 7,
        commit_lsn: Lsn(1),
        end_lsn: Lsn(u64::MAX),
        commit_time: 760_000_000_000_000,
    });
    assert_eq!(buf.len(), 1 + 4 + 8 + 8 + 8);
    assert_eq!(buf[0], b'C');
    assert_eq!(&buf[13..21], &[0xFF; 8]);
}

#[test]
fn relation_layout() {
    let buf = roundtrip(&Message::Relation {
        relid: 16384,
        namespace: "public",
        name: "tâble",
        columns: vec![
            Column {
                name: "id",
                type_oid: 23,
                typmod: -1,
                flags: COLUMN_KEY,
            },
            Column {
                name: "n",
                type_oid: 1700,
                typmod: 655366,
                flags: 0,
            },
        ],
    });
    let mut want = vec![b'R', 0, 0, 0x40, 0, 0, 0, 0, 6];
    want.extend_from_slice(b"public");
    want.extend_from_slice(&[0, 0, 0, 6]);
    want.extend_from_slice("tâble".as_bytes());
    want.extend_from_slice(&[
        0, 2, 0, 0, 0, 2, b'i', b'd', 0, 0, 0, 23, 0xFF, 0xFF, 0xFF, 0xFF, 1,
    ]);
    want.extend_from_slice(&[0, 0, 0, 1, b'n', 0, 0, 0x06, 0xA4, 0, 0x0A, 0, 0x06, 0]);
    assert_eq!(buf, want);
}

#[test]
fn insert_layout() {
    let buf = roundtrip(&Message::Insert {
        relid: 1,
        new: tuple(&[
            Value::Text("42"),
            Value::Null,
            Value::Unchanged,
            Value::Text(""),
        ]),
    });
    assert_eq!(
        buf,
        [b'I', 0, 0, 0, 1, 0, 4, b't', 0, 0, 0, 2, b'4', b'2', b'n', b'u', b't', 0, 0, 0, 0]
    );
}

#[test]
fn update_with_and_without_old_key() {
    let new = tuple(&[Value::Text("1"), Value::Unchanged]);
    let buf = roundtrip(&Message::Update {
        relid: 9,
        old_key: None,
        new: new.clone(),
    });
    assert_eq!(&buf[..6], &[b'U', 0, 0, 0, 9, 0]);
    let old = tuple(&[Value::Text("0"), Value::Null]);
    let buf = roundtrip(&Message::Update {
        relid: 9,
        old_key: Some(old),
        new,
    });
    assert_eq!(&buf[..6], &[b'U', 0, 0, 0, 9, 1]);
}

#[test]
fn delete_and_empty_tuple() {
    roundtrip(&Message::Delete {
        relid: 3,
        old_key: tuple(&[Value::Text("x"), Value::Null]),
    });
    let buf = roundtrip(&Message::Delete {
        relid: 3,
        old_key: Tuple::default(),
    });
    assert_eq!(buf, [b'D', 0, 0, 0, 3, 0, 0]);
}

#[test]
fn truncate_layout() {
    let buf = roundtrip(&Message::Truncate {
        flags: TRUNCATE_CASCADE | TRUNCATE_RESTART_IDENTITY,
        relids: vec![1, 0xFFFF_FFFF],
    });
    assert_eq!(
        buf,
        [b'T', 3, 0, 0, 0, 2, 0, 0, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF]
    );
    roundtrip(&Message::Truncate {
        flags: 0,
        relids: vec![],
    });
}

#[test]
fn truncate_partition_layout() {
    let buf = roundtrip(&Message::TruncatePartition {
        relid: 0x0102_0304,
        partition: "p",
        predicate: "a<1",
    });
    assert_eq!(
        buf,
        [b'P', 1, 2, 3, 4, 0, 0, 0, 1, b'p', 0, 0, 0, 3, b'a', b'<', b'1']
    );
    assert!(
        decode(&buf[..buf.len() - 1]).is_err(),
        "a short TruncatePartition is rejected"
    );
}

#[test]
fn rewrite_layout() {
    let buf = roundtrip(&Message::Rewrite { relid: 0x0102_0304 });
    assert_eq!(buf, [b'W', 1, 2, 3, 4]);
    assert!(
        decode(&[b'W', 1, 2, 3]).is_err(),
        "a short Rewrite is rejected"
    );
    assert!(
        decode(&[b'W', 1, 2, 3, 4, 5]).is_err(),
        "trailing bytes are rejected"
    );
}

/// The example in docs/wire-format.md, byte for byte.
#[test]
fn doc_example() {
    let mut buf = Vec::new();
    put_relation_header(&mut buf, 16384, "public", "t", 2);
    put_column(&mut buf, "id", 23, -1, COLUMN_KEY);
    put_column(&mut buf, "note", 25, -1, 0);
    let hex = "52 00004000 00000006 7075626c6963 00000001 74 0002 \
               00000002 6964 00000017 FFFFFFFF 01 00000004 6e6f7465 00000019 FFFFFFFF 00";
    assert_eq!(buf, unhex(hex));
    buf.clear();
    put_insert_header(&mut buf, 16384);
    put_tuple_header(&mut buf, 2);
    put_text(&mut buf, b"1");
    put_null(&mut buf);
    assert_eq!(buf, unhex("49 00004000 0002 74 00000001 31 6E"));
}

fn unhex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

#[test]
fn errors_say_what_and_where() {
    assert_eq!(
        decode(&[]),
        Err(DecodeError::Truncated {
            expected: "message tag",
            offset: 0,
            needed: 1,
            available: 0
        })
    );
    assert_eq!(decode(b"Q"), Err(DecodeError::UnknownTag { tag: b'Q' }));
    assert_eq!(
        decode(&[b'I', 0, 0, 0, 1, 0, 1, b'z']),
        Err(DecodeError::UnknownValueKind {
            kind: b'z',
            offset: 7
        })
    );
    assert_eq!(
        decode(&[b'U', 0, 0, 0, 1, 2]),
        Err(DecodeError::InvalidOldKeyFlag {
            value: 2,
            offset: 5
        })
    );
    assert_eq!(
        decode(&[b'I', 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 2, 0xC3, 0x28]),
        Err(DecodeError::InvalidUtf8 {
            expected: "text value",
            offset: 12
        })
    );
    assert_eq!(
        decode(&[b'D', 0, 0, 0, 1, 0, 0, 0]),
        Err(DecodeError::TrailingBytes {
            offset: 7,
            count: 1
        })
    );
    let e = decode(&[b'B', 0, 0]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "expected xid (4 bytes) at offset 1, only 2 bytes left"
    );
}

#[test]
fn huge_lengths_and_counts_fail_before_allocating() {
    // A text value claiming 4 GB.
    let e = decode(&[b'I', 0, 0, 0, 1, 0, 1, b't', 0xFF, 0xFF, 0xFF, 0xFF]).unwrap_err();
    assert!(
        matches!(
            e,
            DecodeError::Truncated {
                needed: 0xFFFF_FFFF,
                available: 0,
                ..
            }
        ),
        "{e}"
    );
    // 4 billion relids in 0 bytes.
    let e = decode(&[b'T', 0, 0xFF, 0xFF, 0xFF, 0xFF]).unwrap_err();
    assert!(
        matches!(
            e,
            DecodeError::Truncated {
                expected: "truncated relids",
                ..
            }
        ),
        "{e}"
    );
    // 65535 columns in 0 bytes.
    let e = decode(&[b'R', 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF]).unwrap_err();
    assert!(
        matches!(
            e,
            DecodeError::Truncated {
                expected: "columns",
                needed: 851_955,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn stream_layouts() {
    let buf = roundtrip(&Message::StreamStart {
        xid: 0x0102_0304,
        first: true,
    });
    assert_eq!(buf, vec![b'S', 1, 2, 3, 4, 1]);
    assert_eq!(roundtrip(&Message::StreamStop), vec![b'E']);
    let buf = roundtrip(&Message::StreamAbort { xid: 9, subxid: 10 });
    assert_eq!(buf, vec![b'A', 0, 0, 0, 9, 0, 0, 0, 10]);
    let buf = roundtrip(&Message::StreamCommit {
        xid: 7,
        commit_lsn: Lsn(1),
        end_lsn: Lsn(2),
        commit_time: -1,
    });
    assert_eq!(buf.len(), 1 + 4 + 8 + 8 + 8);
    assert_eq!(buf[0], b'F');

    // A stream change is its header and one whole message, written piecewise.
    let mut piecewise = Vec::new();
    put_stream_change_header(&mut piecewise, 0x0A0B_0C0D);
    put_insert_header(&mut piecewise, 16384);
    put_tuple_header(&mut piecewise, 1);
    put_text(&mut piecewise, b"1");
    let body = &piecewise[5..];
    let buf = roundtrip(&Message::StreamChange {
        xid: 0x0A0B_0C0D,
        body,
    });
    assert_eq!(buf, piecewise);
    assert_eq!(&buf[..5], &[b'X', 0x0A, 0x0B, 0x0C, 0x0D]);
    assert_eq!(
        decode(body),
        Ok(Message::Insert {
            relid: 16384,
            new: tuple(&[Value::Text("1")])
        })
    );
}

#[test]
fn stream_errors_say_what_and_where() {
    // Only messages of a transaction's body can be streamed.
    let mut buf = Vec::new();
    put_stream_change_header(&mut buf, 1);
    put_begin(&mut buf, 1, Lsn(1), 0);
    assert_eq!(decode(&buf), Err(DecodeError::NotStreamable { tag: b'B' }));
    // An empty body, a broken one, a body with trailing bytes.
    let mut buf = Vec::new();
    put_stream_change_header(&mut buf, 1);
    let e = decode(&buf).unwrap_err();
    assert!(matches!(e, DecodeError::Truncated { offset: 5, .. }), "{e}");
    put_insert_header(&mut buf, 1);
    let e = decode(&buf).unwrap_err();
    assert!(
        matches!(
            e,
            DecodeError::Truncated {
                offset: 10,
                expected: "tuple column count",
                ..
            }
        ),
        "{e}"
    );
    put_tuple_header(&mut buf, 0);
    assert!(decode(&buf).is_ok());
    buf.push(0);
    assert_eq!(
        decode(&buf),
        Err(DecodeError::TrailingBytes {
            offset: 12,
            count: 1
        })
    );
    // The first-block flag is 0 or 1.
    let e = decode(&[b'S', 0, 0, 0, 1, 2]).unwrap_err();
    assert_eq!(
        e,
        DecodeError::InvalidFlag {
            value: 2,
            offset: 5
        }
    );
    assert_eq!(e.to_string(), "expected flag 0 or 1 at offset 5, found 2");
}

// --------------------------------------------------------- properties

/// Strings for generated messages; leaked so that messages can borrow
/// them for `'static` (test-only, a few KB per run).
fn leaked_str() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        any::<String>(),
        proptest::string::string_regex("[a-z_\"\\\\ \n\u{e9}\u{1F600}]{0,12}").unwrap(),
    ]
    .prop_map(|s| &*Box::leak(s.into_boxed_str()))
}

fn value() -> impl Strategy<Value = Value<'static>> {
    prop_oneof![
        Just(Value::Null),
        Just(Value::Unchanged),
        leaked_str().prop_map(Value::Text)
    ]
}

fn tuple_s() -> impl Strategy<Value = Tuple<'static>> {
    prop::collection::vec(value(), 0..8).prop_map(|values| Tuple { values })
}

fn column() -> impl Strategy<Value = Column<'static>> {
    (leaked_str(), any::<u32>(), any::<i32>(), any::<u8>()).prop_map(
        |(name, type_oid, typmod, flags)| Column {
            name,
            type_oid,
            typmod,
            flags,
        },
    )
}

fn message() -> impl Strategy<Value = Message<'static>> {
    prop_oneof![
        8 => plain_message(),
        1 => stream_message(),
    ]
}

/// Messages of in-progress transactions, a stream change wrapping any
/// message that may be streamed.
fn stream_message() -> impl Strategy<Value = Message<'static>> {
    prop_oneof![
        (any::<u32>(), any::<bool>()).prop_map(|(xid, first)| Message::StreamStart { xid, first }),
        Just(Message::StreamStop),
        (any::<u32>(), plain_message())
            .prop_filter("streamable", |(_, m)| !matches!(
                m,
                Message::Begin { .. }
                    | Message::Commit { .. }
                    | Message::Signal { .. }
                    | Message::Keepalive { .. }
            ))
            .prop_map(|(xid, m)| {
                let mut body = Vec::new();
                encode(&m, &mut body);
                Message::StreamChange {
                    xid,
                    body: &*Box::leak(body.into_boxed_slice()),
                }
            }),
        (any::<u32>(), any::<u32>()).prop_map(|(xid, subxid)| Message::StreamAbort { xid, subxid }),
        (any::<u32>(), any::<u64>(), any::<u64>(), any::<i64>()).prop_map(
            |(xid, c, e, commit_time)| Message::StreamCommit {
                xid,
                commit_lsn: Lsn(c),
                end_lsn: Lsn(e),
                commit_time,
            }
        ),
    ]
}

fn plain_message() -> impl Strategy<Value = Message<'static>> {
    prop_oneof![
        (any::<u32>(), any::<u64>(), any::<i64>()).prop_map(|(xid, l, commit_time)| {
            Message::Begin {
                xid,
                final_lsn: Lsn(l),
                commit_time,
            }
        }),
        (any::<u32>(), any::<u64>(), any::<u64>(), any::<i64>()).prop_map(
            |(xid, c, e, commit_time)| {
                Message::Commit {
                    xid,
                    commit_lsn: Lsn(c),
                    end_lsn: Lsn(e),
                    commit_time,
                }
            }
        ),
        (
            any::<u32>(),
            leaked_str(),
            leaked_str(),
            prop::collection::vec(column(), 0..6)
        )
            .prop_map(|(relid, namespace, name, columns)| Message::Relation {
                relid,
                namespace,
                name,
                columns
            }),
        (any::<u32>(), tuple_s()).prop_map(|(relid, new)| Message::Insert { relid, new }),
        (any::<u32>(), proptest::option::of(tuple_s()), tuple_s()).prop_map(
            |(relid, old_key, new)| Message::Update {
                relid,
                old_key,
                new
            }
        ),
        (any::<u32>(), tuple_s()).prop_map(|(relid, old_key)| Message::Delete { relid, old_key }),
        (any::<u8>(), prop::collection::vec(any::<u32>(), 0..6))
            .prop_map(|(flags, relids)| Message::Truncate { flags, relids }),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| Message::Signal {
            body: &*Box::leak(b.into_boxed_slice())
        }),
        any::<u64>().prop_map(|l| Message::Keepalive { end_lsn: Lsn(l) }),
        any::<u32>().prop_map(|relid| Message::Rewrite { relid }),
        (any::<u32>(), ".{0,12}", ".{0,40}").prop_map(|(relid, p, w)| {
            Message::TruncatePartition {
                relid,
                partition: Box::leak(p.into_boxed_str()),
                predicate: Box::leak(w.into_boxed_str()),
            }
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn encode_decode_is_identity(msg in message()) {
        let mut buf = Vec::new();
        encode(&msg, &mut buf);
        prop_assert_eq!(decode(&buf), Ok(msg));
    }

    #[test]
    fn strict_prefixes_are_errors(msg in message()) {
        let mut buf = Vec::new();
        encode(&msg, &mut buf);
        for len in 0..buf.len() {
            prop_assert!(decode(&buf[..len]).is_err(), "prefix of {} bytes decoded", len);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        tag in prop::sample::select(b"BCRIUDTSEXAFx".to_vec()),
        mut data in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        fuzz_decode(&data);
        data.insert(0, tag);
        fuzz_decode(&data);
    }

    /// Mutations of valid messages reach deep paths random bytes do not.
    #[test]
    fn mutated_messages_never_panic(msg in message(), pos: prop::sample::Index, byte: u8) {
        let mut buf = Vec::new();
        encode(&msg, &mut buf);
        if !buf.is_empty() {
            let i = pos.index(buf.len());
            buf[i] = byte;
        }
        fuzz_decode(&buf);
    }
}
