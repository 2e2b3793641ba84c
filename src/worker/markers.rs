//! pg_tide's own rows in the stream, read: `tide.signal`'s watermarks and `tide.marker`'s
//! table-list and schema markers, as `worker::apply` meets them (the worker follows them in
//! every transaction, replays included).
//!
//! Owns: reading such a row's columns by name. Guarantees: a row that is not a well-formed
//! watermark or marker (a missing column, an unknown kind or op) reads as `None`, never as a
//! partial one.

use tide_core::model::{MarkerOp, RelDesc, WatermarkKind};
use tide_core::wire::{self, Tuple};

/// The text of column `name` in a row of one of pg_tide's own tables.
pub(super) fn column_text<'t>(rel: &RelDesc, t: &Tuple<'t>, name: &str) -> Option<&'t str> {
    let i = rel.columns.iter().position(|c| c.name == name)?;
    match t.values.get(i)? {
        wire::Value::Text(s) => Some(*s),
        _ => None,
    }
}

/// The (pipeline, watermark, kind) of a `tide.signal` row (`None` for a row that is not one:
/// its CHECK constraint allows only the two kinds).
pub(super) fn parse_watermark(
    rel: &RelDesc,
    t: &Tuple<'_>,
) -> Option<(String, u64, WatermarkKind)> {
    Some((
        column_text(rel, t, "pipeline")?.to_string(),
        column_text(rel, t, "watermark")?.parse().ok()?,
        WatermarkKind::parse(column_text(rel, t, "kind")?)?,
    ))
}

/// The (op, pipeline, relid) of a `tide.marker` row (`None` for a row that is not one: its
/// CHECK constraint allows only the two ops).
pub(super) fn parse_marker(rel: &RelDesc, t: &Tuple<'_>) -> Option<(MarkerOp, String, u32)> {
    Some((
        MarkerOp::parse(column_text(rel, t, "op")?)?,
        column_text(rel, t, "pipeline")?.to_string(),
        column_text(rel, t, "relid")?.parse().ok()?,
    ))
}

/// Whether a remove marker's payload says the table was dropped (`"table_dropped": true`).
pub(super) fn dropped_table(payload: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(payload)
        .ok()
        .and_then(|v| v.get("table_dropped")?.as_bool())
        .unwrap_or(false)
}

/// The relation named in a schema marker's payload (as the stream's events name it).
pub(super) fn schema_relation(payload: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(payload).ok()?;
    v.get("relation")?.as_str().map(str::to_string)
}
