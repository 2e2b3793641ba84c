//! End-to-end test harness for pg_tide.
//!
//! Every e2e suite runs against real scratch PostgreSQL 15 clusters made by
//! `scripts/cluster.sh` (as the `postgres` OS user, on 127.0.0.1, trust auth).
//! The pg_tide extension must already be installed into the system PostgreSQL
//! (`scripts/install.sh`; `scripts/test.sh` does that before running these).
//!
//! ```no_run
//! use pg_test::*;
//! use std::time::Duration;
//!
//! let c = Cluster::builder("my_test").conf("tide.database='postgres'").start();
//! c.execute("CREATE EXTENSION pg_tide");
//! c.wait_until("the launcher to appear", Duration::from_secs(30), Duration::from_millis(200), || {
//!     Ok(c.query_scalar::<i64>("SELECT count(*) FROM pg_stat_activity
//!                                WHERE backend_type = 'pg_tide launcher'") == 1)
//! });
//! let err = c.try_execute("SELECT tide.check()").unwrap_err();
//! assert_db_error(&err, "55000", Some("wal_level"));
//! ```
//!
//! Clusters get a unique name (`t_<name>_<pid>_<seq>`) so suites may run in
//! parallel; `scripts/test.sh` runs them with `--test-threads=1`. On drop a
//! cluster is stopped and removed, except when the test is panicking: then it
//! is stopped and kept, and the path of its server log is printed.
//!
//! Modules (all re-exported here):
//! - `cluster`: scratch clusters ([`Cluster`], [`ClusterBuilder`]) and commands run as the
//!   `postgres` OS user;
//! - `wait`: polling ([`poll_every`], [`wait_until`]);
//! - `errors`: server errors described and asserted ([`describe_error`], [`assert_sql_fails`],
//!   [`expect_fail`]);
//! - `setup`: the clusters a suite starts from ([`setup`], [`target_cluster`],
//!   [`create_server`]);
//! - `suite`: diagnostics, statements that panic with them, pipelines created and waited for,
//!   workers killed and waited for again;
//! - `rows`: source and target compared as multisets, queries that must return nothing, the
//!   outbox replayed onto a copy;
//! - `pgbench`: pgbench runs, to the end or in the background;
//! - `fixtures`: schemas and scripts several suites share (the wallets);
//! - `release`: the oldest release, private PostgreSQL copies with chosen pg_tide files, and the
//!   catalog snapshot two installs are compared by.

pub use postgres;
pub use postgres::error::{DbError, SqlState};
pub use postgres::{Client, NoTls, Row};

/// Error type for closures given to [`wait_until`]: `?` works on any error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Result type for closures given to [`wait_until`].
pub type TestResult<T> = Result<T, BoxError>;

mod cluster;
mod errors;
mod fixtures;
mod major_upgrade;
mod pgbench;
mod release;
mod rows;
mod setup;
mod suite;
mod wait;
pub use cluster::*;
pub use errors::*;
pub use fixtures::*;
pub use major_upgrade::*;
pub use pgbench::*;
pub use release::*;
pub use rows::*;
pub use setup::*;
pub use suite::*;
pub use wait::*;
