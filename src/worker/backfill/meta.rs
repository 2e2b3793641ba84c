//! What a backfill chunk is read with, gathered in one place: the source table as it is now
//! (`pg_catalog`), the pipeline's column list, masks and row filter for it (`catalog::tables`,
//! `catalog::masks`), and the checks that its owner may read it (`security`, `row_filter`). The
//! chunk's read ([`super::chunk`]), the form a reader is asked to hold rows in
//! ([`wanted_form`]), and the check that a chunk still has its table's shape at its high
//! watermark (`emit::still_in_form`) all take it from here, so they agree.

use crate::catalog::backfills;
use crate::error::{TideError, TideResult};
use crate::sql;
use crate::target::{RowForm, Target};
use pgrx::prelude::*;
use tide_core::mask::{Mask, Masks};
use tide_core::model::OwnedColumn;

/// The source table as the chunk reads it.
pub(super) struct TableMeta {
    /// Quoted and qualified.
    pub relation: String,
    /// How the chunk reads it: `ONLY relation`, or a partitioned table with its partitions.
    pub scan: String,
    pub partitioned: bool,
    /// Its name alone, quoted: a whole-row reference in the chunk's query.
    pub relname: String,
    pub row_type: pg_sys::Oid,
    /// Columns in attribute order, as the output plugin sends them (no dropped or generated
    /// columns), with their `format_type`.
    pub columns: Vec<(OwnedColumn, String)>,
    /// The attribute number of each column (a column dropped and added again under its name
    /// has another).
    pub attnums: Vec<i32>,
}

impl TableMeta {
    /// Keep only the columns of a column list (attribute numbers; `tide.add_table`'s columns).
    pub fn restrict(&mut self, only: &[i16]) {
        let keep: Vec<bool> = self
            .attnums
            .iter()
            .map(|a| only.contains(&(*a as i16)))
            .collect();
        let mut i = 0;
        self.columns.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        let mut j = 0;
        self.attnums.retain(|_| {
            j += 1;
            keep[j - 1]
        });
    }

    /// Apply a table's masks (by attribute number; see `tide_core::mask`): a hash or truncate
    /// column is delivered as text, so it is described as text. Each column's mask, in order.
    pub fn mask(&mut self, masks: &Masks) -> Vec<Option<Mask>> {
        let mut layout = Vec::with_capacity(self.attnums.len());
        for (i, a) in self.attnums.iter().enumerate() {
            let m = masks.of(&a.to_string()).cloned();
            if m.as_ref().is_some_and(Mask::retypes) {
                self.columns[i].0.type_oid = pg_sys::TEXTOID.to_u32();
                self.columns[i].1 = "text".into();
            }
            layout.push(m);
        }
        layout
    }

    /// (name, format_type) of each column.
    pub fn shape(&self) -> Vec<(String, String)> {
        self.columns
            .iter()
            .map(|(c, ty)| (c.name.clone(), ty.clone()))
            .collect()
    }
}

/// The table `relid` as it is now (`None`: it no longer exists); `key_columns` marks the key.
pub(super) fn table_meta(relid: u32, key_columns: &[String]) -> TideResult<Option<TableMeta>> {
    let relid = relid.to_string();
    // Type names as a target's session writes them (see security::with_type_names).
    let meta = crate::security::with_type_names(|| {
        sql::text_rows(
            "SELECT pg_catalog.format('%I.%I', n.nspname, c.relname), pg_catalog.quote_ident(c.relname),
                    c.reltype::pg_catalog.int8, a.attname::pg_catalog.text, a.atttypid::pg_catalog.int8,
                    pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnum::pg_catalog.int4,
                    (c.relkind OPERATOR(pg_catalog.=) 'p')::pg_catalog.text
               FROM pg_catalog.pg_class c
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
               JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) c.oid
                AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
                AND a.attgenerated OPERATOR(pg_catalog.=) ''
              WHERE c.oid OPERATOR(pg_catalog.=) $1::pg_catalog.oid ORDER BY a.attnum",
            &[Some(&relid)],
            0,
            false,
        )
    })?;
    let Some(first) = meta.first() else {
        return Ok(None);
    };
    let incomplete =
        || TideError::internal(format!("the columns of table {relid} came back incomplete"));
    let text = |r: &Vec<Option<String>>, i: usize| r[i].clone().ok_or_else(incomplete);
    let oid = |r: &Vec<Option<String>>, i: usize| -> TideResult<u32> {
        r[i].as_deref()
            .and_then(|s| s.parse().ok())
            .ok_or_else(incomplete)
    };
    let mut columns = Vec::with_capacity(meta.len());
    let mut attnums = Vec::with_capacity(meta.len());
    for m in &meta {
        attnums.push(oid(m, 6)? as i32);
        let name = text(m, 3)?;
        columns.push((
            OwnedColumn {
                key: key_columns.contains(&name),
                type_oid: oid(m, 4)?,
                name,
            },
            text(m, 5)?,
        ));
    }
    let relation = text(first, 0)?;
    let partitioned = first[7].as_deref() == Some("true");
    Ok(Some(TableMeta {
        scan: if partitioned {
            relation.clone()
        } else {
            format!("ONLY {relation}")
        },
        partitioned,
        relation,
        relname: text(first, 1)?,
        row_type: pg_sys::Oid::from(oid(first, 2)?),
        columns,
        attnums,
    }))
}

/// A chunk's table as the pipeline reads it: restricted to its column list, masked as the stream
/// masks it, with its row filter.
pub(super) struct ChunkMeta {
    pub table: TableMeta,
    /// The table's row filter (`None`: none).
    pub row_filter: Option<String>,
    /// Whether a column list restricts the columns.
    pub listed: bool,
    /// Each column's mask and the pipeline's salt, when the table has masks.
    pub masks: Option<(Vec<Option<Mask>>, Vec<u8>)>,
}

impl ChunkMeta {
    /// Table `relid` of `pipeline` as a chunk reads it now (`key_columns` marks the key); `None`
    /// when it no longer exists.
    pub fn gather(
        pipeline: &str,
        relid: u32,
        key_columns: &[String],
    ) -> TideResult<Option<ChunkMeta>> {
        let (row_filter, listed) = crate::catalog::tables::shaping(pipeline, relid)?;
        let Some(mut table) = table_meta(relid, key_columns)? else {
            return Ok(None);
        };
        if let Some(l) = &listed {
            table.restrict(l);
        }
        let masks = crate::catalog::masks::of_table(pipeline, relid)?;
        let masks = masks.map(|(m, salt)| (table.mask(&m), salt));
        Ok(Some(ChunkMeta {
            table,
            row_filter,
            listed: listed.is_some(),
            masks,
        }))
    }
}

/// The role a chunk of backfill `b` is read as, once it is known to read every row of `meta`
/// (and its `row_filter`) with its rights now.
pub(super) fn reader(
    b: &backfills::Due,
    meta: &TableMeta,
    row_filter: Option<&str>,
) -> TideResult<pg_sys::Oid> {
    // Read as the pipeline's owner (catalog::backfills::due gives it, whoever started the
    // backfill), in a security-restricted operation (`SET ROLE`/`RESET ROLE` fail there), under
    // a timeout: a slow condition fails its backfill instead of holding the stream. The owner
    // must still read every row: a revoked SELECT or a row-level security policy that applies
    // to it now fails the chunk with the reason instead of reading some rows only.
    let owner = crate::security::owner_oid(&b.owner, &format!("backfill {}", b.id))?;
    if let Some(e) =
        crate::security::read_problem(owner, pg_sys::Oid::from(b.relid), &meta.relation)
    {
        return Err(e);
    }
    if let Some(f) = row_filter {
        // Read as the output plugin reads it, with the owner's rights now.
        crate::row_filter::check_text(pg_sys::Oid::from(b.relid), &meta.relation, f, owner)?;
    }
    Ok(owner)
}

/// The form `sink` wants a chunk of table `relid` with `shape` (name, `format_type`) in. A
/// remote target may have to be asked for its table's columns: if it cannot answer now, the
/// chunk is read later (an error here would fail the backfill).
pub(crate) fn form_for(
    sink: &mut dyn Target,
    relid: u32,
    shape: &[(String, String)],
) -> TideResult<RowForm> {
    sink.row_form(relid, Some(shape))
        .map_err(TideError::retry_later)
}

/// The form `sink` wants the chunks of backfill `b` in, for its table as it is now (its column
/// list and masks applied, as `chunk::read_chunk` applies them before it asks; `read_chunk` still
/// holds rows as text where row values cannot carry them). `None` when the table is gone (the
/// chunk read says so).
pub(super) fn wanted_form(
    pipeline: &str,
    b: &backfills::Due,
    sink: &mut dyn Target,
) -> TideResult<Option<RowForm>> {
    let Some(meta) = ChunkMeta::gather(pipeline, b.relid, &b.key_columns)? else {
        return Ok(None);
    };
    form_for(sink, b.relid, &meta.table.shape()).map(Some)
}
