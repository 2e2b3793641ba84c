//! Connection strings: libpq's keywords, parsing and quoting, and the `postgres` client
//! configuration (with TLS) built from them.

use super::*;
use crate::error::{TideError, TideResult};
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::{pg_guard, pg_sys};
use tide_core::remote_auth::{self, Refusal, Roles};

/// Every keyword libpq (PostgreSQL 15–18) accepts in a connection string.
pub(super) const LIBPQ_KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "sslnegotiation",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "sslkeylogfile",
    "requirepeer",
    "require_auth",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "min_protocol_version",
    "max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
    "oauth_issuer",
    "oauth_client_id",
    "oauth_client_secret",
    "oauth_scope",
];

/// Keywords the `postgres` crate understands, passed through unchanged.
pub(super) const CLIENT_KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "options",
    "application_name",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// libpq keywords whose meaning this client cannot honour and that would weaken security or
/// change the target if silently ignored: refused.
pub(super) const REFUSED_KEYWORDS: &[&str] =
    &["service", "replication", "require_auth", "requirepeer"];

/// Quote a conninfo value: `'...'` with `\` and `'` backslash-escaped.
pub(super) fn quote_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        if c == '\\' || c == '\'' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

/// Build a conninfo string from `key=value` option pairs (foreign server options + user mapping
/// options, as postgres_fdw stores them: host, port, dbname, user, password, sslmode, ...),
/// quoting values correctly ('...' with \\ and \' escaped). Ignores options libpq does not
/// know that postgres_fdw adds (use_remote_estimate, fetch_size, updatable, truncatable, ...).
///
/// A key given twice keeps its position of first appearance and its last value (pass server
/// options first, then user mapping options, as postgres_fdw does). Every value is quoted, so
/// empty values and values with spaces survive.
pub fn conninfo_from_options(opts: &[(String, String)]) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut values: HashMap<&str, &str> = HashMap::new();
    for (key, value) in opts {
        let key = key.as_str();
        if !LIBPQ_KEYWORDS.contains(&key) {
            continue;
        }
        if values.insert(key, value.as_str()).is_none() {
            order.push(key);
        }
    }
    order
        .iter()
        .filter_map(|key| {
            values
                .get(key)
                .map(|value| format!("{key}={}", quote_value(value)))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Parse a libpq `key=value` connection string (values bare, or single-quoted with
/// backslash escapes; whitespace around `=` allowed).
pub(super) fn parse_conninfo(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut it = s.chars().peekable();
    loop {
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.peek().is_none() {
            return Ok(pairs);
        }
        let mut key = String::new();
        while let Some(c) = it.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        if it.next() != Some('=') {
            return Err(format!(
                "missing \"=\" after \"{key}\" in connection string"
            ));
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if it.next_if_eq(&'\'').is_some() {
            loop {
                match it.next() {
                    None => return Err(format!("unterminated quoted string for \"{key}\"")),
                    Some('\'') => break,
                    Some('\\') => {
                        if let Some(c) = it.next() {
                            value.push(c);
                        }
                    }
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = it.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(escaped) = it.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return Err(format!("missing value for \"{key}\" in connection string"));
            }
        }
        pairs.push((key, value));
    }
}

/// Where and how to connect: the client configuration and the TLS options.
#[derive(Debug)]
pub(super) struct Target {
    /// The client configuration (its `ssl_mode` is the first attempt's).
    pub(super) config: Config,
    /// libpq's TLS options.
    pub(super) tls: TlsOptions,
    /// Set when the connection must be seen to use its password (see [`RemoteAccess`]).
    pub(super) probe: Option<PasswordProbe>,
}

/// What a connection that must use its password is built from, one endpoint (host and
/// address) at a time: see `sink_thread::connect`.
pub(super) struct PasswordProbe {
    /// The client keywords of the conninfo except `host`, `hostaddr`, `port` and `password`.
    pub(super) keywords: Vec<(String, String)>,
    /// The password.
    pub(super) password: String,
    /// The application name of the real connection.
    pub(super) application_name: String,
}

impl fmt::Debug for PasswordProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password.
        f.debug_struct("PasswordProbe")
            .field(
                "keywords",
                &self.keywords.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// What the remote sink connects with: the conninfo, and whether the remote must be seen to
/// ask for its password (a pipeline of a role that is no superuser: postgres_fdw's
/// `password_required`). Built by [`remote_access`], which checks the rest of the rules.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteAccess {
    /// libpq-style `key=value` connection string (may hold a password: never printed).
    pub conninfo: String,
    /// Refuse a connection the remote lets in without asking for the password.
    pub probe_password: bool,
}

impl fmt::Debug for RemoteAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteAccess")
            .field("probe_password", &self.probe_password)
            .finish_non_exhaustive()
    }
}

/// `access` with the server setting `name = value` added to its connection's `options` (after
/// the server's own, so it wins), as `options='-c name=value'` sets it for the remote session.
/// A conninfo that is not `key=value` pairs (a URI, which [`remote_access`] never makes) is
/// left as it is.
pub fn with_session_setting(mut access: RemoteAccess, name: &str, value: &str) -> RemoteAccess {
    let Ok(pairs) = parse_conninfo(access.conninfo.trim()) else {
        return access;
    };
    let setting = format!("-c {name}={value}");
    let mut out: Vec<String> = Vec::new();
    let mut options: Option<String> = None;
    for (k, v) in pairs {
        if k == "options" {
            options = Some(v);
        } else {
            out.push(format!("{k}={}", quote_value(&v)));
        }
    }
    let options = match options {
        Some(o) if !o.trim().is_empty() => format!("{o} {setting}"),
        _ => setting,
    };
    out.push(format!("options={}", quote_value(&options)));
    access.conninfo = out.join(" ");
    access
}

/// Turn the caller's conninfo into a client configuration and TLS options: keep what the
/// `postgres` crate understands, take the TLS options (see [`tls`]), ignore libpq keywords
/// without effect here (GSS, client_encoding, ...), refuse what cannot be honoured
/// (`service`, ...), and apply our defaults (connect timeout, keepalives, TCP user timeout,
/// default host, application name).
///
/// A `postgresql://` URI may only use the keywords of the `postgres` crate (so of TLS only
/// `sslmode`, and that only `disable`, `prefer` or `require`).
#[cfg(test)]
pub(super) fn build_config(conninfo: &str, application_name: &str) -> Result<Target, RemoteError> {
    build_config_for(conninfo, application_name, false)
}

/// [`build_config`], for a connection that must be seen to use its password when
/// `probe_password` (then `conninfo` must be `key=value` pairs, which [`remote_access`] makes).
pub(super) fn build_config_for(
    conninfo: &str,
    application_name: &str,
    probe_password: bool,
) -> Result<Target, RemoteError> {
    let trimmed = conninfo.trim();
    let mut tls = TlsOptions::default();
    let mut probe_keywords: Vec<(String, String)> = Vec::new();
    let mut password = String::new();
    let mut config = if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        if probe_password {
            return Err(RemoteError::permanent(
                "a connection that must use its password needs key=value connection options, not a URI",
            ));
        }
        let config = Config::from_str(trimmed).map_err(|e| {
            RemoteError::permanent(format!(
                "invalid remote connection URI: {}",
                error_chain(&e)
            ))
        })?;
        tls = TlsOptions::from_client_mode(config.get_ssl_mode());
        config
    } else {
        let pairs = parse_conninfo(trimmed).map_err(RemoteError::permanent)?;
        // Last value wins, as in libpq (the client would append repeated hosts instead).
        let mut order: Vec<String> = Vec::new();
        let mut values: HashMap<String, String> = HashMap::new();
        for (key, value) in pairs {
            let key = if key == "keepalives_count" {
                "keepalives_retries".to_string()
            } else {
                key
            };
            if values.insert(key.clone(), value).is_none() {
                order.push(key);
            }
        }
        let mut kept: Vec<String> = Vec::new();
        for key in &order {
            let Some(value) = values.get(key) else {
                continue;
            };
            let value = value.as_str();
            if tls.take(key, value)? {
                continue;
            }
            match key.as_str() {
                "gssencmode" if value == "require" => {
                    return Err(RemoteError::permanent(
                        "gssencmode=require is not supported by pg_tide's remote sink",
                    ))
                }
                k if CLIENT_KEYWORDS.contains(&k) => {
                    kept.push(format!("{k}={}", quote_value(value)));
                    match k {
                        "password" => password = value.to_string(),
                        "host" | "hostaddr" | "port" => {}
                        _ => probe_keywords.push((k.to_string(), value.to_string())),
                    }
                }
                k if REFUSED_KEYWORDS.contains(&k) => {
                    return Err(RemoteError::permanent(format!(
                        "connection option \"{k}\" is not supported by pg_tide's remote sink"
                    )))
                }
                k if LIBPQ_KEYWORDS.contains(&k) => {} // no effect without libpq/GSS
                k => {
                    return Err(RemoteError::permanent(format!(
                        "invalid connection option \"{k}\""
                    )))
                }
            }
        }
        Config::from_str(&kept.join(" ")).map_err(|e| {
            RemoteError::permanent(format!(
                "invalid remote connection string: {}",
                error_chain(&e)
            ))
        })?
    };
    tls.finish()?;
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        let port = config.get_ports().first().copied().unwrap_or(5432);
        config.host(&default_host(port));
    }
    if config.get_hostaddrs().is_empty()
        && config
            .get_hosts()
            .iter()
            .all(|h| !matches!(h, Host::Tcp(_)))
    {
        tls.disable(); // Unix-domain sockets only: libpq never uses TLS there
    }
    if config.get_hosts().is_empty() {
        // hostaddr alone: the client needs a name for the TLS handshake; libpq refuses to
        // verify a host name it was not given.
        if tls.mode == tls::SslMode::VerifyFull {
            return Err(RemoteError::permanent(
                "host name must be specified for a verified TLS connection (sslmode=verify-full)",
            )
            .with_hint("Set the foreign server's host option to the name in the server's certificate (hostaddr may stay, to skip the name lookup)."));
        }
        for addr in config.get_hostaddrs().to_vec() {
            config.host(&addr.to_string());
        }
    }
    apply_defaults(&mut config, &tls, application_name);
    let probe = probe_password.then(|| PasswordProbe {
        keywords: probe_keywords,
        password,
        application_name: config
            .get_application_name()
            .unwrap_or_default()
            .to_string(),
    });
    Ok(Target { config, tls, probe })
}

/// Our defaults (connect timeout, keepalives, TCP user timeout), the first attempt's TLS mode
/// and the application name.
pub(super) fn apply_defaults(config: &mut Config, tls: &TlsOptions, application_name: &str) {
    config.ssl_mode(tls.mode.client_mode());
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    if config.get_keepalives() {
        if config.get_keepalives_idle() == POSTGRES_DEFAULT_KEEPALIVES_IDLE {
            config.keepalives_idle(DEFAULT_KEEPALIVES_IDLE);
        }
        if config.get_keepalives_interval().is_none() {
            config.keepalives_interval(DEFAULT_KEEPALIVES_INTERVAL);
        }
        if config.get_keepalives_retries().is_none() {
            config.keepalives_retries(DEFAULT_KEEPALIVES_RETRIES);
        }
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(DEFAULT_TCP_USER_TIMEOUT);
    }
    if !application_name.is_empty() {
        config.application_name(application_name);
    }
    // Notices from the remote are dropped (the default handler would use the `log` crate).
    config.notice_callback(|_| {});
}

/// libpq's default when neither host nor hostaddr is given: `$PGHOST`, else the first of
/// the usual socket directories holding the server's socket, else localhost.
pub(super) fn default_host(port: u16) -> String {
    if let Ok(host) = std::env::var("PGHOST") {
        if !host.is_empty() {
            return host;
        }
    }
    for dir in ["/var/run/postgresql", "/tmp"] {
        if std::path::Path::new(&format!("{dir}/.s.PGSQL.{port}")).exists() {
            return dir.to_string();
        }
    }
    "localhost".to_string()
}

/// How a pipeline owned by `owner` connects through the postgres_fdw server `server`: its
/// conninfo (the server's options, then those of the owner's user mapping, or of the PUBLIC
/// one, as postgres_fdw combines them), with postgres_fdw's rules for a role that is no
/// superuser (see [`tide_core::remote_auth`]): the owner needs USAGE on the server (42501);
/// options naming the server's files must be a superuser's (42501); the user mapping must hold
/// a password (2F003 "password is required", as postgres_fdw says), which the remote must then
/// ask for when connecting ([`RemoteAccess::probe_password`]) — unless a superuser set
/// `password_required 'false'` on the mapping. A superuser owner connects as before.
///
/// Runs SPI, so only on the backend's main thread; called at `create_pipeline`, `add_table`,
/// `verify`, and by the worker whenever it (re)builds its connection.
pub fn remote_access(server: &str, owner: &str) -> TideResult<RemoteAccess> {
    let q = pgrx::spi::quote_identifier;
    let roles = crate::sql::text_rows(
        "SELECT (SELECT r.rolsuper FROM pg_roles r WHERE r.oid = s.srvowner)::text,
                (SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = $2)::text
           FROM pg_foreign_server s WHERE s.srvname = $1",
        &[Some(server), Some(owner)],
        1,
        false,
    )?;
    let Some(row) = roles.into_iter().next() else {
        return Err(TideError::undefined(format!(
            "foreign server \"{server}\" does not exist"
        ))
        .hint(format!(
            "CREATE SERVER {} FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '...', port '5432', dbname '...');",
            q(server)
        )));
    };
    let flag = |i: usize| row.get(i).cloned().flatten().as_deref() == Some("true");
    let roles = Roles {
        server_owner_superuser: flag(0),
        owner_superuser: flag(1),
    };
    crate::security::require_server_usage(server, owner)?;
    let rows = crate::sql::text_rows(
        "SELECT o.origin, o.k, o.v FROM (
             SELECT 's' AS origin, split_part(x, '=', 1) AS k, substr(x, length(split_part(x, '=', 1)) + 2) AS v
               FROM pg_foreign_server s, unnest(s.srvoptions) x WHERE s.srvname = $1
             UNION ALL
             SELECT 'm', split_part(x, '=', 1), substr(x, length(split_part(x, '=', 1)) + 2)
               FROM pg_user_mappings m, unnest(m.umoptions) x
              WHERE m.srvname = $1 AND m.umid = (
                    SELECT m2.umid FROM pg_user_mappings m2
                     WHERE m2.srvname = $1 AND (m2.usename = $2 OR m2.usename = 'public')
                     ORDER BY m2.usename = 'public' LIMIT 1)
         ) o",
        &[Some(server), Some(owner)],
        0,
        false,
    )?;
    let mut server_opts: Vec<(String, String)> = Vec::new();
    let mut mapping_opts: Vec<(String, String)> = Vec::new();
    for r in rows {
        let mut r = r.into_iter();
        let (Some(origin), Some(k)) = (r.next().flatten(), r.next().flatten()) else {
            continue;
        };
        let v = r.next().flatten().unwrap_or_default();
        if origin == "s" {
            server_opts.push((k, v));
        } else {
            mapping_opts.push((k, v));
        }
    }
    let access = remote_auth::check(roles, &server_opts, &mapping_opts).map_err(|refusal| {
        match refusal {
            Refusal::PasswordMissing => TideError::new(
                PgSqlErrorCode::ERRCODE_S_R_E_PROHIBITED_SQL_STATEMENT_ATTEMPTED,
                "password is required",
            )
            .detail(format!(
                "Non-superusers must provide a password in the user mapping: role \"{owner}\" is no superuser, and its user mapping for server \"{server}\" (or PUBLIC's) has no password."
            ))
            .hint(format!(
                "ALTER USER MAPPING FOR {} SERVER {} OPTIONS (ADD password '...'); the remote must ask for it (pg_hba.conf: scram-sha-256 or md5). Or a superuser waives it for this mapping: ALTER USER MAPPING ... OPTIONS (ADD password_required 'false').",
                q(owner),
                q(server)
            )),
            Refusal::FileOption { key, from_mapping } => {
                let (place, fix) = if from_mapping {
                    (
                        format!("the user mapping of role \"{owner}\" for server \"{server}\""),
                        format!("ALTER USER MAPPING FOR {} SERVER {} OPTIONS (DROP {key});", q(owner), q(server)),
                    )
                } else {
                    (
                        format!("foreign server \"{server}\", whose owner is no superuser,"),
                        format!("ALTER SERVER {} OPTIONS (DROP {key}); or have a superuser own the server (ALTER SERVER {} OWNER TO ...).", q(server), q(server)),
                    )
                };
                TideError::privilege(format!(
                    "option \"{key}\" of {place} names a file of the database server, which only a superuser may choose for role \"{owner}\""
                ))
                .hint(format!(
                    "Files of the server (sslcert, sslkey, sslrootcert, sslcrl, sslcrldir, passfile, service, sslkeylogfile) may be named by a server a superuser owns (sslcert and sslkey also by a user mapping a superuser made). {fix}"
                ))
            }
        }
    })?;
    let mut opts = server_opts;
    opts.extend(mapping_opts);
    Ok(RemoteAccess {
        conninfo: conninfo_from_options(&opts),
        probe_password: access.probe_password,
    })
}

/// The error of a connection the sink refused itself ([`PASSWORD_REQUIRED`]: the remote let it
/// in without asking for the password), with its own SQLSTATE, detail and hint; `None` for
/// every other remote error.
pub fn refusal_error(e: &RemoteError) -> Option<TideError> {
    let own = e.own.as_ref().filter(|o| o.sqlstate == PASSWORD_REQUIRED)?;
    let mut err = TideError::new(
        PgSqlErrorCode::ERRCODE_S_R_E_PROHIBITED_SQL_STATEMENT_ATTEMPTED,
        e.message.clone(),
    )
    .detail(own.detail.clone());
    if let Some(h) = &e.hint {
        err = err.hint(h.clone());
    }
    Some(err)
}

/// Set (on the main thread) when a foreign server, a user mapping or a role changed: the
/// worker rebuilds its remote connection, checking the rules again (postgres_fdw drops its
/// connections on the same invalidations).
static OPTIONS_CHANGED: AtomicBool = AtomicBool::new(false);
static WATCHING: AtomicBool = AtomicBool::new(false);

#[pg_guard]
unsafe extern "C-unwind" fn options_invalidated(
    _arg: pg_sys::Datum,
    _cacheid: std::ffi::c_int,
    _hashvalue: u32,
) {
    OPTIONS_CHANGED.store(true, Ordering::SeqCst);
}

/// Watch foreign servers, user mappings and roles for changes (once per process; in a
/// backend, on its main thread). Call before reading the options, so no change is missed.
pub fn watch_remote_options() {
    if WATCHING.swap(true, Ordering::SeqCst) {
        return;
    }
    for cache in [
        pg_sys::SysCacheIdentifier::FOREIGNSERVEROID,
        pg_sys::SysCacheIdentifier::USERMAPPINGOID,
        pg_sys::SysCacheIdentifier::AUTHOID,
    ] {
        // SAFETY: called on the backend's main thread; the callback only sets an atomic.
        unsafe {
            pg_sys::CacheRegisterSyscacheCallback(
                cache as std::ffi::c_int,
                Some(options_invalidated),
                pg_sys::Datum::from(0),
            );
        }
    }
}

/// True (once) if a foreign server, user mapping or role changed since the last call.
pub fn take_options_changed() -> bool {
    OPTIONS_CHANGED.swap(false, Ordering::SeqCst)
}
