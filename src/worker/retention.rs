//! The outbox retention, run by the launcher between its ticks (never by a pipeline worker, so
//! apply latency is untouched: the delete batches run in another process and take no lock a
//! worker waits for; they delete rows the worker no longer touches).
//!
//! For each outbox pipeline: with at least one consumer, the events every consumer has
//! committed are deleted; with none, the events older than `tide.outbox_retention` (0, the
//! default, keeps them). Deletion goes in batches of at most `tide.outbox_prune_batch` rows, one
//! transaction each (`catalog::consumers::prune_batch`, which also counts it in
//! `tide.outbox_prune`), oldest id first, for at most [`BUDGET`] per tick; what is left waits for
//! the next tick, which then comes sooner ([`prune`] says so). Each pipeline's deletions of one
//! tick are logged at DEBUG1.

use crate::catalog::consumers;
use crate::gucs;
use crate::worker::tx;
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// The longest the launcher spends deleting per tick.
pub const BUDGET: Duration = Duration::from_millis(500);

/// Run the retention for at most [`BUDGET`]. Returns whether it stopped with work left (a batch
/// came back full). Failures are logged and retried on the next tick.
pub fn prune() -> bool {
    let max_age_s = gucs::OUTBOX_RETENTION_S.get();
    let batch = gucs::OUTBOX_PRUNE_BATCH.get().max(1) as i64;
    let pipelines = match tx::run(|| Spi::connect(consumers::outbox_pipelines)) {
        Ok(p) => p,
        Err(e) => {
            log!("pg_tide launcher: could not list the outbox pipelines for the retention: {e}");
            return false;
        }
    };
    let started = Instant::now();
    let mut more = false;
    for (pipeline, n_consumers) in pipelines {
        if n_consumers == 0 && max_age_s <= 0 {
            continue;
        }
        let (mut events, mut transactions, mut last) = (0i64, 0i64, None);
        loop {
            if started.elapsed() >= BUDGET {
                more = true;
                break;
            }
            match tx::run(|| consumers::prune_batch(&pipeline, batch, max_age_s as f64)) {
                Ok(p) if p.events > 0 => {
                    events += p.events;
                    transactions += 1;
                    last = p.last_id.map(|id| (id, p.reason));
                    if p.events < batch {
                        break;
                    }
                }
                Ok(_) => break,
                Err(e) => {
                    log!("pg_tide launcher: the outbox retention of pipeline \"{pipeline}\" failed (retried on the next tick): {e}");
                    break;
                }
            }
        }
        if let Some((id, reason)) = last {
            debug1!(
                "pg_tide launcher: deleted {events} outbox events of pipeline \"{pipeline}\" up to id {id} ({}) in {transactions} transactions",
                match reason {
                    tide_core::model::PruneReason::Consumers => "every consumer had committed them",
                    tide_core::model::PruneReason::Age => "older than tide.outbox_retention",
                }
            );
        }
        if more {
            break;
        }
    }
    more
}
