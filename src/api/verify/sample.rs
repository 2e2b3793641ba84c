//! Sampling: the values of some differing rows on both sides, rendered the same way, for
//! the report.

use super::*;

/// Compare `n` random rows column by column; returns (key, columns that differ) for rows that
/// differ in every attempt.
pub(super) fn sample_columns(ctx: &Ctx, n: i32) -> TideResult<Vec<(Vec<String>, Vec<String>)>> {
    let keys_plain = ctx.key_names();
    let picked = sql::text_rows(
        &format!(
            "SELECT {keys_plain} FROM {} ORDER BY random() LIMIT {n}",
            ctx.scan
        ),
        &[],
        0,
        true,
    )?;
    // Both sides rendered the same way: as the source type, cast to text (a remote read can
    // only return text). Rendering the source by the type's output function instead flagged
    // equal values: boolean `t` against `true`, char(5) `'ab   '` against `'ab'`, inet `::1`
    // against `::1/128`.
    let cols_tgt: Vec<String> = ctx
        .cols
        .iter()
        .map(|(c, t)| format!("(({})::{t})::text", quote(c)))
        .collect();
    let cols_src = &cols_tgt;
    let mut out = Vec::new();
    for key in picked {
        let key: Vec<String> = key.into_iter().map(Option::unwrap_or_default).collect();
        let mut differing: Option<HashSet<String>> = None;
        for _ in 0..ATTEMPTS {
            let eq: Vec<String> = ctx
                .key
                .iter()
                .enumerate()
                .map(|(i, k)| format!("{} = ${}::{}", quote(k), i + 1, ctx.key_type(k)))
                .collect();
            let args: Vec<Option<&str>> = key.iter().map(|s| Some(s.as_str())).collect();
            let src = sql::text_rows(
                &format!(
                    "SELECT {} FROM {} WHERE {}",
                    cols_src.join(", "),
                    ctx.scan,
                    eq.join(" AND ")
                ),
                &args,
                1,
                true,
            )?;
            wait_caught_up(&ctx.pipeline)?;
            let q = format!(
                "SELECT {} FROM {} WHERE {}",
                cols_tgt.join(", "),
                ctx.target,
                eq.join(" AND ")
            );
            let tgt = match &ctx.remote {
                Some(r) => remote_read(r, &ctx.target, q, key.clone())?,
                None => sql::text_rows(&q, &args, 1, true)?,
            };
            let (Some(s), Some(t)) = (src.first(), tgt.first()) else {
                // Missing on one side: the range check reports it.
                differing = Some(HashSet::new());
                break;
            };
            let d: HashSet<String> = ctx
                .cols
                .iter()
                .enumerate()
                .filter(|(i, _)| s[*i] != t[*i])
                .map(|(_, (c, _))| c.clone())
                .collect();
            let d = match &differing {
                Some(prev) => prev.intersection(&d).cloned().collect(),
                None => d,
            };
            let empty = d.is_empty();
            differing = Some(d);
            if empty {
                break;
            }
        }
        if let Some(d) = differing {
            if !d.is_empty() {
                let mut cols: Vec<String> = d.into_iter().collect();
                cols.sort();
                out.push((key, cols));
            }
        }
    }
    Ok(out)
}
