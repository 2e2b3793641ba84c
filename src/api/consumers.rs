//! Named outbox consumers: create, drop, read the next batch, commit, seek (see README, Outbox
//! consumers). A consumer belongs to an outbox pipeline; whoever may act on the pipeline (its
//! owner, a member of the owning role, a superuser: `require_pipeline`) may act on its
//! consumers. The catalog statements are in `catalog::consumers`; the retention that deletes
//! what every consumer has committed runs in the launcher (`worker::retention`).

use super::*;
use catalog::consumers;
use tide_core::model::ConsumerStart;

/// Longest consumer name.
const MAX_CONSUMER_NAME: usize = 63;

fn validate_consumer_name(name: &str) -> TideResult<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_CONSUMER_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(
            TideError::invalid(format!("invalid consumer name \"{}\"", shown(name))).hint(format!(
                "Use 1 to {MAX_CONSUMER_NAME} lower-case letters, digits, underscores and hyphens."
            )),
        )
    }
}

/// The pipeline must exist, be the caller's (42704, 42501) and write to the outbox (42809).
/// Returns its owner.
fn require_outbox_pipeline(pipeline: &str) -> TideResult<String> {
    catalog::version_gate()?;
    let owner = require_pipeline(pipeline)?;
    let (kind, _) = catalog::pipelines::target(pipeline)?;
    if !crate::target::kind(kind).consumers {
        return Err(TideError::wrong_object(format!(
            "pipeline \"{}\" writes to a {} target, not to the outbox",
            shown(pipeline),
            kind.as_str()
        ))
        .hint("Consumers read tide.outbox: create them on a pipeline with target 'outbox'."));
    }
    Ok(owner)
}

fn no_consumer(pipeline: &str, consumer: &str) -> TideError {
    TideError::undefined(format!(
        "pipeline \"{}\" has no consumer \"{}\"",
        shown(pipeline),
        shown(consumer)
    ))
    .hint(format!(
        "SELECT consumer FROM tide.consumers WHERE pipeline = '{}' lists them; tide.create_consumer creates one.",
        shown(pipeline).replace('\'', "''")
    ))
}

/// The consumer's committed id (42704 when there is none).
fn require_consumer(pipeline: &str, consumer: &str) -> TideResult<i64> {
    consumers::committed(pipeline, consumer)?.ok_or_else(|| no_consumer(pipeline, consumer))
}

/// Register a named consumer of an outbox pipeline. `start`: `'earliest'` (before the oldest
/// event still in the outbox) or `'latest'` (at the newest event). Returns its committed id.
#[pg_extern]
pub(super) fn create_consumer(
    pipeline: Option<&str>,
    name: Option<&str>,
    start: default!(Option<&str>, "'earliest'"),
) -> i64 {
    (|| {
        create_consumer_impl(
            required(pipeline, "pipeline")?,
            required(name, "name")?,
            required(start, "start")?,
        )
    })()
    .or_raise()
}

fn create_consumer_impl(pipeline: &str, name: &str, start: &str) -> TideResult<i64> {
    require_outbox_pipeline(pipeline)?;
    validate_consumer_name(name)?;
    let Some(start) = ConsumerStart::parse(start) else {
        return Err(
            TideError::invalid(format!("unknown consumer start \"{}\"", shown(start)))
                .hint("Use 'earliest' (read every event still in the outbox) or 'latest' (only events written from now on)."),
        );
    };
    let owner = crate::security::caller_name()?;
    // Held until commit: a retention batch running meanwhile has finished, and the next one
    // sees this consumer (catalog::consumers).
    consumers::lock_retention(pipeline)?;
    let (oldest, newest) = consumers::bounds(pipeline, true)?;
    let committed = match start {
        ConsumerStart::Earliest => oldest.map(|o| o - 1),
        ConsumerStart::Latest => newest,
    }
    .unwrap_or(0);
    if !consumers::insert(pipeline, name, &owner, committed)? {
        return Err(TideError::duplicate(format!(
            "pipeline \"{}\" already has a consumer \"{}\"",
            shown(pipeline),
            shown(name)
        ))
        .hint("Pick another name, or drop it first with tide.drop_consumer."));
    }
    Ok(committed)
}

/// Forget a consumer. The events it had not committed are no longer kept for it.
#[pg_extern]
pub(super) fn drop_consumer(pipeline: Option<&str>, name: Option<&str>) {
    (|| {
        let (pipeline, name) = (required(pipeline, "pipeline")?, required(name, "name")?);
        require_outbox_pipeline(pipeline)?;
        if !consumers::delete(pipeline, name)? {
            return Err(no_consumer(pipeline, name));
        }
        Ok(())
    })()
    .or_raise()
}

/// Delete the pipeline's outbox events with `id <= up_to` (what a consumer that tracks its own
/// position has processed); returns how many. Members have no DELETE right on `tide.outbox` (it
/// would also let them `LOCK` it and stop every outbox pipeline): trimming goes through here,
/// for the pipelines the caller may act on. Takes the retention lock, like a prune batch.
#[pg_extern]
pub(super) fn trim_outbox(pipeline: Option<&str>, up_to: Option<i64>) -> i64 {
    (|| {
        let pipeline = required(pipeline, "pipeline")?;
        let up_to = required(up_to, "up_to")?;
        require_outbox_pipeline(pipeline)?;
        consumers::trim(pipeline, up_to)
    })()
    .or_raise()
}

/// pg_tide internal (`tide.read_outbox`): checks the caller and the arguments and returns the
/// bounds `[after, upto]` of the consumer's next batch: its events are those with
/// `after < id <= upto`.
#[pg_extern]
pub(super) fn _consumer_batch(
    pipeline: Option<&str>,
    consumer: Option<&str>,
    max_events: Option<i32>,
) -> Vec<i64> {
    (|| {
        let pipeline = required(pipeline, "pipeline")?;
        let consumer = required(consumer, "consumer")?;
        let max = required(max_events, "max_events")?;
        require_outbox_pipeline(pipeline)?;
        if max < 1 {
            return Err(
                TideError::invalid(format!("max_events must be positive, not {max}"))
                    .hint("Pass the largest number of events to return, e.g. 1000."),
            );
        }
        let after = require_consumer(pipeline, consumer)?;
        let upto = consumers::batch_end(pipeline, after, max as i64)?;
        Ok(vec![after, upto])
    })()
    .or_raise()
}

/// pg_tide internal (`tide.read_outbox(..., wait => ...)`): checks the caller and the
/// arguments, then waits up to `wait` until the pipeline has committed an event after the
/// consumer's committed position; true when there is one. `tide.read_outbox` reads its batch in
/// a statement after this one, so with a snapshot taken after the wait (READ COMMITTED only: a
/// transaction snapshot would not show what arrived).
#[pg_extern]
pub(super) fn _outbox_wait(
    pipeline: Option<&str>,
    consumer: Option<&str>,
    wait: Option<pgrx::datum::Interval>,
) -> bool {
    (|| {
        let pipeline = required(pipeline, "pipeline")?;
        let consumer = required(consumer, "consumer")?;
        let wait = required(wait, "wait")?;
        require_outbox_pipeline(pipeline)?;
        let after = require_consumer(pipeline, consumer)?;
        let micros = wait
            .micros()
            .saturating_add((wait.days() as i64).saturating_mul(86_400_000_000))
            .saturating_add((wait.months() as i64).saturating_mul(30 * 86_400_000_000));
        if micros < 0 {
            return Err(TideError::invalid("wait must not be negative")
                .hint("Pass how long to wait for events, e.g. '30 seconds', or omit it not to wait."));
        }
        let has_events = || -> TideResult<bool> {
            // A snapshot of its own each time (the worker commits meanwhile).
            crate::catalog::consumers::has_events_after(pipeline, after)
        };
        if micros == 0 {
            return has_events();
        }
        let isolation =
            sql::one::<String>("SELECT current_setting('transaction_isolation')", &[])?
                .unwrap_or_default();
        if isolation != "read committed" {
            return Err(TideError::unsupported(format!(
                "tide.read_outbox cannot wait in a {isolation} transaction"
            ))
            .hint("Its snapshot would not show the events that arrive: read in READ COMMITTED, or without wait."));
        }
        let deadline = super::deadline_after(micros);
        loop {
            if has_events()? {
                return Ok(true);
            }
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            sleep_ms(20);
        }
    })()
    .or_raise()
}

/// Commit a consumer's position: every event of the pipeline with an id up to `id` is
/// processed. Moves forward only (the same id again is a no-op); `tide.seek_consumer` moves it
/// anywhere.
#[pg_extern]
pub(super) fn commit_consumer(pipeline: Option<&str>, consumer: Option<&str>, id: Option<i64>) {
    (|| {
        let pipeline = required(pipeline, "pipeline")?;
        let consumer = required(consumer, "consumer")?;
        let id = required(id, "id")?;
        require_outbox_pipeline(pipeline)?;
        let committed = require_consumer(pipeline, consumer)?;
        if id == committed {
            return Ok(());
        }
        if id < committed {
            return Err(TideError::invalid(format!(
                "consumer \"{}\" has committed id {committed} already; {id} would move it back",
                shown(consumer)
            ))
            .hint("Commit the id of the last event you processed (it only moves forward); to read again from an earlier position use tide.seek_consumer."));
        }
        let (_, newest) = consumers::bounds(pipeline, false)?;
        if newest.is_none_or(|n| id > n) {
            return Err(TideError::invalid(format!(
                "id {id} is beyond the newest event of pipeline \"{}\" ({})",
                shown(pipeline),
                newest.map_or_else(|| "it has none".to_string(), |n| format!("id {n}"))
            ))
            .hint("Commit the id of an event tide.read_outbox returned."));
        }
        consumers::set_position(pipeline, consumer, id, true)?;
        Ok(())
    })()
    .or_raise()
}

/// Move a consumer's committed position anywhere between just before the pipeline's oldest
/// event still in the outbox and its newest event (to read events again, or to skip them).
#[pg_extern]
pub(super) fn seek_consumer(pipeline: Option<&str>, consumer: Option<&str>, id: Option<i64>) {
    (|| {
        let pipeline = required(pipeline, "pipeline")?;
        let consumer = required(consumer, "consumer")?;
        let id = required(id, "id")?;
        require_outbox_pipeline(pipeline)?;
        require_consumer(pipeline, consumer)?;
        // Held until commit, so no retention batch deletes what this seek goes back to.
        consumers::lock_retention(pipeline)?;
        let committed = require_consumer(pipeline, consumer)?;
        if id == committed {
            return Ok(());
        }
        let (oldest, newest) = consumers::bounds(pipeline, true)?;
        match (oldest, newest) {
            (Some(lo), Some(hi)) if id >= lo - 1 && id <= hi => {}
            (Some(lo), Some(hi)) => {
                return Err(TideError::invalid(format!(
                    "id {id} is outside the events of pipeline \"{}\" in the outbox (ids {lo} to {hi})",
                    shown(pipeline)
                ))
                .hint(format!("Seek to an id from {} (before the oldest event kept) to {hi}; older events were deleted.", lo - 1)))
            }
            _ => {
                return Err(TideError::invalid(format!(
                    "pipeline \"{}\" has no events in the outbox to seek to",
                    shown(pipeline)
                ))
                .hint("Wait until the pipeline has written events."))
            }
        }
        consumers::set_position(pipeline, consumer, id, false)?;
        Ok(())
    })()
    .or_raise()
}
