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
    /// The transaction left open by a [`Part`] that did not commit (its id). A new connection
    /// has none, so a part that continues a transaction lost with its connection is refused.
    pub(super) open: Option<u64>,
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
        RemoteStep::Fence(stmt) => {
            let rows = run_statement(conn, stmt)?;
            if rows.is_empty() {
                // The transaction is rolled back by the caller of the step, as after any error.
                return Err(StatementError {
                    error: RemoteError::fenced(),
                    connection_ok: true,
                });
            }
            Ok(rows)
        }
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
            c.open = None;
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

/// A connection attempt that failed: the client's error, or one raised before connecting (a
/// TLS connector that could not be built).
pub(super) enum OpenError {
    Client(postgres::Error),
    Setup(RemoteError),
}

/// Open a connection with `config` as the TLS options say. `allow` tries clear text first and
/// TLS when the server refuses that (libpq's order); the other modes make one attempt, with the
/// client's `sslmode` (`prefer` falls back to clear text only if the server does not support
/// TLS). Returns the client and the TLS connector it used, if any (for cancel requests).
pub(super) fn open(
    config: &Config,
    tls: &TlsOptions,
    failure: &Arc<Mutex<Option<VerifyFailure>>>,
) -> Result<(Client, Option<MakeTlsConnector>), OpenError> {
    let attempt = |config: &Config, tls: Option<&MakeTlsConnector>| match tls {
        Some(tls) => config.connect(tls.clone()),
        None => config.connect(NoTls),
    };
    match tls.mode {
        tls::SslMode::Disable => attempt(config, None)
            .map(|c| (c, None))
            .map_err(OpenError::Client),
        tls::SslMode::Allow => match attempt(config, None) {
            Ok(client) => Ok((client, None)),
            Err(e) if e.as_db_error().is_some() => {
                let connector = tls.connector(failure).map_err(OpenError::Setup)?;
                let mut config = config.clone();
                config.ssl_mode(SslMode::Require);
                attempt(&config, Some(&connector))
                    .map(|c| (c, Some(connector)))
                    .map_err(OpenError::Client)
            }
            Err(e) => Err(OpenError::Client(e)),
        },
        _ => {
            let connector = tls.connector(failure).map_err(OpenError::Setup)?;
            attempt(config, Some(&connector))
                .map(|c| (c, Some(connector)))
                .map_err(OpenError::Client)
        }
    }
}

/// Open a connection as the target says: with `config` as it is, or, for a connection that
/// must use its password, [`connect_using_password`].
pub(super) fn connect(target: &Target) -> Result<(Client, Option<MakeTlsConnector>), RemoteError> {
    if let Some(probe) = &target.probe {
        return connect_using_password(target, probe);
    }
    let failure = Arc::new(Mutex::new(None));
    open(&target.config, &target.tls, &failure).map_err(|e| open_error(e, target, &failure))
}

fn open_error(
    e: OpenError,
    target: &Target,
    failure: &Mutex<Option<VerifyFailure>>,
) -> RemoteError {
    match e {
        OpenError::Client(e) => connect_error(&e, target, failure),
        OpenError::Setup(e) => e,
    }
}

/// One place to connect to: a host (name or socket directory), the address to use for it (a
/// TCP host's, resolved once here), and a port.
#[derive(Debug, Clone)]
pub(super) struct Endpoint {
    pub(super) host: Host,
    pub(super) addr: Option<std::net::IpAddr>,
    pub(super) port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.host, &self.addr) {
            (Host::Tcp(h), Some(a)) if h != &a.to_string() => {
                write!(f, "host \"{h}\" ({a}), port {}", self.port)
            }
            (_, Some(a)) => write!(f, "host {a}, port {}", self.port),
            (Host::Tcp(h), None) => write!(f, "host \"{h}\", port {}", self.port),
            #[cfg(unix)]
            (Host::Unix(p), None) => write!(
                f,
                "socket directory \"{}\", port {}",
                p.display(),
                self.port
            ),
        }
    }
}

/// Every endpoint of `config`, in its order, each TCP host name resolved to its addresses (so
/// the probe and the connection reach the same address).
pub(super) fn endpoints(config: &Config) -> Result<Vec<Endpoint>, RemoteError> {
    use std::net::ToSocketAddrs;
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    let ports = config.get_ports();
    if !addrs.is_empty() && addrs.len() != hosts.len() {
        return Err(RemoteError::permanent(format!(
            "number of hosts ({}) is different from number of hostaddrs ({})",
            hosts.len(),
            addrs.len()
        )));
    }
    if ports.len() > 1 && ports.len() != hosts.len() {
        return Err(RemoteError::permanent("invalid number of ports"));
    }
    let mut out = Vec::new();
    let mut unresolved = None;
    for (i, host) in hosts.iter().enumerate() {
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        match (host, addrs.get(i)) {
            (_, Some(addr)) => out.push(Endpoint {
                host: host.clone(),
                addr: Some(*addr),
                port,
            }),
            (Host::Tcp(name), None) => match (name.as_str(), port).to_socket_addrs() {
                Ok(resolved) => out.extend(resolved.map(|a| Endpoint {
                    host: host.clone(),
                    addr: Some(a.ip()),
                    port,
                })),
                Err(e) => unresolved = Some(format!("could not resolve host \"{name}\": {e}")),
            },
            #[cfg(unix)]
            (Host::Unix(_), None) => out.push(Endpoint {
                host: host.clone(),
                addr: None,
                port,
            }),
        }
    }
    if out.is_empty() {
        return Err(RemoteError::transient(
            unresolved.unwrap_or_else(|| "no host to connect to".to_string()),
        )
        .context("could not connect to the remote server"));
    }
    Ok(out)
}

/// The client configuration of one endpoint: the probe's keywords, the endpoint, our defaults;
/// with the password for the connection itself, without it (and without `options`, whose
/// settings a probe has no business applying) for the probe.
pub(super) fn endpoint_config(
    target: &Target,
    probe: &PasswordProbe,
    endpoint: &Endpoint,
    with_password: bool,
) -> Result<Config, RemoteError> {
    let text = probe
        .keywords
        .iter()
        .filter(|(k, _)| with_password || k != "options")
        .map(|(k, v)| format!("{k}={}", quote_value(v)))
        .collect::<Vec<_>>()
        .join(" ");
    let mut config = Config::from_str(&text).map_err(|e| {
        RemoteError::permanent(format!(
            "invalid remote connection string: {}",
            error_chain(&e)
        ))
    })?;
    match &endpoint.host {
        Host::Tcp(h) => {
            config.host(h);
        }
        #[cfg(unix)]
        Host::Unix(p) => {
            config.host_path(p);
        }
    }
    if let Some(addr) = endpoint.addr {
        config.hostaddr(addr);
    }
    config.port(endpoint.port);
    if with_password {
        config.password(&probe.password);
        apply_defaults(&mut config, &target.tls, &probe.application_name);
    } else {
        apply_defaults(&mut config, &target.tls, PROBE_APPLICATION_NAME);
    }
    Ok(config)
}

/// The application name of a password probe's connection.
pub(super) const PROBE_APPLICATION_NAME: &str = "pg_tide password check";

/// True if the client gave up because the server asked for a password it was not given:
/// proof that the server requires one. (The server logs nothing: a client that hangs up when
/// asked for a password is how psql finds out whether to prompt for one.)
pub(super) fn asked_for_password(e: &postgres::Error) -> bool {
    // The client's `Error::config("password missing")`: kind "invalid configuration", and
    // the reason as its source.
    e.as_db_error().is_none()
        && e.to_string() == "invalid configuration"
        && std::error::Error::source(e).is_some_and(|s| s.to_string() == "password missing")
}

/// Connect so that the connection is known to have used its password, as postgres_fdw
/// requires of a non-superuser's (`PQconnectionUsedPassword`; the `postgres` client does not
/// say whether it sent one). For each endpoint in turn (host names resolved once, so both
/// attempts reach the same address): first a probe with the same options but no password —
/// the server must ask for one, which ends the probe before it logs in; then, at that same
/// endpoint, the connection with the password. A server that lets the probe in (trust, peer,
/// ident, a client certificate) refuses the whole connection ([`PASSWORD_REQUIRED`]), whichever
/// endpoint it is; any other failure moves on to the next endpoint, as the client does.
pub(super) fn connect_using_password(
    target: &Target,
    probe: &PasswordProbe,
) -> Result<(Client, Option<MakeTlsConnector>), RemoteError> {
    let mut last = None;
    for endpoint in endpoints(&target.config)? {
        let failure = Arc::new(Mutex::new(None));
        let probe_config = endpoint_config(target, probe, &endpoint, false)?;
        match open(&probe_config, &target.tls, &failure) {
            Ok((client, _)) => {
                drop(client);
                return Err(password_not_requested(&target.config, &endpoint));
            }
            Err(OpenError::Client(e)) if asked_for_password(&e) => {
                let config = endpoint_config(target, probe, &endpoint, true)?;
                let failure = Arc::new(Mutex::new(None));
                match open(&config, &target.tls, &failure) {
                    Ok(opened) => return Ok(opened),
                    Err(e) => last = Some(open_error(e, target, &failure)),
                }
            }
            Err(e) => last = Some(open_error(e, target, &failure)),
        }
    }
    Err(last.unwrap_or_else(|| {
        RemoteError::transient("no host to connect to")
            .context("could not connect to the remote server")
    }))
}

/// "password is required": the remote let a connection without a password in.
pub(super) fn password_not_requested(config: &Config, endpoint: &Endpoint) -> RemoteError {
    let user = config.get_user().unwrap_or_default();
    let mut e = RemoteError::permanent("password is required").with_hint(
        "Change the remote server's authentication method for that user (pg_hba.conf) to one \
         that asks for the password (scram-sha-256, md5), or map to a user it asks a password \
         of (ALTER USER MAPPING ... OPTIONS (SET user '...', SET password '...')); or a superuser \
         sets password_required 'false' in the user mapping.",
    );
    e.own = Some(Box::new(OwnCode {
        sqlstate: PASSWORD_REQUIRED,
        detail: format!(
            "The remote server ({endpoint}) did not ask for the password of user \"{user}\": a \
         pipeline owned by a role that is no superuser must log in with its user mapping's \
         password, as postgres_fdw requires."
        ),
    }));
    e
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
        open: None,
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
    if let Work::Transaction(_, Some(part)) = &request.work {
        if part.continues {
            return continue_part(conn, request, *part, shared);
        }
    }
    let prelude = match request.work {
        Work::Transaction(..) => format!("BEGIN; SET LOCAL statement_timeout = {timeout_ms}"),
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
        if matches!(request.work, Work::Transaction(..)) && c.open.take().is_some() {
            // A transaction a failed caller left open: never let its parts commit with this one.
            if let Err(e) = c.client.batch_execute("ROLLBACK") {
                discard(conn, shared);
                return Err(RemoteError::from_pg(&e));
            }
        }
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
    match &request.work {
        Work::Query(stmt) => {
            let Some(c) = conn.as_mut() else {
                return Err(RemoteError::transient("no remote connection")); // unreachable
            };
            match run_statement(c, stmt) {
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
            }
        }
        Work::Transaction(stmts, part) => run_transaction(conn, request.seq, stmts, *part, shared),
    }
}

/// The rest of a request that continues a transaction an earlier [`Part`] left open.
fn continue_part(
    conn: &mut Option<Conn>,
    request: &Request,
    part: Part,
    shared: &Shared,
) -> Result<Vec<Rows>, RemoteError> {
    let Work::Transaction(stmts, _) = &request.work else {
        return Err(RemoteError::permanent(
            "internal error: a query sent as a part",
        )); // unreachable
    };
    let open = conn
        .as_ref()
        .is_some_and(|c| c.alive() && c.open == Some(part.id));
    if !open {
        if conn.as_ref().is_some_and(|c| c.open.is_some()) {
            roll_back(conn, shared, true);
        }
        return Err(RemoteError::transient(
            "the remote transaction this batch began was lost with its connection; the batch is sent again",
        ));
    }
    if is_abandoned(shared, request.seq) {
        return Err(abandoned_error());
    }
    run_transaction(conn, request.seq, stmts, Some(part), shared)
}

/// Run `stmts` in the transaction the prelude began (or a [`Part`] continues), then commit it,
/// or leave it open when `part` says so.
fn run_transaction(
    conn: &mut Option<Conn>,
    seq: u64,
    stmts: &[RemoteStep],
    part: Option<Part>,
    shared: &Shared,
) -> Result<Vec<Rows>, RemoteError> {
    let mut results = Vec::with_capacity(stmts.len());
    for stmt in stmts {
        if is_abandoned(shared, seq) {
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
    if let Some(p) = part.filter(|p| !p.commit) {
        if is_abandoned(shared, seq) {
            discard(conn, shared);
            return Err(abandoned_error());
        }
        if let Some(c) = conn.as_mut() {
            c.open = Some(p.id);
        }
        return Ok(results);
    }
    {
        let mut ctl = lock(&shared.ctl);
        if ctl.abandoned >= seq {
            drop(ctl);
            discard(conn, shared);
            return Err(abandoned_error());
        }
        ctl.committing = true;
    }
    let Some(c) = conn.as_mut() else {
        return Err(RemoteError::transient("no remote connection")); // unreachable
    };
    c.open = None;
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
    probe_password: bool,
    requests: Receiver<Request>,
    replies: Sender<Reply>,
    shared: &Shared,
) {
    block_signals();
    let target = catch_unwind(AssertUnwindSafe(|| {
        build_config_for(conninfo, application_name, probe_password)
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
