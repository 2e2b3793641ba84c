//! Planning a verification: what to compare (the source, its key, the target, local or
//! remote) and the statements that read each side.

use super::*;

impl Ctx {
    /// The key columns, quoted, comma-separated (no collation).
    pub(super) fn key_names(&self) -> String {
        self.key
            .iter()
            .map(|k| quote(k))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub(super) fn collate(&self, k: &str) -> &'static str {
        if self.collatable.contains(k) {
            " COLLATE \"C\""
        } else {
            ""
        }
    }

    pub(super) fn key_type(&self, k: &str) -> String {
        self.cols
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| "text".into())
    }

    pub(super) fn key_list(&self, alias: &str) -> String {
        self.key
            .iter()
            .map(|k| format!("{alias}{}{}", quote(k), self.collate(k)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `(k1, k2) > ($1::T1, $2::T2) AND (k1, k2) <= ($3::T1, $4::T2)` for the given bounds.
    pub(super) fn range_clause(
        &self,
        from: Option<&[String]>,
        to: Option<&[String]>,
        first_param: usize,
    ) -> (String, Vec<String>) {
        let mut clauses = Vec::new();
        let mut params = Vec::new();
        let mut n = first_param;
        for (bound, op) in [(from, ">"), (to, "<=")] {
            if let Some(vals) = bound {
                let ps: Vec<String> = self
                    .key
                    .iter()
                    .map(|k| {
                        let p = format!("${n}::{}{}", self.key_type(k), self.collate(k));
                        n += 1;
                        p
                    })
                    .collect();
                clauses.push(format!("({}) {op} ({})", self.key_list(""), ps.join(", ")));
                params.extend(vals.iter().cloned());
            }
        }
        let sql = if clauses.is_empty() {
            "true".to_string()
        } else {
            clauses.join(" AND ")
        };
        (sql, params)
    }

    /// For a table without a key (`REPLICA IDENTITY FULL`): every row of `from` as a multiset
    /// element, `<md5 of the row> #<n>` for its n-th copy, and the md5. Two sides hold the same
    /// multiset exactly when they have the same elements.
    pub(super) fn multiset_select(&self, from: &str, cast: bool) -> String {
        let all: Vec<String> = self
            .cols
            .iter()
            .map(|(n, t)| {
                if cast {
                    format!("{}::{t}", quote(n))
                } else {
                    quote(n)
                }
            })
            .collect();
        format!(
            "SELECT h || ' #' || row_number() OVER (PARTITION BY h), h FROM (SELECT md5(ROW({})::text) AS h FROM {from}) s",
            all.join(", ")
        )
    }

    pub(super) fn hash_select(&self, cast: bool) -> String {
        let c = |name: &str, ty: &str| {
            if cast {
                format!("{}::{ty}", quote(name))
            } else {
                quote(name)
            }
        };
        let keys: Vec<String> = self.key.iter().map(|k| c(k, &self.key_type(k))).collect();
        let all: Vec<String> = self.cols.iter().map(|(n, t)| c(n, t)).collect();
        format!(
            "ROW({})::text, md5(ROW({})::text)",
            keys.join(", "),
            all.join(", ")
        )
    }
}

pub(super) fn setup(
    relid: pg_sys::Oid,
    pipeline: Option<&str>,
    allow_running_backfill: bool,
) -> TideResult<Ctx> {
    check_server()?;
    let pipeline = resolve_pipeline(relid, pipeline)?;
    // (After the ownership check.) Held to the end of the transaction: every source read below
    // takes a fresh snapshot after this, so none of them can see a rewritten source as empty.
    // SAFETY: `relid` names a relation the caller owns (checked above; a dropped one makes
    // LockRelationOid an ERROR, not UB); main thread, inside the SQL function's transaction, which
    // releases the lock.
    unsafe { pg_sys::LockRelationOid(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
    let source = relation_name(relid)?;
    let (target_kind, options) = catalog::pipelines::target(&pipeline)?;
    let kind = crate::target::kind(target_kind);
    if let Some(t) = &kind.tableless {
        return Err(TideError::prerequisite(format!(
            "pipeline \"{pipeline}\" writes to {}: there is no target table to compare",
            t.writes_to
        ))
        .hint(t.verify_hint));
    }
    let Some(t) = catalog::tables::target_table(&pipeline, relid)? else {
        return Err(TideError::prerequisite(format!(
            "pipeline \"{pipeline}\" does not capture {source}"
        ))
        .hint("Add it with tide.add_table."));
    };
    let target = format!("{}.{}", quote(&t.schema), quote(&t.name));
    let key = t.key;
    if !allow_running_backfill {
        if let Some(state) = catalog::backfills::active_state(&pipeline, relid)? {
            return Err(TideError::prerequisite(format!("a backfill of {source} for pipeline \"{pipeline}\" is {state}: the target is not complete yet"))
                .hint(format!("Wait for it (SELECT tide.wait_for_backfill({}, {})) and verify then.", pgrx::spi::quote_literal(&source), pgrx::spi::quote_literal(&pipeline))));
        }
    }
    let relid_text = relid.to_u32().to_string();
    let collatable: HashSet<String> = sql::text_rows(
        "SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = $1::oid AND a.attnum > 0 AND a.attcollation <> 0",
        &[Some(&relid_text)],
        0,
        false,
    )?
    .into_iter()
    .filter_map(|r| r.into_iter().next().flatten())
    .collect();
    let enabled = catalog::pipelines::enabled(&pipeline)?.unwrap_or(false);
    if !enabled || shmem::worker_pid(&pipeline).is_none() {
        return Err(TideError::prerequisite(format!("pipeline \"{pipeline}\" is not streaming (paused or without a worker)"))
            .hint("Verification compares the target after it has caught up with the source: resume the pipeline (tide.resume_pipeline) and look at tide.pipelines."));
    }
    // What the target should hold: the rows the table's row filter passes, the columns of its
    // column list.
    let (row_filter, listed) = catalog::tables::shaping(&pipeline, relid.to_u32())?;
    let listed_text = listed.map(|l| {
        format!(
            "{{{}}}",
            l.iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    });
    let (cols, masked, masks) = delivered_columns(&pipeline, relid, listed_text.as_deref())?;
    let remote = if kind.remote {
        let server = options
            .get("server")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        let owner = catalog::pipelines::owner(&pipeline)?.unwrap_or_default();
        Some(RemoteSink::start_with(
            remote_access(server, &owner)?,
            "pg_tide verify",
        ))
    } else {
        None
    };
    let local_target = if remote.is_none() {
        sql::one::<pg_sys::Oid>("SELECT to_regclass($1)::oid", &[target.clone().into()])?
    } else {
        None
    };
    for (k, v) in SETTINGS {
        sql::one::<String>(
            "SELECT set_config($1, $2, true)",
            &[(*k).into(), (*v).into()],
        )?;
    }
    let scan = shaped_scan(
        crate::catalog::tables::scan(relid, &source)?,
        row_filter.as_deref(),
        masks.is_some().then_some(masked.as_slice()),
        &pipeline,
    );
    Ok(Ctx {
        local_target,
        collatable,
        pipeline,
        relid,
        scan,
        source,
        target,
        key,
        cols,
        remote,
    })
}

/// A masked column as delivered: name, type (text for hash and truncate), its mask.
type Delivered = (String, String, Option<tide_core::mask::Mask>);

/// The columns the target should hold (`listed`: the column list as an `int2[]` literal), as
/// (name, type as delivered), the same with each one's mask, and the table's masks.
#[allow(clippy::type_complexity)]
fn delivered_columns(
    pipeline: &str,
    relid: pg_sys::Oid,
    listed: Option<&str>,
) -> TideResult<(
    Vec<(String, String)>,
    Vec<Delivered>,
    Option<tide_core::mask::Masks>,
)> {
    let cols: Vec<(String, String, String)> = sql::text_rows(
        "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnum::text FROM pg_attribute a
          WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
            AND ($2::int2[] IS NULL OR a.attnum = ANY ($2::int2[])) ORDER BY a.attnum",
        &[Some(&relid.to_u32().to_string()), listed],
        0,
        false,
    )?
    .into_iter()
    .map(|r| {
        (
            r[0].clone().unwrap_or_default(),
            r[1].clone().unwrap_or_default(),
            r[2].clone().unwrap_or_default(),
        )
    })
    .collect();
    // ...with its masks applied (the stored masks, the pipeline's salt read by tide.mask_salt,
    // which lets the caller, the owner, have it): a hash or truncate column is text.
    let masks = catalog::masks::of_table(pipeline, relid.to_u32())?.map(|(m, _)| m);
    let masked: Vec<Delivered> = cols
        .into_iter()
        .map(|(n, t, attnum)| {
            let m = masks.as_ref().and_then(|m| m.of(&attnum)).cloned();
            let t = if m.as_ref().is_some_and(|m| m.retypes()) {
                "text".to_string()
            } else {
                t
            };
            (n, t, m)
        })
        .collect();
    let cols: Vec<(String, String)> = masked
        .iter()
        .map(|(n, t, _)| (n.clone(), t.clone()))
        .collect();
    Ok((cols, masked, masks))
}

/// How the source is read: the table, or only the rows its row filter passes (a subquery under
/// the name `source`; the filter on lines of its own, as the chunk's query puts it), with the
/// masked columns masked (`masked`: every delivered column with its type as delivered and its
/// mask) by the SQL form of the masks (`tide_core::mask::Mask::sql`), in the column's type.
fn shaped_scan(
    scan: String,
    row_filter: Option<&str>,
    masked: Option<&[Delivered]>,
    pipeline: &str,
) -> String {
    let filter = row_filter
        .map(|f| format!(" WHERE (\n{f}\n)"))
        .unwrap_or_default();
    match masked {
        Some(cols) => {
            let salt = format!(
                "(SELECT tide.mask_salt({}))",
                tide_core::plan::quote_literal(pipeline)
            );
            let list: Vec<String> = cols
                .iter()
                .map(|(n, t, m)| match m {
                    Some(m) => format!("({})::{t} AS {}", m.sql(&quote(n), &salt), quote(n)),
                    None => quote(n),
                })
                .collect();
            format!("(SELECT {} FROM {scan}{filter}) AS source", list.join(", "))
        }
        None if row_filter.is_some() => format!("(SELECT * FROM {scan}{filter}) AS source"),
        None => scan,
    }
}

/// One side of a range: key text → (key values, row hash).
pub(super) type Side = BTreeMap<String, (Vec<String>, String)>;
