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
//!   its own statements. [`as_owner_pinned`] is the same with pg_tide's pinned `search_path`,
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
    let oid = unsafe { pg_sys::get_role_oid(c.as_ptr(), true) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// Whether `member` has the privileges of `role` (directly, through inheritance, or as a
/// superuser): what PostgreSQL checks for "is the owner or a member of the owning role".
pub fn has_privs_of(member: pg_sys::Oid, role: pg_sys::Oid) -> bool {
    unsafe { pg_sys::has_privs_of_role(member, role) }
}

pub fn is_superuser(role: pg_sys::Oid) -> bool {
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
    // SAFETY: a GUC nest level opened and closed around `f` on this (the main) thread.
    let nest = unsafe {
        let nest = pg_sys::NewGUCNestLevel();
        pg_sys::set_config_option(
            c"search_path".as_ptr(),
            search_path.as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        nest
    };
    let out = f();
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

/// Run `f` as `owner` in a security-restricted operation, with pg_tide's pinned `search_path`
/// (`pg_catalog, pg_temp`): for pg_tide's own statements made on the owner's behalf from a
/// session of another role (the event trigger of followed schemas runs in the session of
/// whoever does the DDL), so that no name in them resolves to an object that role created.
pub fn as_owner_pinned<R>(owner: pg_sys::Oid, f: impl FnOnce() -> TideResult<R>) -> TideResult<R> {
    switched(owner, c"pg_catalog, pg_temp", f)
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
        let c = unsafe { pg_sys::GetUserNameFromId(owner, true) };
        if c.is_null() {
            format!("{}", owner.to_u32())
        } else {
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
