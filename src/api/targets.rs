//! SQL-side checks of table targets: pipeline options, the remote server, and the target table
//! of each captured table (created when missing, checked when present).

use crate::error::{TideError, TideResult};
use crate::sql;
use crate::target::remote::{refusal_error, remote_access, RemoteSink};
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use pgrx::prelude::*;
use std::time::Duration;
use tide_core::plan::holds;

const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

fn quote(ident: &str) -> String {
    pgrx::spi::quote_identifier(ident)
}

/// Check the foreign server and the user mapping of `role` (the pipeline's owner), and that the
/// server answers; with `replica`, also that the remote user may set `session_replication_role`
/// (the option of that name: PostgreSQL lets superusers set it, and roles granted `SET` on it).
pub fn check_remote(server: &str, role: &str, replica: bool) -> TideResult<()> {
    let fdw = sql::one::<String>(
        "SELECT w.fdwname::text FROM pg_foreign_server s JOIN pg_foreign_data_wrapper w ON w.oid = s.srvfdw WHERE s.srvname = $1",
        &[server.into()],
    )?;
    match fdw.as_deref() {
        None => {
            return Err(TideError::undefined(format!("foreign server \"{server}\" does not exist"))
                .hint(format!("CREATE EXTENSION IF NOT EXISTS postgres_fdw; CREATE SERVER {} FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '...', port '5432', dbname '...');", quote(server))))
        }
        Some("postgres_fdw") => {}
        Some(other) => {
            return Err(TideError::invalid(format!("foreign server \"{server}\" uses the wrapper {other}, not postgres_fdw"))
                .hint("pg_tide reads connection details from a postgres_fdw server and its user mapping."))
        }
    }
    let role = role.to_string();
    let mapped = sql::one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_user_mappings WHERE srvname = $1 AND (usename = $2 OR usename = 'public'))",
        &[server.into(), role.clone().into()],
    )?
    .unwrap_or(false);
    if !mapped {
        return Err(TideError::undefined(format!(
            "no user mapping for role \"{role}\" on server \"{server}\""
        ))
        .hint(format!(
            "CREATE USER MAPPING FOR {} SERVER {} OPTIONS (user '...', password '...');",
            quote(&role),
            quote(server)
        )));
    }
    // The rules a connection for this role follows (USAGE, password, files), checked here and
    // again whenever the worker connects.
    let remote = RemoteSink::start_with(remote_access(server, &role)?, "pg_tide check");
    remote.query("SELECT 1::text", vec![], CHECK_TIMEOUT).map_err(|e| {
        if let Some(refused) = refusal_error(&e) {
            return refused;
        }
        // A client-side failure (no SQLSTATE) carries the sink's own hint (a TLS certificate
        // or file problem, an option it refuses), which says more than the generic one.
        let hint = match (&e.sqlstate, &e.hint) {
            (None, Some(h)) => h.clone(),
            _ => "Check the server's host, port and dbname options and the user mapping's user and password. (Once the pipeline exists, an outage is not an error to you: the pipeline shows it and catches up.)".to_string(),
        };
        TideError::new(PgSqlErrorCode::ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION, format!("cannot reach server \"{server}\": {}", e.message))
            .hint(hint)
    })?;
    if replica {
        remote
            .query(
                "SELECT pg_catalog.set_config('session_replication_role', 'replica', true)",
                vec![],
                CHECK_TIMEOUT,
            )
            .map_err(|e| {
                crate::target::table::replica_refused(
                    &format!("server \"{server}\""),
                    &e.message,
                    e.sqlstate.as_deref(),
                )
            })?;
    }
    Ok(())
}

/// A source column: name, type, NOT NULL.
struct SourceCol {
    name: String,
    ty: String,
    not_null: bool,
}

fn source_columns(relid: pg_sys::Oid) -> TideResult<Vec<SourceCol>> {
    let rows = sql::text_rows(
        "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull::text
           FROM pg_attribute a WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
          ORDER BY a.attnum",
        &[Some(&relid.to_u32().to_string())],
        0,
        false,
    )?;
    Ok(rows
        .into_iter()
        .map(|r| SourceCol {
            name: r[0].clone().unwrap_or_default(),
            ty: r[1].clone().unwrap_or_default(),
            not_null: r[2].as_deref() == Some("true"),
        })
        .collect())
}

const TARGET_SHAPE: &str = "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod),
        coalesce((SELECT true FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary AND a.attnum = ANY ((i.indkey::int2[])[0:i.indnkeyatts - 1])), false)::text
   FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum";

/// A target table as `add_table` found it: where it is, and whether it already held rows that
/// are still there (`truncate` empties them first, as the pipeline's owner).
pub struct EnsuredTarget {
    pub schema: String,
    pub name: String,
    pub held_rows: bool,
}

thread_local! {
    /// The remote connection of this transaction's `ensure_target` calls: the `add_table`s of
    /// one transaction (`add_tables_in_schema` makes one per table, so does a script) share
    /// one connection to a remote target instead of opening one each (41-57 ms apiece in
    /// benchmark B7: 8 s of 200 tables' 18.6 s). Kept for one [`RemoteAccess`] (server, user
    /// mapping) at a time; closed when the transaction ends (commit, abort or prepare). Its statements
    /// are the remote's own transactions, as with a connection per call.
    static TRANSACTION_REMOTE: std::cell::RefCell<Option<std::rc::Rc<RemoteSink>>> =
        const { std::cell::RefCell::new(None) };
}

/// The transaction's remote connection for `access` ([`TRANSACTION_REMOTE`]), opened on first
/// use.
fn transaction_remote(access: crate::target::remote::RemoteAccess) -> std::rc::Rc<RemoteSink> {
    TRANSACTION_REMOTE.with(|cell| {
        let mut held = cell.borrow_mut();
        if let Some(sink) = held.as_ref().filter(|s| s.access() == access) {
            return sink.clone();
        }
        if held.is_none() {
            let close = || TRANSACTION_REMOTE.with(|c| drop(c.borrow_mut().take()));
            pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Commit, close);
            pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Abort, close);
            // PREPARE TRANSACTION ends the session's transaction too (commit and abort then
            // come later, for the prepared one, and the callbacks above would wait for the
            // session's next transaction end).
            pgrx::register_xact_callback(pgrx::PgXactCallbackEvent::Prepare, close);
        }
        let sink = std::rc::Rc::new(RemoteSink::start_with(access, "pg_tide add_table"));
        *held = Some(sink.clone());
        sink
    })
}

/// What `tide.add_table` asks of a captured table's target table.
pub struct Wanted<'a> {
    /// The pipeline's (validated) options.
    pub options: &'a serde_json::Value,
    /// The source table, its name as events show it, its key.
    pub relid: pg_sys::Oid,
    pub source_qualified: &'a str,
    pub key: &'a [String],
    /// `target_table`, if given.
    pub target_table: Option<&'a str>,
    /// The pipeline's owner.
    pub owner: &'a str,
    /// `truncate_target`.
    pub truncate: bool,
    /// The column list, if any: the target has those columns only.
    pub only: Option<&'a [String]>,
    /// The column masks, if any.
    pub masked: Option<&'a super::masks::Checked>,
}

/// Make sure the target table of a captured table exists and fits, for a pipeline whose target
/// is of kind `kind` (one that writes tables); returns where it is and whether it holds rows.
pub fn ensure_target(kind: &crate::target::Kind, w: &Wanted<'_>) -> TideResult<EnsuredTarget> {
    let Wanted {
        options,
        relid,
        source_qualified,
        key,
        target_table,
        owner,
        truncate,
        only,
        masked,
    } = *w;
    let (schema, name) = target_name(options, relid, target_table)?;
    let qualified = format!("{}.{}", quote(&schema), quote(&name));
    if kind.local_tables && crate::target::options::reserved_schema(&schema) {
        return Err(TideError::invalid(format!(
            "{qualified} is in schema \"{schema}\", which pg_tide does not write to"
        ))
        .hint("Targets live in your own schemas: not pg_catalog, information_schema, pg_toast, pg_temp or pg_tide's schema tide."));
    }
    let owner_oid = crate::security::owner_oid(owner, "the pipeline")?;
    // A column list: the target has those columns only.
    let cols: Vec<SourceCol> = source_columns(relid)?
        .into_iter()
        .filter(|c| only.is_none_or(|o| o.contains(&c.name)))
        .map(|mut c| {
            // Masks: a hash or truncate column holds text; a column masked with null, NULLs.
            if let Some(m) = masked {
                if m.retyped(&c.name) {
                    c.ty = "text".into();
                }
                if m.nulled(&c.name) {
                    c.not_null = false;
                }
            }
            c
        })
        .collect();
    let remote = if kind.remote {
        let server = options
            .get("server")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        // The owner's user mapping, the one the worker will use, and its rules.
        Some(transaction_remote(remote_access(server, owner)?))
    } else {
        None
    };
    if remote.is_none() {
        let same = sql::one::<bool>(
            "SELECT to_regclass($1) = $2::regclass",
            &[qualified.clone().into(), relid.into()],
        )?
        .unwrap_or(false);
        if same {
            return Err(TideError::invalid(format!("the target table {qualified} is the source table {source_qualified}"))
                .hint("A local table target must live elsewhere: give the pipeline another schema option, or pass target_table => 'schema.name'."));
        }
    }
    let shape = target_shape(remote.as_deref(), &qualified)?;
    if shape.is_empty() {
        create_target(
            remote.as_deref(),
            &schema,
            &qualified,
            &cols,
            key,
            owner_oid,
        )?;
        return Ok(EnsuredTarget {
            schema,
            name,
            held_rows: false,
        });
    }
    // The table exists. A local one must be an ordinary table the owner may write as pg_tide
    // will.
    if remote.is_none() {
        check_local_target(&qualified, owner)?;
    }
    // Every difference is listed.
    let diffs = differences(&cols, key, &shape);
    if !diffs.is_empty() {
        return Err(TideError::new(
            PgSqlErrorCode::ERRCODE_INVALID_TABLE_DEFINITION,
            format!("target table {qualified} does not match {source_qualified}"),
        )
        .detail(diffs.join("; "))
        .hint(format!(
            "Fix {qualified} (or drop it and pg_tide creates it), or pass another target_table."
        )));
    }
    let held_rows = holds_rows(remote.as_deref(), &qualified, truncate, owner_oid)?;
    Ok(EnsuredTarget {
        schema,
        name,
        held_rows,
    })
}

/// The target table's (schema, name) for source `relid`: `target_table` (a name, optionally
/// schema-qualified), else the source's name in the pipeline's `schema` option (default
/// `public`).
fn target_name(
    options: &serde_json::Value,
    relid: pg_sys::Oid,
    target_table: Option<&str>,
) -> TideResult<(String, String)> {
    let schema_opt = options
        .get("schema")
        .and_then(|v| v.as_str())
        .unwrap_or("public")
        .to_string();
    let relname = sql::one::<String>(
        "SELECT relname::text FROM pg_class WHERE oid = $1",
        &[relid.into()],
    )?
    .unwrap_or_default();
    Ok(match target_table {
        None => (schema_opt, relname),
        Some(t) => {
            let parts =
                sql::one::<Vec<String>>("SELECT parse_ident($1)", &[t.into()])?.unwrap_or_default();
            match parts.as_slice() {
                [n] => (schema_opt, n.clone()),
                [s, n] => (s.clone(), n.clone()),
                _ => {
                    return Err(TideError::invalid(format!(
                        "invalid target table name \"{}\"",
                        crate::api::shown(t)
                    ))
                    .hint("Pass a table name, optionally schema-qualified: 'replica.orders'."))
                }
            }
        }
    })
}

/// The target table's columns (name, `format_type`, part of the primary key), read where it
/// lives (none: it does not exist).
fn target_shape(
    remote: Option<&RemoteSink>,
    qualified: &str,
) -> TideResult<Vec<Vec<Option<String>>>> {
    Ok(match remote {
        Some(r) => r
            .query(TARGET_SHAPE, vec![Some(qualified.to_string())], CHECK_TIMEOUT)
            .map_err(|e| {
                if let Some(refused) = refusal_error(&e) {
                    return refused;
                }
                // A client-side failure (no SQLSTATE: connection, TLS) carries the sink's hint.
                let hint = match (&e.sqlstate, &e.hint) {
                    (None, Some(h)) => h.clone(),
                    _ => "Check that the server is reachable and the mapped user may read its catalogs.".to_string(),
                };
                TideError::new(
                    PgSqlErrorCode::ERRCODE_FDW_ERROR,
                    format!(
                        "cannot inspect the remote target {qualified}: {}",
                        e.message
                    ),
                )
                .hint(hint)
            })?,
        None => sql::text_rows(TARGET_SHAPE, &[Some(qualified)], 0, true)?,
    })
}

/// Create the target table with the source's columns and key: on the remote (as its mapped
/// user), or here as the pipeline's owner (who then owns it, and whose CREATE privilege
/// PostgreSQL checks), never as the caller or as pg_tide.
fn create_target(
    remote: Option<&RemoteSink>,
    schema: &str,
    qualified: &str,
    cols: &[SourceCol],
    key: &[String],
    owner_oid: pg_sys::Oid,
) -> TideResult<()> {
    let mut defs: Vec<String> = cols
        .iter()
        .map(|c| {
            format!(
                "{} {}{}",
                quote(&c.name),
                c.ty,
                if c.not_null { " NOT NULL" } else { "" }
            )
        })
        .collect();
    // A source without a key (REPLICA IDENTITY FULL) gets a target without one: its rows are a
    // multiset, duplicates included.
    if !key.is_empty() {
        defs.push(format!(
            "PRIMARY KEY ({})",
            key.iter().map(|k| quote(k)).collect::<Vec<_>>().join(", ")
        ));
    }
    let create_schema = format!("CREATE SCHEMA IF NOT EXISTS {}", quote(schema));
    let create = format!("CREATE TABLE {qualified} ({})", defs.join(", "));
    match remote {
        Some(r) => {
            let stmts = vec![
                crate::target::remote::RemoteStatement {
                    sql: create_schema,
                    params: vec![],
                },
                crate::target::remote::RemoteStatement {
                    sql: create,
                    params: vec![],
                },
            ];
            r.transaction(stmts, CHECK_TIMEOUT).map_err(|e| {
                    TideError::new(PgSqlErrorCode::ERRCODE_FDW_ERROR, format!("cannot create the remote target {qualified}: {}", e.message))
                        .hint("Grant the mapped user CREATE on the target schema, or create the table yourself with the source's columns and key.")
                })?;
        }
        None => {
            let exists = sql::one::<bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
                &[schema.into()],
            )?
            .unwrap_or(false);
            // Created as the pipeline's owner (who then owns it, and whose CREATE privilege
            // PostgreSQL checks), never as the caller or as pg_tide.
            crate::security::as_owner(owner_oid, || {
                if !exists {
                    sql::exec(&create_schema, &[])?;
                }
                sql::exec(&create, &[])
            })?;
        }
    }
    Ok(())
}

/// A local target table must be an ordinary table the owner may write as pg_tide will: INSERT,
/// UPDATE and DELETE for changes, TRUNCATE for truncate events.
fn check_local_target(qualified: &str, owner: &str) -> TideResult<()> {
    let kind = sql::one::<String>(
        "SELECT c.relkind::text FROM pg_class c WHERE c.oid = to_regclass($1)",
        &[qualified.into()],
    )?
    .unwrap_or_default();
    if kind != "r" {
        return Err(TideError::wrong_object(format!(
            "the target {qualified} is not an ordinary table"
        ))
        .hint("Pass target_table => a table (or a name pg_tide can create)."));
    }
    let missing: Vec<String> = ["INSERT", "UPDATE", "DELETE", "TRUNCATE"]
        .iter()
        .filter(|p| {
            !sql::one::<bool>(
                "SELECT has_table_privilege($1::text::name, to_regclass($2), $3)",
                &[owner.into(), qualified.into(), (**p).into()],
            )
            .ok()
            .flatten()
            .unwrap_or(false)
        })
        .map(|p| p.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(TideError::privilege(format!(
                "the pipeline's owner \"{owner}\" may not write the target {qualified} (no {} privilege)",
                missing.join(", ")
            ))
            .hint(format!(
                "GRANT INSERT, UPDATE, DELETE, TRUNCATE ON {qualified} TO {}; or pass another target_table.",
                quote(owner)
            )));
    }
    Ok(())
}

/// How the existing target table differs from the source's columns and key (every difference).
fn differences(cols: &[SourceCol], key: &[String], shape: &[Vec<Option<String>>]) -> Vec<String> {
    let mut diffs = Vec::new();
    for c in cols {
        match shape
            .iter()
            .find(|r| r[0].as_deref() == Some(c.name.as_str()))
        {
            None => diffs.push(format!("column {} is missing", quote(&c.name))),
            Some(r) => {
                let tty = r[1].clone().unwrap_or_default();
                if !holds(&tty, &c.ty) {
                    diffs.push(format!(
                        "column {} is {tty}, the source's is {}",
                        quote(&c.name),
                        c.ty
                    ));
                }
            }
        }
    }
    let mut tkey: Vec<String> = shape
        .iter()
        .filter(|r| r[2].as_deref() == Some("true"))
        .filter_map(|r| r[0].clone())
        .collect();
    let mut skey = key.to_vec();
    tkey.sort();
    skey.sort();
    if tkey != skey && skey.is_empty() {
        diffs.push(format!(
            "its primary key is ({}), and the source has no key (its duplicate rows could not be written)",
            tkey.join(", ")
        ));
    } else if tkey != skey {
        diffs.push(format!(
            "its primary key is ({}), the source's key is ({})",
            tkey.join(", "),
            skey.join(", ")
        ));
    }
    diffs
}

/// Whether the existing target table still holds rows: none when `truncate` emptied it (as the
/// pipeline's owner here, whose TRUNCATE privilege was checked; as the mapped user on a remote).
fn holds_rows(
    remote: Option<&RemoteSink>,
    qualified: &str,
    truncate: bool,
    owner_oid: pg_sys::Oid,
) -> TideResult<bool> {
    let held_rows = match remote {
        Some(r) => {
            let rows = r
                .query(
                    &format!("SELECT EXISTS (SELECT 1 FROM {qualified})::text"),
                    vec![],
                    CHECK_TIMEOUT,
                )
                .map_err(|e| {
                    refusal_error(&e).unwrap_or_else(|| {
                        TideError::new(
                            PgSqlErrorCode::ERRCODE_FDW_ERROR,
                            format!("cannot read the remote target {qualified}: {}", e.message),
                        )
                        .hint("Grant the mapped user SELECT on the target table.")
                    })
                })?;
            rows.first()
                .and_then(|r| r.first())
                .cloned()
                .flatten()
                .as_deref()
                == Some("true")
        }
        // Read as pg_tide: the owner needs no SELECT on its target.
        None => crate::security::as_tide(|| {
            sql::one::<bool>(&format!("SELECT EXISTS (SELECT 1 FROM {qualified})"), &[])
        })?
        .unwrap_or(false),
    };
    if !(held_rows && truncate) {
        return Ok(held_rows);
    }
    let stmt = format!("TRUNCATE {qualified}");
    match remote {
        Some(r) => {
            r.transaction(
                vec![crate::target::remote::RemoteStatement {
                    sql: stmt,
                    params: vec![],
                }],
                CHECK_TIMEOUT,
            )
            .map_err(|e| {
                refusal_error(&e).unwrap_or_else(|| {
                    TideError::new(
                        PgSqlErrorCode::ERRCODE_FDW_ERROR,
                        format!(
                            "cannot truncate the remote target {qualified}: {}",
                            e.message
                        ),
                    )
                    .hint(
                        "Grant the mapped user TRUNCATE on the target table, or empty it yourself.",
                    )
                })
            })?;
        }
        None => crate::security::as_owner(owner_oid, || sql::exec(&stmt, &[]))?,
    }
    Ok(false)
}
