//! Tests of the parent module: every message round-trips, and every cut or extended message is
//! refused.
use super::*;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

fn due() -> impl Strategy<Value = Due> {
    (
        due_without_bound(),
        option::of(vec(".*", 0..3)),
        option::of(any::<i64>()),
    )
        .prop_map(|(d, to_key, chunk_cap)| Due {
            to_key,
            chunk_cap,
            ..d
        })
}

fn due_without_bound() -> impl Strategy<Value = Due> {
    (
        any::<i64>(),
        any::<u32>(),
        any::<i64>(),
        option::of(any::<i64>()),
        option::of(".*"),
        ".*",
        vec(".*", 0..3),
        option::of(vec(".*", 0..3)),
        any::<i64>(),
        option::of(".*"),
        option::of(".*"),
        any::<bool>(),
    )
        .prop_map(
            |(
                id,
                relid,
                chunk_size,
                rows_per_second,
                condition,
                owner,
                key_columns,
                last_key,
                chunk_no,
                repair_deletes,
                sweep,
                resync,
            )| Due {
                id,
                relid,
                chunk_size,
                rows_per_second,
                condition,
                owner,
                key_columns,
                last_key,
                chunk_no,
                repair_deletes,
                sweep,
                resync,
                to_key: None,
                chunk_cap: None,
            },
        )
}

fn form() -> impl Strategy<Value = RowForm> {
    (0u8..5).prop_map(|t| RowForm::from_tag(t).unwrap())
}

fn key_values() -> impl Strategy<Value = KeyValues> {
    vec((".*", option::of(".*")), 0..3)
}

fn row() -> impl Strategy<Value = Row> {
    prop_oneof![
        Just(Row::None),
        ".*".prop_map(Row::Json),
        vec(any::<u8>(), 0..40).prop_map(Row::Jsonb),
        vec(option::of(".*"), 0..4).prop_map(Row::Text),
        key_values().prop_map(Row::Key),
        any::<u32>().prop_map(Row::Value),
        ".*".prop_map(Row::Copy),
    ]
}

/// A snapshot in `pg_current_snapshot()`'s text form, and its parsed form.
fn snapshot() -> impl Strategy<Value = String> {
    (1u64..1000, 0u64..50, vec(0u64..50, 0..4)).prop_map(|(xmin, span, mut xip)| {
        let xmax = xmin + span;
        xip.retain(|x| *x < span);
        xip.sort();
        xip.dedup();
        let xip: Vec<String> = xip.iter().map(|x| (xmin + x).to_string()).collect();
        format!("{xmin}:{xmax}:{}", xip.join(","))
    })
}

/// Row values owned by the test (what the worker's PostgreSQL memory would hold).
#[derive(Debug, Clone, PartialEq)]
struct Owned(u32, Vec<Vec<u8>>);

impl RowBytes for Owned {
    fn row_type(&self) -> u32 {
        self.0
    }
    fn each_row(&self, f: &mut dyn FnMut(&[u8])) {
        for r in &self.1 {
            f(r)
        }
    }
    fn len(&self) -> usize {
        self.1.len()
    }
}

fn chunk() -> impl Strategy<Value = Chunk<Owned>> {
    (
        (
            form(),
            snapshot(),
            option::of(any::<i64>()),
            option::of(any::<f64>().prop_filter("not NaN", |f| !f.is_nan())),
        ),
        vec((".*", key_values()), 0..3),
        ".*",
        vec((".*", ".*"), 0..4),
        vec((".*", vec(".*", 0..3), row()), 0..5),
        option::of((
            any::<u32>(),
            vec(vec(any::<u8>(), 0..20), 0..4),
            vec(any::<i32>(), 0..4),
        )),
        vec(any::<i32>(), 0..4),
        any::<bool>(),
        any::<i64>(),
    )
        .prop_map(
            |(
                (form, snapshot, table_rows, key_fraction),
                deletes,
                relation,
                columns,
                rows,
                values,
                attnums,
                is_last,
                read_at,
            )| Chunk {
                form,
                invisible: InvisibleXids::parse(&snapshot).unwrap(),
                snapshot,
                estimate: Estimate {
                    table_rows,
                    key_fraction,
                },
                deletes,
                relation,
                columns,
                rows: rows
                    .into_iter()
                    .map(|(key, key_values, row)| ChunkRow {
                        key,
                        key_values,
                        row,
                    })
                    .collect(),
                values: values.map(|(t, rows, attnums)| (Owned(t, rows), attnums)),
                attnums,
                is_last,
                read_at,
            },
        )
}

fn failure() -> impl Strategy<Value = Failure> {
    (
        any::<i32>(),
        ".*",
        option::of(".*"),
        option::of(".*"),
        any::<bool>(),
    )
        .prop_map(|(code, message, detail, hint, retry)| Failure {
            code,
            message,
            detail,
            hint,
            retry,
        })
}

/// The decoded response, with its row values copied out, for comparison with what was sent.
fn owned(r: Response<RawValues<'_>>) -> Response<Owned> {
    r.map(|(w, job, c)| {
        let c = c
            .map_values(|v| {
                Ok::<_, ()>(Owned(
                    v.row_type,
                    v.rows.iter().map(|r| r.to_vec()).collect(),
                ))
            })
            .unwrap();
        (w, job, c)
    })
}

fn same(a: &Response<Owned>, b: &Response<Owned>) -> bool {
    match (a, b) {
        (Err(x), Err(y)) => x == y,
        (Ok((w1, j1, c1)), Ok((w2, j2, c2))) => {
            w1 == w2
                && j1 == j2
                && c1.form == c2.form
                && c1.invisible == c2.invisible
                && c1.snapshot == c2.snapshot
                && c1.estimate == c2.estimate
                && c1.deletes == c2.deletes
                && c1.relation == c2.relation
                && c1.columns == c2.columns
                && c1.rows == c2.rows
                && c1.values == c2.values
                && c1.attnums == c2.attnums
                && c1.is_last == c2.is_last
                && c1.read_at == c2.read_at
        }
        _ => false,
    }
}

/// Every proper prefix of `msg`, and `msg` with a byte more, fail to decode.
fn refuses_cuts(msg: &[u8], decode: impl Fn(&[u8]) -> bool) {
    for cut in 0..msg.len() {
        assert!(
            !decode(&msg[..cut]),
            "a message cut at {cut} of {} decoded",
            msg.len()
        );
    }
    let mut longer = msg.to_vec();
    longer.push(0);
    assert!(!decode(&longer), "a message with a byte more decoded");
}

proptest! {
    #[test]
    fn requests_round_trip(pipeline in ".*", job in due(), form in form(), writer in any::<u32>()) {
        let r = Request { pipeline, job, form, writer };
        let msg = encode_request(&r);
        prop_assert_eq!(decode_request(&msg), Ok(r));
        refuses_cuts(&msg, |b| decode_request(b).is_ok());
    }

    #[test]
    fn chunks_round_trip(watermark in any::<u64>(), job in due(), c in chunk()) {
        let sent: Response<Owned> = Ok((watermark, job, c));
        let msg = encode_response(&sent);
        let got = owned(decode_response(&msg).expect("decodes"));
        prop_assert!(same(&sent, &got), "sent {:?}\ngot {:?}", sent, got);
        refuses_cuts(&msg, |b| decode_response(b).is_ok());
    }

    #[test]
    fn failures_round_trip(f in failure()) {
        let sent: Response<Owned> = Err(f);
        let msg = encode_response(&sent);
        let got = owned(decode_response(&msg).expect("decodes"));
        prop_assert!(same(&sent, &got));
        refuses_cuts(&msg, |b| decode_response(b).is_ok());
    }

    /// Arbitrary bytes never panic the decoder (the reader's queue is shared memory).
    #[test]
    fn garbage_is_an_error_not_a_panic(bytes in vec(any::<u8>(), 0..200)) {
        let _ = decode_request(&bytes);
        let _ = decode_response(&bytes);
    }
}

/// A backfill of 5000-row chunks with nothing else set.
fn job() -> Due {
    Due {
        id: 1,
        relid: 2,
        chunk_size: 5000,
        rows_per_second: None,
        condition: None,
        owner: "o".into(),
        key_columns: vec!["id".into()],
        last_key: None,
        chunk_no: 1,
        repair_deletes: None,
        sweep: None,
        resync: false,
        to_key: None,
        chunk_cap: None,
    }
}

#[test]
fn unknown_tags_are_refused() {
    let job = Due {
        chunk_size: 3,
        to_key: Some(vec!["9".into(), "z".into()]),
        chunk_cap: Some(2),
        ..job()
    };
    let mut msg = encode_request(&Request {
        pipeline: "p".into(),
        job,
        form: RowForm::Text,
        writer: 9,
    });
    let at = msg.len() - 5;
    assert_eq!(msg[at], RowForm::Text.tag());
    msg[at] = 9;
    assert_eq!(decode_request(&msg), Err(Malformed));
    // A response that is neither an error (0) nor a chunk (1).
    assert!(decode_response(&[2]).is_err());
    // A boolean that is neither 0 nor 1.
    let f: Response<Owned> = Err(Failure {
        code: 1,
        message: "m".into(),
        detail: None,
        hint: None,
        retry: true,
    });
    let mut msg = encode_response(&f);
    *msg.last_mut().unwrap() = 2;
    assert!(decode_response(&msg).is_err());
}

#[test]
fn a_cap_bounds_the_rows_per_chunk_only_below_the_chunk_size() {
    let mut job = job();
    assert_eq!(job.rows_per_chunk(), 5000);
    job.chunk_cap = Some(2000);
    assert_eq!(job.rows_per_chunk(), 2000);
    job.chunk_cap = Some(9000);
    assert_eq!(job.rows_per_chunk(), 5000);
    job.chunk_cap = Some(0);
    assert_eq!(job.rows_per_chunk(), 5000, "0: no cap");
    job.chunk_size = 0;
    job.chunk_cap = None;
    assert_eq!(job.rows_per_chunk(), 1);
}
