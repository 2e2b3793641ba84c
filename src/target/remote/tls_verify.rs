//! Why a TLS handshake failed, in words: the certificate a verification refused (subject,
//! issuer, names) and the error of a handshake as the pipeline shows it.

use super::*;

/// The CN of an X.509 name, or "?".
fn common_name(name: &openssl::x509::X509NameRef) -> String {
    name.entries_by_nid(Nid::COMMONNAME)
        .next()
        .and_then(|e| e.data().to_string().ok())
        .unwrap_or_else(|| "?".to_string())
}

/// subjectAltName DNS names and IP addresses of `cert`.
fn alt_names(cert: &X509Ref) -> Vec<String> {
    let Some(names) = cert.subject_alt_names() else {
        return Vec::new();
    };
    names
        .iter()
        .filter_map(|n| {
            if let Some(dns) = n.dnsname() {
                return Some(dns.to_string());
            }
            match n.ipaddress()? {
                [a, b, c, d] => Some(std::net::Ipv4Addr::new(*a, *b, *c, *d).to_string()),
                bytes if bytes.len() == 16 => {
                    let mut octets = [0u8; 16];
                    octets.copy_from_slice(bytes);
                    Some(std::net::Ipv6Addr::from(octets).to_string())
                }
                _ => None,
            }
        })
        .collect()
}

impl VerifyFailure {
    pub(super) fn new(ctx: &X509StoreContextRef, host: &str) -> VerifyFailure {
        let error = ctx.error();
        // The server's own certificate: the first of the chain built so far.
        let leaf = ctx
            .chain()
            .and_then(|chain| chain.iter().next())
            .or_else(|| ctx.current_cert());
        let (subject, issuer, names) = match leaf {
            Some(cert) => (
                common_name(cert.subject_name()),
                common_name(cert.issuer_name()),
                alt_names(cert),
            ),
            None => ("?".into(), "?".into(), Vec::new()),
        };
        VerifyFailure {
            code: error.as_raw(),
            reason: error.error_string().to_string(),
            host: host.to_string(),
            subject,
            issuer,
            names,
        }
    }

    /// The error for this failure, with a hint.
    pub(in crate::target::remote) fn error(&self, tls: &TlsOptions) -> RemoteError {
        let reason = &self.reason;
        let cert = format!(
            "the server certificate (CN \"{}\", issued by CN \"{}\")",
            self.subject, self.issuer
        );
        let (message, hint) = match self.code {
            verr::HOSTNAME_MISMATCH | verr::IP_ADDRESS_MISMATCH => {
                let mut names = String::new();
                if self.names.is_empty() {
                    let _ = write!(names, " It has no subjectAltName; its CN is \"{}\".", self.subject);
                } else {
                    let _ = write!(names, " Its subjectAltName names: {}.", self.names.join(", "));
                }
                (
                    format!(
                        "{cert} does not match host name \"{}\" (certificate verify failed: {reason})",
                        self.host
                    ),
                    format!(
                        "sslmode=verify-full checks that the certificate names the host: set the \
                         foreign server's host option to a name in the certificate's \
                         subjectAltName (or its CN when it has none), or use sslmode=verify-ca to \
                         verify the certificate chain only.{names}"
                    ),
                )
            }
            verr::UNABLE_TO_GET_ISSUER_CERT
            | verr::UNABLE_TO_GET_ISSUER_CERT_LOCALLY
            | verr::SELF_SIGNED_CERT_IN_CHAIN
            | verr::DEPTH_ZERO_SELF_SIGNED_CERT
            | verr::UNABLE_TO_VERIFY_LEAF_SIGNATURE => (
                format!(
                    "{cert} is not signed by a CA in {} (certificate verify failed: {reason})",
                    tls.root_name()
                ),
                format!(
                    "{} does not hold the CA that issued the remote server's certificate: set \
                     the foreign server's sslrootcert to that CA's certificate (a PEM file \
                     readable by the operating system user this server runs as).",
                    tls.root_name()
                ),
            ),
            verr::CERT_HAS_EXPIRED | verr::CERT_NOT_YET_VALID => (
                format!("{cert} is not valid now (certificate verify failed: {reason})"),
                "Renew the certificate on the remote server (ssl_cert_file), or check the clocks \
                 of both machines."
                    .to_string(),
            ),
            verr::CERT_REVOKED => (
                format!("{cert} is revoked (certificate verify failed: {reason})"),
                "The certificate revocation list (sslcrl, sslcrldir) lists it: give the remote \
                 server a new certificate."
                    .to_string(),
            ),
            verr::UNABLE_TO_GET_CRL | verr::CRL_HAS_EXPIRED | verr::CRL_NOT_YET_VALID => (
                format!("cannot check {cert} for revocation (certificate verify failed: {reason})"),
                "With sslcrl or sslcrldir (or ~/.postgresql/root.crl), every CA of the chain needs \
                 a current revocation list there."
                    .to_string(),
            ),
            _ => (
                format!("{cert} could not be verified (certificate verify failed: {reason})"),
                format!(
                    "Check {} and the remote server's certificate (ssl_cert_file).",
                    tls.root_name()
                ),
            ),
        };
        RemoteError::permanent(format!("could not connect to the remote server: {message}"))
            .with_hint(hint)
    }
}

/// The error for a failed TLS handshake that is not a verification failure: permanent unless
/// the connection broke underneath (then a retry may do).
pub(in crate::target::remote) fn handshake_error(
    e: &postgres::Error,
    tls: &TlsOptions,
) -> RemoteError {
    let text = error_chain(e);
    if text.contains("server does not support TLS") {
        return RemoteError::permanent(format!(
            "could not connect to the remote server: the server does not support TLS, but \
             sslmode={} requires it",
            tls.mode.name()
        ))
        .with_hint(
            "Turn TLS on at the remote server (ssl = on, with ssl_cert_file and ssl_key_file), \
             or, on a network you trust, use sslmode=prefer or sslmode=disable.",
        );
    }
    let detail = text
        .strip_prefix("error performing TLS handshake: ")
        .unwrap_or(&text);
    let message = format!("could not connect to the remote server: TLS handshake failed: {detail}");
    if connection_broke(e) {
        return RemoteError::transient(message);
    }
    RemoteError::permanent(message).with_hint(
        "Check the foreign server's ssl* options against the remote server's TLS settings \
         (ssl_min_protocol_version, ssl_ciphers, its certificate).",
    )
}

/// True if a TLS error came from the connection breaking (I/O error, unexpected EOF) rather
/// than from the TLS protocol itself.
fn connection_broke(e: &postgres::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(ssl) = err.downcast_ref::<openssl::ssl::Error>() {
            if ssl.io_error().is_some()
                || ssl.code() == openssl::ssl::ErrorCode::SYSCALL
                || ssl.code() == openssl::ssl::ErrorCode::ZERO_RETURN
            {
                return true;
            }
            return ssl
                .ssl_error()
                .is_some_and(|stack| stack.to_string().contains("unexpected eof"));
        }
        if err.downcast_ref::<std::io::Error>().is_some() {
            return true;
        }
        source = err.source();
    }
    false
}
