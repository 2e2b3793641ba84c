//! A second writer of a pipeline fences it (issue 47): a producer that initialises the
//! pipeline's transactional id (`pg_tide-<system identifier>-<database OID>-<pipeline>`, what a
//! copy of the server started with pg_tide would do) makes the pipeline's next commit fail; the
//! pipeline pauses with 55006, a message that says it was fenced and the remedy; nothing it
//! produced after the fence is visible to a `read_committed` consumer. `tide.resume_pipeline`
//! fences the other producer in turn (its own transaction then fails), and every change arrives
//! exactly once.
//!
//! Then a transaction in doubt on the position topic (a record of it written, neither committed
//! nor aborted; here another producer's, held open by the test) holds the position read of a
//! restarted worker: it does not read around it (an older position, and a batch sent twice if
//! the transaction then commits, issue 47) but reports it and waits, and streams once it is
//! decided.

use crate::broker::*;
use pg_test::*;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use std::collections::HashMap;
use std::time::Duration;
use std::time::Instant;

#[test]
fn kafka_second_writer_fences_the_pipeline() {
    let b = Broker::start("fenced");
    let c = start_cluster(Cluster::builder("kafka_fenced"));
    init_extension(&c);
    c.execute(
        "CREATE ROLE alice LOGIN; GRANT tide_admin TO alice;
         CREATE TABLE f (k int PRIMARY KEY, v int NOT NULL);
         GRANT SELECT ON f TO alice;",
    );
    create_kafka_server(&c, "events", &b, "alice");
    let mut alice = connect_as(&c, "alice");
    alice
        .batch_execute(
            r#"SELECT tide.create_pipeline('fp', 'kafka', '{"server": "events"}');
               SELECT tide.add_table('fp', 'f', backfill => false);"#,
        )
        .unwrap_or_else(|e| panic!("create_pipeline: {}\n{}", describe_error(&e), diag(&c)));
    wait_streaming(&c, "fp", Duration::from_secs(30));
    c.execute("INSERT INTO f SELECT g, 1 FROM generate_series(1, 50) g");
    wait_pipeline(&c, "fp", 60);

    // The other writer: the same transactional id, initialised.
    let id: String = c.query_scalar(
        "SELECT 'pg_tide-' || system_identifier || '-' || (SELECT oid FROM pg_database WHERE datname = current_database()) || '-fp' FROM pg_control_system()",
    );
    let other: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", b.addr())
        .set("transactional.id", &id)
        .create()
        .expect("the other producer");
    other
        .init_transactions(Duration::from_secs(30))
        .expect("init_transactions of the other writer");

    // The pipeline's next batch: fenced, paused with the reason and the remedy.
    c.execute("UPDATE f SET v = 2 WHERE k <= 10");
    let mut seen = (String::new(), String::new(), String::new());
    c.wait_until(
        "the pipeline paused with 55006",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || {
            let r = c.try_query_one(
                "SELECT state, coalesce(last_error_sqlstate, ''), coalesce(last_error, ''), coalesce(remedy, '')
                   FROM tide.pipelines WHERE name = 'fp'",
            )?;
            let (st, code, err, remedy): (String, String, String, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            seen = (st.clone(), err, remedy);
            Ok(st == "paused" && code == "55006")
        },
    );
    eprintln!("kafka fenced: {} / {}", seen.1, seen.2);
    assert!(
        seen.1.contains("fenced") && seen.1.contains("transactional id"),
        "last_error: {}",
        seen.1
    );
    assert!(
        seen.2.contains("tide.resume_pipeline"),
        "remedy: {}",
        seen.2
    );
    let updates = |recs: &[Rec]| recs.iter().filter(|r| r.op() == Some("u")).count();
    let topic = "fp.public.f";
    assert_eq!(
        updates(&consume(&b.addr(), &[topic])),
        0,
        "a fenced pipeline's batch is not visible to read_committed"
    );

    // Resume: the pipeline fences the other writer and delivers the update once.
    c.execute("SELECT tide.resume_pipeline('fp')");
    wait_streaming(&c, "fp", Duration::from_secs(60));
    c.execute("UPDATE f SET v = 3 WHERE k <= 5");
    wait_pipeline(&c, "fp", 120);
    let recs = consume(&b.addr(), &[topic]);
    let mut per_key: HashMap<String, Vec<i64>> = HashMap::new();
    for r in &recs {
        if let (Some(k), Some(v)) = (&r.key, &r.value) {
            if let Some(n) = v["after"]["v"].as_i64() {
                per_key.entry(k.clone()).or_default().push(n);
            }
        }
    }
    for k in 1..=50 {
        let want: Vec<i64> = match k {
            1..=5 => vec![1, 2, 3],
            6..=10 => vec![1, 2],
            _ => vec![1],
        };
        let key = format!("{{\"k\":{k}}}");
        assert_eq!(
            per_key.get(&key),
            Some(&want),
            "key {key}: the versions read (every change once, in order)"
        );
    }
    // The other producer is fenced now: a transaction of its own does not commit.
    let theirs = other.begin_transaction().and_then(|_| {
        other
            .send(
                BaseRecord::<str, str>::to(topic)
                    .key("{\"k\":1}")
                    .payload("{}"),
            )
            .map_err(|(e, _)| e)?;
        other.commit_transaction(Duration::from_secs(30))
    });
    eprintln!("kafka fenced: the other writer after the resume: {theirs:?}");
    assert!(
        theirs.is_err(),
        "the other writer still commits after the resume"
    );
    assert_eq!(
        consume(&b.addr(), &[topic]).len(),
        recs.len(),
        "nothing of the fenced writer is visible"
    );

    in_doubt_position_holds_the_read(&c, &b, &recs);
}

/// A transaction of another producer left open on the position topic (a position record of the
/// pipeline's current position in it, flushed, not committed): the worker restarted by a kill -9
/// reports it and streams nothing while it is open; once it commits, the change made meanwhile
/// arrives once.
fn in_doubt_position_holds_the_read(c: &Cluster, b: &Broker, before: &[Rec]) {
    let topic = "fp.public.f";
    let applied: String =
        c.query_scalar("SELECT applied_lsn::text FROM tide.pipelines WHERE name = 'fp'");
    let doubt: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", b.addr())
        .set("transactional.id", "pg_test-in-doubt")
        .create()
        .expect("the in-doubt producer");
    doubt
        .init_transactions(Duration::from_secs(30))
        .expect("init_transactions");
    doubt.begin_transaction().expect("begin_transaction");
    let value = format!("{{\"pipeline\":\"fp\",\"applied_lsn\":\"{applied}\"}}");
    doubt
        .send(
            BaseRecord::<str, str>::to("fp.pg_tide.position")
                .partition(0)
                .key("fp")
                .payload(&value),
        )
        .map_err(|(e, _)| e)
        .expect("the in-doubt position record");
    doubt
        .flush(Duration::from_secs(30))
        .expect("the in-doubt record written");
    let pid = worker_pid(c, "fp").expect("the worker runs");
    kill9_and_wait_restart(c, pid, Duration::from_secs(60));
    c.execute("UPDATE f SET v = 4 WHERE k = 1");
    let mut last = String::new();
    c.wait_until(
        "the restarted worker reports the transaction in doubt",
        Duration::from_secs(120),
        Duration::from_millis(200),
        || {
            last = c.try_query_scalar::<String>(
                "SELECT coalesce(last_error, '') || ' | remedy: ' || coalesce(remedy, '') FROM tide.pipelines WHERE name = 'fp'",
            )?;
            Ok(last.contains("neither committed nor aborted"))
        },
    );
    eprintln!("kafka in doubt: {last}");
    // Its own remedy, not the one of an unreachable broker.
    assert!(
        last.contains("find-hanging") && !last.contains("unreachable"),
        "the remedy of a transaction in doubt: {last}"
    );
    let started = Instant::now();
    let fours = |recs: &[Rec]| {
        recs.iter()
            .filter(|r| {
                r.value
                    .as_ref()
                    .is_some_and(|v| v["after"]["v"].as_i64() == Some(4))
            })
            .count()
    };
    assert_eq!(
        fours(&consume_as(&b.addr(), &[topic], "read_uncommitted")),
        0,
        "nothing is sent while the position is in doubt"
    );
    doubt
        .commit_transaction(Duration::from_secs(30))
        .expect("commit the in-doubt transaction");
    wait_pipeline(c, "fp", 180);
    let recs = consume(&b.addr(), &[topic]);
    eprintln!(
        "kafka in doubt: streams again {:.1?} after the decision",
        started.elapsed()
    );
    assert_eq!(fours(&recs), 1, "the change made meanwhile arrives once");
    assert_eq!(recs.len(), before.len() + 1, "nothing else is sent again");
}
