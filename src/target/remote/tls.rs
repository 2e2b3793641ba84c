//! TLS for the remote sink: libpq's `ssl*` connection options, read from the conninfo and turned
//! into an OpenSSL connector for the `postgres` client (`postgres-openssl`).
//!
//! What this module owns: the parsed TLS options of one conninfo ([`TlsOptions`]), the connector
//! built from them for each connection attempt (files are read then, so replaced certificates
//! are picked up on reconnect), and the messages and hints of TLS failures.
//!
//! Semantics follow libpq (PostgreSQL 15–18):
//! - `sslmode`: `disable`; `allow` (clear text, and TLS only if the server refuses the clear
//!   connection); `prefer` (TLS if the server supports it, else clear text); `require` (TLS; the
//!   certificate is verified only if a root certificate is available, as with libpq);
//!   `verify-ca` (chain checked against the root certificate); `verify-full` (chain and host
//!   name: the `host` option against the certificate's subjectAltName, or its CN when it has no
//!   DNS names).
//! - `sslrootcert` (default `~/.postgresql/root.crt` of the server's OS user, used when it
//!   exists), or `system` for OpenSSL's default trust store (only with `verify-full`, the default
//!   sslmode then); `sslcrl`, `sslcrldir` (default `~/.postgresql/root.crl`); `sslcert`, `sslkey`
//!   (default `~/.postgresql/postgresql.crt` / `.key`), `sslpassword` for an encrypted key, with
//!   libpq's key file permission rule; `sslcertmode` `disable`/`allow`; `sslsni`;
//!   `ssl_min_protocol_version` (default TLSv1.2) and `ssl_max_protocol_version`.
//!
//! Differences from libpq, each stricter:
//! - a file named explicitly (`sslrootcert`, `sslcrl`, `sslcrldir`, `sslcert`) must exist;
//!   libpq silently goes without a missing one unless the sslmode needs it;
//! - `prefer` falls back to clear text only when the server answers that it does not support
//!   TLS; libpq also retries in clear text when the TLS handshake fails (for example a
//!   certificate that does not verify against `sslrootcert`) or the server refuses the
//!   encrypted session: here those are errors;
//! - `sslcertmode=require` and engine keys (`sslkey=engine:...`) are refused.
//!
//! Relative file names are relative to the server's data directory (the process's working
//! directory), as for postgres_fdw. Everything here runs on the sink thread and never calls
//! PostgreSQL.

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openssl::nid::Nid;
use openssl::pkey::PKey;
use openssl::ssl::{
    SslConnector, SslConnectorBuilder, SslFiletype, SslMethod, SslVerifyMode, SslVersion,
};
use openssl::x509::store::{X509Lookup, X509StoreBuilder};
use openssl::x509::verify::X509VerifyFlags;
use openssl::x509::{X509Ref, X509StoreContextRef, X509};
use postgres::config::SslMode as ClientSslMode;
use postgres_openssl::MakeTlsConnector;

use super::{error_chain, RemoteError};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Option<SslMode> {
        Some(match value {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// The keyword, for messages.
    pub(super) fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// The `postgres` client's mode for the first connection attempt (`allow` starts in clear
    /// text; verification is the connector's business).
    pub(super) fn client_mode(self) -> ClientSslMode {
        match self {
            SslMode::Disable | SslMode::Allow => ClientSslMode::Disable,
            SslMode::Prefer => ClientSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => ClientSslMode::Require,
        }
    }

    fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

/// The TLS options of a conninfo.
#[derive(Clone)]
pub(super) struct TlsOptions {
    /// `sslmode` (default `prefer`, or `verify-full` with `sslrootcert=system`).
    pub(super) mode: SslMode,
    /// Whether `sslmode` was given.
    mode_given: bool,
    /// `sslrootcert`: a file, or `system`.
    rootcert: Option<String>,
    /// `sslcrl`.
    crl: Option<String>,
    /// `sslcrldir`.
    crldir: Option<String>,
    /// `sslcert`.
    cert: Option<String>,
    /// `sslkey`.
    key: Option<String>,
    /// `sslpassword` (never printed).
    password: Option<String>,
    /// False for `sslcertmode=disable`: send no client certificate.
    send_cert: bool,
    /// `sslsni` (libpq: SNI only when it is "1", the default; never for an IP address).
    sni: bool,
    /// `ssl_min_protocol_version` (default TLSv1.2, as libpq's).
    min_version: Option<SslVersion>,
    /// `ssl_max_protocol_version`.
    max_version: Option<SslVersion>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("mode", &self.mode)
            .field("rootcert", &self.rootcert)
            .field("crl", &self.crl)
            .field("crldir", &self.crldir)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("password", &self.password.as_ref().map(|_| "(redacted)"))
            .field("send_cert", &self.send_cert)
            .field("sni", &self.sni)
            .field("min_version", &self.min_version)
            .field("max_version", &self.max_version)
            .finish_non_exhaustive()
    }
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            mode: SslMode::Prefer,
            mode_given: false,
            rootcert: None,
            crl: None,
            crldir: None,
            cert: None,
            key: None,
            password: None,
            send_cert: true,
            sni: true,
            min_version: Some(SslVersion::TLS1_2),
            max_version: None,
        }
    }
}

/// A protocol version name as libpq takes it (case-insensitive); `None` = no bound.
fn protocol_version(key: &str, value: &str) -> Result<Option<SslVersion>, RemoteError> {
    Ok(Some(match value.to_ascii_lowercase().as_str() {
        "" => return Ok(None),
        "tlsv1" => SslVersion::TLS1,
        "tlsv1.1" => SslVersion::TLS1_1,
        "tlsv1.2" => SslVersion::TLS1_2,
        "tlsv1.3" => SslVersion::TLS1_3,
        _ => {
            return Err(
                RemoteError::permanent(format!("invalid {key} value: \"{value}\""))
                    .with_hint("Use TLSv1, TLSv1.1, TLSv1.2 or TLSv1.3."),
            )
        }
    }))
}

/// Rank of a protocol version, for comparing bounds.
fn version_rank(v: SslVersion) -> u8 {
    [
        SslVersion::TLS1,
        SslVersion::TLS1_1,
        SslVersion::TLS1_2,
        SslVersion::TLS1_3,
    ]
    .iter()
    .position(|x| *x == v)
    .map_or(0, |i| i as u8 + 1)
}

/// A file option's value; empty means "not set", as in libpq.
fn file_value(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_string())
}

impl TlsOptions {
    /// Take one conninfo keyword if it is a TLS option this module handles; false otherwise.
    pub(super) fn take(&mut self, key: &str, value: &str) -> Result<bool, RemoteError> {
        match key {
            "sslmode" => {
                self.mode = SslMode::parse(value).ok_or_else(|| {
                    RemoteError::permanent(format!("invalid sslmode value: \"{value}\""))
                        .with_hint("Use disable, allow, prefer, require, verify-ca or verify-full.")
                })?;
                self.mode_given = true;
            }
            "sslrootcert" => self.rootcert = file_value(value),
            "sslcrl" => self.crl = file_value(value),
            "sslcrldir" => self.crldir = file_value(value),
            "sslcert" => self.cert = file_value(value),
            "sslkey" => {
                if value.starts_with("engine:") {
                    return Err(RemoteError::permanent(
                        "sslkey with an OpenSSL engine (\"engine:...\") is not supported by \
                         pg_tide's remote sink",
                    )
                    .with_hint("Name a PEM key file."));
                }
                self.key = file_value(value);
            }
            "sslpassword" => self.password = Some(value.to_string()),
            "sslsni" => self.sni = value == "1",
            "sslcertmode" => match value {
                "disable" => self.send_cert = false,
                "allow" => self.send_cert = true,
                "require" => {
                    return Err(RemoteError::permanent(
                        "sslcertmode=require is not supported by pg_tide's remote sink",
                    )
                    .with_hint(
                        "Use sslcertmode=allow (the default): a client certificate, if \
                                configured, is sent when the server asks for one.",
                    ))
                }
                _ => {
                    return Err(RemoteError::permanent(format!(
                        "invalid sslcertmode value: \"{value}\""
                    )))
                }
            },
            "ssl_min_protocol_version" => self.min_version = protocol_version(key, value)?,
            "ssl_max_protocol_version" => self.max_version = protocol_version(key, value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Options from the `postgres` client's own mode (a `postgresql://` URI: its other TLS
    /// options cannot be given there).
    pub(super) fn from_client_mode(mode: ClientSslMode) -> TlsOptions {
        TlsOptions {
            mode: match mode {
                ClientSslMode::Disable => SslMode::Disable,
                ClientSslMode::Require => SslMode::Require,
                _ => SslMode::Prefer,
            },
            mode_given: true,
            ..TlsOptions::default()
        }
    }

    /// Check the combination once every option is known (libpq's rules), and settle the
    /// default sslmode.
    pub(super) fn finish(&mut self) -> Result<(), RemoteError> {
        if self.rootcert.as_deref() == Some("system") {
            if !self.mode_given {
                self.mode = SslMode::VerifyFull;
            } else if self.mode != SslMode::VerifyFull {
                return Err(RemoteError::permanent(format!(
                    "weak sslmode \"{}\" may not be used with sslrootcert=system",
                    self.mode.name()
                ))
                .with_hint("Use sslmode=verify-full with the system's trusted roots."));
            }
        }
        if let (Some(min), Some(max)) = (self.min_version, self.max_version) {
            if version_rank(min) > version_rank(max) {
                return Err(RemoteError::permanent(
                    "invalid SSL protocol version range: ssl_min_protocol_version is above \
                     ssl_max_protocol_version",
                ));
            }
        }
        Ok(())
    }

    /// Connections over Unix-domain sockets never use TLS (libpq ignores sslmode there).
    pub(super) fn disable(&mut self) {
        self.mode = SslMode::Disable;
    }

    /// The root certificate to verify against: explicit, else libpq's default if it exists.
    fn root_source(&self) -> Result<Option<RootCerts>, RemoteError> {
        match self.rootcert.as_deref() {
            Some("system") => Ok(Some(RootCerts::System)),
            Some(path) => Ok(Some(RootCerts::File(PathBuf::from(path)))),
            None => {
                let default = home_file("root.crt");
                match default {
                    Some(path) if path.exists() => Ok(Some(RootCerts::File(path))),
                    _ if self.mode.verifies() => {
                        let shown = default.map_or_else(
                            || "~/.postgresql/root.crt".to_string(),
                            |p| p.display().to_string(),
                        );
                        Err(RemoteError::permanent(format!(
                            "root certificate file \"{shown}\" does not exist (sslmode={} needs \
                             a root certificate)",
                            self.mode.name()
                        ))
                        .with_hint(
                            "Either provide the file (the foreign server's option sslrootcert \
                             names it), use the system's trusted roots with sslrootcert=system, \
                             or change sslmode to disable server certificate verification.",
                        ))
                    }
                    _ => Ok(None),
                }
            }
        }
    }

    /// Build the TLS connector for one connection attempt (reads the files). `failure`
    /// receives the first certificate verification failure of the handshake, if any.
    pub(super) fn connector(
        &self,
        failure: &Arc<Mutex<Option<VerifyFailure>>>,
    ) -> Result<MakeTlsConnector, RemoteError> {
        let init = |e: openssl::error::ErrorStack| {
            RemoteError::permanent(format!("could not initialise TLS: {}", error_chain(&e)))
        };
        let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(init)?;
        builder
            .set_min_proto_version(self.min_version)
            .map_err(init)?;
        builder
            .set_max_proto_version(self.max_version)
            .map_err(init)?;
        let roots = self.root_source()?;
        let verify = roots.is_some();
        if let Some(roots) = &roots {
            let mut store = X509StoreBuilder::new().map_err(init)?;
            match roots {
                RootCerts::System => store.set_default_paths().map_err(init)?,
                RootCerts::File(path) => {
                    let pem = read_file("root certificate", "sslrootcert", path)?;
                    let certs = X509::stack_from_pem(&pem).map_err(|e| {
                        RemoteError::permanent(format!(
                            "could not read root certificate file \"{}\": {}",
                            path.display(),
                            error_chain(&e)
                        ))
                        .with_hint("sslrootcert must name a file of PEM certificates.")
                    })?;
                    if certs.is_empty() {
                        return Err(RemoteError::permanent(format!(
                            "root certificate file \"{}\" holds no certificate",
                            path.display()
                        ))
                        .with_hint("sslrootcert must name a file of PEM certificates."));
                    }
                    for cert in certs {
                        store.add_cert(cert).map_err(init)?;
                    }
                }
            }
            let mut crl = false;
            let crl_file = match &self.crl {
                Some(f) => Some(PathBuf::from(f)),
                None => home_file("root.crl").filter(|p| p.exists()),
            };
            if let Some(path) = crl_file {
                check_readable("certificate revocation list", "sslcrl", &path)?;
                let lookup = store.add_lookup(X509Lookup::file()).map_err(init)?;
                lookup.load_crl_file(&path, SslFiletype::PEM).map_err(|e| {
                    RemoteError::permanent(format!(
                        "could not load certificate revocation list file \"{}\": {}",
                        path.display(),
                        error_chain(&e)
                    ))
                    .with_hint(file_hint("sslcrl"))
                })?;
                crl = true;
            }
            if let Some(dir) = &self.crldir {
                let path = Path::new(dir);
                if !path.is_dir() {
                    return Err(RemoteError::permanent(format!(
                        "certificate revocation list directory \"{dir}\" does not exist or is not \
                         a directory"
                    ))
                    .with_hint(file_hint("sslcrldir")));
                }
                let lookup = store.add_lookup(X509Lookup::hash_dir()).map_err(init)?;
                lookup.add_dir(dir, SslFiletype::PEM).map_err(init)?;
                crl = true;
            }
            if crl {
                store
                    .set_flags(X509VerifyFlags::CRL_CHECK | X509VerifyFlags::CRL_CHECK_ALL)
                    .map_err(init)?;
            }
            builder.set_cert_store(store.build());
            builder.set_verify(SslVerifyMode::PEER);
        } else {
            builder.set_verify(SslVerifyMode::NONE);
        }
        if self.send_cert {
            self.load_client_cert(&mut builder)?;
        }
        let mut connector = MakeTlsConnector::new(builder.build());
        let sni = self.sni;
        let check_host = self.mode == SslMode::VerifyFull;
        let failure = Arc::clone(failure);
        connector.set_callback(move |conf, host| {
            conf.set_use_server_name_indication(sni);
            conf.set_verify_hostname(check_host);
            if verify {
                let failure = Arc::clone(&failure);
                let host = host.to_string();
                conf.set_verify_callback(SslVerifyMode::PEER, move |ok, ctx| {
                    if !ok {
                        let mut slot = failure.lock().unwrap_or_else(|p| p.into_inner());
                        if slot.is_none() {
                            *slot = Some(VerifyFailure::new(ctx, &host));
                        }
                    }
                    ok
                });
            }
            Ok(())
        });
        Ok(connector)
    }

    /// Load the client certificate and key into `builder`, if there is a certificate.
    fn load_client_cert(&self, builder: &mut SslConnectorBuilder) -> Result<(), RemoteError> {
        let cert = match &self.cert {
            Some(f) => PathBuf::from(f),
            None => match home_file("postgresql.crt") {
                Some(p) if p.exists() => p,
                _ => return Ok(()),
            },
        };
        check_readable("client certificate", "sslcert", &cert)?;
        builder.set_certificate_chain_file(&cert).map_err(|e| {
            RemoteError::permanent(format!(
                "could not load client certificate file \"{}\": {}",
                cert.display(),
                error_chain(&e)
            ))
            .with_hint(file_hint("sslcert"))
        })?;
        let key = match &self.key {
            Some(f) => PathBuf::from(f),
            None => {
                home_file("postgresql.key").unwrap_or_else(|| "~/.postgresql/postgresql.key".into())
            }
        };
        let meta = std::fs::metadata(&key).map_err(|e| {
            RemoteError::permanent(format!(
                "certificate present, but not private key file \"{}\": {e}",
                key.display()
            ))
            .with_hint("Set sslkey to the file of the client certificate's private key.")
        })?;
        if !meta.is_file() {
            return Err(RemoteError::permanent(format!(
                "private key file \"{}\" is not a regular file",
                key.display()
            )));
        }
        // libpq's rule: 0600 or less if owned by the current user, 0640 or less if by root.
        let mode = meta.mode();
        if (meta.uid() == effective_uid() && mode & 0o077 != 0)
            || (meta.uid() == 0 && mode & 0o037 != 0)
        {
            return Err(RemoteError::permanent(format!(
                "private key file \"{}\" has group or world access",
                key.display()
            ))
            .with_hint(
                "The file must have permissions u=rw (0600) or less if owned by the operating \
                 system user this server runs as, or u=rw,g=r (0640) or less if owned by root.",
            ));
        }
        let pem = read_file("private key", "sslkey", &key)?;
        let password = self.password.clone().unwrap_or_default();
        let pkey = PKey::private_key_from_pem_callback(&pem, |buf| {
            // Never prompt: an encrypted key without sslpassword fails to decrypt.
            let n = password.len().min(buf.len());
            buf[..n].copy_from_slice(&password.as_bytes()[..n]);
            Ok(n)
        })
        .map_err(|e| {
            RemoteError::permanent(format!(
                "could not load private key file \"{}\": {}",
                key.display(),
                error_chain(&e)
            ))
            .with_hint(
                "The key must be PEM; an encrypted key needs sslpassword (a user mapping option).",
            )
        })?;
        // OpenSSL refuses a key that is not the certificate's here already.
        let mismatch = || {
            RemoteError::permanent(format!(
                "certificate \"{}\" does not match private key file \"{}\"",
                cert.display(),
                key.display()
            ))
            .with_hint("sslcert and sslkey must be a certificate and its own key.")
        };
        builder.set_private_key(&pkey).map_err(|e| {
            if e.to_string().contains("key values mismatch") {
                return mismatch();
            }
            RemoteError::permanent(format!(
                "could not use private key file \"{}\": {}",
                key.display(),
                error_chain(&e)
            ))
        })?;
        builder.check_private_key().map_err(|_| mismatch())?;
        Ok(())
    }

    /// Where the server's certificate must come from, for messages.
    fn root_name(&self) -> String {
        match self.rootcert.as_deref() {
            Some("system") => "the system's trusted roots (sslrootcert=system)".to_string(),
            Some(path) => format!("sslrootcert \"{path}\""),
            None => home_file("root.crt").map_or_else(
                || "~/.postgresql/root.crt".to_string(),
                |p| format!("the default root certificate file \"{}\"", p.display()),
            ),
        }
    }
}

/// Root certificates for verification.
enum RootCerts {
    /// OpenSSL's default locations.
    System,
    /// A PEM file.
    File(PathBuf),
}

/// `~/.postgresql/<file>` for the server's OS user (libpq's default file locations).
fn home_file(file: &str) -> Option<PathBuf> {
    // $HOME, else the passwd entry of the effective user.
    let home = std::env::home_dir()?;
    Some(home.join(".postgresql").join(file))
}

/// The process's effective user id.
fn effective_uid() -> u32 {
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// The hint for a TLS file given by `option` (or its default) that cannot be used.
fn file_hint(option: &str) -> String {
    format!(
        "The file of {option} is read by the operating system user this PostgreSQL server runs \
         as (a relative name from its data directory): check the {option} option of the foreign \
         server or user mapping, and the file's permissions."
    )
}

/// A file that must exist and be readable; `option` names it.
fn check_readable(what: &str, option: &str, path: &Path) -> Result<(), RemoteError> {
    std::fs::File::open(path).map(drop).map_err(|e| {
        RemoteError::permanent(format!(
            "could not open {what} file \"{}\" ({option}): {e}",
            path.display()
        ))
        .with_hint(file_hint(option))
    })
}

/// The contents of a file that must exist and be readable; `option` names it.
fn read_file(what: &str, option: &str, path: &Path) -> Result<Vec<u8>, RemoteError> {
    std::fs::read(path).map_err(|e| {
        RemoteError::permanent(format!(
            "could not read {what} file \"{}\" ({option}): {e}",
            path.display()
        ))
        .with_hint(file_hint(option))
    })
}

// ---------------------------------------------------------------------------------------------
// Failures
// ---------------------------------------------------------------------------------------------

/// OpenSSL's `X509_V_ERR_*` codes this module explains.
mod verr {
    pub const UNABLE_TO_GET_ISSUER_CERT: i32 = 2;
    pub const UNABLE_TO_GET_CRL: i32 = 3;
    pub const CERT_NOT_YET_VALID: i32 = 9;
    pub const CERT_HAS_EXPIRED: i32 = 10;
    pub const CRL_NOT_YET_VALID: i32 = 11;
    pub const CRL_HAS_EXPIRED: i32 = 12;
    pub const DEPTH_ZERO_SELF_SIGNED_CERT: i32 = 18;
    pub const SELF_SIGNED_CERT_IN_CHAIN: i32 = 19;
    pub const UNABLE_TO_GET_ISSUER_CERT_LOCALLY: i32 = 20;
    pub const UNABLE_TO_VERIFY_LEAF_SIGNATURE: i32 = 21;
    pub const CERT_REVOKED: i32 = 23;
    pub const HOSTNAME_MISMATCH: i32 = 62;
    pub const IP_ADDRESS_MISMATCH: i32 = 64;
}

/// The first certificate verification failure of a handshake.
#[derive(Debug, Clone)]
pub(super) struct VerifyFailure {
    /// `X509_V_ERR_*`.
    code: i32,
    /// OpenSSL's text for it.
    reason: String,
    /// The host name checked (the `host` option).
    host: String,
    /// The server certificate's subject CN, and its issuer's.
    subject: String,
    issuer: String,
    /// The server certificate's DNS names and IP addresses (subjectAltName).
    names: Vec<String>,
}

#[path = "tls_verify.rs"]
mod verify;
pub(super) use verify::handshake_error;

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
