//! The sink thread: its one connection, running requests, rollback and reconnects. It never
//! calls into PostgreSQL and blocks every signal.

use super::*;

/// Block every signal in the calling thread, so that PostgreSQL's signal handlers (SIGTERM,
/// SIGUSR1, SIGALRM, ...) run on the backend's main thread only. Threads created by this one
/// (the client's DNS helper threads) inherit the mask.
pub(super) fn block_signals() {
    // SAFETY: `set` is a valid sigset_t, initialised by sigfillset before use; a null `old` is
    // allowed. Neither call can fail with valid arguments.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// The sink thread's connection and the statements prepared on it.
pub(super) struct Conn {
    /// The client.
    pub(super) client: Client,
    /// Prepared statements by (parameter count, SQL).
    pub(super) statements: HashMap<(usize, String), Statement>,
}

impl Conn {
    /// False if the client already knows the connection is closed. (A connection the server
    /// closed while idle is only noticed on the next round trip: the request prelude, which
    /// is retried once on a fresh connection. Polling the socket here would need a reactor
    /// turn, which costs about 1 ms per request with this client.)
    pub(super) fn alive(&self) -> bool {
        !self.client.is_closed()
    }

    /// The prepared statement for `sql` with `n` text parameters.
    pub(super) fn prepare(&mut self, sql: &str, n: usize) -> Result<Statement, postgres::Error> {
        let key = (n, sql.to_string());
        if let Some(statement) = self.statements.get(&key) {
            return Ok(statement.clone());
        }
        let types = vec![Type::TEXT; n];
        let statement = self.client.prepare_typed(sql, &types)?;
        if self.statements.len() >= STATEMENT_CACHE_MAX {
            self.statements.clear();
        }
        self.statements.insert(key, statement.clone());
        Ok(statement)
    }
}

/// A statement failure, and whether the connection is still usable after it.
pub(super) struct StatementError {
    /// The error.
    pub(super) error: RemoteError,
    /// False if the connection must be dropped.
    pub(super) connection_ok: bool,
}

/// Run one statement on `conn` and read its rows.
pub(super) fn run_statement(
    conn: &mut Conn,
    stmt: &RemoteStatement,
) -> Result<Rows, StatementError> {
    let pg_error = |e: postgres::Error| StatementError {
        connection_ok: e.as_db_error().is_some(),
        error: RemoteError::from_pg(&e),
    };
    let statement = conn
        .prepare(&stmt.sql, stmt.params.len())
        .map_err(pg_error)?;
    check_columns(&statement).map_err(|error| StatementError {
        error,
        connection_ok: true,
    })?;
    let values: Vec<Option<&str>> = stmt.params.iter().map(Option::as_deref).collect();
    let params: Vec<&(dyn ToSql + Sync)> =
        values.iter().map(|v| v as &(dyn ToSql + Sync)).collect();
    let rows = conn.client.query(&statement, &params).map_err(pg_error)?;
    rows_as_text(&rows).map_err(|error| StatementError {
        error,
        connection_ok: true,
    })
}

/// Run one step of a transaction on `conn`: a statement (its rows), simple-protocol SQL or a
/// `COPY ... FROM STDIN` with its data (no rows).
pub(super) fn run_step(conn: &mut Conn, step: &RemoteStep) -> Result<Rows, StatementError> {
    let pg_error = |e: postgres::Error| StatementError {
        connection_ok: e.as_db_error().is_some(),
        error: RemoteError::from_pg(&e),
    };
    match step {
        RemoteStep::Statement(stmt) => run_statement(conn, stmt),
        RemoteStep::Simple(sql) => {
            conn.client.batch_execute(sql).map_err(pg_error)?;
            Ok(Vec::new())
        }
        RemoteStep::CopyIn { sql, data } => copy_in(conn, sql, data),
        RemoteStep::LoadChunk {
            probe,
            direct,
            staged,
            data,
        } => {
            let taken = run_statement(conn, probe)?
                .first()
                .and_then(|r| r.first().cloned().flatten());
            if taken.as_deref() == Some("f") {
                return copy_in(conn, direct, data);
            }
            for step in staged {
                match step {
                    RemoteStep::CopyIn { sql, .. } => copy_in(conn, sql, data)?,
                    other => run_step(conn, other)?,
                };
            }
            Ok(Vec::new())
        }
    }
}

/// `COPY ... FROM STDIN` (`sql`) on `conn`, sending `data`.
fn copy_in(conn: &mut Conn, sql: &str, data: &[u8]) -> Result<Rows, StatementError> {
    use std::io::Write;
    let pg_error = |e: postgres::Error| StatementError {
        connection_ok: e.as_db_error().is_some(),
        error: RemoteError::from_pg(&e),
    };
    let mut writer = conn.client.copy_in(sql).map_err(pg_error)?;
    if let Err(e) = writer.write_all(data) {
        // The copy is aborted when the writer is dropped; an I/O error means the connection is
        // gone or unusable (a server error shows at `finish`).
        drop(writer);
        return Err(StatementError {
            error: RemoteError::transient(format!("sending COPY data failed: {e}")),
            connection_ok: false,
        });
    }
    writer.finish().map_err(pg_error)?;
    Ok(Vec::new())
}

/// Drop the connection (if any) and record that there is none.
pub(super) fn discard(conn: &mut Option<Conn>, shared: &Shared) {
    if conn.take().is_some() {
        lock(&shared.ctl).cancel = None;
        shared.connected.store(false, Ordering::SeqCst);
    }
}

/// Roll back the open transaction; drop the connection if that fails or is unsafe.
pub(super) fn roll_back(conn: &mut Option<Conn>, shared: &Shared, connection_ok: bool) {
    let ok = connection_ok
        && conn.as_mut().is_some_and(|c| {
            c.statements.clear();
            c.client.batch_execute("ROLLBACK").is_ok()
        });
    if !ok {
        discard(conn, shared);
    }
}

/// The error of a failed connection attempt: a certificate that did not verify, another TLS
/// failure, or the client's or server's error.
pub(super) fn connect_error(
    e: &postgres::Error,
    target: &Target,
    failure: &Mutex<Option<VerifyFailure>>,
) -> RemoteError {
    if e.as_db_error().is_none() && e.to_string().starts_with("error performing TLS handshake") {
        if let Some(f) = lock(failure).take() {
            return f.error(&target.tls);
        }
        return tls::handshake_error(e, &target.tls);
    }
    let mut error = RemoteError::from_pg(e);
    if let Some(cause) = error.message.strip_prefix("error connecting to server: ") {
        error.message = cause.to_string();
    }
    error.context("could not connect to the remote server")
}

/// Open a connection as the TLS options say. `allow` tries clear text first and TLS when the
/// server refuses that (libpq's order); the other modes make one attempt, with the client's
/// `sslmode` (`prefer` falls back to clear text only if the server does not support TLS).
/// Returns the client and the TLS connector it used, if any (for cancel requests).
pub(super) fn connect(target: &Target) -> Result<(Client, Option<MakeTlsConnector>), RemoteError> {
    let failure = Arc::new(Mutex::new(None));
    let attempt = |config: &Config, tls: Option<&MakeTlsConnector>| match tls {
        Some(tls) => config.connect(tls.clone()),
        None => config.connect(NoTls),
    };
    match target.tls.mode {
        tls::SslMode::Disable => attempt(&target.config, None)
            .map(|c| (c, None))
            .map_err(|e| connect_error(&e, target, &failure)),
        tls::SslMode::Allow => match attempt(&target.config, None) {
            Ok(client) => Ok((client, None)),
            Err(e) if e.as_db_error().is_some() => {
                let connector = target.tls.connector(&failure)?;
                let mut config = target.config.clone();
                config.ssl_mode(SslMode::Require);
                attempt(&config, Some(&connector))
                    .map(|c| (c, Some(connector)))
                    .map_err(|e| connect_error(&e, target, &failure))
            }
            Err(e) => Err(connect_error(&e, target, &failure)),
        },
        _ => {
            let connector = target.tls.connector(&failure)?;
            attempt(&target.config, Some(&connector))
                .map(|c| (c, Some(connector)))
                .map_err(|e| connect_error(&e, target, &failure))
        }
    }
}

/// Make sure `conn` holds a live connection; true if it was just opened.
pub(super) fn ensure_connected(
    target: &Target,
    conn: &mut Option<Conn>,
    shared: &Shared,
) -> Result<bool, RemoteError> {
    if let Some(c) = conn.as_ref() {
        if c.alive() {
            return Ok(false);
        }
        discard(conn, shared);
    }
    let (client, tls) = connect(target)?;
    lock(&shared.ctl).cancel = Some(Canceller {
        token: client.cancel_token(),
        tls,
    });
    shared.connected.store(true, Ordering::SeqCst);
    *conn = Some(Conn {
        client,
        statements: HashMap::new(),
    });
    Ok(true)
}

/// True if the main thread has given up on request `seq`.
pub(super) fn is_abandoned(shared: &Shared, seq: u64) -> bool {
    lock(&shared.ctl).abandoned >= seq
}

/// The error a request abandoned mid-way returns (the main thread discards it).
pub(super) fn abandoned_error() -> RemoteError {
    RemoteError::transient("request abandoned after the caller's timeout")
}

/// Execute one request. `sent` is set once anything was sent on the connection.
pub(super) fn run_request(
    target: &Target,
    conn: &mut Option<Conn>,
    request: &Request,
    shared: &Shared,
    sent: &mut bool,
) -> Result<Vec<Rows>, RemoteError> {
    let timeout_ms = request.timeout.as_millis().clamp(1, i32::MAX as u128);
    let prelude = match request.work {
        Work::Transaction(_) => format!("BEGIN; SET LOCAL statement_timeout = {timeout_ms}"),
        Work::Query(_) => format!("SET statement_timeout = {timeout_ms}"),
    };
    // Connect (or reuse), then run the prelude. A reused connection that turns out to be
    // dead on this first round trip has executed nothing: retry once on a fresh one.
    let mut retried = false;
    loop {
        let fresh = ensure_connected(target, conn, shared)?;
        if is_abandoned(shared, request.seq) {
            return Err(abandoned_error());
        }
        let Some(c) = conn.as_mut() else {
            return Err(RemoteError::transient("no remote connection")); // unreachable
        };
        *sent = true;
        match c.client.batch_execute(&prelude) {
            Ok(()) => break,
            Err(e) => {
                discard(conn, shared);
                if !retried && !fresh && connection_lost(&e) {
                    retried = true;
                    continue;
                }
                return Err(RemoteError::from_pg(&e));
            }
        }
    }
    let Some(c) = conn.as_mut() else {
        return Err(RemoteError::transient("no remote connection")); // unreachable
    };
    match &request.work {
        Work::Query(stmt) => match run_statement(c, stmt) {
            Ok(rows) => Ok(vec![rows]),
            Err(StatementError {
                error,
                connection_ok,
            }) => {
                c.statements.clear();
                if !connection_ok {
                    discard(conn, shared);
                }
                Err(error)
            }
        },
        Work::Transaction(stmts) => {
            let mut results = Vec::with_capacity(stmts.len());
            for stmt in stmts {
                if is_abandoned(shared, request.seq) {
                    discard(conn, shared); // rolls back; a cancel may be on its way
                    return Err(abandoned_error());
                }
                let Some(c) = conn.as_mut() else {
                    return Err(RemoteError::transient("no remote connection")); // unreachable
                };
                match run_step(c, stmt) {
                    Ok(rows) => results.push(rows),
                    Err(StatementError {
                        error,
                        connection_ok,
                    }) => {
                        roll_back(conn, shared, connection_ok);
                        return Err(error);
                    }
                }
            }
            {
                let mut ctl = lock(&shared.ctl);
                if ctl.abandoned >= request.seq {
                    drop(ctl);
                    discard(conn, shared);
                    return Err(abandoned_error());
                }
                ctl.committing = true;
            }
            let Some(c) = conn.as_mut() else {
                return Err(RemoteError::transient("no remote connection")); // unreachable
            };
            match c.client.batch_execute("COMMIT") {
                Ok(()) => Ok(results),
                Err(e) if e.as_db_error().is_some() => {
                    // The server refused the commit (deferred constraint, serialization
                    // failure...) and rolled back; the session is usable.
                    c.statements.clear();
                    Err(RemoteError::from_pg(&e))
                }
                Err(e) => {
                    discard(conn, shared);
                    Err(RemoteError::from_pg(&e).context(
                        "connection lost during COMMIT; the outcome of the remote transaction is unknown",
                    ))
                }
            }
        }
    }
}

/// Text of a panic payload.
pub(super) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// The sink thread: serve requests until the request channel closes or `stop` is set.
pub(super) fn sink_thread(
    conninfo: &str,
    application_name: &str,
    requests: Receiver<Request>,
    replies: Sender<Reply>,
    shared: &Shared,
) {
    block_signals();
    let target = catch_unwind(AssertUnwindSafe(|| {
        build_config(conninfo, application_name)
    }))
    .unwrap_or_else(|p| {
        Err(RemoteError::permanent(format!(
            "internal error parsing the remote connection string: {}",
            panic_text(p.as_ref())
        )))
    });
    let mut conn: Option<Conn> = None;
    while let Ok(request) = requests.recv() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        {
            let mut ctl = lock(&shared.ctl);
            if request.seq <= ctl.abandoned {
                continue; // timed out while queued
            }
            ctl.inflight = Some(request.seq);
            ctl.committing = false;
            ctl.cancel_fired = false;
            ctl.abandoned_at = None;
        }
        let mut sent = false;
        let result = match &target {
            Err(e) => Err(e.clone()),
            Ok(target) => catch_unwind(AssertUnwindSafe(|| {
                run_request(target, &mut conn, &request, shared, &mut sent)
            }))
            .unwrap_or_else(|p| {
                let _ = catch_unwind(AssertUnwindSafe(|| discard(&mut conn, shared)));
                Err(RemoteError::permanent(format!(
                    "internal error in the remote sink: {}",
                    panic_text(p.as_ref())
                )))
            }),
        };
        let doomed = {
            let mut ctl = lock(&shared.ctl);
            let abandoned = ctl.abandoned >= request.seq;
            let doomed = if ctl.cancel_fired || (abandoned && sent) {
                ctl.cancel = None;
                shared.connected.store(false, Ordering::SeqCst);
                conn.take()
            } else {
                None
            };
            ctl.inflight = None;
            ctl.committing = false;
            ctl.cancel_fired = false;
            ctl.abandoned_at = None;
            let _ = replies.send(Reply {
                seq: request.seq,
                result,
            });
            doomed
        };
        // Close outside the lock (sends Terminate; may wait for the network).
        let _ = catch_unwind(AssertUnwindSafe(|| drop(doomed)));
    }
    let _ = catch_unwind(AssertUnwindSafe(|| discard(&mut conn, shared)));
}
