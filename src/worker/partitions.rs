//! Partitioned tables captured through their root: partitions attached while the pipeline runs.
//!
//! Owns: noticing that a captured partitioned table has partitions (holding rows) other than
//! those recorded in `tide.pipeline_table.partitions` (by `tide.add_table`, then here), and
//! queueing a backfill of exactly the new partitions' rows (`condition = tableoid = ANY (...)`),
//! through the watermark algorithm like any other.
//!
//! Guarantees:
//! - The rows a partition held when it was attached reach the target: the output plugin sends
//!   the partition's changes as the table's from the `ATTACH PARTITION` on (the catalog at each
//!   change's position says whether it is a partition yet), and the backfill, which starts after
//!   the attach committed, reads the rest with the usual window reconciliation. It is queued
//!   once no other backfill of the table is active (an active one may have read past the
//!   partition's keys); until then the partitions stay unrecorded and are looked at again.
//! - A partition whose changes cannot be followed (foreign, unlogged, a replica identity without
//!   the key) pauses the pipeline with the reason and the remedy instead of being captured with
//!   holes. A detached partition is simply no longer recorded: its changes stop at the
//!   `DETACH`, its rows stay at the target.
//! - Checked at most once per [`CHECK_EVERY_US`] per worker, in the iteration's transaction,
//!   before anything is decoded, and only by pipelines that capture a partitioned table.

use crate::catalog;
use crate::catalog::pipelines::PipelineRow;
use crate::error::{TideError, TideResult};
use pgrx::spi::SpiClient;
use std::sync::atomic::{AtomicI64, Ordering};

/// How often a worker looks for attached partitions (µs).
pub const CHECK_EVERY_US: i64 = 1_000_000;

static LAST_CHECK_US: AtomicI64 = AtomicI64::new(0);

/// Look for partitions attached to the pipeline's captured partitioned tables (at most once per
/// [`CHECK_EVERY_US`]) and queue their backfills; returns notes for the server log.
pub(super) fn follow(
    c: &mut SpiClient<'_>,
    p: &PipelineRow,
    now_us: i64,
    notes: &mut Vec<String>,
) -> TideResult<()> {
    if now_us - LAST_CHECK_US.load(Ordering::Relaxed) < CHECK_EVERY_US {
        return Ok(());
    }
    LAST_CHECK_US.store(now_us, Ordering::Relaxed);
    for ch in catalog::tables::partition_changes(c, &p.name)? {
        if !ch.attached.is_empty() {
            let problems =
                catalog::tables::partition_problems(ch.relid, &ch.key_columns, Some(&ch.attached))?;
            if let Some(pr) = problems.first() {
                let mut e = TideError::prerequisite(format!(
                    "partition {} of {} {}",
                    pr.name, ch.relation, pr.problem
                ))
                .hint(format!(
                    "Detach it (ALTER TABLE {} DETACH PARTITION {}), or give it a replica identity with the key (ALTER TABLE {} REPLICA IDENTITY DEFAULT, with the table's primary key), then SELECT tide.resume_pipeline('{}').",
                    ch.relation, pr.name, pr.name, p.name
                ));
                e.pause_pipeline = true;
                return Err(e);
            }
            let chunk_size = tide_core::model::DEFAULT_CHUNK_SIZE;
            match catalog::backfills::queue_for_partitions(
                c,
                &p.name,
                ch.relid,
                &ch.attached,
                &p.owner,
                chunk_size,
            )? {
                Some(id) => notes.push(format!(
                    "backfill {id} queued for {} partition(s) attached to {}",
                    ch.attached.len(),
                    ch.relation
                )),
                // Another backfill of the table is active: look again later.
                None => continue,
            }
        }
        catalog::tables::record_partitions(c, &p.name, ch.relid, &ch.current)?;
    }
    Ok(())
}
