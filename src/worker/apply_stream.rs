//! The changes of a streamed transaction (one in progress at the source, sent in blocks) as
//! [`Applier`] meets them: written while it runs to a target of its own when the target can
//! ([`crate::target::RemoteTarget::open_stream`], see [`crate::worker::stream_apply`]), or left to
//! be applied whole at its commit.
//!
//! Owns: the handlers of a block's start, its changes and its end. Guarantees: anything a live
//! transaction's target cannot take (a change that needs DDL at the target, a message other
//! than a row change, a table captured since it began) makes it fall back to being applied at
//! its commit, from the spool: never half written while it runs and again at its commit.

use crate::error::{TideError, TideResult};
use crate::target::CommitPoint;
use crate::worker::apply::{rel_desc, rel_desc_of, Applier};
use crate::worker::rows::{render_err, update_keys, Emit};
use crate::worker::stream_apply::LiveTxn;
use tide_core::json;
use tide_core::model::Op;
use tide_core::wire::{self, Message};

impl Applier<'_, '_> {
    /// A block of streamed transaction `xid` begins. At its first block: written while it runs
    /// when the target can and fewer than `tide.remote_stream_connections` are. When it is,
    /// everything before the block is committed at the target first: the block may change rows
    /// that transactions committed before it changed (they hold no lock at the source any
    /// more, and would at the remote until committed).
    pub(super) fn on_stream_start(&mut self, xid: u32, first: bool) -> TideResult<()> {
        let sink = &mut *self.sink;
        let open = || {
            crate::target::as_remote(sink)
                .map(|r| r.open_stream())
                .transpose()
        };
        if self.streams.start(xid, first, open, &self.sets.capturing) {
            let before = self.last_applied.map(|(end, _)| end);
            self.sink
                .commit(self.c, &self.p.name, before, CommitPoint::Early)?;
        }
        Ok(())
    }

    /// A change of the block being received: written to its transaction's remote transaction
    /// if it is live; anything that cannot be makes it fall back.
    pub(super) fn on_stream_change(&mut self, body: &[u8]) -> TideResult<()> {
        let Some(xid) = self.streams.current.filter(|&x| self.streams.is_live(x)) else {
            return Ok(());
        };
        let msg = wire::decode(body).map_err(|e| {
            TideError::internal(format!(
                "cannot decode a streamed change of the pg_tide output plugin: {e}"
            ))
        })?;
        if let Err(e) = self.stream_change(xid, msg) {
            self.out.notes.push(format!(
                "transaction {xid} is applied at its commit rather than while it runs: {}",
                e.message
            ));
            self.streams.fall_back(xid);
        }
        Ok(())
    }

    /// The end of a block: what it wrote is sent into its remote transaction, left open.
    pub(super) fn on_stream_stop(&mut self) {
        let Some(xid) = self.streams.current.take() else {
            return;
        };
        let Some(live) = self.streams.live_mut(xid) else {
            return;
        };
        let open = CommitPoint::Open;
        if let Err(e) = live.target.commit(self.c, &self.p.name, None, open) {
            self.out.notes.push(format!(
                "transaction {xid} is applied at its commit rather than while it runs: {}",
                e.message
            ));
            self.streams.fall_back(xid);
        }
    }

    /// Write one change of live streamed transaction `xid` to its target. An error: it falls
    /// back.
    fn stream_change(&mut self, xid: u32, msg: Message<'_>) -> TideResult<()> {
        let stop = |what: &str| Err(TideError::internal(format!("it has {what}")));
        let change = match &msg {
            Message::Relation { .. } => None,
            Message::Insert { relid, .. }
            | Message::Update { relid, .. }
            | Message::Delete { relid, .. } => Some(*relid),
            _ => return stop("a truncate or a table rewrite"),
        };
        if let Some(relid) = change {
            if relid == self.marker_relid || relid == self.signal_relid {
                return stop("a table-list or schema marker, or a watermark");
            }
            if self.sets.pending.contains(&relid) {
                return stop("a change of a table whose capture begins later in the stream");
            }
            if !self.sets.capturing.contains(&relid) {
                return Ok(());
            }
        }
        let Some(live) = self.streams.live_mut(xid) else {
            return Ok(());
        };
        if change.is_some_and(|r| !live.known.contains(&r)) {
            return stop("a change of a table captured since it began");
        }
        if let Some(relid) = change.filter(|&r| live.written.insert(r)) {
            // As at the commit (`check_read`): nothing of a table its owner may no longer read
            // goes to the remote, even uncommitted.
            let qualified = live
                .rels
                .get(&relid)
                .map_or_else(|| relid.to_string(), |r| r.qualified.clone());
            let oid = pgrx::pg_sys::Oid::from(relid);
            if let Some(e) = crate::security::read_problem(self.owner, oid, &qualified) {
                return Err(e);
            }
        }
        let LiveTxn {
            target, rels, txn, ..
        } = live;
        let mut to = Emit {
            sink: target.as_mut(),
            c: &mut *self.c,
            t: txn,
        };
        match msg {
            Message::Relation {
                relid,
                namespace,
                name,
                columns,
            } => {
                let rel = rel_desc_of(namespace, name, &columns);
                if self.sets.follows(relid) {
                    to.sink.describe(to.c, relid, &rel)?;
                }
                rels.insert(relid, rel);
                Ok(())
            }
            // Changes of captured tables only, from here on (checked above).
            Message::Insert { relid, new } => {
                let rel = rel_desc(rels, relid)?;
                let mut key = String::new();
                json::render_key(&rel.columns, &new, &mut key).map_err(render_err)?;
                to.row((relid, rel), Op::Insert, key, &new)
            }
            Message::Update {
                relid,
                old_key,
                new,
            } => {
                let rel = rel_desc(rels, relid)?;
                let (old, new_key) = update_keys(rel, old_key.as_ref(), &new)?;
                to.update((relid, rel), (old, old_key.as_ref()), new_key, &new)
            }
            Message::Delete { relid, old_key } => {
                let rel = rel_desc(rels, relid)?;
                let mut k = String::new();
                json::render_key(&rel.columns, &old_key, &mut k).map_err(render_err)?;
                to.delete((relid, rel), k, &old_key)
            }
            _ => stop("an unexpected message"),
        }
    }
}
