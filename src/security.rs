//! Who pg_tide acts as, and the only ways it changes that.
//!
//! Owns: the three identities pg_tide code runs under, and the switches between them.
//! - **The caller** (the SQL API): every `tide.*` function is `SECURITY INVOKER`; what a caller
//!   may do is decided from [`caller`] and the pipeline's owner (`api::require_pipeline`).
//! - **pg_tide itself** ([`as_tide`]): pg_tide's own tables (`tide.pipeline`, `tide.backfill`,
//!   ...) are readable and writable by no role but their owner; the API reaches them only
//!   through `as_tide`, which switches to the bootstrap superuser (the worker's own identity)
//!   with `SECURITY_LOCAL_USERID_CHANGE | SECURITY_RESTRICTED_OPERATION` and a pinned
//!   `search_path = pg_catalog, pg_temp`, around fixed statements that run no user code.
//! - **The pipeline's owner** ([`as_owner`]): everything the worker (or the API) runs on a
//!   user's behalf — backfill conditions and chunk reads, writes and schema changes at a local
//!   table target, creating a target — runs as the owner in a security-restricted operation,
//!   the way PostgreSQL runs maintenance commands and (PG16) its apply worker: `SET ROLE`,
//!   `RESET ROLE` and `SET SESSION AUTHORIZATION` fail inside it, so user code cannot climb back
//!   to the worker's superuser identity, and the owner's privileges are checked as for any of
//!   its own statements. [`as_owner_writing`] is how a local table target is written: as the
//!   owner, its identity fixed, but not security-restricted (a deferred foreign key could not be
//!   queued), with what that restriction protects taken care of otherwise (deferred triggers
//!   fired as the owner before commit, cursors WITH HOLD and temporary tables refused, LISTEN
//!   undone). [`as_owner_pinned`] is the same as `as_owner` with pg_tide's pinned `search_path`,
//!   for what pg_tide does for the owner from another role's session (a followed schema's
//!   tables, captured in the session of whoever creates them).
//!
//! Guarantees: the previous identity, security context and GUC values are restored when the
//! closure returns, whether `Ok` or `Err`; if it raises an ERROR instead, the transaction (or
//! subtransaction) abort restores them, as PostgreSQL does for its own switches. No setting
//! made inside a switch outlives it (`set_config(name, value, false)` included): the settings
//! scope opened around it is thrown away, never committed.

use crate::error::{TideError, TideResult};
use pgrx::pg_sys;
use std::ffi::CString;

/// The role calling the SQL API (the current user: pg_tide's functions are SECURITY INVOKER).
pub fn caller() -> pg_sys::Oid {
    // SAFETY: reads this backend's current user id; main thread.
    unsafe { pg_sys::GetUserId() }
}

/// The caller's role name.
pub fn caller_name() -> TideResult<String> {
    crate::sql::one::<String>("SELECT current_user::text", &[])?
        .ok_or_else(|| TideError::internal("current_user is NULL"))
}

/// The OID of a role by name, if it exists.
pub fn role_oid(name: &str) -> Option<pg_sys::Oid> {
    let c = CString::new(name).ok()?;
    // SAFETY: `c` is a NUL-terminated string alive for the call; missing_ok, so an unknown role is
    // InvalidOid, not an ERROR; main thread.
    let oid = unsafe { pg_sys::get_role_oid(c.as_ptr(), true) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// Whether `member` has the privileges of `role` (directly, through inheritance, or as a
/// superuser): what PostgreSQL checks for "is the owner or a member of the owning role".
pub fn has_privs_of(member: pg_sys::Oid, role: pg_sys::Oid) -> bool {
    // SAFETY: a catalog check of two role OIDs (an unknown one is no member); main thread.
    unsafe { pg_sys::has_privs_of_role(member, role) }
}

pub fn is_superuser(role: pg_sys::Oid) -> bool {
    // SAFETY: a syscache lookup of a role OID (an unknown one is no superuser); main thread.
    unsafe { pg_sys::superuser_arg(role) }
}

/// Run `f` with `user` as the current user, in a security-restricted operation, with
/// `search_path` pinned to `search_path` for its duration.
fn switched<R>(
    user: pg_sys::Oid,
    search_path: &std::ffi::CStr,
    f: impl FnOnce() -> TideResult<R>,
) -> TideResult<R> {
    let mut save_user = pg_sys::InvalidOid;
    let mut save_ctx: std::ffi::c_int = 0;
    // SAFETY: the saved user and security context are restored below, after `f` returns
    // (with_search_path catches `f`'s errors); an ERROR instead unwinds the transaction, whose
    // abort restores them, as for PostgreSQL's own SECURITY_RESTRICTED_OPERATION switches; main
    // thread.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut save_user, &mut save_ctx);
        pg_sys::SetUserIdAndSecContext(
            user,
            save_ctx
                | pg_sys::SECURITY_LOCAL_USERID_CHANGE as std::ffi::c_int
                | pg_sys::SECURITY_RESTRICTED_OPERATION as std::ffi::c_int,
        );
    }
    let out = with_search_path(search_path, f);
    // SAFETY: restores exactly what GetUserIdAndSecContext saved above; main thread.
    unsafe { pg_sys::SetUserIdAndSecContext(save_user, save_ctx) };
    out
}

/// Run `f` in a settings scope of its own with `search_path` set to `search_path`; every
/// setting made inside (`set_config(..., false)` included) is discarded when it returns, as
/// PostgreSQL's maintenance commands do around user code (`AtEOXact_GUC(false, ...)`), so
/// nothing user code sets reaches the statements pg_tide runs afterwards. An ERROR instead
/// unwinds the scope with the (sub)transaction.
fn with_search_path<R>(
    search_path: &std::ffi::CStr,
    f: impl FnOnce() -> TideResult<R>,
) -> TideResult<R> {
    with_settings(&[(c"search_path", search_path)], f)
}

/// [`with_search_path`] with any settings: each `(name, value)` set in the scope (as pg_tide,
/// whatever the current user: `session_replication_role` is a superuser's setting).
fn with_settings<R>(
    settings: &[(&std::ffi::CStr, &std::ffi::CStr)],
    f: impl FnOnce() -> TideResult<R>,
) -> TideResult<R> {
    // SAFETY: a GUC nest level opened and closed around `f` on this (the main) thread.
    let nest = unsafe {
        let nest = pg_sys::NewGUCNestLevel();
        for (name, value) in settings {
            pg_sys::set_config_option(
                name.as_ptr(),
                value.as_ptr(),
                pg_sys::GucContext::PGC_SUSET,
                pg_sys::GucSource::PGC_S_SESSION,
                pg_sys::GucAction::GUC_ACTION_SAVE,
                true,
                0,
                false,
            );
        }
        nest
    };
    let out = f();
    // SAFETY: closes the GUC nest level opened above (every setting made inside is discarded); main
    // thread.
    unsafe { pg_sys::AtEOXact_GUC(false, nest) };
    out
}

/// The `search_path` of pg_tide's own sessions (launcher, pipeline workers, readers), pinned at
/// connection, as a `SECURITY DEFINER` function's `SET search_path` is: `pg_catalog` first and
/// nothing a role can create objects in, so no unqualified name in a statement pg_tide runs as
/// itself can resolve to an owner's function, operator or table. User code that runs in the
/// session ([`as_owner`]) cannot move it: its settings are discarded when it returns.
pub const PINNED_SEARCH_PATH: &str = "pg_catalog, pg_temp";

/// Pin this session's `search_path` (see [`PINNED_SEARCH_PATH`]). For a background worker, once
/// after it connects; in a transaction.
pub fn pin_search_path() -> TideResult<()> {
    crate::sql::one::<String>(
        "SELECT pg_catalog.set_config('search_path', $1, false)",
        &[PINNED_SEARCH_PATH.into()],
    )?;
    Ok(())
}

/// Run `f` (fixed catalog queries of pg_tide's own sessions) with `search_path` set to
/// `pg_catalog, "$user", public` for its duration, so that `format_type` names a type as it did
/// before the session's path was pinned and as a target's session names it (`mood`, not
/// `public.mood`: the text both sides of a shape comparison must agree on). Every function and
/// operator in such a query must be written `pg_catalog.f(...)` / `OPERATOR(pg_catalog.=)`
/// (as pg_dump does), so that nothing in `public` can be chosen by overload resolution; types
/// and relations resolve in `pg_catalog` first. The setting is discarded afterwards.
pub fn with_type_names<R>(f: impl FnOnce() -> TideResult<R>) -> TideResult<R> {
    with_search_path(c"pg_catalog, \"$user\", public", f)
}

/// Run `f` with `search_path` pinned to [`PINNED_SEARCH_PATH`] for its duration, whatever the
/// session's is (the path the output plugin reads row filters under, see `row_filter`).
pub fn with_pinned_search_path<R>(f: impl FnOnce() -> TideResult<R>) -> TideResult<R> {
    with_search_path(c"pg_catalog, pg_temp", f)
}

/// Run `f` as pg_tide itself (the bootstrap superuser), for fixed statements on pg_tide's own
/// tables. Never pass user-supplied SQL, or statements that call user-defined functions or
/// operators, to code run here.
pub fn as_tide<R>(f: impl FnOnce() -> TideResult<R>) -> TideResult<R> {
    switched(
        pg_sys::Oid::from(pg_sys::BOOTSTRAP_SUPERUSERID),
        c"pg_catalog, pg_temp", // PINNED_SEARCH_PATH
        f,
    )
}

/// Run `f` as `owner` (a pipeline's or a backfill's owner), in a security-restricted
/// operation. The search path is the owner's schemas-free default, so unqualified names in
/// user code resolve as `"$user", public` would for that role.
pub fn as_owner<R>(owner: pg_sys::Oid, f: impl FnOnce() -> TideResult<R>) -> TideResult<R> {
    switched(owner, c"\"$user\", public", f)
}

// commands/async.h, which pgrx does not bind.
unsafe extern "C-unwind" {
    fn Async_UnlistenAll();
}

thread_local! {
    /// The owner whose writes to a local table target ([`as_owner_writing`]) may have queued
    /// deferred trigger events in the current transaction, fired by [`fire_deferred`].
    static DEFERRED_OWNER: std::cell::Cell<Option<pg_sys::Oid>> = const { std::cell::Cell::new(None) };
}

/// Run `f` — pg_tide's own statement writing a local table target — as `owner`, with the
/// owner's identity fixed for its duration (`SECURITY_LOCAL_USERID_CHANGE`: `SET ROLE`, `RESET
/// ROLE` and `SET SESSION AUTHORIZATION` fail, as in a `SECURITY DEFINER` function) and a
/// settings scope thrown away afterwards, but **not** security-restricted: PostgreSQL refuses
/// to queue a deferred trigger event (a `DEFERRABLE INITIALLY DEFERRED` foreign key between two
/// target tables) inside a security-restricted operation (42501 "cannot fire deferred trigger
/// within security-restricted operation"), because it would fire at commit as whoever commits.
///
/// What a security-restricted operation keeps user code from leaving behind for later, when the
/// worker is pg_tide (a superuser) again, is refused or undone here instead, before `f`'s result
/// is returned:
/// - deferred trigger events: fired by [`fire_deferred`] as `owner`, security-restricted, before
///   the transaction commits (the local target's commit and, as a safety net, `worker::tx`);
/// - a cursor `WITH HOLD` (its query would run on at commit, as pg_tide) and a temporary table
///   (it would outlive the statement in pg_tide's session): either fails the statement with
///   42501, so the transaction rolls back with them;
/// - a `LISTEN` (pg_tide's worker never reads notifications, so the server's notification queue
///   would fill): undone (`UNLISTEN *`) in the same transaction.
///
/// `CLOSE`, `DISCARD` (only `TEMP`, `PLANS` and `SEQUENCES` can run from a statement) and
/// `UNLISTEN` have nothing of pg_tide's to act on in a worker. Everything else runs as under
/// [`as_owner`]: as the owner, with the owner's privileges.
///
/// With `replica`, `session_replication_role` is `replica` for `f`'s duration (the pipeline's
/// option of that name: only `ENABLE REPLICA` and `ENABLE ALWAYS` triggers fire), and nothing
/// else: the setting goes with the scope.
pub fn as_owner_writing<R>(
    owner: pg_sys::Oid,
    replica: bool,
    f: impl FnOnce() -> TideResult<R>,
) -> TideResult<R> {
    let mut save_user = pg_sys::InvalidOid;
    let mut save_ctx: std::ffi::c_int = 0;
    let temp_before = temp_namespace();
    DEFERRED_OWNER.with(|d| d.set(Some(owner)));
    // SAFETY: in a transaction; saves the current user and context, restored below whichever
    // way `f` returns (an ERROR aborts the transaction, which restores them itself).
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut save_user, &mut save_ctx);
        pg_sys::SetUserIdAndSecContext(
            owner,
            save_ctx | pg_sys::SECURITY_LOCAL_USERID_CHANGE as std::ffi::c_int,
        );
    }
    let mut settings = vec![(c"search_path", c"\"$user\", public")];
    if replica {
        settings.push((c"session_replication_role", c"replica"));
    }
    let out = with_settings(&settings, f);
    // SAFETY: in a transaction; queues an UNLISTEN * after whatever the statement queued.
    unsafe { Async_UnlistenAll() };
    // SAFETY: puts back the user and context saved above, in the same transaction.
    unsafe { pg_sys::SetUserIdAndSecContext(save_user, save_ctx) };
    let out = out?;
    left_behind(temp_before)?;
    Ok(out)
}

/// The OID of this session's temporary schema (`InvalidOid`: it has none).
fn temp_namespace() -> pg_sys::Oid {
    let (mut nsp, mut toast) = (pg_sys::InvalidOid, pg_sys::InvalidOid);
    // SAFETY: reads two backend-local variables.
    unsafe { pg_sys::GetTempNamespaceState(&mut nsp, &mut toast) };
    nsp
}

/// What an owner's write left that would outlive it in pg_tide's session (see
/// [`as_owner_writing`]): an ERROR (42501), so the transaction rolls it back.
fn left_behind(temp_before: pg_sys::Oid) -> TideResult<()> {
    let refuse = |what: &str| {
        TideError::privilege(format!(
            "code run by a write to a table target ({what}) would outlive it in pg_tide's worker"
        ))
        .hint("A trigger (or a function it calls) on a table target may not create temporary tables or cursors WITH HOLD, as in a security-restricted operation. Change the trigger; the worker retries.")
    };
    if temp_before == pg_sys::InvalidOid && temp_namespace() != pg_sys::InvalidOid {
        return Err(refuse("a temporary table"));
    }
    // SAFETY: reads the portal table. No cursor left open at all: none held either (a worker
    // has no open portal of its own between statements).
    if unsafe { pg_sys::ThereAreNoReadyPortals() } {
        return Ok(());
    }
    let held = crate::sql::one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_cursors c WHERE c.is_holdable)",
        &[],
    )?
    .unwrap_or(false);
    if held {
        return Err(refuse("a cursor WITH HOLD"));
    }
    Ok(())
}

/// Fire the deferred trigger events that writes to a local table target ([`as_owner_writing`])
/// queued in the current transaction, as that target's owner in a security-restricted
/// operation: a deferrable foreign key is checked here (an ERROR, 23503, when it does not
/// hold), and a deferred constraint trigger runs as the owner, never as pg_tide. Called at the
/// local target's commit, and by `worker::tx` before every commit; nothing when no such write
/// ran (events queued by pg_tide's own statements: none, its tables have no deferrable
/// constraint). At the top level (no statement running), in a transaction.
pub fn fire_deferred() -> TideResult<()> {
    let Some(owner) = DEFERRED_OWNER.with(|d| d.take()) else {
        return Ok(());
    };
    as_owner(owner, || {
        // SAFETY: at the top level of a transaction (no query running), as at commit; it
        // pushes a snapshot itself when there are events to fire.
        unsafe { pg_sys::AfterTriggerFireDeferred() };
        Ok(())
    })
}

/// Forget [`as_owner_writing`]'s owner after the transaction rolled back (its events went with
/// it).
pub fn forget_deferred() {
    DEFERRED_OWNER.with(|d| d.set(None));
}

/// Run `f` as `owner` in a security-restricted operation, with pg_tide's pinned `search_path`
/// (`pg_catalog, pg_temp`): for pg_tide's own statements made on the owner's behalf from a
/// session of another role (the event trigger of followed schemas runs in the session of
/// whoever does the DDL), so that no name in them resolves to an object that role created.
pub fn as_owner_pinned<R>(owner: pg_sys::Oid, f: impl FnOnce() -> TideResult<R>) -> TideResult<R> {
    switched(owner, c"pg_catalog, pg_temp", f)
}

/// `owner` may use the foreign server `server` (a pipeline's target server, postgres_fdw's or
/// tide_kafka's): 42501 with the GRANT to run if not. The server must exist (each caller says
/// first how to create one of its wrapper).
pub fn require_server_usage(server: &str, owner: &str) -> TideResult<()> {
    let usage = crate::sql::one::<bool>(
        "SELECT has_server_privilege($1::text::name, $2, 'USAGE')",
        &[owner.into(), server.into()],
    )?
    .unwrap_or(false);
    if usage {
        return Ok(());
    }
    let q = pgrx::spi::quote_identifier;
    Err(TideError::privilege(format!(
        "role \"{owner}\" may not use foreign server \"{server}\""
    ))
    .hint(format!(
        "GRANT USAGE ON FOREIGN SERVER {} TO {};",
        q(server),
        q(owner)
    )))
}

/// The OID of a pipeline or backfill owner recorded by name; a clear error if the role is gone.
pub fn owner_oid(owner: &str, what: &str) -> TideResult<pg_sys::Oid> {
    role_oid(owner).ok_or_else(|| {
        TideError::undefined(format!(
            "role \"{owner}\", the owner of {what}, does not exist"
        ))
        .hint("Drop it and create it again as an existing role.")
    })
}

/// Why `owner` may not read every row of table `relid` (`qualified`) as a pipeline delivers it,
/// if it may not: it lacks SELECT, or row-level security applies to it (it would read only some
/// rows, and the pipeline would deliver all of them). PostgreSQL 16's subscriptions refuse the
/// same. `None` when it may, and for a table that no longer exists (its changes end with it).
/// In a transaction; reads the catalogs as they are now.
pub fn read_problem(owner: pg_sys::Oid, relid: pg_sys::Oid, qualified: &str) -> Option<TideError> {
    let mut missing = false;
    // SAFETY: catalog lookups in a transaction; a missing relation is reported, not raised.
    let acl = unsafe {
        pg_sys::pg_class_aclcheck_ext(
            relid,
            owner,
            pg_sys::ACL_SELECT as pg_sys::AclMode,
            &mut missing,
        )
    };
    if missing {
        return None;
    }
    let name = || {
        // SAFETY: a syscache lookup of a role OID, missing_ok (NULL for an unknown role); main
        // thread.
        let c = unsafe { pg_sys::GetUserNameFromId(owner, true) };
        if c.is_null() {
            format!("{}", owner.to_u32())
        } else {
            // SAFETY: `c` is non-NULL (checked above): the NUL-terminated name GetUserNameFromId
            // allocated.
            unsafe { std::ffi::CStr::from_ptr(c) }
                .to_string_lossy()
                .into_owned()
        }
    };
    if acl != pg_sys::AclResult::ACLCHECK_OK {
        let who = name();
        return Some(
            TideError::privilege(format!(
                "the pipeline's owner \"{who}\" may not SELECT from {qualified}"
            ))
            .hint(format!(
                "A pipeline delivers only what its owner may read. GRANT SELECT ON {qualified} TO {} (its changes are then delivered), or drop the pipeline.",
                pgrx::spi::quote_identifier(&who)
            )),
        );
    }
    // SAFETY: as above; noError = true returns RLS_ENABLED instead of raising.
    let rls = unsafe { pg_sys::check_enable_rls(relid, owner, true) };
    if rls == pg_sys::CheckEnableRlsResult::RLS_ENABLED as std::ffi::c_int {
        let who = name();
        return Some(
            TideError::privilege(format!(
                "row-level security of {qualified} applies to the pipeline's owner \"{who}\""
            ))
            .hint(format!(
                "A pipeline delivers every row, so its owner must read every row: give {} BYPASSRLS, or a policy that lets it read all rows, or make it the table's owner (without FORCE ROW LEVEL SECURITY).",
                pgrx::spi::quote_identifier(&who)
            )),
        );
    }
    None
}
