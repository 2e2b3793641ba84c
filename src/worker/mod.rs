//! Background workers: the launcher, the per-pipeline worker, and the one transaction helper
//! both use.

pub mod backfill;
pub mod decoder;
pub mod launcher;
pub mod origin;
pub mod pipeline;
pub mod tx;
