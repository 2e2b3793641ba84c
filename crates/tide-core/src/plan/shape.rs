//! The DDL that keeps a target table's shape in step with its source, and which type changes
//! are safe widenings.

use super::*;

/// A source column as the shape check sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceColumn {
    pub name: String,
    /// `format_type` of the column.
    pub ty: String,
    /// The value rows that existed before the column was added have (`attmissingval`), when it
    /// was added with a non-volatile default.
    pub missing: Option<String>,
}

/// What keeps a target table's shape in step with its source.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ShapePlan {
    /// DDL to apply, each with what it does in words.
    pub ddl: Vec<(String, String)>,
    /// Changes that are not safe to apply (a type change that is not a widening), in words.
    pub refused: Vec<String>,
    /// The target's columns once `ddl` is applied.
    pub shape: Vec<(String, String)>,
    /// The source's key changed ([`plan_schema_change`]), which pg_tide cannot follow.
    pub key_changed: bool,
    /// A column `ddl` adds has a value for the rows that existed before it (its `missing`):
    /// those rows carry it only at the source, never in the stream. Whoever adds the column
    /// instead of this plan (a user following a paused pipeline's remedy) may leave them
    /// without it, so the table is read again after such a pause.
    pub adds_existing_values: bool,
}

/// Compare the source's columns with the target's (`(name, format_type)` each) and plan the
/// DDL for the target table `table` (quoted, qualified): add the columns it lacks (with the
/// source's missing value as default, so rows and decoded events from before the column
/// existed get it), widen columns whose type the source widened, and refuse the rest. Columns
/// only the target has are left alone.
/// Types are the source's `format_type` text, which PostgreSQL writes with its identifiers
/// already quoted (`"My Type"`, `public."e"`), so they go into the DDL as they are; names are
/// quoted here and default values are literals ([`quote_literal`]).
pub fn plan_shape(table: &str, source: &[SourceColumn], target: &[(String, String)]) -> ShapePlan {
    let mut plan = ShapePlan {
        shape: target.to_vec(),
        ..ShapePlan::default()
    };
    for col in source {
        let (name, ty) = (&col.name, &col.ty);
        match target.iter().find(|(n, _)| n == name) {
            None => {
                plan.adds_existing_values |= col.missing.is_some();
                let ddl = match &col.missing {
                    Some(v) => format!(
                        "ALTER TABLE {table} ADD COLUMN {} {ty} DEFAULT {}::{ty}",
                        quote_ident(name),
                        quote_literal(v)
                    ),
                    None => format!("ALTER TABLE {table} ADD COLUMN {} {ty}", quote_ident(name)),
                };
                plan.ddl.push((ddl, format!("add column {name} {ty}")));
                plan.shape.push((name.clone(), ty.clone()));
            }
            Some((_, tty)) if holds(tty, ty) => {} // the target is already at least as wide
            Some((_, tty)) if holds(ty, tty) => {
                plan.ddl.push((
                    format!(
                        "ALTER TABLE {table} ALTER COLUMN {} TYPE {ty}",
                        quote_ident(name)
                    ),
                    format!("widen column {name} from {tty} to {ty}"),
                ));
                if let Some(c) = plan.shape.iter_mut().find(|(n, _)| n == name) {
                    c.1 = ty.clone();
                }
            }
            Some((_, tty)) => plan.refused.push(format!(
                "column {name} changed from {tty} to {ty}, which is not a safe widening"
            )),
        }
    }
    plan
}

/// Plan what a schema event (`change`, see [`crate::model::SchemaChange`]) does to the target
/// table `table` (quoted, qualified) whose columns are `target` and whose key is `target_key`,
/// at the event's position: columns renamed at the source are renamed (when the target has the
/// old name and not the new one), then each dropped column the target has is dropped (also
/// when a column of that name was added again: its rows have the new column's values) —
/// unless it is part of the target's key, which is refused — then [`plan_shape`] against the
/// new columns (added columns with the value existing rows got, safe widenings; the rest
/// refused).
/// A changed key is refused (`key_changed`): pg_tide keys the target, its backfill and its
/// reconciliation by the key it recorded.
pub fn plan_schema_change(
    table: &str,
    change: &crate::model::SchemaChange,
    target: &[(String, String)],
    target_key: &[String],
) -> ShapePlan {
    let mut renamed_target = target.to_vec();
    let mut ddl = Vec::new();
    for (from, to) in &change.renamed {
        let has = |n: &str| renamed_target.iter().any(|(c, _)| c == n);
        if has(from) && !has(to) && !target_key.contains(from) {
            ddl.push((
                format!(
                    "ALTER TABLE {table} RENAME COLUMN {} TO {}",
                    quote_ident(from),
                    quote_ident(to)
                ),
                format!("rename column {from} to {to}"),
            ));
            if let Some(c) = renamed_target.iter_mut().find(|(c, _)| c == from) {
                c.0 = to.clone();
            }
        }
    }
    let mut refused = Vec::new();
    for name in &change.dropped {
        if !renamed_target.iter().any(|(n, _)| n == name) {
            continue; // never at the target
        }
        if target_key.contains(name) {
            refused.push(format!(
                "column {name} was dropped at the source, and it is part of the target's key"
            ));
            continue;
        }
        // Also when a column of that name was added again: its rows have new values.
        ddl.push((
            format!("ALTER TABLE {table} DROP COLUMN {}", quote_ident(name)),
            format!("drop column {name}"),
        ));
        renamed_target.retain(|(n, _)| n != name);
    }
    let source: Vec<SourceColumn> = change
        .columns
        .iter()
        .map(|(name, ty)| SourceColumn {
            name: name.clone(),
            ty: ty.clone(),
            missing: change
                .added
                .iter()
                .find(|(n, _, _)| n == name)
                .and_then(|(_, _, v)| v.clone()),
        })
        .collect();
    let mut plan = plan_shape(table, &source, &renamed_target);
    ddl.append(&mut plan.ddl);
    plan.ddl = ddl;
    refused.append(&mut plan.refused);
    plan.refused = refused;
    if change.key_changed() {
        plan.key_changed = true;
        plan.refused.push(format!(
            "the key changed from ({}) to ({})",
            change.previous_key.join(", "),
            change.key.join(", ")
        ));
    }
    plan
}

/// Whether type `wide` can hold every value of type `narrow` (so `narrow → wide` is a safe
/// widening). Types are `format_type` strings.
pub fn holds(wide: &str, narrow: &str) -> bool {
    if wide == narrow {
        return true;
    }
    let int_digits = |t: &str| match t {
        "smallint" => Some(5),
        "integer" => Some(10),
        "bigint" => Some(19),
        _ => None,
    };
    let numeric = |t: &str| -> Option<Option<(u32, u32)>> {
        if t == "numeric" {
            return Some(None);
        }
        let inner = t.strip_prefix("numeric(")?.strip_suffix(')')?;
        let mut it = inner.split(',');
        let p = it.next()?.trim().parse().ok()?;
        let s = it
            .next()
            .map(|s| s.trim().parse().ok())
            .unwrap_or(Some(0))?;
        Some(Some((p, s)))
    };
    let varchar = |t: &str| -> Option<Option<u32>> {
        if t == "character varying" {
            return Some(None);
        }
        t.strip_prefix("character varying(")?
            .strip_suffix(')')?
            .parse()
            .ok()
            .map(Some)
    };
    match (wide, narrow) {
        ("text", n) if n == "text" || varchar(n).is_some() || n.starts_with("character(") => true,
        ("double precision", "real") => true,
        ("double precision", n) if n == "smallint" || n == "integer" => true,
        (w, n) if int_digits(w).is_some() && int_digits(n).is_some() => {
            int_digits(w) >= int_digits(n)
        }
        (w, n) if numeric(w).is_some() => match (numeric(w), int_digits(n), numeric(n)) {
            (Some(None), Some(_), _) | (Some(None), _, Some(_)) => true,
            (Some(Some((p, s))), Some(d), _) => p.saturating_sub(s) >= d,
            (Some(Some((wp, ws))), _, Some(Some((np, ns)))) => {
                ws >= ns && wp.saturating_sub(ws) >= np.saturating_sub(ns)
            }
            _ => false,
        },
        (w, n) if varchar(w).is_some() && varchar(n).is_some() => match (varchar(w), varchar(n)) {
            (Some(None), _) => true,
            (Some(Some(a)), Some(Some(b))) => a >= b,
            _ => false,
        },
        _ => false,
    }
}
