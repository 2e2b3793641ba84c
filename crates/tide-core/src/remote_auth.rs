//! Who may connect to a remote (`postgres`) target how: postgres_fdw's rules for a connection
//! made on a non-superuser's behalf, decided from the options alone.
//!
//! A remote connection is made by the server, as its OS user, from its network address, with
//! its files. A role that is no superuser must not borrow any of that:
//!
//! - **Password.** postgres_fdw (`check_conn_params`, `connect_pg_server`) lets a
//!   non-superuser connect only with a non-empty `password` in the user mapping, and only if the
//!   remote then asked for it (libpq's `PQconnectionUsedPassword`): otherwise trust, peer, ident
//!   or a client certificate would log the role in as whoever the mapping names, on the
//!   strength of the server's identity. A superuser waives this for one mapping with
//!   `password_required 'false'` (postgres_fdw's validator lets only superusers set it, or
//!   change a mapping that has it).
//! - **Files.** Options naming files the connection reads or writes (`sslcert`, `sslkey`,
//!   `sslrootcert`, `sslcrl`, `sslcrldir`, `passfile`, `service`, `sslkeylogfile`) are a
//!   superuser's decision: accepted from a foreign server a superuser owns, and `sslcert` /
//!   `sslkey` from a user mapping (postgres_fdw's validator lets only superusers put them
//!   there); `sslrootcert=system` names no file (OpenSSL's default trust store) and is always
//!   accepted.
//!
//! A superuser owner is not restricted at all, as with postgres_fdw. [`check`] decides; whether
//! the remote really asked for the password is known only when connecting (the caller's job,
//! told by [`Access::probe_password`]).

/// libpq keywords that name a file the connection reads (or, `sslkeylogfile`, writes).
pub const FILE_OPTIONS: &[&str] = &[
    "sslcert",
    "sslkey",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "passfile",
    "service",
    "sslkeylogfile",
];

/// File options a user mapping may hold: PostgreSQL's postgres_fdw validator lets only
/// superusers set them there (so their presence is a superuser's decision).
pub const MAPPING_FILE_OPTIONS: &[&str] = &["sslcert", "sslkey"];

/// What is known about the roles involved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    /// The role the connection is made for (the pipeline's owner) is a superuser.
    pub owner_superuser: bool,
    /// The foreign server's owner is a superuser.
    pub server_owner_superuser: bool,
}

/// The connection may be made; how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The remote must be seen to ask for the password when connecting; a connection it lets
    /// in without one is refused ([`Refusal::PasswordNotRequested`]).
    pub probe_password: bool,
}

/// Why the connection may not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No non-empty `password` in the user mapping (and no `password_required 'false'`).
    PasswordMissing,
    /// An option naming a file, from a place a non-superuser controls.
    FileOption {
        /// The keyword.
        key: String,
        /// It came from the user mapping (else from the foreign server).
        from_mapping: bool,
    },
}

/// A boolean option as postgres_fdw reads it (`defGetBoolean` of a string): `true`/`on` or
/// `false`/`off`, case-insensitively; anything else is no boolean (the validator refuses it).
pub fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "on" => Some(true),
        "false" | "off" => Some(false),
        _ => None,
    }
}

/// Whether the user mapping requires a password (`password_required`, default true; a value
/// that is not a boolean, which postgres_fdw's validator would have refused, counts as true).
pub fn password_required(mapping: &[(String, String)]) -> bool {
    mapping
        .iter()
        .rev()
        .find(|(k, _)| k == "password_required")
        .and_then(|(_, v)| parse_bool(v))
        .unwrap_or(true)
}

/// Decide whether a connection with these options may be made for the owner. `server` are the
/// foreign server's options, `mapping` the user mapping's (the owner's or PUBLIC's), both as
/// stored (`key`, `value`). The first refusal found is returned (file options first, as they
/// are checked before anything is connected).
pub fn check(
    roles: Roles,
    server: &[(String, String)],
    mapping: &[(String, String)],
) -> Result<Access, Refusal> {
    if roles.owner_superuser {
        return Ok(Access {
            probe_password: false,
        });
    }
    let names_file =
        |k: &str, v: &str| FILE_OPTIONS.contains(&k) && !(k == "sslrootcert" && v == "system");
    if !roles.server_owner_superuser {
        if let Some((k, _)) = server.iter().find(|(k, v)| names_file(k, v)) {
            return Err(Refusal::FileOption {
                key: k.clone(),
                from_mapping: false,
            });
        }
    }
    if let Some((k, _)) = mapping
        .iter()
        .find(|(k, v)| names_file(k, v) && !MAPPING_FILE_OPTIONS.contains(&k.as_str()))
    {
        return Err(Refusal::FileOption {
            key: k.clone(),
            from_mapping: true,
        });
    }
    if !password_required(mapping) {
        return Ok(Access {
            probe_password: false,
        });
    }
    // The password the connection would use: the last one given, mapping after server (as the
    // conninfo is built); postgres_fdw's validator only allows it in the mapping.
    let password = server
        .iter()
        .chain(mapping.iter())
        .rfind(|(k, _)| k == "password")
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    if password.is_empty() {
        return Err(Refusal::PasswordMissing);
    }
    Ok(Access {
        probe_password: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const MEMBER: Roles = Roles {
        owner_superuser: false,
        server_owner_superuser: true,
    };

    #[test]
    fn booleans_as_postgres_fdw_reads_them() {
        for t in ["true", "TRUE", "on", "On"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["false", "False", "off", "OFF"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for x in ["", "t", "0", "1", "no", "maybe", " false"] {
            assert_eq!(parse_bool(x), None, "{x}");
        }
    }

    #[test]
    fn superuser_owner_is_not_restricted() {
        let roles = Roles {
            owner_superuser: true,
            server_owner_superuser: false,
        };
        let server = o(&[
            ("host", "h"),
            ("sslkey", "/etc/ssl/private/k"),
            ("passfile", "p"),
        ]);
        let mapping = o(&[("user", "postgres")]);
        assert_eq!(
            check(roles, &server, &mapping),
            Ok(Access {
                probe_password: false
            })
        );
    }

    #[test]
    fn member_needs_a_password_that_is_used() {
        assert_eq!(
            check(MEMBER, &o(&[("host", "h")]), &o(&[("user", "postgres")])),
            Err(Refusal::PasswordMissing)
        );
        assert_eq!(
            check(MEMBER, &o(&[]), &o(&[("user", "u"), ("password", "")])),
            Err(Refusal::PasswordMissing)
        );
        // password_required 'true' (or a value that is no boolean) changes nothing.
        for v in ["true", "bogus", "0"] {
            assert_eq!(
                check(
                    MEMBER,
                    &o(&[]),
                    &o(&[("user", "u"), ("password_required", v)])
                ),
                Err(Refusal::PasswordMissing)
            );
        }
        assert_eq!(
            check(MEMBER, &o(&[]), &o(&[("user", "u"), ("password", "pw")])),
            Ok(Access {
                probe_password: true
            })
        );
    }

    #[test]
    fn superuser_waiver() {
        for v in ["false", "off", "FALSE"] {
            assert_eq!(
                check(
                    MEMBER,
                    &o(&[]),
                    &o(&[("user", "u"), ("password_required", v)])
                ),
                Ok(Access {
                    probe_password: false
                }),
                "{v}"
            );
        }
        // With a password too: not probed (postgres_fdw skips PQconnectionUsedPassword).
        assert_eq!(
            check(
                MEMBER,
                &o(&[]),
                &o(&[("password", "pw"), ("password_required", "false")])
            ),
            Ok(Access {
                probe_password: false
            })
        );
    }

    #[test]
    fn file_options() {
        let mallory_server = Roles {
            owner_superuser: false,
            server_owner_superuser: false,
        };
        let mapping = o(&[("user", "u"), ("password", "pw")]);
        for key in FILE_OPTIONS {
            let server = o(&[("host", "h"), (key, "f")]);
            assert_eq!(
                check(mallory_server, &server, &mapping),
                Err(Refusal::FileOption {
                    key: key.to_string(),
                    from_mapping: false
                }),
                "{key}"
            );
            // The superuser's server may name files.
            assert_eq!(
                check(MEMBER, &server, &mapping),
                Ok(Access {
                    probe_password: true
                }),
                "{key}"
            );
            // A mapping may hold sslcert and sslkey (only superusers can put them there).
            let mut m = mapping.clone();
            m.push((key.to_string(), "f".to_string()));
            let expected = if MAPPING_FILE_OPTIONS.contains(key) {
                Ok(Access {
                    probe_password: true,
                })
            } else {
                Err(Refusal::FileOption {
                    key: key.to_string(),
                    from_mapping: true,
                })
            };
            assert_eq!(check(mallory_server, &o(&[]), &m), expected, "{key}");
        }
        // sslrootcert=system names no file.
        assert_eq!(
            check(
                mallory_server,
                &o(&[("sslrootcert", "system"), ("sslmode", "verify-full")]),
                &mapping
            ),
            Ok(Access {
                probe_password: true
            })
        );
        // A file option is refused before a missing password is.
        assert_eq!(
            check(
                mallory_server,
                &o(&[("passfile", "p")]),
                &o(&[("user", "u")])
            ),
            Err(Refusal::FileOption {
                key: "passfile".into(),
                from_mapping: false
            })
        );
    }
}
