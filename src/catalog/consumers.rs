//! `tide.consumer` (named outbox consumers and their committed positions) and the outbox
//! retention (`tide.outbox_prune` and the batched DELETEs on `tide.outbox`). Written by the SQL
//! API (create, commit, seek, drop a consumer) and by the launcher (the retention).
//!
//! A committed position is an outbox `id`: every event of the pipeline with an id at or below it
//! has been processed. That is sound because a pipeline's ids increase in its stream order: one
//! worker per pipeline (`shmem::claim`), whose target transactions are serial, inserts them
//! (`catalog::outbox::insert`, one identity value per row in the order of the events), so a
//! transaction of the pipeline that commits later has higher ids, and a reader that sees an event
//! sees every earlier one of the same pipeline.
//!
//! The retention and the functions that may move a committed position *back* (a new consumer,
//! `tide.seek_consumer`) take the pipeline's retention lock ([`lock_retention`]), so a batch
//! never deletes an event below a position registered while it ran: the batch reads the
//! consumers in a statement that starts after it holds the lock.

use super::corrupt;
use crate::error::TideResult;
use crate::sql_as_tide;
use pgrx::spi::SpiClient;
use tide_core::model::PruneReason;

/// Take the pipeline's retention lock until the end of the transaction. Called by the SQL API
/// (as pg_tide) before it creates a consumer or seeks one.
pub(crate) fn lock_retention(pipeline: &str) -> TideResult<()> {
    crate::locks::lock(
        crate::locks::Lock::Retention(pipeline),
        crate::locks::Mode::Exclusive,
    )
}

/// A consumer's committed id; `None` when there is no such consumer. Called by the SQL API;
/// runs as pg_tide.
pub(crate) fn committed(pipeline: &str, consumer: &str) -> TideResult<Option<i64>> {
    sql_as_tide::one::<i64>(
        "SELECT committed_id FROM tide.consumer WHERE pipeline = $1 AND name = $2",
        &[pipeline.into(), consumer.into()],
    )
}

/// The oldest and newest id of the pipeline's events in `tide.outbox` (`None`s when it has
/// none). `fresh`: in a snapshot taken now (after a lock), not the statement's. Called by the SQL
/// API; runs as pg_tide.
pub(crate) fn bounds(pipeline: &str, fresh: bool) -> TideResult<(Option<i64>, Option<i64>)> {
    let rows = sql_as_tide::text_rows(
        "SELECT min(id), max(id) FROM tide.outbox WHERE pipeline = $1",
        &[Some(pipeline)],
        1,
        fresh,
    )?;
    let row = rows.into_iter().next().unwrap_or_default();
    let num = |i: usize| -> TideResult<Option<i64>> {
        match row.get(i).cloned().flatten() {
            None => Ok(None),
            Some(t) => t
                .parse::<i64>()
                .map(Some)
                .map_err(|_| corrupt("outbox id", pipeline)),
        }
    };
    Ok((num(0)?, num(1)?))
}

/// Whether the pipeline has an event after id `after`, in a snapshot taken now (the caller polls
/// while the worker commits). Called by the SQL API; runs as pg_tide.
pub(crate) fn has_events_after(pipeline: &str, after: i64) -> TideResult<bool> {
    let rows = sql_as_tide::text_rows(
        "SELECT 1 FROM tide.outbox WHERE pipeline = $1 AND id > $2::int8 LIMIT 1",
        &[Some(pipeline), Some(&after.to_string())],
        1,
        true,
    )?;
    Ok(!rows.is_empty())
}

/// Register a consumer at `committed_id` (with the `(commit_lsn, position)` of the event at that
/// id when it is there). `false` when the pipeline already has a consumer of that name. Called by
/// the SQL API; runs as pg_tide.
pub(crate) fn insert(
    pipeline: &str,
    consumer: &str,
    owner: &str,
    committed_id: i64,
) -> TideResult<bool> {
    Ok(sql_as_tide::write_one::<bool>(
        "INSERT INTO tide.consumer (pipeline, name, owner, committed_id, committed_lsn, committed_position)
         SELECT $1, $2, $3::name, $4, o.commit_lsn, o.position
           FROM (SELECT 1) one
           LEFT JOIN tide.outbox o ON o.pipeline = $1 AND o.id = $4
         ON CONFLICT (pipeline, name) DO NOTHING
         RETURNING true",
        &[pipeline.into(), consumer.into(), owner.into(), committed_id.into()],
    )?
    .unwrap_or(false))
}

/// Move a consumer's committed position to `id`, with the `(commit_lsn, position)` of the
/// pipeline's newest event at or below `id`, and `committed_at = now()`. `forward_only`: only if
/// that moves it forward (a concurrent commit that went further wins). Returns whether the row
/// changed. Called by the SQL API; runs as pg_tide.
pub(crate) fn set_position(
    pipeline: &str,
    consumer: &str,
    id: i64,
    forward_only: bool,
) -> TideResult<bool> {
    Ok(sql_as_tide::write_one::<bool>(
        "UPDATE tide.consumer c
            SET committed_id = $3, committed_lsn = e.commit_lsn, committed_position = e.position,
                committed_at = now()
           FROM (SELECT 1) one
           LEFT JOIN LATERAL (SELECT o.commit_lsn, o.position FROM tide.outbox o
                               WHERE o.pipeline = $1 AND o.id <= $3
                               ORDER BY o.id DESC LIMIT 1) e ON true
          WHERE c.pipeline = $1 AND c.name = $2 AND (NOT $4 OR c.committed_id < $3)
         RETURNING true",
        &[
            pipeline.into(),
            consumer.into(),
            id.into(),
            forward_only.into(),
        ],
    )?
    .unwrap_or(false))
}

/// Forget a consumer; whether it existed. Called by the SQL API; runs as pg_tide.
pub(crate) fn delete(pipeline: &str, consumer: &str) -> TideResult<bool> {
    Ok(sql_as_tide::exec_count(
        "DELETE FROM tide.consumer WHERE pipeline = $1 AND name = $2",
        &[pipeline.into(), consumer.into()],
    )? > 0)
}

/// The last id of a consumer's next batch: of the pipeline's events after `after` in id order,
/// at most `max` and only whole source transactions (events of one transaction share their
/// `commit_lsn` and are contiguous), unless the first transaction alone has more than `max`
/// events: then its first `max`. `after` itself when there is nothing to read. Called by the SQL
/// API (`tide._consumer_batch`); runs as pg_tide.
pub(crate) fn batch_end(pipeline: &str, after: i64, max: i64) -> TideResult<i64> {
    let end = sql_as_tide::one::<i64>(
        "WITH b AS (
             SELECT s.id, s.commit_lsn, row_number() OVER (ORDER BY s.id) AS n
               FROM (SELECT o.id, o.commit_lsn FROM tide.outbox o
                      WHERE o.pipeline = $1 AND o.id > $2 ORDER BY o.id LIMIT $3 + 1) s
         ), k AS (
             SELECT (SELECT count(*) FROM b) AS total,
                    (SELECT id FROM b WHERE n = $3) AS last_id,
                    (SELECT commit_lsn FROM b WHERE n = $3) AS last_lsn,
                    (SELECT commit_lsn FROM b WHERE n = $3 + 1) AS next_lsn
         )
         SELECT CASE WHEN k.total <= $3 THEN coalesce((SELECT max(id) FROM b), $2)
                     WHEN k.next_lsn <> k.last_lsn THEN k.last_id
                     -- the batch would end inside a transaction: end before it, unless it is
                     -- the only one
                     ELSE coalesce((SELECT max(id) FROM b WHERE n <= $3 AND commit_lsn <> k.last_lsn),
                                   k.last_id) END
           FROM k",
        &[pipeline.into(), after.into(), max.into()],
    )?;
    end.ok_or_else(|| corrupt("outbox batch", pipeline))
}

// --- the retention (the launcher) ----------------------------------------------------------------

/// The outbox pipelines and how many consumers each has, by name. Called by the launcher, in its
/// transaction (a read).
pub(crate) fn outbox_pipelines(c: &SpiClient<'_>) -> TideResult<Vec<(String, i64)>> {
    let mut out = Vec::new();
    for row in c.select(
        "SELECT p.name, (SELECT count(*) FROM tide.consumer c WHERE c.pipeline = p.name)
           FROM tide.pipeline p WHERE p.target = $1 ORDER BY p.name",
        None,
        &[tide_core::model::TargetKind::Outbox.as_str().into()],
    )? {
        let name = row.get::<String>(1)?.ok_or_else(|| corrupt("name", "?"))?;
        let consumers = row.get::<i64>(2)?.unwrap_or(0);
        out.push((name, consumers));
    }
    Ok(out)
}

/// What one retention batch deleted.
pub(crate) struct Pruned {
    pub events: i64,
    /// The highest id deleted.
    pub last_id: Option<i64>,
    pub reason: PruneReason,
}

/// Delete one batch of a pipeline's outbox events, at most `batch`, oldest first, and count it
/// in `tide.outbox_prune` (two statements: the retention lock, then one statement that reads the
/// consumers, deletes and counts). With consumers: the events every consumer has committed
/// (`id <= min(committed_id)`). Without: the events older than `max_age_s` seconds
/// (`commit_time`), in id order up to the first younger one; none when `max_age_s <= 0`.
/// Called by the launcher, in a transaction of its own per batch. The lock is only tried: a
/// role that holds it (a transaction left open after `tide.trim_outbox` or `create_consumer`)
/// must not stop the launcher, which starts every role's workers; that pipeline's retention
/// waits for the next tick (an empty batch).
pub(crate) fn prune_batch(pipeline: &str, batch: i64, max_age_s: f64) -> TideResult<Pruned> {
    if !crate::locks::try_lock(
        crate::locks::Lock::Retention(pipeline),
        crate::locks::Mode::Exclusive,
    )? {
        return Ok(Pruned {
            events: 0,
            last_id: None,
            reason: PruneReason::Consumers,
        });
    }
    // A writing statement: it takes its snapshot now, after the lock (see the module header).
    let rows = crate::sql::text_rows(
        "WITH c AS (SELECT count(*) AS n, min(committed_id) AS upto
                      FROM tide.consumer WHERE pipeline = $1),
              v AS (SELECT o.id, o.commit_time FROM tide.outbox o, c
                     WHERE o.pipeline = $1 AND (c.n = 0 OR o.id <= c.upto)
                     ORDER BY o.id LIMIT $2::int8),
              d AS (SELECT v.id FROM v, c
                     WHERE c.n > 0
                        OR ($3::float8 > 0
                            AND v.id < coalesce((SELECT min(y.id) FROM v y
                                                  WHERE y.commit_time >= now() - make_interval(secs => $3::float8)),
                                                9223372036854775807))),
              del AS (DELETE FROM tide.outbox o USING d WHERE o.id = d.id RETURNING o.id),
              s AS (SELECT count(*) AS n, max(id) AS last FROM del),
              up AS (INSERT INTO tide.outbox_prune AS r (pipeline, events, transactions, last_id, last_reason, last_at)
                     SELECT $1, s.n, 1, s.last, CASE WHEN c.n > 0 THEN $4 ELSE $5 END, now()
                       FROM s, c WHERE s.n > 0
                     ON CONFLICT (pipeline) DO UPDATE
                        SET events = r.events + excluded.events, transactions = r.transactions + 1,
                            last_id = excluded.last_id, last_reason = excluded.last_reason,
                            last_at = excluded.last_at)
         SELECT s.n, s.last, c.n > 0 FROM s, c",
        &[
            Some(pipeline),
            Some(batch.to_string().as_str()),
            Some(max_age_s.to_string().as_str()),
            Some(PruneReason::Consumers.as_str()),
            Some(PruneReason::Age.as_str()),
        ],
        0,
        true,
    )?;
    let row = rows
        .into_iter()
        .next()
        .ok_or_else(|| corrupt("retention result", pipeline))?;
    let events = row
        .first()
        .cloned()
        .flatten()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or_else(|| corrupt("retention count", pipeline))?;
    let last_id = row
        .get(1)
        .cloned()
        .flatten()
        .and_then(|t| t.parse::<i64>().ok());
    let reason = if row.get(2).cloned().flatten().as_deref() == Some("t") {
        PruneReason::Consumers
    } else {
        PruneReason::Age
    };
    Ok(Pruned {
        events,
        last_id,
        reason,
    })
}

/// Delete `pipeline`'s outbox events with `id <= up_to` under the retention lock; returns how
/// many. Called by the SQL API (`tide.trim_outbox`, after its checks); runs as pg_tide.
pub(crate) fn trim(pipeline: &str, up_to: i64) -> TideResult<i64> {
    lock_retention(pipeline)?;
    let n = sql_as_tide::exec_count(
        "DELETE FROM tide.outbox WHERE pipeline = $1 AND id <= $2",
        &[pipeline.into(), up_to.into()],
    )?;
    Ok(n as i64)
}
