//! Row filters (`tide.add_table(..., row_filter => '<expression>')`).
//!
//! Owns: reading a row filter (one SQL expression, as after `WHERE`) against a relation, the
//! rules it must follow, and its evaluation on a decoded row in the output plugin.
//!
//! Guarantees:
//! - One stored text, two readers that agree: the backfill's chunk query puts it in its `WHERE`
//!   (run as the pipeline's owner, search path `"$user", public`), the output plugin parses it
//!   against the relation at the change's catalog state (search path `pg_catalog, pg_temp`).
//!   [`check_text`] analyses it under both paths and refuses it unless both give the same tree,
//!   so no function or operator of a user schema can make them disagree; the chunk reader checks
//!   again before every chunk.
//! - The rules are PostgreSQL 15's for publication row filters (`publicationcmds.c`): only
//!   columns (no system column), constants, operators and immutable built-in functions, on
//!   built-in types and collations; no subquery, aggregate, window function, volatile or
//!   user-defined function, operator or type. So its evaluation during decoding (under a
//!   historic snapshot, as the worker's role) reads no table and runs no user code. Every
//!   function it calls must also be executable by the pipeline's owner, checked when the filter
//!   is stored, at every chunk, and each time the plugin compiles it (the owner's OID is a plugin
//!   option): at the start of a decoding session, after a change of the table, and after any
//!   change of a function's catalog row, a GRANT or REVOKE among them, at its position in the
//!   stream.
//! - Replica identity: an UPDATE or DELETE is decided on the old row, so every column the filter
//!   reads must be in the old row: the replica identity must be FULL or cover those columns
//!   (PostgreSQL 15 refuses the UPDATE/DELETE on the table otherwise; pg_tide refuses the filter
//!   at `add_table`, and the plugin stops the stream with the same error if the identity
//!   changed since).

use crate::error::{TideError, TideResult};
use pgrx::pg_sys;
use pgrx::pg_sys::errcodes::PgSqlErrorCode;
use std::ffi::{c_void, CStr, CString};

/// The raw parse tree of `text` if it is exactly one SQL expression, as PostgreSQL's parser
/// sees it (`raw_parser` in PL/pgSQL-expression mode, which accepts `<targets> [FROM ...]
/// [WHERE ...] ...`; the tree must be a single unnamed target and nothing else); otherwise why
/// not. A syntax error is the parser's ERROR.
pub fn raw_expression(text: &str) -> Result<*mut pg_sys::Node, &'static str> {
    let c = CString::new(text).map_err(|_| "it contains a NUL byte")?;
    // SAFETY: the parser reads the NUL-terminated string and returns a tree in the current
    // memory context; every pointer below is checked before it is read.
    unsafe {
        let list = pg_sys::raw_parser(c.as_ptr(), pg_sys::RawParseMode::RAW_PARSE_PLPGSQL_EXPR);
        if list.is_null() || (*list).length != 1 {
            return Err("it is not one expression");
        }
        let raw = (*(*list).elements).ptr_value as *mut pg_sys::RawStmt;
        let stmt = (*raw).stmt;
        if stmt.is_null() || (*stmt).type_ != pg_sys::NodeTag::T_SelectStmt {
            return Err("it is not one expression");
        }
        let s = &*(stmt as *mut pg_sys::SelectStmt);
        let only_targets = s.distinctClause.is_null()
            && s.intoClause.is_null()
            && s.fromClause.is_null()
            && s.whereClause.is_null()
            && s.groupClause.is_null()
            && s.havingClause.is_null()
            && s.windowClause.is_null()
            && s.valuesLists.is_null()
            && s.sortClause.is_null()
            && s.limitOffset.is_null()
            && s.limitCount.is_null()
            && s.lockingClause.is_null()
            && s.withClause.is_null()
            && s.op == pg_sys::SetOperation::SETOP_NONE;
        if !only_targets || s.targetList.is_null() || (*s.targetList).length != 1 {
            return Err("it is not one expression");
        }
        let target = (*(*s.targetList).elements).ptr_value as *mut pg_sys::ResTarget;
        if !(*target).name.is_null() {
            return Err("it is not one expression (it has an alias)");
        }
        Ok((*target).val)
    }
}

/// Parse-analyse the raw expression `raw` as a `WHERE` clause on `rel` (its columns by name),
/// coerced to boolean, with collations assigned. An unknown column or a type mismatch is the
/// parser's ERROR.
unsafe fn analyze(rel: pg_sys::Relation, raw: *mut pg_sys::Node) -> *mut pg_sys::Node {
    // SAFETY: the callers (check_text, Compiled::new) pass an open, locked relation and a raw
    // expression tree in the current memory context; the parse state is freed here and the analysed
    // tree is allocated in the current memory context; an invalid expression is the parser's ERROR.
    unsafe {
        let pstate = pg_sys::make_parsestate(std::ptr::null_mut());
        let nsitem = pg_sys::addRangeTableEntryForRelation(
            pstate,
            rel,
            pg_sys::AccessShareLock as pg_sys::LOCKMODE,
            std::ptr::null_mut(),
            false,
            false,
        );
        pg_sys::addNSItemToQuery(pstate, nsitem, false, true, true);
        let e = pg_sys::transformExpr(pstate, raw, pg_sys::ParseExprKind::EXPR_KIND_WHERE);
        let e = pg_sys::coerce_to_boolean(pstate, e, c"row_filter".as_ptr());
        pg_sys::assign_expr_collations(pstate, e);
        pg_sys::free_parsestate(pstate);
        pg_sys::fix_opfuncids(e);
        e
    }
}

/// Why an analysed filter breaks the rules (SQLSTATE and message), if it does.
struct Walk {
    owner: Option<pg_sys::Oid>,
    problem: Option<(PgSqlErrorCode, String)>,
}

fn func_name(funcid: pg_sys::Oid) -> String {
    // SAFETY: a syscache lookup; NULL for an unknown OID.
    let p = unsafe { pg_sys::get_func_name(funcid) };
    if p.is_null() {
        format!("function {}", funcid.to_u32())
    } else {
        // SAFETY: a palloc'd NUL-terminated name.
        format!("{}()", unsafe { CStr::from_ptr(p) }.to_string_lossy())
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn function_bad(funcid: pg_sys::Oid, cx: *mut c_void) -> bool {
    // SAFETY: `cx` is the `Walk` that `check` passes.
    let w = unsafe { &mut *(cx as *mut Walk) };
    if funcid.to_u32() >= pg_sys::FirstNormalObjectId {
        w.problem = Some((
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "it calls the user-defined function or operator {}",
                func_name(funcid)
            ),
        ));
        return true;
    }
    // SAFETY: syscache lookups of an existing function.
    if unsafe { pg_sys::func_volatile(funcid) } as u8 != pg_sys::PROVOLATILE_IMMUTABLE {
        w.problem = Some((
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("it calls {}, which is not immutable", func_name(funcid)),
        ));
        return true;
    }
    if let Some(owner) = w.owner {
        // SAFETY: a syscache lookup of a function OID taken from an analysed expression and a role
        // OID; an unknown OID is an ERROR, not UB; main thread.
        let acl = unsafe {
            crate::pgver::proc_aclcheck(funcid, owner, pg_sys::ACL_EXECUTE as pg_sys::AclMode)
        };
        if acl != pg_sys::AclResult::ACLCHECK_OK {
            w.problem = Some((
                PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
                format!(
                    "permission denied for function {}: the pipeline's owner may not execute it",
                    func_name(funcid)
                ),
            ));
            return true;
        }
    }
    false
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn walker(node: *mut pg_sys::Node, cx: *mut c_void) -> bool {
    use pg_sys::NodeTag::*;
    if node.is_null() {
        return false;
    }
    // SAFETY: `cx` is the `Walk` that `check` passes; `node` is a node of an analysed tree.
    unsafe {
        let w = &mut *(cx as *mut Walk);
        let tag = (*node).type_;
        let mut bad = |code, msg: String| {
            w.problem = Some((code, msg));
            true
        };
        match tag {
            T_Var => {
                if (*(node as *mut pg_sys::Var)).varattno < 0 {
                    return bad(
                        PgSqlErrorCode::ERRCODE_INVALID_COLUMN_REFERENCE,
                        "it reads a system column".into(),
                    );
                }
            }
            T_Const | T_OpExpr | T_DistinctExpr | T_NullIfExpr | T_ScalarArrayOpExpr
            | T_FuncExpr | T_BoolExpr | T_NullTest | T_BooleanTest | T_CaseExpr | T_CaseWhen
            | T_CaseTestExpr | T_CoalesceExpr | T_MinMaxExpr | T_ArrayExpr | T_RowExpr
            | T_RelabelType | T_CoerceViaIO | T_ArrayCoerceExpr | T_CollateExpr | T_List => {}
            _ => {
                return bad(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    "it holds a subquery, an aggregate, a window function, a parameter or another construct that is not a plain expression".into(),
                )
            }
        }
        if !matches!(tag, T_List | T_CaseWhen) {
            let ty = pg_sys::exprType(node);
            if ty.to_u32() >= pg_sys::FirstNormalObjectId {
                let name = CStr::from_ptr(pg_sys::format_type_be(ty))
                    .to_string_lossy()
                    .into_owned();
                return bad(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    format!("it uses the user-defined type {name}"),
                );
            }
            if pg_sys::exprCollation(node).to_u32() >= pg_sys::FirstNormalObjectId {
                return bad(
                    PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                    "it uses a user-defined collation".into(),
                );
            }
        }
        if pg_sys::check_functions_in_node(node, Some(function_bad), cx) {
            return true;
        }
        pg_sys::expression_tree_walker(node, Some(walker), cx)
    }
}

/// `expr` (analysed) against the rules; functions executable by `owner` when given.
unsafe fn check(
    expr: *mut pg_sys::Node,
    owner: Option<pg_sys::Oid>,
) -> Result<(), (PgSqlErrorCode, String)> {
    let mut w = Walk {
        owner,
        problem: None,
    };
    // SAFETY: `w` outlives the walk.
    unsafe { walker(expr, &mut w as *mut Walk as *mut c_void) };
    match w.problem {
        Some(p) => Err(p),
        None => Ok(()),
    }
}

/// The columns (attribute numbers) `expr` reads.
unsafe fn columns(expr: *mut pg_sys::Node) -> Vec<i16> {
    // SAFETY: `expr` is an analysed expression tree (from `analyze`); the bitmap pull_varattnos
    // builds is in the current memory context and read with bms_next_member until it says none is
    // left.
    unsafe {
        let mut set: *mut pg_sys::Bitmapset = std::ptr::null_mut();
        pg_sys::pull_varattnos(expr, 1, &mut set);
        let mut out = Vec::new();
        let mut i = -1;
        loop {
            i = pg_sys::bms_next_member(set, i);
            if i < 0 {
                break;
            }
            out.push((i + pg_sys::FirstLowInvalidHeapAttributeNumber) as i16);
        }
        out
    }
}

/// Whether the old row of an UPDATE or DELETE of `rel` holds every column of `cols`: replica
/// identity FULL, or every one in the replica identity (its index, else the primary key).
unsafe fn identity_covers(rel: pg_sys::Relation, cols: &[i16]) -> bool {
    // SAFETY: `rel` is an open relation (the callers keep it open); the identity bitmaps
    // RelationGetIndexAttrBitmap returns are copies in the current memory context (NULL: none).
    unsafe {
        if (*(*rel).rd_rel).relreplident == pg_sys::REPLICA_IDENTITY_FULL as std::ffi::c_char {
            return true;
        }
        let mut ident = pg_sys::RelationGetIndexAttrBitmap(
            rel,
            pg_sys::IndexAttrBitmapKind::INDEX_ATTR_BITMAP_IDENTITY_KEY,
        );
        if ident.is_null() {
            ident = pg_sys::RelationGetIndexAttrBitmap(
                rel,
                pg_sys::IndexAttrBitmapKind::INDEX_ATTR_BITMAP_PRIMARY_KEY,
            );
        }
        cols.iter().all(|&a| {
            pg_sys::bms_is_member(a as i32 - pg_sys::FirstLowInvalidHeapAttributeNumber, ident)
        })
    }
}

/// Names of the columns `cols` of `rel`.
unsafe fn column_names(rel: pg_sys::Relation, cols: &[i16]) -> Vec<String> {
    // SAFETY: `rel` is an open relation; only attribute numbers within 1..=natts are read, and
    // their names are NUL-terminated NameData.
    unsafe {
        let desc = (*rel).rd_att;
        cols.iter()
            .filter(|&&a| a > 0 && (a as i32) <= (*desc).natts)
            .map(|&a| {
                let att = crate::pgver::tupdesc_attr(desc, a as usize - 1);
                CStr::from_ptr((*att).attname.data.as_ptr())
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }
}

fn hint_rules(qualified: &str) -> String {
    format!("A row filter is one boolean expression on the columns of {qualified}, as after WHERE, made of columns, constants, operators and immutable built-in functions (PostgreSQL 15's rules for publication row filters), e.g. 'region = ''eu'' AND NOT archived'.")
}

/// Check the row filter `text` of table `relid` (`qualified`) for a pipeline owned by `owner`,
/// as the API stores it and as the chunk reader reads it: one expression; valid on the table's
/// columns; the rules above, under the owner's search path and under pg_tide's, to the same
/// tree; every function executable by the owner; its columns in the replica identity. Errors
/// carry a SQLSTATE and a hint. Runs the analysis as the owner.
pub fn check_text(
    relid: pg_sys::Oid,
    qualified: &str,
    text: &str,
    owner: pg_sys::Oid,
) -> TideResult<()> {
    let invalid = |code: PgSqlErrorCode, why: &str| {
        TideError::new(code, format!("invalid row filter for {qualified}: {why}"))
            .hint(hint_rules(qualified))
    };
    if text.trim().is_empty() {
        return Err(TideError::invalid(format!("the row filter for {qualified} is empty")).hint(
            "Pass a boolean expression on the table's columns, or omit row_filter (NULL) to deliver every row.",
        ));
    }
    let raw = caught(qualified, || {
        raw_expression(text).map_err(|why| invalid(PgSqlErrorCode::ERRCODE_SYNTAX_ERROR, why))
    })?;
    // SAFETY: the relation is locked by the caller (add_table, the chunk reader); opened here and
    // closed below whatever happens (errors of the analysis are caught inside each switch, so
    // the switch restores the identity and the settings); the trees live in the current memory
    // context.
    unsafe {
        pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let rel = pg_sys::RelationIdGetRelation(relid);
        if rel.is_null() {
            return Err(TideError::undefined(format!(
                "relation {qualified} does not exist"
            )));
        }
        let raw_copy = pg_sys::copyObjectImpl(raw as *const c_void) as *mut pg_sys::Node;
        let analysed =
            crate::security::as_owner(owner, || caught(qualified, || Ok(analyze(rel, raw))))
                .and_then(|a| {
                    crate::security::with_pinned_search_path(|| {
                        caught(qualified, || Ok(analyze(rel, raw_copy)))
                    })
                    .map(|b| (a, b))
                })
                .and_then(|(a, b)| {
                    let checked = caught(qualified, || Ok(check(a, Some(owner))))?;
                    let cols = columns(a);
                    Ok((
                        a,
                        b,
                        checked,
                        identity_covers(rel, &cols),
                        column_names(rel, &cols),
                    ))
                });
        pg_sys::RelationClose(rel);
        let (as_owner, as_tide, checked, covered, names) = analysed?;
        checked.map_err(|(code, why)| {
            if code == PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE {
                TideError::new(code, format!("invalid row filter for {qualified}: {why}")).hint(
                    "The stream and the backfill evaluate the filter with the pipeline owner's rights: GRANT EXECUTE on the function to the owner, or filter without it.",
                )
            } else {
                invalid(code, &why)
            }
        })?;
        if !pg_sys::equal(as_owner as *const c_void, as_tide as *const c_void) {
            return Err(invalid(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                "an operator, function or type of a schema on the owner's search path takes the place of a built-in one in it",
            ));
        }
        if !covered {
            return Err(TideError::new(
                PgSqlErrorCode::ERRCODE_INVALID_COLUMN_REFERENCE,
                format!(
                    "the row filter for {qualified} reads {} outside the table's replica identity",
                    names.join(", ")
                ),
            )
            .hint(format!("An UPDATE or DELETE is filtered on the old row, which holds only the replica identity's columns (as for PostgreSQL 15's publications): filter on those columns, or ALTER TABLE {qualified} REPLICA IDENTITY FULL.")));
        }
    }
    Ok(())
}

/// Run `f`, turning a PostgreSQL ERROR it raises into an "invalid row filter" error with its
/// SQLSTATE and message.
fn caught<R>(qualified: &str, f: impl FnOnce() -> TideResult<R>) -> TideResult<R> {
    pgrx::PgTryBuilder::new(std::panic::AssertUnwindSafe(f))
        .catch_others(|e| {
            let (code, msg) = match &e {
                pgrx::pg_sys::panic::CaughtError::PostgresError(r)
                | pgrx::pg_sys::panic::CaughtError::ErrorReport(r) => {
                    (r.sql_error_code(), r.message().to_string())
                }
                pgrx::pg_sys::panic::CaughtError::RustPanic { ereport, .. } => {
                    (ereport.sql_error_code(), ereport.message().to_string())
                }
            };
            Err(
                TideError::new(code, format!("invalid row filter for {qualified}: {msg}"))
                    .hint(hint_rules(qualified)),
            )
        })
        .execute()
}

/// A row filter compiled for one relation in the output plugin: its expression state, an
/// expression context and a slot in a memory context of its own (deleted with it).
pub struct Compiled {
    cx: pg_sys::MemoryContext,
    state: *mut pg_sys::ExprState,
    econtext: *mut pg_sys::ExprContext,
    slot: *mut pg_sys::TupleTableSlot,
    /// Every column it reads is in the old row of an UPDATE/DELETE (see the module header).
    pub covered: bool,
    /// The relation's name, for errors.
    pub name: String,
}

impl Compiled {
    /// Compile `text` for `rel` (the relation a change is sent as), in a child of `parent`.
    /// Raises an ERROR when the text breaks the rules (it was checked when stored: only a
    /// hand-made plugin option or a later change of the table or of a privilege gets here).
    ///
    /// # Safety
    /// In a transaction where `rel`'s catalog can be read (the plugin's change callback).
    pub unsafe fn new(
        rel: pg_sys::Relation,
        text: &str,
        owner: Option<pg_sys::Oid>,
        parent: pg_sys::MemoryContext,
    ) -> Compiled {
        // SAFETY: the caller's (see # Safety): `rel` is open in a transaction where its catalog can
        // be read; everything is built in `cx` (a child of `parent`) or is the standalone
        // expression context freed by Drop, and the previous memory context is restored before
        // return (an ERROR raised meanwhile leaves `cx` to be freed with `parent`).
        unsafe {
            let cx = pg_sys::AllocSetContextCreateInternal(
                parent,
                c"pg_tide row filter".as_ptr(),
                pg_sys::ALLOCSET_SMALL_MINSIZE as usize,
                pg_sys::ALLOCSET_SMALL_INITSIZE as usize,
                pg_sys::ALLOCSET_SMALL_MAXSIZE as usize,
            );
            let old = pg_sys::MemoryContextSwitchTo(cx);
            let name = CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr())
                .to_string_lossy()
                .into_owned();
            let fail = |code, why: &str| -> ! {
                TideError::new(code, format!("pg_tide: invalid row filter for \"{name}\": {why}"))
                    .hint("Check it with tide.tables (row_filter); remove and re-add the table with a filter that follows the rules of the README (Row filters).")
                    .raise()
            };
            let raw = match raw_expression(text) {
                Ok(r) => r,
                Err(why) => fail(PgSqlErrorCode::ERRCODE_SYNTAX_ERROR, why),
            };
            let expr = analyze(rel, raw);
            if let Err((code, why)) = check(expr, owner) {
                fail(code, &why);
            }
            let covered = identity_covers(rel, &columns(expr));
            let planned = pg_sys::expression_planner(expr as *mut pg_sys::Expr);
            let state = pg_sys::ExecInitExpr(planned, std::ptr::null_mut());
            let econtext = pg_sys::CreateStandaloneExprContext();
            // A copy (not reference-counted, in `cx`), as pgoutput makes: the relation's own
            // descriptor would be pinned by the current resource owner, which is not the one
            // current when the filter is dropped.
            let desc = pg_sys::CreateTupleDescCopy((*rel).rd_att);
            let slot = pg_sys::MakeSingleTupleTableSlot(desc, &raw const pg_sys::TTSOpsVirtual);
            pg_sys::MemoryContextSwitchTo(old);
            Compiled {
                cx,
                state,
                econtext,
                slot,
                covered,
                name,
            }
        }
    }

    /// Whether the row `values`/`nulls` (laid out as the relation) passes: NULL is false, as
    /// for `WHERE`.
    ///
    /// # Safety
    /// `values`/`nulls` have one entry per attribute of the relation it was compiled for, and
    /// their by-reference values live until this returns.
    pub unsafe fn matches(&self, values: &[pg_sys::Datum], nulls: &[bool]) -> bool {
        // SAFETY: the caller's (see # Safety): one value per attribute (`n` is also bounded by the
        // slot's natts), alive until this returns; `slot`, `state` and `econtext` were built by
        // `new` and live until Drop; the per-tuple memory is reset before return.
        unsafe {
            let slot = self.slot;
            pg_sys::ExecClearTuple(slot);
            let n = ((*(*slot).tts_tupleDescriptor).natts as usize).min(values.len());
            for i in 0..n {
                *(*slot).tts_values.add(i) = values[i];
                *(*slot).tts_isnull.add(i) = nulls[i];
            }
            pg_sys::ExecStoreVirtualTuple(slot);
            (*self.econtext).ecxt_scantuple = slot;
            let mut isnull = false;
            let d = pg_sys::ExecEvalExprSwitchContext(self.state, self.econtext, &mut isnull);
            let pass = !isnull && d.value() != 0;
            pg_sys::MemoryContextReset((*self.econtext).ecxt_per_tuple_memory);
            pg_sys::ExecClearTuple(slot);
            pass
        }
    }
}

impl Drop for Compiled {
    fn drop(&mut self) {
        // SAFETY: made by `new`; the expression context is standalone (freed with its memory,
        // which is under the caller's context, not ours: free it explicitly), the rest is in
        // `cx`.
        unsafe {
            pg_sys::ExecDropSingleTupleTableSlot(self.slot);
            pg_sys::FreeExprContext(self.econtext, false);
            pg_sys::MemoryContextDelete(self.cx);
        }
    }
}
