//! Tests of the parent module.
use super::*;

fn parse(pairs: &[(&str, &str)]) -> Result<TlsOptions, RemoteError> {
    let mut t = TlsOptions::default();
    for (k, v) in pairs {
        assert!(t.take(k, v)?, "{k} not taken");
    }
    t.finish()?;
    Ok(t)
}

#[test]
fn modes_and_defaults() {
    let t = parse(&[]).unwrap();
    assert_eq!(t.mode, SslMode::Prefer);
    assert_eq!(t.min_version, Some(SslVersion::TLS1_2));
    for (name, client) in [
        ("disable", ClientSslMode::Disable),
        ("allow", ClientSslMode::Disable),
        ("prefer", ClientSslMode::Prefer),
        ("require", ClientSslMode::Require),
        ("verify-ca", ClientSslMode::Require),
        ("verify-full", ClientSslMode::Require),
    ] {
        let t = parse(&[("sslmode", name)]).unwrap();
        assert_eq!(t.mode.name(), name);
        assert_eq!(t.mode.client_mode(), client, "{name}");
    }
    assert!(!TlsOptions::default().take("host", "h").unwrap());
    let e = parse(&[("sslmode", "bogus")]).unwrap_err();
    assert!(!e.transient && e.hint.is_some(), "{e:?}");
}

#[test]
fn system_roots_need_verify_full() {
    let t = parse(&[("sslrootcert", "system")]).unwrap();
    assert_eq!(t.mode, SslMode::VerifyFull);
    assert!(parse(&[("sslrootcert", "system"), ("sslmode", "verify-full")]).is_ok());
    let e = parse(&[("sslmode", "require"), ("sslrootcert", "system")]).unwrap_err();
    assert!(e.message.contains("weak sslmode"), "{e:?}");
}

#[test]
fn option_values() {
    let t = parse(&[
        ("ssl_min_protocol_version", "tlsv1.3"),
        ("ssl_max_protocol_version", "TLSv1.3"),
        ("sslsni", "0"),
        ("sslcertmode", "disable"),
        ("sslrootcert", ""),
    ])
    .unwrap();
    assert_eq!(t.min_version, Some(SslVersion::TLS1_3));
    assert!(!t.sni && !t.send_cert && t.rootcert.is_none());
    for bad in [
        [
            ("ssl_min_protocol_version", "TLSv1.3"),
            ("ssl_max_protocol_version", "TLSv1.2"),
        ],
        [
            ("ssl_min_protocol_version", "SSLv3"),
            ("sslmode", "require"),
        ],
        [("sslcertmode", "require"), ("sslmode", "require")],
        [("sslkey", "engine:pkcs11:x"), ("sslmode", "require")],
    ] {
        let e = parse(&bad).unwrap_err();
        assert!(!e.transient, "{bad:?}: {e:?}");
    }
}

/// A self-signed certificate and its key, PEM.
fn self_signed(cn: &str) -> (Vec<u8>, Vec<u8>) {
    use openssl::asn1::Asn1Time;
    use openssl::ec::{EcGroup, EcKey};
    use openssl::hash::MessageDigest;
    use openssl::x509::{X509Builder, X509NameBuilder};
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_nid(Nid::COMMONNAME, cn).unwrap();
    let name = name.build();
    let mut b = X509Builder::new().unwrap();
    b.set_version(2).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(&name).unwrap();
    b.set_pubkey(&key).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::days_from_now(1).unwrap())
        .unwrap();
    b.sign(&key, MessageDigest::sha256()).unwrap();
    (
        b.build().to_pem().unwrap(),
        key.private_key_to_pem_pkcs8().unwrap(),
    )
}

#[test]
fn client_certificate_and_key_rules() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("tide_tls_unit_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = self_signed("me");
    let (_, other_key) = self_signed("other");
    let file = |name: &str, pem: &[u8], mode: u32| {
        let p = dir.join(name);
        std::fs::write(&p, pem).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p.display().to_string()
    };
    let cert = file("c.crt", &cert, 0o644);
    let key_ok = file("ok.key", &key, 0o600);
    let key_open = file("open.key", &key, 0o644);
    let key_other = file("other.key", &other_key, 0o600);
    let failure = Arc::new(Mutex::new(None));
    let with = |key: &str| {
        parse(&[("sslmode", "require"), ("sslcert", &cert), ("sslkey", key)])
            .unwrap()
            .connector(&failure)
            .err()
    };
    assert!(with(&key_ok).is_none(), "{:?}", with(&key_ok));
    let e = with(&key_open).expect("a world-readable key was accepted");
    assert!(e.message.contains("group or world access"), "{e:?}");
    let e = with(&key_other).expect("another certificate's key was accepted");
    assert!(e.message.contains("does not match"), "{e:?}");
    let e = with(&dir.join("none.key").display().to_string()).expect("no key");
    assert!(e.message.contains("not private key"), "{e:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_files_are_errors() {
    let failure = Arc::new(Mutex::new(None));
    let t = parse(&[
        ("sslmode", "require"),
        ("sslrootcert", "/nonexistent/ca.crt"),
    ])
    .unwrap();
    let Err(e) = t.connector(&failure) else {
        panic!("a missing file was accepted")
    };
    assert!(
        !e.transient && e.message.contains("/nonexistent/ca.crt"),
        "{e:?}"
    );
    assert!(e.hint.is_some());
    let t = parse(&[("sslmode", "require"), ("sslcert", "/nonexistent/c.crt")]).unwrap();
    let Err(e) = t.connector(&failure) else {
        panic!("a missing file was accepted")
    };
    assert!(e.message.contains("/nonexistent/c.crt"), "{e:?}");
    // Nothing to verify with and nothing required: fine.
    let t = parse(&[("sslmode", "require"), ("sslcertmode", "disable")]).unwrap();
    if home_file("root.crt").is_none_or(|p| !p.exists()) {
        assert!(t.connector(&failure).is_ok());
    }
}
