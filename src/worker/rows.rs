//! A decoded row change of a captured table as its target's events (`worker::apply`'s inserts,
//! updates and deletes, of the stream and of a transaction written while it runs).
//!
//! Owns: rendering a decoded row once, in the row form the target asked for
//! ([`Target::row_form`]: text or JSON), with its key, its unchanged TOAST columns and, for a
//! table captured without a key (`REPLICA IDENTITY FULL`), its whole old row. Guarantees: an
//! update that changes the key is a delete of the old key and an insert of the new row; every
//! event takes the next position of its source transaction ([`Target::send`]).

use crate::error::{TideError, TideResult};
use crate::target::{Change, Event, Row, RowForm, Target};
use pgrx::spi::SpiClient;
use tide_core::model::{Op, RelDesc, Txn};
use tide_core::wire::Tuple;
use tide_core::{json, texts};

/// Where a decoded change goes: the target, the worker's SPI client, and the source transaction
/// whose next events it makes.
pub(super) struct Emit<'a, 'c> {
    pub sink: &'a mut dyn Target,
    pub c: &'a mut SpiClient<'c>,
    pub t: &'a mut Txn,
}

/// A captured table: its OID and description.
pub(super) type Table<'r> = (u32, &'r RelDesc);

impl Emit<'_, '_> {
    /// An insert or an update (`op`) of `new`, whose key is `key`.
    pub fn row(
        &mut self,
        table: Table<'_>,
        op: Op,
        key: String,
        new: &Tuple<'_>,
    ) -> TideResult<()> {
        self.emit(table, op, key, None, new)
    }

    /// An update, its old key (`old`, rendered, with `old_key` as PostgreSQL logged it) and new
    /// key given: a key change is a delete of the old key and an insert of the new row.
    pub fn update(
        &mut self,
        table: Table<'_>,
        (old, old_key): (Option<String>, Option<&Tuple<'_>>),
        new_key: String,
        new: &Tuple<'_>,
    ) -> TideResult<()> {
        let rel = table.1;
        if keyless(rel) {
            let old_row = old_key.ok_or_else(|| no_old_row(rel))?;
            return self.emit(table, Op::Update, new_key, Some(old_row), new);
        }
        match old {
            Some(old) if old != new_key => {
                let Some(old_tuple) = old_key else {
                    return Err(TideError::internal("a key change without the old key"));
                };
                self.delete(table, old, old_tuple)?;
                self.row(table, Op::Insert, new_key, new)
            }
            _ => self.row(table, Op::Update, new_key, new),
        }
    }

    /// A delete of the key `key` (rendered from `old`, the old key tuple or the old row).
    pub fn delete(&mut self, table: Table<'_>, key: String, old: &Tuple<'_>) -> TideResult<()> {
        let ev = delete_event(self.sink, table, key, old)?;
        self.sink.send(self.c, self.t, Change::Row(ev))?;
        Ok(())
    }

    fn emit(
        &mut self,
        (relid, rel): Table<'_>,
        op: Op,
        key: String,
        old: Option<&Tuple<'_>>,
        new: &Tuple<'_>,
    ) -> TideResult<()> {
        let (row, unchanged) = match self.sink.row_form(relid, None)?.per_row() {
            RowForm::Text => {
                let (values, unchanged) = texts::row(&rel.columns, new).map_err(render_err)?;
                (Row::Text(values), unchanged)
            }
            _ => {
                let mut row = String::new();
                let unchanged =
                    json::render_row(&rel.columns, new, &mut row).map_err(render_err)?;
                (Row::Json(row), unchanged)
            }
        };
        let columns = rel
            .columns
            .iter()
            .enumerate()
            .filter(|(i, _)| !unchanged.contains(i))
            .map(|(_, c)| c.name.clone())
            .collect();
        let unchanged = unchanged
            .iter()
            .filter_map(|&i| rel.columns.get(i).map(|c| c.name.clone()))
            .collect();
        let (key, old) = match old {
            Some(o) => old_row(self.sink, (relid, rel), o)?,
            None if keyless(rel) => (None, Row::None),
            None => (Some(key), Row::None),
        };
        let ev = Event {
            relid,
            relation: rel.qualified.clone(),
            op,
            key,
            row,
            unchanged,
            columns,
            old,
            backfill: None,
            only_where: None,
        };
        self.sink.send(self.c, self.t, Change::Row(ev))?;
        Ok(())
    }
}

/// An update's old key (when PostgreSQL logged one) and new key, rendered.
pub(super) fn update_keys(
    rel: &RelDesc,
    old_key: Option<&Tuple<'_>>,
    new: &Tuple<'_>,
) -> TideResult<(Option<String>, String)> {
    let old = match old_key {
        Some(old) => {
            let mut k = String::new();
            json::render_key(&rel.columns, old, &mut k).map_err(render_err)?;
            Some(k)
        }
        None => None,
    };
    let mut new_key = String::new();
    match (json::render_key(&rel.columns, new, &mut new_key), &old) {
        (Ok(()), _) => {}
        // A key column stored out of line and not changed: the old key (which PostgreSQL logs
        // in that case) is the key.
        (Err(json::RenderError::UnchangedKey { .. }), Some(old)) => new_key = old.clone(),
        (Err(e), _) => return Err(render_err(e)),
    }
    Ok((old, new_key))
}

pub(super) fn render_err(e: json::RenderError) -> TideError {
    TideError::internal(format!("cannot render a decoded row: {e}"))
}

/// Whether `rel` was captured without a key (`REPLICA IDENTITY FULL`): no column is a key
/// column. Its events carry the old row instead of a key: as `key` (JSON) for a target that
/// takes JSON, as [`Event::old`] for one that takes text.
fn keyless(rel: &RelDesc) -> bool {
    !rel.columns.iter().any(|c| c.key)
}

/// The whole old row of a keyless table's update or delete, for the target's row form: `(key,
/// old)` of its event.
fn old_row(
    sink: &mut dyn Target,
    (relid, rel): Table<'_>,
    old: &Tuple<'_>,
) -> TideResult<(Option<String>, Row)> {
    if sink.row_form(relid, None)?.per_row() == RowForm::Text {
        let (values, unchanged) = texts::row(&rel.columns, old).map_err(render_err)?;
        if !unchanged.is_empty() {
            return Err(TideError::internal(format!(
                "the old row of a change of {} lacks a column",
                rel.qualified
            )));
        }
        let named = rel.columns.iter().map(|c| c.name.clone()).zip(values);
        Ok((None, Row::Key(named.collect())))
    } else {
        let mut k = String::new();
        json::render_row(&rel.columns, old, &mut k).map_err(render_err)?;
        // `key` for the outbox; `old` too, which tells the kafka target the row has no key.
        Ok((Some(k.clone()), Row::Json(k)))
    }
}

/// A change of a keyless table that PostgreSQL logged without the old row: its replica
/// identity is no longer FULL (the event trigger refuses that change while the table is
/// captured, so only a change made with the trigger disabled gets here).
fn no_old_row(rel: &RelDesc) -> TideError {
    TideError::prerequisite(format!(
        "a change of {} carries no old row: the table has no key and its replica identity is no longer FULL, so the row to change cannot be found",
        rel.qualified
    ))
    .hint(format!(
        "ALTER TABLE {} REPLICA IDENTITY FULL; then skip the transaction (tide.skip_transaction) and repair the target, or remove the table and add it again.",
        rel.qualified
    ))
}

/// An event without a row (delete, truncate).
pub(super) fn key_event(relid: u32, rel: &RelDesc, op: Op, key: Option<String>) -> Event {
    Event::bare(relid, rel.qualified.clone(), op, key)
}

/// A delete of the key in `old` (the old key tuple, or the old row).
fn delete_event(
    sink: &mut dyn Target,
    (relid, rel): Table<'_>,
    key: String,
    old: &Tuple<'_>,
) -> TideResult<Event> {
    if keyless(rel) {
        let (key, row) = old_row(sink, (relid, rel), old)?;
        let mut ev = key_event(relid, rel, Op::Delete, key);
        ev.old = row;
        return Ok(ev);
    }
    let mut ev = key_event(relid, rel, Op::Delete, Some(key));
    if sink.row_form(relid, None)?.per_row() == RowForm::Text {
        ev.row = Row::Key(texts::key(&rel.columns, old).map_err(render_err)?);
    }
    Ok(ev)
}
