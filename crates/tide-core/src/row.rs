//! A row on its way from a source table to a target, and the forms it can take.
//!
//! Owns: the one vocabulary the worker, the chunk reader, the read-ahead protocol and every
//! target share for a row. A target declares, per table, the [`RowForm`] it wants (for stream
//! events, and for a backfill chunk with given columns); the worker renders each row once, in
//! that form, into a [`Row`]. Adding a form is a variant here, one arm where rows are rendered
//! (the worker's `emit_row` and `read_chunk`), one in the codec ([`crate::read_ahead`]) and the
//! targets that want it.

/// A row's key columns by name, with their text output (NULL as `None`).
pub type KeyValues = Vec<(String, Option<String>)>;

/// How a target wants a table's rows.
///
/// The per-row forms ([`RowForm::Json`], [`RowForm::Jsonb`], [`RowForm::Text`]) are what an
/// event carries; the batch forms ([`RowForm::RowValues`], [`RowForm::CopyText`]) exist for a
/// backfill chunk only, whose surviving rows reach the target as one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowForm {
    /// A JSON object of the sent columns (the outbox's stream events; Kafka).
    Json,
    /// The same JSON object parsed into a `jsonb` datum by whoever read the row (a chunk's rows
    /// for the outbox: the chunk's reader parses them, not the worker). Stream events of such a
    /// target are [`RowForm::Json`].
    Jsonb,
    /// Each column's text output (table targets: each text is cast to the target column's type,
    /// so every value arrives exactly).
    Text,
    /// Row values of the source table's row type, one array for the chunk (a table in this
    /// database with each of the chunk's columns, same types). Stream events: [`RowForm::Text`].
    RowValues,
    /// Lines of `COPY ... FROM STDIN` text, one COPY for the chunk (a table in another
    /// PostgreSQL with each of the chunk's columns, same types). Stream events:
    /// [`RowForm::Text`].
    CopyText,
}

impl RowForm {
    /// Every form, in the codec's order ([`RowForm::tag`]).
    pub const ALL: [RowForm; 5] = [
        RowForm::Json,
        RowForm::Jsonb,
        RowForm::Text,
        RowForm::RowValues,
        RowForm::CopyText,
    ];

    /// The form of one event's row for a target that wants `self`: batch forms fall back to
    /// [`RowForm::Text`] (a chunk row that must go as an event, a stream event), `jsonb` to JSON
    /// for a row the worker renders itself.
    pub fn per_row(self) -> RowForm {
        match self {
            RowForm::Json | RowForm::Jsonb => RowForm::Json,
            RowForm::Text | RowForm::RowValues | RowForm::CopyText => RowForm::Text,
        }
    }

    /// One byte naming the form in the read-ahead protocol.
    pub fn tag(self) -> u8 {
        match self {
            RowForm::Json => 0,
            RowForm::Jsonb => 1,
            RowForm::Text => 2,
            RowForm::RowValues => 3,
            RowForm::CopyText => 4,
        }
    }

    /// The form a [`RowForm::tag`] names.
    pub fn from_tag(t: u8) -> Option<RowForm> {
        RowForm::ALL.get(usize::from(t)).copied()
    }
}

/// One row, in exactly one form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Row {
    /// No row: a truncate, or a delete to a target that takes JSON (the event's key says what).
    None,
    /// [`RowForm::Json`]: a JSON object of the sent columns.
    Json(String),
    /// [`RowForm::Jsonb`]: a `jsonb` datum's bytes (its varlena, 4-byte header included).
    Jsonb(Vec<u8>),
    /// [`RowForm::Text`]: each sent column's text output, NULL as `None`, in the event's column
    /// order.
    Text(Vec<Option<String>>),
    /// A delete to a target that takes text: the key columns by name with their text output (a
    /// stream delete's old key, a repair's key that no longer exists at the source).
    Key(KeyValues),
    /// [`RowForm::RowValues`]: row `n` of the chunk's row values (chunk rows only, until the
    /// surviving ones are written as one batch).
    Value(u32),
    /// [`RowForm::CopyText`]: the row as one line of COPY text, newline included (chunk rows
    /// only, until the surviving ones are written as one COPY).
    Copy(String),
}

impl Row {
    /// Whether the row goes to the target in a batch of its chunk ([`Row::Value`],
    /// [`Row::Copy`]) rather than as an event.
    pub fn batched(&self) -> bool {
        matches!(self, Row::Value(_) | Row::Copy(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_unknown_tags_are_refused() {
        for f in RowForm::ALL {
            assert_eq!(RowForm::from_tag(f.tag()), Some(f));
        }
        assert_eq!(RowForm::from_tag(5), None);
        assert_eq!(RowForm::from_tag(255), None);
    }

    #[test]
    fn per_row_forms() {
        assert_eq!(RowForm::Jsonb.per_row(), RowForm::Json);
        assert_eq!(RowForm::RowValues.per_row(), RowForm::Text);
        assert_eq!(RowForm::CopyText.per_row(), RowForm::Text);
        assert_eq!(RowForm::Text.per_row(), RowForm::Text);
        assert_eq!(RowForm::Json.per_row(), RowForm::Json);
        assert!(Row::Value(0).batched() && Row::Copy(String::new()).batched());
        assert!(!Row::Text(vec![]).batched() && !Row::Key(vec![]).batched());
    }
}
