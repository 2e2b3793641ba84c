//! pg_tide's logical decoding output plugin.
//!
//! Owns: turning decoded heap changes into the versioned binary wire format of
//! `docs/wire-format.md` (encoded by `tide_core::wire`, the same code the worker decodes with).
//!
//! Guarantees:
//! - Only the relations listed in the `tables` option are emitted, and no logical message (any
//!   role may emit one; pg_tide's markers are rows of `tide.marker`). Without a `tables` option every user table outside
//!   the `tide` schema is emitted, which is handy for `pg_logical_slot_peek_binary_changes` by hand.
//!   pg_tide's own catalog and outbox tables are never emitted, so its writes cannot feed back.
//! - Transactions that emit nothing are not emitted at all (Begin is written lazily).
//! - A `Relation` message precedes the first change of a relation in a decoding session and
//!   follows every relcache invalidation of it, so every change is read with the shape it was
//!   written with (DDL does not stop the stream).
//! - An unchanged TOAST value is sent as "unchanged", never as a placeholder or a stale value.
//! - A transaction that rewrites an emitted relation's heap (table-rewriting `ALTER TABLE`) sends
//!   one `Rewrite` message for it, at the position of its first rewritten row: the rows of a
//!   rewrite are not decoded as changes of the table, yet may all have new values.
//! - Changes committed with a `pg_tide_*` replication origin (a pipeline worker's own writes to
//!   table targets, see `worker::origin`) are not emitted: no pipeline ever captures what
//!   pg_tide wrote. Once such an origin is known, its transactions are not even decoded
//!   (`filter_by_origin`). A worker writes its watermarks outside those transactions.
//! - A partitioned table named in `tables` is emitted whole: a change of any of its partitions
//!   (any depth, attached now or later, as the catalog says at the change's position) is sent as
//!   a change of the partitioned table, with its Relation and its columns (matched by name:
//!   partitions may have another column order or dropped columns), as pgoutput's
//!   `publish_via_partition_root` does. (An UPDATE that moves a row to another partition changes
//!   its key, which always includes the partition key: it is the partition's delete and the other
//!   partition's insert, like any key change.) A TRUNCATE
//!   of every partition is a Truncate of the table; of some partitions only, a
//!   TruncatePartition per partition with its constraint (what was removed). See
//!   `docs/wire-format.md`, "Partitioned tables".
//! - A relation with a `row_filter.<relid>` option is filtered as PostgreSQL 15's publication
//!   row filters do (see `filtered_change` and `row_filter`): only the changes whose rows pass
//!   are sent, an update moving a row in or out becomes an insert or a delete. Relations without
//!   one take the unfiltered path unchanged.
//! - A relation with a `masks.<relid>` option has those columns masked in every tuple it sends
//!   (new rows, old rows, old keys; see `tide_core::mask`): the clear value never enters the
//!   stream. A `hash` or `truncate` column is described as `text` in its Relation message.
//! - Values are the type's text output, produced under a per-change memory context that is reset
//!   after each change, so memory does not grow with transaction size.
//! - With the option `streaming 'on'` (and a server that can stream: the context allows it), a
//!   transaction larger than `logical_decoding_work_mem` is sent while it runs, in blocks
//!   (`StreamStart`, `StreamChange`s, `StreamStop`), then `StreamCommit` or `StreamAbort`
//!   (also for an aborted subtransaction of it, whose changes are marked with its xid), as
//!   `docs/wire-format.md` describes. A streamed transaction's Relation messages are its own
//!   (sent in it whatever was sent before, and the transaction's first block of each session
//!   carries `first`); after it ends, the relations it described are described again before
//!   their next change elsewhere. Without the option nothing is streamed.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use tide_core::lsn::Lsn;
use tide_core::stream_blocks::StreamBlocks;
use tide_core::wire;

/// Per-decoding-session state, owned by `ctx->output_plugin_private`.
struct PluginState {
    /// The slot is being created (`pg_create_logical_replication_slot`: startup's `is_init`).
    /// Decoding then looks for its starting point and replays the transactions that begin and
    /// commit while it waits for older ones to end, with no writer to write to (the callbacks
    /// may not write, and no catalog lookup of theirs may run there: a lookup of a worker's
    /// replication origin failed with "snapshot reference ... is not owned by resource owner
    /// TopTransaction"). Every callback does nothing meanwhile, and `filter_by_origin` drops
    /// every change: nothing before the slot's consistent point is ever delivered anyway.
    creating: bool,
    /// `None`: emit every user table outside the `tide` schema.
    tables: Option<HashSet<pg_sys::Oid>>,
    /// Whether the current transaction's Begin has been written.
    begun: bool,
    /// Scratch buffer for one message.
    buf: Vec<u8>,
    /// Type output function per type OID.
    out_funcs: HashMap<pg_sys::Oid, pg_sys::Oid>,
    /// Short-lived context reset after every change.
    change_cx: pg_sys::MemoryContext,
    /// OID of the `tide` schema, when it exists.
    tide_namespace: Option<pg_sys::Oid>,
    /// Transactions skipped (nothing emitted) since the last message, and the end LSN of the last
    /// transaction reported (emitted or keepalive).
    skipped: u32,
    reported_end: u64,
    /// Relations whose rewrite the current transaction has reported (or found not wanted).
    rewritten: HashSet<pg_sys::Oid>,
    /// Replication origin → whether it is a pg_tide worker's (`pg_tide_*`), as looked up.
    origins: HashMap<pg_sys::RepOriginId, bool>,
    /// Streamed transactions: the block being decoded, whether its StreamStart was written
    /// (lazily, like Begin), which transactions wrote a block, their rewrites reported.
    stream: StreamBlocks,
    /// The (sub)transaction of the change being written in a block.
    sub: u32,
    /// Row filters by emitted relation (`row_filter.<relid>` options), and the role whose right
    /// to execute their functions is checked (`row_filter_owner`).
    row_filters: HashMap<pg_sys::Oid, String>,
    filter_owner: Option<pg_sys::Oid>,
    /// The row filters compiled for the relations as they are now (dropped at a relcache
    /// invalidation of the relation, see `STALE_FILTERS`).
    compiled: HashMap<pg_sys::Oid, crate::row_filter::Compiled>,
    /// Memory the compiled filters live under (the decoding context's).
    filter_parent: pg_sys::MemoryContext,
    /// Column lists by emitted relation (`columns.<relid>` options): whether each attribute
    /// (by number - 1) is sent.
    column_lists: HashMap<pg_sys::Oid, std::rc::Rc<Vec<bool>>>,
    /// The column list of the relation whose change is being written, if it has one.
    listed: Option<std::rc::Rc<Vec<bool>>>,
    /// Column masks by emitted relation (`masks.<relid>` options): each attribute's (by number
    /// - 1) mask, if it has one; and the pipeline's salt (`mask_salt`, hex).
    masks: HashMap<pg_sys::Oid, std::rc::Rc<Masked>>,
    salt: Vec<u8>,
    /// The masks of the relation whose change is being written, if it has any.
    masked: Option<std::rc::Rc<Masked>>,
}

/// One relation's masks, by attribute number - 1.
type Masked = Vec<Option<tide_core::mask::Mask>>;

/// PostgreSQL functions pgrx does not bind (`catalog/partition.h`, `catalog/pg_inherits.h`,
/// `utils/partcache.h`), called through pgrx's FFI guard (an ERROR becomes a Rust panic that
/// the callback's `#[pg_guard]` turns back into the ERROR).
mod c {
    use pgrx::pg_sys;
    mod raw {
        use pgrx::pg_sys;
        unsafe extern "C-unwind" {
            pub fn get_partition_ancestors(relid: pg_sys::Oid) -> *mut pg_sys::List;
            pub fn find_all_inheritors(
                parent: pg_sys::Oid,
                lockmode: pg_sys::LOCKMODE,
                numparents: *mut *mut pg_sys::List,
            ) -> *mut pg_sys::List;
            pub fn get_partition_qual_relid(relid: pg_sys::Oid) -> *mut pg_sys::Expr;
        }
    }
    pub unsafe fn get_partition_ancestors(relid: pg_sys::Oid) -> *mut pg_sys::List {
        unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| raw::get_partition_ancestors(relid)) }
    }
    pub unsafe fn find_all_inheritors(parent: pg_sys::Oid) -> *mut pg_sys::List {
        unsafe {
            pg_sys::ffi::pg_guard_ffi_boundary(|| {
                raw::find_all_inheritors(
                    parent,
                    pg_sys::NoLock as pg_sys::LOCKMODE,
                    std::ptr::null_mut(),
                )
            })
        }
    }
    pub unsafe fn get_partition_qual_relid(relid: pg_sys::Oid) -> *mut pg_sys::Expr {
        unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| raw::get_partition_qual_relid(relid)) }
    }
}

/// A Keepalive is written after this many skipped transactions...
const KEEPALIVE_TXNS: u32 = 64;
/// ...or this much WAL, whichever comes first.
const KEEPALIVE_BYTES: u64 = 1 << 20;

thread_local! {
    /// Relations whose description was sent in this decoding session and not invalidated since.
    static SENT: RefCell<HashSet<pg_sys::Oid>> = RefCell::new(HashSet::new());
    static CALLBACK_REGISTERED: RefCell<bool> = const { RefCell::new(false) };
    /// Streamed transaction → relations described in it and not invalidated since.
    static STREAM_SENT: RefCell<HashMap<u32, HashSet<pg_sys::Oid>>> = RefCell::new(HashMap::new());
    /// Partition → the emitted partitioned table it is sent as (`None`: not one of an emitted
    /// table's partitions), as looked up; dropped at a relcache invalidation of either.
    static ROUTES: RefCell<HashMap<pg_sys::Oid, Option<pg_sys::Oid>>> = RefCell::new(HashMap::new());
    /// Relations invalidated since their row filter was compiled (`None`: all), dropped by the
    /// next change (not in the callback, which must not free what a caller may be using).
    static STALE_FILTERS: RefCell<Option<HashSet<pg_sys::Oid>>> = RefCell::new(Some(HashSet::new()));
}

#[pg_guard]
unsafe extern "C-unwind" fn relcache_invalidated(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    SENT.with(|s| {
        let mut s = s.borrow_mut();
        if relid == pg_sys::InvalidOid {
            s.clear();
        } else {
            s.remove(&relid);
        }
    });
    STREAM_SENT.with(|s| {
        for set in s.borrow_mut().values_mut() {
            if relid == pg_sys::InvalidOid {
                set.clear();
            } else {
                set.remove(&relid);
            }
        }
    });
    ROUTES.with(|r| {
        let mut r = r.borrow_mut();
        if relid == pg_sys::InvalidOid {
            r.clear();
        } else {
            r.remove(&relid);
            r.retain(|_, root| *root != Some(relid));
        }
    });
    STALE_FILTERS.with(|f| {
        let mut f = f.borrow_mut();
        match (relid == pg_sys::InvalidOid, f.as_mut()) {
            (true, _) => *f = None,
            (false, Some(set)) => {
                set.insert(relid);
            }
            (false, None) => {}
        }
    });
}

/// A function's catalog row changed (its privileges among them, at the position of the GRANT or
/// REVOKE in the stream): every row filter is compiled again, checking the owner's right to
/// execute its functions as the catalog says from there on.
#[pg_guard]
unsafe extern "C-unwind" fn function_invalidated(_arg: pg_sys::Datum, _cacheid: i32, _hash: u32) {
    STALE_FILTERS.with(|f| *f.borrow_mut() = None);
}

/// Entry point PostgreSQL looks up when a slot uses the plugin `pg_tide`.
#[pg_guard]
#[unsafe(no_mangle)]
pub unsafe extern "C-unwind" fn _PG_output_plugin_init(cb: *mut pg_sys::OutputPluginCallbacks) {
    unsafe {
        (*cb).startup_cb = Some(startup);
        (*cb).begin_cb = Some(begin);
        (*cb).change_cb = Some(change);
        (*cb).truncate_cb = Some(truncate);
        (*cb).commit_cb = Some(commit);
        // No message_cb: logical messages are not pg_tide's (any role can emit one with
        // pg_logical_emit_message), so none reaches a worker.
        (*cb).filter_by_origin_cb = Some(filter_by_origin);
        // In-progress transactions, when the reader asks for them (option `streaming`). No
        // stream_message_cb (no message_cb either), and no two-phase callbacks: decoding calls
        // stream_prepare only for a slot with two_phase, which pg_tide never creates.
        (*cb).stream_start_cb = Some(stream_start);
        (*cb).stream_stop_cb = Some(stream_stop);
        (*cb).stream_abort_cb = Some(stream_abort);
        (*cb).stream_commit_cb = Some(stream_commit);
        (*cb).stream_change_cb = Some(stream_change);
        (*cb).stream_truncate_cb = Some(stream_truncate);
        (*cb).shutdown_cb = Some(shutdown);
    }
}

/// The plugin's state, at the entry of a callback (every callback but startup and shutdown
/// calls this first, before it writes anything).
///
/// Discards what an interrupted callback left in the scratch buffer: every callback flushes each
/// message it starts before it returns, so bytes found here are part of a message an ERROR cut
/// short. Decoding goes on after one such ERROR: a streamed transaction that aborts while its
/// block is decoded makes the next catalog lookup (a type's output function, an enum label)
/// fail with ERRCODE_TRANSACTION_ROLLBACK, which `ReorderBufferProcessTXN` catches, and then
/// calls `stream_stop`. Kept, the half-written change and the StreamStop went out as one
/// message, which the reader could not decode ("expected a value kind ... found byte 0x45",
/// issue 42).
unsafe fn state<'a>(ctx: *mut pg_sys::LogicalDecodingContext) -> &'a mut PluginState {
    // SAFETY: startup stores a leaked Box<PluginState> here before any other callback runs, and
    // shutdown is the only place that frees it.
    let st = unsafe { &mut *((*ctx).output_plugin_private as *mut PluginState) };
    st.buf.clear();
    st
}

fn option_string(def: *mut pg_sys::DefElem) -> (String, String) {
    unsafe {
        let name = CStr::from_ptr((*def).defname)
            .to_string_lossy()
            .into_owned();
        let value = if (*def).arg.is_null() {
            String::new()
        } else {
            CStr::from_ptr(pg_sys::defGetString(def))
                .to_string_lossy()
                .into_owned()
        };
        (name, value)
    }
}

fn invalid_option(message: String) -> ! {
    crate::error::TideError::invalid(message)
        .hint(format!(
            "pg_tide accepts the options proto_version ('{}'), tables (comma-separated relation OIDs), streaming ('on' or 'off'), row_filter.<relation OID> (a row filter), row_filter_owner (a role OID), columns.<relation OID> (comma-separated attribute numbers), masks.<relation OID> (a JSON object of attribute numbers and masks) and mask_salt (hex).",
            wire::PROTO_VERSION
        ))
        .raise()
}

/// The plugin's options (see `invalid_option`'s hint).
struct Options {
    tables: Option<HashSet<pg_sys::Oid>>,
    /// Whether to stream transactions in progress (`streaming 'on'`).
    streaming: bool,
    row_filters: HashMap<pg_sys::Oid, String>,
    filter_owner: Option<pg_sys::Oid>,
    column_lists: HashMap<pg_sys::Oid, std::rc::Rc<Vec<bool>>>,
    masks: HashMap<pg_sys::Oid, std::rc::Rc<Masked>>,
    salt: Vec<u8>,
}

/// A `masks.<relid>` option: the relation, and each attribute's mask by number - 1. The value
/// is never repeated in an error (it is a pipeline's own setting, but only its names matter).
fn parse_masks(name: &str, value: &str) -> (pg_sys::Oid, Masked) {
    let relid = name["masks.".len()..].parse::<u32>();
    let parsed = tide_core::mask::Masks::parse(value).and_then(|m| {
        let mut out: Masked = Vec::new();
        for (attnum, mask) in m.columns {
            let a = attnum
                .parse::<usize>()
                .ok()
                .filter(|&a| a > 0 && a <= pg_sys::MaxHeapAttributeNumber as usize)
                .ok_or_else(|| format!("\"{attnum}\" is not an attribute number"))?;
            if out.len() < a {
                out.resize(a, None);
            }
            out[a - 1] = Some(mask);
        }
        Ok(out)
    });
    match (relid, parsed) {
        (Ok(oid), Ok(m)) => (pg_sys::Oid::from(oid), m),
        (_, Err(why)) => invalid_option(format!(
            "pg_tide output plugin: option \"{name}\" is not a JSON object of attribute numbers and masks: {why}"
        )),
        (Err(_), _) => invalid_option(format!(
            "pg_tide output plugin: option \"{name}\" does not name a relation OID"
        )),
    }
}

/// The `mask_salt` option (hex); its value is never repeated in an error.
fn parse_salt(value: &str) -> Vec<u8> {
    let v = value.trim();
    let bytes: Option<Vec<u8>> = v
        .len()
        .is_multiple_of(2)
        .then(|| {
            (0..v.len())
                .step_by(2)
                .map(|i| v.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
                .collect()
        })
        .flatten();
    bytes.unwrap_or_else(|| {
        invalid_option("pg_tide output plugin: option mask_salt is not hexadecimal".into())
    })
}

/// Read the options a decoding session was started with; an unknown or malformed one is an
/// ERROR (22023).
unsafe fn parse_options(list: *mut pg_sys::List) -> Options {
    unsafe {
        let mut tables = None;
        let mut streaming = false;
        let mut row_filters = HashMap::new();
        let mut filter_owner = None;
        let mut column_lists = HashMap::new();
        let mut masks = HashMap::new();
        let mut salt = Vec::new();
        if !list.is_null() {
            for i in 0..(*list).length {
                let def = (*(*list).elements.add(i as usize)).ptr_value as *mut pg_sys::DefElem;
                let (name, value) = option_string(def);
                match name.as_str() {
                    "proto_version" => {
                        if value.trim() != wire::PROTO_VERSION.to_string() {
                            invalid_option(format!(
                                "pg_tide output plugin: unsupported proto_version \"{value}\" (this server speaks {})",
                                wire::PROTO_VERSION
                            ));
                        }
                    }
                    "tables" => {
                        let mut set = HashSet::new();
                        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                            match part.parse::<u32>() {
                                Ok(oid) => {
                                    set.insert(pg_sys::Oid::from(oid));
                                }
                                Err(_) => invalid_option(format!(
                                    "pg_tide output plugin: \"{part}\" in option tables is not a relation OID"
                                )),
                            }
                        }
                        tables = Some(set);
                    }
                    "streaming" => {
                        streaming = match value.trim() {
                            "on" | "true" | "1" => true,
                            "off" | "false" | "0" => false,
                            other => invalid_option(format!(
                                "pg_tide output plugin: option streaming must be 'on' or 'off', not \"{other}\""
                            )),
                        }
                    }
                    "row_filter_owner" => match value.trim().parse::<u32>() {
                        Ok(oid) => filter_owner = Some(pg_sys::Oid::from(oid)),
                        Err(_) => invalid_option(format!(
                            "pg_tide output plugin: \"{value}\" in option row_filter_owner is not a role OID"
                        )),
                    },
                    other if other.starts_with("columns.") => {
                        let relid = other["columns.".len()..].parse::<u32>();
                        let attnums: Result<Vec<usize>, _> = value
                            .split(',')
                            .map(|a| a.trim().parse::<usize>())
                            .collect();
                        match (relid, attnums) {
                            (Ok(oid), Ok(attnums)) if attnums.iter().all(|&a| a > 0) => {
                                let max = attnums.iter().copied().max().unwrap_or(0);
                                let mut mask = vec![false; max];
                                for a in attnums {
                                    mask[a - 1] = true;
                                }
                                column_lists.insert(pg_sys::Oid::from(oid), std::rc::Rc::new(mask));
                            }
                            _ => invalid_option(format!(
                                "pg_tide output plugin: option \"{other}\" = \"{value}\" is not a relation OID with attribute numbers"
                            )),
                        }
                    }
                    "mask_salt" => salt = parse_salt(&value),
                    other if other.starts_with("masks.") => {
                        let (oid, m) = parse_masks(other, &value);
                        masks.insert(oid, std::rc::Rc::new(m));
                    }
                    other if other.starts_with("row_filter.") => {
                        match other["row_filter.".len()..].parse::<u32>() {
                            Ok(oid) => {
                                row_filters.insert(pg_sys::Oid::from(oid), value);
                            }
                            Err(_) => invalid_option(format!(
                                "pg_tide output plugin: option \"{other}\" does not name a relation OID"
                            )),
                        }
                    }
                    other => {
                        invalid_option(format!("pg_tide output plugin: unknown option \"{other}\""))
                    }
                }
            }
        }

        Options {
            tables,
            streaming,
            row_filters,
            filter_owner,
            column_lists,
            masks,
            salt,
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn startup(
    ctx: *mut pg_sys::LogicalDecodingContext,
    opt: *mut pg_sys::OutputPluginOptions,
    is_init: bool,
) {
    unsafe {
        (*opt).output_type = pg_sys::OutputPluginOutputType::OUTPUT_PLUGIN_BINARY_OUTPUT;
        // The rows a table-rewriting ALTER TABLE writes into the new heap come to `change` on a
        // transient relation whose `relrewrite` names the table; `change` reports each rewrite
        // once as a `Rewrite` message.
        (*opt).receive_rewrites = true;

        let Options {
            tables,
            streaming,
            row_filters,
            filter_owner,
            column_lists,
            masks,
            salt,
        } = parse_options((*ctx).output_plugin_options);
        // Decoding set `streaming` when the plugin has the stream callbacks and the context can
        // stream (not while creating the slot, for instance); stream only if asked to, as
        // pgoutput does.
        (*ctx).streaming = (*ctx).streaming && streaming;

        let change_cx = pg_sys::AllocSetContextCreateInternal(
            (*ctx).context,
            c"pg_tide change".as_ptr(),
            pg_sys::ALLOCSET_DEFAULT_MINSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_INITSIZE as usize,
            pg_sys::ALLOCSET_DEFAULT_MAXSIZE as usize,
        );
        let ns = pg_sys::get_namespace_oid(c"tide".as_ptr(), true);
        let tide_namespace = if ns == pg_sys::InvalidOid {
            None
        } else {
            Some(ns)
        };

        let state = Box::new(PluginState {
            creating: is_init,
            tables,
            begun: false,
            buf: Vec::with_capacity(8192),
            out_funcs: HashMap::new(),
            change_cx,
            tide_namespace,
            skipped: 0,
            reported_end: 0,
            rewritten: HashSet::new(),
            origins: HashMap::new(),
            stream: StreamBlocks::default(),
            sub: 0,
            row_filters,
            filter_owner,
            compiled: HashMap::new(),
            filter_parent: (*ctx).context,
            column_lists,
            listed: None,
            masks,
            salt,
            masked: None,
        });
        (*ctx).output_plugin_private = Box::into_raw(state) as *mut std::ffi::c_void;

        SENT.with(|s| s.borrow_mut().clear());
        STREAM_SENT.with(|s| s.borrow_mut().clear());
        ROUTES.with(|r| r.borrow_mut().clear());
        STALE_FILTERS.with(|f| *f.borrow_mut() = Some(HashSet::new()));
        CALLBACK_REGISTERED.with(|r| {
            if !*r.borrow() {
                pg_sys::CacheRegisterRelcacheCallback(
                    Some(relcache_invalidated),
                    pg_sys::Datum::from(0),
                );
                pg_sys::CacheRegisterSyscacheCallback(
                    pg_sys::SysCacheIdentifier::PROCOID as i32,
                    Some(function_invalidated),
                    pg_sys::Datum::from(0),
                );
                *r.borrow_mut() = true;
            }
        });
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn shutdown(ctx: *mut pg_sys::LogicalDecodingContext) {
    unsafe {
        let p = (*ctx).output_plugin_private as *mut PluginState;
        if !p.is_null() {
            drop(Box::from_raw(p));
            (*ctx).output_plugin_private = std::ptr::null_mut();
        }
    }
}

/// Hand the scratch buffer to PostgreSQL as one output message.
unsafe fn flush(ctx: *mut pg_sys::LogicalDecodingContext, st: &mut PluginState, last: bool) {
    unsafe {
        pg_sys::OutputPluginPrepareWrite(ctx, last);
        pg_sys::appendBinaryStringInfo(
            (*ctx).out,
            st.buf.as_ptr() as *const _,
            st.buf.len() as i32,
        );
        pg_sys::OutputPluginWrite(ctx, last);
    }
    st.buf.clear();
}

unsafe fn ensure_begun(
    ctx: *mut pg_sys::LogicalDecodingContext,
    st: &mut PluginState,
    txn: *mut pg_sys::ReorderBufferTXN,
) {
    if st.stream.block().is_some() {
        if let Some((top, first)) = st.stream.open() {
            wire::put_stream_start(&mut st.buf, top, first);
            unsafe { flush(ctx, st, false) };
            STREAM_SENT.with(|s| {
                s.borrow_mut().entry(top).or_default();
            });
        }
        return;
    }
    if st.begun {
        return;
    }
    unsafe {
        wire::put_begin(
            &mut st.buf,
            u32::from((*txn).xid),
            Lsn((*txn).final_lsn),
            (*txn).xact_time.commit_time,
        );
        flush(ctx, st, false);
    }
    st.begun = true;
}

#[pg_guard]
unsafe extern "C-unwind" fn begin(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
) {
    unsafe {
        let st = state(ctx);
        if st.creating {
            return;
        }
        st.begun = false;
        st.rewritten.clear();
        // Learn the transaction's origin here, where the catalog can be read: from then on
        // `filter_by_origin` drops that origin's transactions before they are decoded.
        from_tide(st, txn);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn commit(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    commit_lsn: pg_sys::XLogRecPtr,
) {
    unsafe {
        let st = state(ctx);
        if st.creating {
            return;
        }
        let end = (*txn).end_lsn;
        if !st.begun {
            skipped_commit(ctx, st, end);
            return;
        }
        st.skipped = 0;
        st.reported_end = end;
        wire::put_commit(
            &mut st.buf,
            u32::from((*txn).xid),
            Lsn(commit_lsn),
            Lsn((*txn).end_lsn),
            (*txn).xact_time.commit_time,
        );
        flush(ctx, st, true);
        st.begun = false;
    }
}

/// A transaction that emitted nothing committed (ending at `end`): let the reader advance past
/// skipped transactions now and then, so an idle pipeline on a busy server does not retain WAL
/// or re-decode it forever.
unsafe fn skipped_commit(
    ctx: *mut pg_sys::LogicalDecodingContext,
    st: &mut PluginState,
    end: pg_sys::XLogRecPtr,
) {
    st.skipped += 1;
    if st.skipped >= KEEPALIVE_TXNS || end.saturating_sub(st.reported_end) >= KEEPALIVE_BYTES {
        wire::put_keepalive(&mut st.buf, Lsn(end));
        unsafe { flush(ctx, st, true) };
        st.skipped = 0;
        st.reported_end = end;
    }
}

/// In a stream block, the header that makes the next message a StreamChange of `xid`.
fn lead(st: &mut PluginState, xid: u32) {
    if st.stream.block().is_some() {
        wire::put_stream_change_header(&mut st.buf, xid);
    }
}

/// The top-level transaction of the current stream block, or 0 outside one.
fn block_top(st: &PluginState) -> u32 {
    st.stream.block().unwrap_or(0)
}

/// The origin a change was made with: the transaction's (known at its commit), else the
/// change's own (a streamed transaction has not committed yet).
unsafe fn origin_of(
    txn: *mut pg_sys::ReorderBufferTXN,
    change: *mut pg_sys::ReorderBufferChange,
) -> pg_sys::RepOriginId {
    unsafe {
        let o = (*txn).origin_id;
        if o != pg_sys::InvalidRepOriginId as pg_sys::RepOriginId || change.is_null() {
            o
        } else {
            (*change).origin_id
        }
    }
}

/// Whether `txn` was committed by a pg_tide worker (its replication origin is `pg_tide_*`).
unsafe fn from_tide(st: &mut PluginState, txn: *mut pg_sys::ReorderBufferTXN) -> bool {
    unsafe { from_tide_origin(st, (*txn).origin_id) }
}

/// Whether `origin` is a pg_tide worker's (`pg_tide_*`). Looked up once per origin and decoding
/// session (inside the replay transaction, where the catalogs may be read).
unsafe fn from_tide_origin(st: &mut PluginState, origin: pg_sys::RepOriginId) -> bool {
    unsafe {
        if origin == pg_sys::InvalidRepOriginId as pg_sys::RepOriginId {
            return false;
        }
        *st.origins.entry(origin).or_insert_with(|| {
            let mut name: *mut std::ffi::c_char = std::ptr::null_mut();
            pg_sys::replorigin_by_oid(origin, true, &mut name)
                && !name.is_null()
                && CStr::from_ptr(name)
                    .to_bytes()
                    .starts_with(crate::worker::origin::PREFIX.as_bytes())
        })
    }
}

/// Called by decoding for every change record before it is queued: true drops it, and the
/// whole transaction at its commit, unread. True for every change while the slot is created
/// (`PluginState::creating`), and otherwise only for an origin already known to be a pg_tide
/// worker's (`begin` looked it up for an earlier transaction), so from a pipeline's second
/// iteration on, its own writes to its table targets (a backfill chunk's rows among them) are not
/// even queued for decoding. The lookup itself needs the catalog, which decoding may not read
/// here: an origin not seen yet is let through, and `change`/`truncate` drop its changes.
/// Dropping a whole transaction is what `change` would do with its changes too: a pg_tide
/// worker commits watermarks and markers outside the transactions that carry its origin (see
/// `worker::origin`), so no signal or marker row is lost.
#[pg_guard]
unsafe extern "C-unwind" fn filter_by_origin(
    ctx: *mut pg_sys::LogicalDecodingContext,
    origin_id: pg_sys::RepOriginId,
) -> bool {
    // SAFETY: called by decoding with the context startup prepared.
    let st = unsafe { state(ctx) };
    st.creating || st.origins.get(&origin_id).copied().unwrap_or(false)
}

fn wanted(st: &PluginState, rel: pg_sys::Relation) -> bool {
    unsafe {
        let relid = (*rel).rd_id;
        match &st.tables {
            Some(set) => set.contains(&relid),
            None => {
                let ns = (*(*rel).rd_rel).relnamespace;
                Some(ns) != st.tide_namespace
                    && ns != pg_sys::Oid::from(pg_sys::PG_CATALOG_NAMESPACE)
            }
        }
    }
}

/// Attribute numbers (1-based) of the relation's key: the replica identity index, else the
/// primary key.
unsafe fn key_bitmap(rel: pg_sys::Relation) -> *mut pg_sys::Bitmapset {
    unsafe {
        let ident = pg_sys::RelationGetIndexAttrBitmap(
            rel,
            pg_sys::IndexAttrBitmapKind::INDEX_ATTR_BITMAP_IDENTITY_KEY,
        );
        if !ident.is_null() {
            return ident;
        }
        pg_sys::RelationGetIndexAttrBitmap(
            rel,
            pg_sys::IndexAttrBitmapKind::INDEX_ATTR_BITMAP_PRIMARY_KEY,
        )
    }
}

unsafe fn attr(desc: pg_sys::TupleDesc, i: usize) -> *mut pg_sys::FormData_pg_attribute {
    // SAFETY: the caller's: `desc` is a relation's descriptor and `i` below its natts.
    unsafe { crate::pgver::tupdesc_attr(desc, i) }
}

/// Whether a column is sent at all: dropped and generated columns are not.
unsafe fn sent_column(a: *mut pg_sys::FormData_pg_attribute) -> bool {
    unsafe { !(*a).attisdropped && (*a).attgenerated == 0 }
}

/// Whether a column is sent under column list `listed` (`None`: every column is).
unsafe fn listed_column(
    a: *mut pg_sys::FormData_pg_attribute,
    listed: Option<&std::rc::Rc<Vec<bool>>>,
) -> bool {
    unsafe {
        sent_column(a)
            && listed.is_none_or(|l| l.get((*a).attnum as usize - 1).copied().unwrap_or(false))
    }
}

unsafe fn send_relation_if_needed(
    ctx: *mut pg_sys::LogicalDecodingContext,
    st: &mut PluginState,
    rel: pg_sys::Relation,
) {
    unsafe {
        let relid = (*rel).rd_id;
        let top = st.stream.block();
        let sent = match top {
            Some(x) => STREAM_SENT.with(|s| s.borrow().get(&x).is_some_and(|r| r.contains(&relid))),
            None => SENT.with(|s| s.borrow().contains(&relid)),
        };
        if sent {
            return;
        }
        let desc = (*rel).rd_att;
        let natts = (*desc).natts as usize;
        let keys = key_bitmap(rel);
        let nsname_ptr = pg_sys::get_namespace_name((*(*rel).rd_rel).relnamespace);
        let nsname = if nsname_ptr.is_null() {
            ""
        } else {
            CStr::from_ptr(nsname_ptr).to_str().unwrap_or("")
        };
        let relname = CStr::from_ptr((*(*rel).rd_rel).relname.data.as_ptr())
            .to_str()
            .unwrap_or("");
        let listed = st.column_lists.get(&relid).cloned();
        let masked = st.masks.get(&relid).cloned();
        let ncols = (0..natts)
            .filter(|&i| listed_column(attr(desc, i), listed.as_ref()))
            .count();
        lead(st, block_top(st));
        wire::put_relation_header(&mut st.buf, relid.to_u32(), nsname, relname, ncols as u16);
        for i in 0..natts {
            let a = attr(desc, i);
            if !listed_column(a, listed.as_ref()) {
                continue;
            }
            let name = CStr::from_ptr((*a).attname.data.as_ptr())
                .to_str()
                .unwrap_or("");
            let is_key = pg_sys::bms_is_member(
                (*a).attnum as i32 - pg_sys::FirstLowInvalidHeapAttributeNumber,
                keys,
            );
            let flags = if is_key { wire::COLUMN_KEY } else { 0 };
            // A hash or truncate mask delivers text.
            let retyped = masked
                .as_ref()
                .and_then(|m| m.get((*a).attnum as usize - 1))
                .is_some_and(|m| m.as_ref().is_some_and(|m| m.retypes()));
            let (ty, typmod) = if retyped {
                (pg_sys::TEXTOID.to_u32(), -1)
            } else {
                ((*a).atttypid.to_u32(), (*a).atttypmod)
            };
            wire::put_column(&mut st.buf, name, ty, typmod, flags);
        }
        flush(ctx, st, false);
        match top {
            Some(x) => STREAM_SENT.with(|s| {
                s.borrow_mut().entry(x).or_default().insert(relid);
            }),
            None => SENT.with(|s| {
                s.borrow_mut().insert(relid);
            }),
        }
    }
}

/// `VARATT_IS_EXTERNAL_ONDISK`: a TOAST pointer to a value stored out of line. In a decoded
/// tuple this is only ever an unchanged value of an UPDATE (changed ones are reassembled).
unsafe fn is_external_ondisk(ptr: *const pg_sys::varlena) -> bool {
    unsafe {
        pgrx::varlena::varatt_is_1b_e(ptr)
            && pgrx::varlena::vartag_external(ptr) as pg_sys::vartag_external::Type
                == pg_sys::vartag_external::VARTAG_ONDISK
    }
}

/// The emitted partitioned table `rel` (a partition) is sent as, if any: its topmost ancestor
/// named in the `tables` option, as the catalog says now (decoding reads it at the change's
/// position). Looked up once per partition and decoding session, until a relcache invalidation.
unsafe fn route(st: &PluginState, rel: pg_sys::Relation) -> Option<pg_sys::Oid> {
    unsafe {
        let set = st.tables.as_ref()?;
        if !(*(*rel).rd_rel).relispartition {
            return None;
        }
        let relid = (*rel).rd_id;
        if let Some(r) = ROUTES.with(|m| m.borrow().get(&relid).copied()) {
            return r;
        }
        let ancestors = c::get_partition_ancestors(relid);
        let mut found = None;
        if !ancestors.is_null() {
            // Nearest first: the last one named is the topmost.
            for i in 0..(*ancestors).length {
                let a = pg_sys::list_nth_oid(ancestors, i);
                if set.contains(&a) {
                    found = Some(a);
                }
            }
            pg_sys::list_free(ancestors);
        }
        ROUTES.with(|m| m.borrow_mut().insert(relid, found));
        found
    }
}

/// The type output function of `typid`, cached.
unsafe fn out_func(st: &mut PluginState, typid: pg_sys::Oid) -> pg_sys::Oid {
    *st.out_funcs.entry(typid).or_insert_with(|| {
        let mut f = pg_sys::InvalidOid;
        let mut varlena = false;
        unsafe { pg_sys::getTypeOutputInfo(typid, &mut f, &mut varlena) };
        f
    })
}

/// Deform `tuple` (laid out as `desc`) into values and nulls.
unsafe fn deform(
    desc: pg_sys::TupleDesc,
    tuple: pg_sys::HeapTuple,
) -> (Vec<pg_sys::Datum>, Vec<bool>) {
    unsafe {
        let natts = (*desc).natts as usize;
        let mut values = vec![pg_sys::Datum::from(0); natts];
        let mut nulls = vec![false; natts];
        pg_sys::heap_deform_tuple(tuple, desc, values.as_mut_ptr(), nulls.as_mut_ptr());
        (values, nulls)
    }
}

unsafe fn put_tuple(st: &mut PluginState, desc: pg_sys::TupleDesc, tuple: pg_sys::HeapTuple) {
    unsafe {
        let (values, nulls) = deform(desc, tuple);
        put_values(st, desc, &values, &nulls);
    }
}

/// A deformed tuple, laid out as `desc`, as the wire's tuple.
unsafe fn put_values(
    st: &mut PluginState,
    desc: pg_sys::TupleDesc,
    values: &[pg_sys::Datum],
    nulls: &[bool],
) {
    unsafe {
        let natts = (*desc).natts as usize;
        let listed = st.listed.clone();
        let masked = st.masked.clone();
        let ncols = (0..natts)
            .filter(|&i| listed_column(attr(desc, i), listed.as_ref()))
            .count();
        wire::put_tuple_header(&mut st.buf, ncols as u16);
        for i in 0..natts {
            let a = attr(desc, i);
            if !listed_column(a, listed.as_ref()) {
                continue;
            }
            let mask = masked
                .as_ref()
                .and_then(|m| m.get(i))
                .and_then(Option::as_ref);
            if nulls[i] {
                match mask.and_then(|m| m.apply(&st.salt, None)) {
                    Some(v) => wire::put_text(&mut st.buf, v.as_bytes()),
                    None => wire::put_null(&mut st.buf),
                }
                continue;
            }
            let datum = values[i];
            if (*a).attlen == -1 && is_external_ondisk(datum.cast_mut_ptr()) {
                // The target keeps the (masked) value it has.
                wire::put_unchanged(&mut st.buf);
                continue;
            }
            let text = match mask {
                // Neither needs the value: it is not even turned into text.
                Some(m @ (tide_core::mask::Mask::Null | tide_core::mask::Mask::Constant(_))) => {
                    match m.apply(&st.salt, None) {
                        Some(v) => wire::put_text(&mut st.buf, v.as_bytes()),
                        None => wire::put_null(&mut st.buf),
                    }
                    continue;
                }
                _ => {
                    let func = out_func(st, (*a).atttypid);
                    CStr::from_ptr(pg_sys::OidOutputFunctionCall(func, datum))
                }
            };
            match mask {
                Some(m) => match m.apply(&st.salt, Some(&text.to_string_lossy())) {
                    Some(v) => wire::put_text(&mut st.buf, v.as_bytes()),
                    None => wire::put_null(&mut st.buf),
                },
                None => wire::put_text(&mut st.buf, text.to_bytes()),
            }
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn change(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    rel: pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    unsafe { emit_change(ctx, txn, rel, change) }
}

/// A change of a committed transaction, or of a streamed one inside a block.
unsafe fn emit_change(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    rel: pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    unsafe {
        let st = state(ctx);
        let tide = from_tide_origin(st, origin_of(txn, change));
        let rewrite_of = (*(*rel).rd_rel).relrewrite;
        if rewrite_of != pg_sys::InvalidOid {
            if !tide {
                report_rewrite(ctx, st, txn, rewrite_of);
            }
            return;
        }
        if tide {
            return;
        }
        let sub = st.sub;
        let old_cx = pg_sys::MemoryContextSwitchTo(st.change_cx);
        // The relation the change is sent as: the emitted partitioned table `rel` is a partition
        // of (which wins over `rel` itself: a table captured alone and attached later belongs to
        // the table from then on), or `rel`.
        let root = match route(st, rel).map(|r| pg_sys::RelationIdGetRelation(r)) {
            Some(r) if !r.is_null() => Some(r),
            None if wanted(st, rel) => None,
            _ => {
                pg_sys::MemoryContextSwitchTo(old_cx);
                pg_sys::MemoryContextReset(st.change_cx);
                return;
            }
        };
        let out_rel = root.unwrap_or(rel);
        let desc = (*out_rel).rd_att;
        // Columns by name: NULL when the partition has the table's layout.
        let map = match root {
            Some(_) => pg_sys::convert_tuples_by_name((*rel).rd_att, desc),
            None => std::ptr::null_mut(),
        };
        let conv = |t: crate::pgver::ChangeTuple| -> pg_sys::HeapTuple {
            let h = crate::pgver::change_heap_tuple(t);
            if map.is_null() {
                h
            } else {
                pg_sys::execute_attr_map_tuple(h, map)
            }
        };
        let relid = (*out_rel).rd_id;
        let tp = (*change).data.tp;
        use pg_sys::ReorderBufferChangeType::*;
        let mut emitted = true;
        let filtered = !st.row_filters.is_empty() && st.row_filters.contains_key(&relid);
        st.listed = if st.column_lists.is_empty() {
            None
        } else {
            st.column_lists.get(&relid).cloned()
        };
        st.masked = if st.masks.is_empty() {
            None
        } else {
            st.masks.get(&relid).cloned()
        };
        let tuple = |t: crate::pgver::ChangeTuple| (!t.is_null()).then(|| conv(t));
        match (*change).action {
            REORDER_BUFFER_CHANGE_INSERT
            | REORDER_BUFFER_CHANGE_UPDATE
            | REORDER_BUFFER_CHANGE_DELETE
                if filtered =>
            {
                let (old, new) = (tuple(tp.oldtuple), tuple(tp.newtuple));
                emitted = filtered_change(ctx, st, txn, out_rel, (*change).action, old, new);
            }
            REORDER_BUFFER_CHANGE_INSERT if !tp.newtuple.is_null() => {
                ensure_begun(ctx, st, txn);
                send_relation_if_needed(ctx, st, out_rel);
                lead(st, sub);
                wire::put_insert_header(&mut st.buf, relid.to_u32());
                put_tuple(st, desc, conv(tp.newtuple));
            }
            REORDER_BUFFER_CHANGE_UPDATE if !tp.newtuple.is_null() => {
                ensure_begun(ctx, st, txn);
                send_relation_if_needed(ctx, st, out_rel);
                let has_old = !tp.oldtuple.is_null();
                lead(st, sub);
                wire::put_update_header(&mut st.buf, relid.to_u32(), has_old);
                if has_old {
                    put_tuple(st, desc, conv(tp.oldtuple));
                }
                put_tuple(st, desc, conv(tp.newtuple));
            }
            REORDER_BUFFER_CHANGE_DELETE if !tp.oldtuple.is_null() => {
                ensure_begun(ctx, st, txn);
                send_relation_if_needed(ctx, st, out_rel);
                lead(st, sub);
                wire::put_delete_header(&mut st.buf, relid.to_u32());
                put_tuple(st, desc, conv(tp.oldtuple));
            }
            REORDER_BUFFER_CHANGE_DELETE => {
                // REPLICA IDENTITY NOTHING: the key of the deleted row is not in the WAL.
                pgrx::warning!(
                    "pg_tide: a DELETE on relation {} carries no key (REPLICA IDENTITY NOTHING) and cannot be captured",
                    (*rel).rd_id.to_u32()
                );
                emitted = false;
            }
            _ => emitted = false,
        }
        if emitted {
            flush(ctx, st, true);
        } else {
            st.buf.clear();
        }
        if let Some(r) = root {
            pg_sys::RelationClose(r);
        }
        pg_sys::MemoryContextSwitchTo(old_cx);
        pg_sys::MemoryContextReset(st.change_cx);
    }
}

/// The compiled row filter of emitted relation `rel`, compiled now if it is not (or its
/// relation changed since).
unsafe fn row_filter(
    st: &mut PluginState,
    rel: pg_sys::Relation,
) -> Option<&crate::row_filter::Compiled> {
    unsafe {
        let stale = STALE_FILTERS.with(|f| f.replace(Some(HashSet::new())));
        match stale {
            None => st.compiled.clear(),
            Some(set) => st.compiled.retain(|relid, _| !set.contains(relid)),
        }
        let relid = (*rel).rd_id;
        let text = st.row_filters.get(&relid)?;
        if !st.compiled.contains_key(&relid) {
            let c = crate::row_filter::Compiled::new(rel, text, st.filter_owner, st.filter_parent);
            if !c.covered {
                pgrx::warning!(
                    "pg_tide: the row filter of \"{}\" reads columns outside its replica identity (changed since tide.add_table): its updates are decided on the new row and its deletes are all delivered",
                    c.name
                );
            }
            st.compiled.insert(relid, c);
        }
        st.compiled.get(&relid)
    }
}

/// What a change of a filtered relation becomes, as PostgreSQL 15's publications decide
/// (pgoutput_row_filter): an insert is sent if its new row passes, a delete if its old row
/// does; an update whose old and new rows both pass stays an update, one whose new row only
/// passes becomes an insert, one whose old row only passes becomes a delete (of the old key),
/// one with neither is not sent. An update without an old row (its key unchanged under
/// REPLICA IDENTITY DEFAULT/INDEX: the filter's columns, all in the identity, are unchanged) is
/// decided on the new row. An unchanged TOASTed value of the new row is taken from the old row
/// when that has it (REPLICA IDENTITY FULL), for the filter and in what is sent. Writes the
/// message into the buffer (after Begin and the Relation if needed); returns whether it did.
#[allow(clippy::too_many_arguments)]
unsafe fn filtered_change(
    ctx: *mut pg_sys::LogicalDecodingContext,
    st: &mut PluginState,
    txn: *mut pg_sys::ReorderBufferTXN,
    rel: pg_sys::Relation,
    action: pg_sys::ReorderBufferChangeType::Type,
    old: Option<pg_sys::HeapTuple>,
    new: Option<pg_sys::HeapTuple>,
) -> bool {
    use pg_sys::ReorderBufferChangeType::*;
    unsafe {
        let desc = (*rel).rd_att;
        let relid = (*rel).rd_id.to_u32();
        let old = old.map(|t| deform(desc, t));
        let mut new = new.map(|t| deform(desc, t));
        if let (Some((ov, on)), Some((nv, nn))) = (&old, &mut new) {
            for i in 0..(*desc).natts as usize {
                let a = attr(desc, i);
                if (*a).attlen == -1
                    && !nn[i]
                    && is_external_ondisk(nv[i].cast_mut_ptr())
                    && !on[i]
                    && !is_external_ondisk(ov[i].cast_mut_ptr())
                {
                    nv[i] = ov[i];
                }
            }
        }
        let Some(f) = row_filter(st, rel) else {
            return false;
        };
        let covered = f.covered;
        let pass =
            |t: &Option<(Vec<pg_sys::Datum>, Vec<bool>)>| t.as_ref().map(|(v, n)| f.matches(v, n));
        let new_in = pass(&new);
        let old_in = if covered { pass(&old).or(new_in) } else { None };
        // What to send: Insert(new) / Update(old?, new) / Delete(old or new's key).
        enum Send {
            Insert,
            Update,
            Delete,
        }
        let send = match action {
            REORDER_BUFFER_CHANGE_INSERT => (new_in == Some(true)).then_some(Send::Insert),
            REORDER_BUFFER_CHANGE_DELETE if old.is_none() => None,
            REORDER_BUFFER_CHANGE_DELETE => {
                (!covered || pass(&old) == Some(true)).then_some(Send::Delete)
            }
            REORDER_BUFFER_CHANGE_UPDATE if new.is_some() => match (old_in, new_in) {
                (Some(true), Some(true)) | (None, Some(true)) => Some(Send::Update),
                (Some(false), Some(true)) => Some(Send::Insert),
                (Some(true), Some(false)) | (None, Some(false)) => Some(Send::Delete),
                _ => None,
            },
            _ => None,
        };
        let Some(send) = send else {
            return false;
        };
        ensure_begun(ctx, st, txn);
        send_relation_if_needed(ctx, st, rel);
        // Inside a stream block, the change's header names its (sub)transaction first.
        let sub = st.sub;
        lead(st, sub);
        match send {
            Send::Insert => {
                let Some((v, n)) = &new else { return false };
                wire::put_insert_header(&mut st.buf, relid);
                put_values(st, desc, v, n);
            }
            Send::Update => {
                let Some((v, n)) = &new else { return false };
                wire::put_update_header(&mut st.buf, relid, old.is_some());
                if let Some((ov, on)) = &old {
                    put_values(st, desc, ov, on);
                }
                put_values(st, desc, v, n);
            }
            Send::Delete => {
                let Some((v, n)) = old.as_ref().or(new.as_ref()) else {
                    return false;
                };
                wire::put_delete_header(&mut st.buf, relid);
                put_values(st, desc, v, n);
            }
        }
        true
    }
}

/// A row written by a heap rewrite of `relid`: send one `Rewrite` message per transaction if the
/// relation is emitted (a partition's as one of its partitioned table).
unsafe fn report_rewrite(
    ctx: *mut pg_sys::LogicalDecodingContext,
    st: &mut PluginState,
    txn: *mut pg_sys::ReorderBufferTXN,
    relid: pg_sys::Oid,
) {
    unsafe {
        if !rewrite_first(st, relid) {
            return;
        }
        // Opened under the decoding's historic snapshot, like `rel` itself.
        let orig = pg_sys::RelationIdGetRelation(relid);
        if orig.is_null() {
            return;
        }
        let emitted_as = route(st, orig).or(wanted(st, orig).then_some(relid));
        pg_sys::RelationClose(orig);
        let Some(as_relid) = emitted_as else {
            return;
        };
        if as_relid != relid && !rewrite_first(st, as_relid) {
            return;
        }
        ensure_begun(ctx, st, txn);
        lead(st, block_top(st));
        wire::put_rewrite(&mut st.buf, as_relid.to_u32());
        flush(ctx, st, true);
    }
}

/// Whether this is the first rewrite of `relid` the current transaction reports (recording it).
fn rewrite_first(st: &mut PluginState, relid: pg_sys::Oid) -> bool {
    match st.stream.rewrite_first(relid.to_u32()) {
        Some(first) => first,
        None => st.rewritten.insert(relid),
    }
}

/// The partitions of `root` that hold rows (tables, at any depth).
unsafe fn leaf_partitions(root: pg_sys::Oid) -> Vec<pg_sys::Oid> {
    unsafe {
        let all = c::find_all_inheritors(root);
        let mut out = Vec::new();
        if !all.is_null() {
            for i in 0..(*all).length {
                let r = pg_sys::list_nth_oid(all, i);
                if r != root
                    && pg_sys::get_rel_relkind(r) == pg_sys::RELKIND_RELATION as std::ffi::c_char
                {
                    out.push(r);
                }
            }
            pg_sys::list_free(all);
        }
        out
    }
}

/// The partition constraint of `leaf` as SQL (`pg_get_partition_constraintdef`), and its name.
unsafe fn partition_predicate(leaf: pg_sys::Relation) -> (String, String) {
    unsafe {
        let relid = (*leaf).rd_id;
        let relname = CStr::from_ptr((*(*leaf).rd_rel).relname.data.as_ptr());
        let ns = pg_sys::get_namespace_name((*(*leaf).rd_rel).relnamespace);
        let nsname = if ns.is_null() {
            String::new()
        } else {
            CStr::from_ptr(ns).to_string_lossy().into_owned()
        };
        let name = format!(
            "{}.{}",
            pgrx::spi::quote_identifier(nsname),
            pgrx::spi::quote_identifier(relname.to_string_lossy().as_ref())
        );
        let expr = c::get_partition_qual_relid(relid);
        let predicate = if expr.is_null() {
            // No constraint (the only partition, a default one): it held every row.
            "true".to_string()
        } else {
            let dp = pg_sys::deparse_context_for(relname.as_ptr(), relid);
            let text = pg_sys::deparse_expression(expr as *mut pg_sys::Node, dp, false, false);
            CStr::from_ptr(text).to_string_lossy().into_owned()
        };
        (name, predicate)
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn truncate(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    nrelations: std::ffi::c_int,
    relations: *mut pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    unsafe { emit_truncate(ctx, txn, nrelations, relations, change) }
}

/// A TRUNCATE of a committed transaction, or of a streamed one inside a block.
unsafe fn emit_truncate(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    nrelations: std::ffi::c_int,
    relations: *mut pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    unsafe {
        let st = state(ctx);
        if from_tide_origin(st, origin_of(txn, change)) {
            return;
        }
        let sub = st.sub;
        let all: Vec<pg_sys::Relation> = (0..nrelations as usize)
            .map(|i| *relations.add(i))
            .collect();
        let mut rels: Vec<pg_sys::Relation> = Vec::new();
        // Partitions of emitted partitioned tables, by table.
        let mut parts: Vec<(pg_sys::Oid, Vec<pg_sys::Relation>)> = Vec::new();
        for &r in &all {
            if let Some(root) = route(st, r) {
                match parts.iter_mut().find(|(p, _)| *p == root) {
                    Some((_, v)) => v.push(r),
                    None => parts.push((root, vec![r])),
                }
            } else if wanted(st, r) {
                rels.push(r);
            }
        }
        if rels.is_empty() && parts.is_empty() {
            return;
        }
        let old_cx = pg_sys::MemoryContextSwitchTo(st.change_cx);
        ensure_begun(ctx, st, txn);
        let mut relids: Vec<u32> = Vec::new();
        for &r in &rels {
            send_relation_if_needed(ctx, st, r);
            relids.push((*r).rd_id.to_u32());
        }
        // (partitioned table, partition name, predicate) of partitions truncated alone.
        let mut partial: Vec<(u32, String, String)> = Vec::new();
        for (root, leaves) in &parts {
            let root_rel = pg_sys::RelationIdGetRelation(*root);
            if root_rel.is_null() {
                continue;
            }
            send_relation_if_needed(ctx, st, root_rel);
            pg_sys::RelationClose(root_rel);
            let truncated: HashSet<pg_sys::Oid> = leaves.iter().map(|&l| (*l).rd_id).collect();
            if leaf_partitions(*root).iter().all(|l| truncated.contains(l)) {
                relids.push(root.to_u32());
            } else {
                for &l in leaves {
                    let (name, predicate) = partition_predicate(l);
                    partial.push((root.to_u32(), name, predicate));
                }
            }
        }
        if !relids.is_empty() {
            let t = (*change).data.truncate;
            let flags = (t.cascade as u8) | ((t.restart_seqs as u8) << 1);
            lead(st, sub);
            wire::put_truncate(&mut st.buf, flags, &relids);
            flush(ctx, st, partial.is_empty());
        }
        let n = partial.len();
        for (i, (root, name, predicate)) in partial.into_iter().enumerate() {
            lead(st, sub);
            wire::put_truncate_partition(&mut st.buf, root, &name, &predicate);
            flush(ctx, st, i + 1 == n);
        }
        pg_sys::MemoryContextSwitchTo(old_cx);
        pg_sys::MemoryContextReset(st.change_cx);
    }
}

// ------------------------------------------------------------ streamed transactions

/// The transaction id of `txn` (0 when it has none).
unsafe fn xid_of(txn: *mut pg_sys::ReorderBufferTXN) -> u32 {
    unsafe { u32::from((*txn).xid) }
}

#[pg_guard]
unsafe extern "C-unwind" fn stream_start(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
) {
    unsafe {
        let st = state(ctx);
        // A block is written only once it has a change to send (`ensure_begun`).
        st.stream.start(xid_of(txn));
        st.sub = xid_of(txn);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn stream_stop(
    ctx: *mut pg_sys::LogicalDecodingContext,
    _txn: *mut pg_sys::ReorderBufferTXN,
) {
    unsafe {
        let st = state(ctx);
        if st.stream.stop() {
            wire::put_stream_stop(&mut st.buf);
            flush(ctx, st, true);
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn stream_change(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    rel: pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    unsafe {
        // The subtransaction that made the change: an abort of it drops the change.
        let sub = (*change).txn;
        state(ctx).sub = if sub.is_null() {
            xid_of(txn)
        } else {
            xid_of(sub)
        };
        emit_change(ctx, txn, rel, change)
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn stream_truncate(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    nrelations: std::ffi::c_int,
    relations: *mut pg_sys::Relation,
    change: *mut pg_sys::ReorderBufferChange,
) {
    unsafe {
        let sub = (*change).txn;
        state(ctx).sub = if sub.is_null() {
            xid_of(txn)
        } else {
            xid_of(sub)
        };
        emit_truncate(ctx, txn, nrelations, relations, change)
    }
}

/// A streamed transaction ended: the relations it described are described again before their
/// next change elsewhere (the reader's description may now be the one it carried).
fn forget_stream(top: u32) {
    if let Some(rels) = STREAM_SENT.with(|s| s.borrow_mut().remove(&top)) {
        SENT.with(|s| {
            let mut s = s.borrow_mut();
            for r in rels {
                s.remove(&r);
            }
        });
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn stream_abort(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    _abort_lsn: pg_sys::XLogRecPtr,
) {
    unsafe {
        let st = state(ctx);
        let toptxn = (*txn).toptxn;
        let top = if toptxn.is_null() {
            xid_of(txn)
        } else {
            xid_of(toptxn)
        };
        let sub = xid_of(txn);
        if st.stream.abort(top, sub) {
            wire::put_stream_abort(&mut st.buf, top, sub);
            flush(ctx, st, true);
        }
        if top == sub {
            forget_stream(top);
        }
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn stream_commit(
    ctx: *mut pg_sys::LogicalDecodingContext,
    txn: *mut pg_sys::ReorderBufferTXN,
    commit_lsn: pg_sys::XLogRecPtr,
) {
    unsafe {
        let st = state(ctx);
        let xid = xid_of(txn);
        let end = (*txn).end_lsn;
        let written = st.stream.commit(xid);
        forget_stream(xid);
        if !written {
            skipped_commit(ctx, st, end);
            return;
        }
        st.skipped = 0;
        st.reported_end = end;
        wire::put_stream_commit(
            &mut st.buf,
            xid,
            Lsn(commit_lsn),
            Lsn(end),
            (*txn).xact_time.commit_time,
        );
        flush(ctx, st, true);
    }
}
