//! A decoded row as its columns' text output, for targets that write rows as text (table
//! targets: [`crate::plan`] casts each value to the target column's type), where the outbox
//! renders JSON ([`crate::json`]). Pure, like the rest of the crate.

use crate::json::{ColumnDesc, RenderError};
use crate::wire::{Tuple, Value};

/// The text of every column of `tuple` that was sent (NULL as `None`), in column order, and the
/// indexes of the unchanged out-of-line (TOAST) columns that were not sent and are left out.
///
/// # Errors
/// [`RenderError::WidthMismatch`] when the tuple does not have one value per column.
pub fn row<C: ColumnDesc>(
    cols: &[C],
    tuple: &Tuple<'_>,
) -> Result<(Vec<Option<String>>, Vec<usize>), RenderError> {
    width(cols, tuple)?;
    let mut values = Vec::with_capacity(cols.len());
    let mut unchanged = Vec::new();
    for (i, v) in tuple.values.iter().enumerate() {
        match *v {
            Value::Null => values.push(None),
            Value::Text(s) => values.push(Some(s.to_string())),
            Value::Unchanged => unchanged.push(i),
        }
    }
    Ok((values, unchanged))
}

/// The key columns ([`ColumnDesc::is_key`]) of `tuple`, by name, with their text (NULL as
/// `None`), in column order. For an update, pass the old-key tuple when one was sent.
///
/// # Errors
/// [`RenderError::UnchangedKey`] when a key column's value was not sent, or
/// [`RenderError::WidthMismatch`].
pub fn key<C: ColumnDesc>(
    cols: &[C],
    tuple: &Tuple<'_>,
) -> Result<Vec<(String, Option<String>)>, RenderError> {
    width(cols, tuple)?;
    let mut out = Vec::new();
    for (i, (c, v)) in cols.iter().zip(&tuple.values).enumerate() {
        if !c.is_key() {
            continue;
        }
        out.push((
            c.name().to_string(),
            match *v {
                Value::Null => None,
                Value::Text(s) => Some(s.to_string()),
                Value::Unchanged => {
                    return Err(RenderError::UnchangedKey {
                        column: i,
                        name: c.name().to_string(),
                    })
                }
            },
        ));
    }
    Ok(out)
}

fn width<C: ColumnDesc>(cols: &[C], tuple: &Tuple<'_>) -> Result<(), RenderError> {
    if cols.len() != tuple.values.len() {
        return Err(RenderError::WidthMismatch {
            columns: cols.len(),
            values: tuple.values.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::OwnedColumn;

    fn cols() -> Vec<OwnedColumn> {
        [("id", true), ("j", false), ("big", false), ("n", false)]
            .iter()
            .map(|(n, k)| OwnedColumn {
                name: n.to_string(),
                type_oid: 25,
                key: *k,
            })
            .collect()
    }

    #[test]
    fn rows_and_keys() {
        let t = Tuple {
            values: vec![
                Value::Text("7"),
                Value::Text("null"),
                Value::Unchanged,
                Value::Null,
            ],
        };
        let (values, unchanged) = row(&cols(), &t).unwrap();
        // JSON null stays the text "null"; SQL NULL is None; the unchanged column is left out.
        assert_eq!(values, vec![Some("7".into()), Some("null".into()), None]);
        assert_eq!(unchanged, vec![2]);
        assert_eq!(
            key(&cols(), &t).unwrap(),
            vec![("id".into(), Some("7".into()))]
        );
        let bad = Tuple {
            values: vec![Value::Unchanged, Value::Null, Value::Null, Value::Null],
        };
        assert!(matches!(
            key(&cols(), &bad),
            Err(RenderError::UnchangedKey { column: 0, .. })
        ));
        assert!(matches!(
            row(&cols(), &Tuple { values: vec![] }),
            Err(RenderError::WidthMismatch { .. })
        ));
    }
}
