//! Connection strings: libpq's keywords, parsing and quoting, and the `postgres` client
//! configuration (with TLS) built from them.

use super::*;

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
}

/// Turn the caller's conninfo into a client configuration and TLS options: keep what the
/// `postgres` crate understands, take the TLS options (see [`tls`]), ignore libpq keywords
/// without effect here (GSS, client_encoding, ...), refuse what cannot be honoured
/// (`service`, ...), and apply our defaults (connect timeout, keepalives, TCP user timeout,
/// default host, application name).
///
/// A `postgresql://` URI may only use the keywords of the `postgres` crate (so of TLS only
/// `sslmode`, and that only `disable`, `prefer` or `require`).
pub(super) fn build_config(conninfo: &str, application_name: &str) -> Result<Target, RemoteError> {
    let trimmed = conninfo.trim();
    let mut tls = TlsOptions::default();
    let mut config = if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
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
    Ok(Target { config, tls })
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

/// The conninfo of a foreign server for a role: the server's options, then the options of the
/// role's user mapping (or of the `public` one), as postgres_fdw combines them. Runs SPI, so
/// only on the backend's main thread.
pub fn conninfo_for_server(server: &str, role: &str) -> crate::error::TideResult<String> {
    let rows = crate::sql::text_rows(
        "SELECT o.k, o.v FROM (
             SELECT split_part(x, '=', 1) AS k, substr(x, length(split_part(x, '=', 1)) + 2) AS v
               FROM pg_foreign_server s, unnest(s.srvoptions) x WHERE s.srvname = $1
             UNION ALL
             SELECT split_part(x, '=', 1), substr(x, length(split_part(x, '=', 1)) + 2)
               FROM pg_user_mappings m, unnest(m.umoptions) x
              WHERE m.srvname = $1 AND m.umid = (
                    SELECT m2.umid FROM pg_user_mappings m2
                     WHERE m2.srvname = $1 AND (m2.usename = $2 OR m2.usename = 'public')
                     ORDER BY m2.usename = 'public' LIMIT 1)
         ) o",
        &[Some(server), Some(role)],
        0,
        false,
    )?;
    let opts: Vec<(String, String)> = rows
        .into_iter()
        .filter_map(|r| {
            let mut r = r.into_iter();
            Some((r.next().flatten()?, r.next().flatten().unwrap_or_default()))
        })
        .collect();
    Ok(conninfo_from_options(&opts))
}
