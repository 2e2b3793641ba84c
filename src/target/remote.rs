//! The connection to a remote PostgreSQL target, owned by a dedicated thread.
//!
//! A pipeline worker whose target is a table in another PostgreSQL server writes through a
//! [`RemoteSink`]. pgrx forbids any thread but the backend's main thread from touching
//! PostgreSQL, so the remote connection (pure-Rust `postgres` client, no libpq) lives on a
//! thread of its own, and the main thread talks to it over a bounded channel.
//!
//! What this module owns: the sink thread, its single remote connection, the statements it
//! has prepared on that connection, and the request/reply protocol between the two threads.
//!
//! What it guarantees:
//! - The sink thread never calls pgrx or `pg_sys`, never logs through PostgreSQL and does not
//!   panic on a reachable path; every failure is returned as a [`RemoteError`] value. (Should
//!   the `postgres` crate panic, the panic is caught, the connection dropped and an error
//!   returned.) It blocks every signal, so PostgreSQL's handlers only run on the main thread.
//! - The caller never waits longer than the timeout it passes (plus, only when the remote is
//!   inside `COMMIT` at that moment, the same time again to learn the outcome). A request that
//!   timed out is abandoned: its in-flight statement is cancelled, its transaction is rolled
//!   back (the connection is dropped) unless `COMMIT` had already been sent, and its late
//!   reply is discarded by sequence number, never mistaken for a later request's reply.
//! - [`RemoteSink::transaction`] (and [`RemoteSink::transaction_steps`], whose steps may also
//!   be simple-protocol SQL or a `COPY ... FROM STDIN` with its data, [`RemoteStep`]) is all or
//!   nothing: either every statement ran and `COMMIT` succeeded (`Ok`), or the remote
//!   transaction was rolled back (`Err`). The one exception is
//!   inherent to any client: if the connection breaks (or the caller's time runs out) while
//!   `COMMIT` is in flight, the outcome is unknown, and the error says so.
//! - A broken connection is dropped and the next request reconnects. A reused connection
//!   that the server closed while it was idle (server restarted, backend terminated) fails
//!   on the request's first round trip, before any of the request's statements ran; the
//!   request is then retried once on a fresh connection, so the caller sees no error.
//! - A sink thread stuck in network I/O that no timeout can interrupt (a server that accepts
//!   TCP and never answers) is replaced by a new thread after [`STUCK_AFTER`]; at most
//!   [`MAX_RETIRED`] such threads are left behind before requests fail as "busy" instead.
//!
//! TLS follows libpq: the conninfo's `sslmode` (`disable`, `allow`, `prefer` — the default —,
//! `require`, `verify-ca`, `verify-full`), `sslrootcert` (a PEM file, or `system`), `sslcrl`,
//! `sslcrldir`, `sslcert`, `sslkey`, `sslpassword`, `sslcertmode`, `sslsni` and
//! `ssl_min/max_protocol_version` are honoured, through OpenSSL (`postgres-openssl`); see the
//! [`tls`] module for the details and the (stricter) differences from libpq. Certificate files
//! are read when connecting, on the sink thread. A certificate that does not verify, or a file
//! that cannot be read, is a non-transient error with a hint.
//!
//! A connection made for a role that is no superuser ([`RemoteAccess::probe_password`], decided
//! by [`remote_access`] on the main thread with postgres_fdw's rules) must be seen to use its
//! password, as postgres_fdw checks with libpq's `PQconnectionUsedPassword`, which this client
//! lacks: for each endpoint (host names resolved once), the sink thread first connects without
//! the password, which must end with the server asking for one, and only then connects with it
//! to the same address; a server that lets the probe in is refused ("password is required",
//! SQLSTATE 2F003, [`PASSWORD_REQUIRED`]). After a foreign server, user mapping or role
//! changed ([`take_options_changed`]) the worker checks the rules again and rebuilds its sink
//! if what it connects with changed.

use std::collections::HashMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use postgres::config::{Host, SslMode};
use postgres::types::{FromSql, Kind, PgLsn, ToSql, Type};
use postgres::{CancelToken, Client, Config, NoTls, Row, Statement};
use postgres_openssl::MakeTlsConnector;

mod client;
mod conninfo;
mod error;
mod sink_thread;
mod text;
mod tls;

pub use client::*;
pub use conninfo::*;
pub use error::*;
use sink_thread::*;
use text::*;
use tls::{TlsOptions, VerifyFailure};

/// Connect timeout used when the connection string does not set `connect_timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// TCP keepalive idle time used when the connection string does not set `keepalives_idle`.
const DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(30);
/// TCP keepalive probe interval used when `keepalives_interval` is not set.
const DEFAULT_KEEPALIVES_INTERVAL: Duration = Duration::from_secs(10);
/// TCP keepalive probe count used when `keepalives_count` is not set.
const DEFAULT_KEEPALIVES_RETRIES: u32 = 3;
/// `TCP_USER_TIMEOUT` used when `tcp_user_timeout` is not set: unacknowledged data for this
/// long breaks the connection instead of blocking the sink thread for the kernel's ~15 min.
const DEFAULT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(60);
/// The `postgres` crate's default keepalive idle time (2 h), which we lower.
const POSTGRES_DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(2 * 60 * 60);
/// Requests that may wait in the channel while the sink thread is busy.
const REQUEST_QUEUE: usize = 1;
/// How long `Drop` waits for the sink thread to exit before detaching it.
const STOP_WAIT: Duration = Duration::from_secs(2);
/// A sink thread still busy this long after its request was abandoned is replaced.
pub const STUCK_AFTER: Duration = Duration::from_secs(30);
/// Replaced (stuck) sink threads tolerated at once before requests fail as "busy".
pub const MAX_RETIRED: usize = 4;
/// Prepared statements kept per connection before the cache is cleared.
const STATEMENT_CACHE_MAX: usize = 256;

/// Rows of one statement: every column as its text output, NULL as `None`.
type Rows = Vec<Vec<Option<String>>>;

/// One SQL statement to run on the remote; parameters are sent as text (`$n` are text;
/// the SQL casts them, e.g. `$1::jsonb[]`), NULL as None. Arrays are passed as a single text
/// parameter in PostgreSQL array-literal syntax built by the caller.
///
/// Result columns are returned as text. Columns of type text, varchar, char(n), name, json,
/// jsonb, bool, int2, int4, int8, oid, pg_lsn, uuid, bytea, enums and domains over these are
/// read directly (in PostgreSQL's text output format); any other type must be cast to `::text`
/// in the SQL, or the statement fails (before it runs) with a non-transient error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteStatement {
    /// The SQL text: exactly one statement, parameters `$1..$n` typed `text`.
    pub sql: String,
    /// The values of `$1..$n`, as text; `None` is SQL NULL.
    pub params: Vec<Option<String>>,
}

/// One step of a remote transaction ([`RemoteSink::transaction_steps`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RemoteStep {
    /// A statement with text parameters; its rows are returned.
    Statement(RemoteStatement),
    /// SQL without parameters, run with the simple query protocol (several statements may be
    /// separated by `;`); no rows are returned. Nothing is prepared.
    Simple(String),
    /// `COPY ... FROM STDIN` (`sql`) and the data it reads (in the COPY's format, complete
    /// rows); no rows are returned.
    CopyIn { sql: String, data: Vec<u8> },
    /// A backfill chunk's rows (`data`, COPY text): `probe` (one boolean row) says whether the
    /// target holds a key of the chunk's range; if not, `COPY direct FROM STDIN` loads them
    /// straight into the table, else `staged` steps do (a staging table and one upsert). No
    /// rows are returned.
    LoadChunk {
        probe: RemoteStatement,
        direct: String,
        /// The staging steps; their `CopyIn` data is empty and `data` is sent instead.
        staged: Vec<RemoteStep>,
        data: Vec<u8>,
    },
    /// A statement that must return a row, or the transaction is rolled back with the error
    /// [`FENCED`] (non-transient): the check that the writer still owns the target, in the same
    /// remote transaction as the data it guards (`target::table::fence`). Its rows are returned.
    Fence(RemoteStatement),
}

#[cfg(test)]
mod tests;
