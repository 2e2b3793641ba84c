//! Remote (`postgres`) targets: connections follow postgres_fdw's rules for non-superusers.

#[allow(unused_imports)]
use super::*;
