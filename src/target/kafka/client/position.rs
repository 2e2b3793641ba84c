//! Reading the pipeline's position back from the position topic: after `init_transactions`,
//! and only once the topic's last stable offset reached the end of its log.

use super::*;

impl State {
    pub(super) fn read_position(&mut self) -> Result<Option<Lsn>, KafkaFailure> {
        let topic = self.settings.position_topic.clone();
        self.ensure_topic(&topic, true)?;
        // Transactional: whatever an earlier producer of this transactional id left open is
        // committed or aborted (and that producer fenced) before the position is read.
        self.ready(false)?;
        let mut props = self.settings.properties.clone();
        props.retain(|(k, _)| !PRODUCER_ONLY.contains(&k.as_str()));
        props.push((
            "group.id".into(),
            format!("pg_tide-{}-position", self.settings.pipeline),
        ));
        props.push(("enable.auto.commit".into(), "false".into()));
        props.push(("enable.auto.offset.store".into(), "false".into()));
        props.push(("enable.partition.eof".into(), "true".into()));
        let mut uncommitted = props.clone();
        uncommitted.push(("isolation.level".into(), "read_uncommitted".into()));
        props.push(("isolation.level".into(), "read_committed".into()));
        let consumer: BaseConsumer = config(&props)
            .create()
            .map_err(|e| KafkaFailure::from_kafka("cannot create the Kafka consumer", &e))?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        // The end of the log (read_uncommitted: every record written, in a transaction decided
        // or not) once the producer is initialised: no transaction of this pipeline is open then,
        // so the read_committed end (the last stable offset) must reach it before the position is
        // read. Below it lies a transaction not decided on this partition (seen after a broker
        // restart: the batch acknowledged as committed last had its position record there, and
        // a read_committed read stopped before it): reading around it returns an older position,
        // the batch is sent again, and it is there twice if that transaction then commits, or
        // missing if it aborts while the catalog skips it (issue 47). The read waits for it to be
        // decided, and fails (the worker retries) while it is not.
        let probe: BaseConsumer = config(&uncommitted)
            .create()
            .map_err(|e| KafkaFailure::from_kafka("cannot create the Kafka consumer", &e))?;
        let (_, written) = watermarks(&probe, &topic, deadline)?;
        drop(probe);
        let (low, high) = loop {
            let (low, stable) = watermarks(&consumer, &topic, deadline)?;
            if stable >= written {
                break (low, stable);
            }
            if Instant::now() >= deadline {
                return Err(KafkaFailure {
                    hint: Some(UNDECIDED_HINT),
                    ..KafkaFailure::transient(format!(
                        "topic {topic} holds a transaction that is neither committed nor aborted (its last stable offset {stable} stays below its end {written}): the pipeline's position is not read until it is decided"
                    ))
                });
            }
            thread::sleep(Duration::from_millis(100));
        };
        let mut end = high;
        while end > low {
            let start = (end - POSITION_WINDOW).max(low);
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topic, 0, Offset::Offset(start))
                .map_err(|e| KafkaFailure::from_kafka("cannot assign the position topic", &e))?;
            consumer
                .assign(&tpl)
                .map_err(|e| KafkaFailure::from_kafka("cannot assign the position topic", &e))?;
            let mut found = None;
            let deadline = Instant::now() + REQUEST_TIMEOUT;
            loop {
                if Instant::now() >= deadline {
                    return Err(KafkaFailure::transient(format!(
                        "cannot read topic {topic} within {} s",
                        REQUEST_TIMEOUT.as_secs()
                    )));
                }
                match consumer.poll(Duration::from_millis(100)) {
                    None => continue,
                    Some(Err(KafkaError::PartitionEOF(_))) => break,
                    Some(Err(e)) => {
                        return Err(KafkaFailure::from_kafka(
                            &format!("cannot read topic {topic}"),
                            &e,
                        ))
                    }
                    Some(Ok(m)) => {
                        if m.key() == Some(self.settings.pipeline.as_bytes()) {
                            if let Some(l) = m
                                .payload()
                                .and_then(tide_core::kafka::parse_position_record)
                            {
                                found = Some(l);
                            }
                        }
                        if m.offset() >= end - 1 {
                            break;
                        }
                    }
                }
            }
            if found.is_some() {
                return Ok(found);
            }
            end = start;
        }
        Ok(None)
    }
}

/// The low and high watermarks of partition 0 of `topic` as `consumer` sees them (its
/// `isolation.level`: read_committed ends at the last stable offset), retried until `deadline`.
fn watermarks(
    consumer: &BaseConsumer,
    topic: &str,
    deadline: Instant,
) -> Result<(i64, i64), KafkaFailure> {
    loop {
        match consumer.fetch_watermarks(topic, 0, REQUEST_TIMEOUT) {
            Ok(w) => return Ok(w),
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(200)),
            Err(e) => {
                return Err(KafkaFailure::from_kafka(
                    &format!("cannot read the offsets of topic {topic}"),
                    &e,
                ))
            }
        }
    }
}
