//! Comparing rows: a source table and its target as multisets (explicit column lists rendered as
//! text, so both sides render alike), queries that must return no rows, and the outbox replayed
//! onto an empty copy of its source.

use crate::*;
use std::collections::HashMap;

/// The first column (text) of every row of `sql`.
pub fn texts(c: &Cluster, sql: &str) -> Vec<String> {
    c.query(sql).iter().map(|r| r.get::<_, String>(0)).collect()
}

/// Multiset difference: (in `a` but not `b`, in `b` but not `a`), with multiplicity.
pub fn multiset_diff(a: &[String], b: &[String]) -> (Vec<String>, Vec<String>) {
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for r in a {
        *counts.entry(r.as_str()).or_default() += 1;
    }
    for r in b {
        *counts.entry(r.as_str()).or_default() -= 1;
    }
    let mut only_a = Vec::new();
    let mut only_b = Vec::new();
    for (r, n) in counts {
        for _ in 0..n.max(0) {
            only_a.push(r.to_string());
        }
        for _ in 0..(-n).max(0) {
            only_b.push(r.to_string());
        }
    }
    only_a.sort();
    only_b.sort();
    (only_a, only_b)
}

/// The source table and its target hold exactly the same rows (set difference both ways is 0
/// rows, duplicates counted). `cols` is the column list, so both sides render rows alike.
#[track_caller]
pub fn assert_same_rows(
    what: &str,
    src: &Cluster,
    source: &str,
    tgt: &Cluster,
    target: &str,
    cols: &str,
) {
    match compare_rows(what, src, source, tgt, target, cols) {
        Ok(msg) => eprintln!("  {msg}"),
        Err(msg) => panic!("{msg}\n{}", diag(src)),
    }
}

/// Like [`assert_same_rows`], without panicking: Ok(summary) or Err(description).
pub fn compare_rows(
    what: &str,
    src: &Cluster,
    source: &str,
    tgt: &Cluster,
    target: &str,
    cols: &str,
) -> Result<String, String> {
    let a = texts(src, &format!("SELECT row({cols})::text FROM {source}"));
    let b = texts(tgt, &format!("SELECT row({cols})::text FROM {target}"));
    let (only_src, only_tgt) = multiset_diff(&a, &b);
    if !only_src.is_empty() || !only_tgt.is_empty() {
        return Err(format!(
            "{what}: {source} ({} rows) and its target {target} ({} rows) differ: {} rows only at the source, \
             {} only at the target.\nonly at the source (first 15, ({cols})):\n  {}\nonly at the target (first 15):\n  {}",
            a.len(),
            b.len(),
            only_src.len(),
            only_tgt.len(),
            only_src.iter().take(15).cloned().collect::<Vec<_>>().join("\n  "),
            only_tgt.iter().take(15).cloned().collect::<Vec<_>>().join("\n  "),
        ));
    }
    Ok(format!(
        "{what}: {source} = {target}: {} rows, 0 differences either way",
        a.len()
    ))
}

/// Assert that a query returns no rows; the failure shows up to 20 of them.
#[track_caller]
pub fn assert_no_rows(c: &Cluster, what: &str, sql: &str) {
    let n: i64 = c.query_scalar(&format!("SELECT count(*) FROM ({sql}) q"));
    assert_eq!(
        n,
        0,
        "{what}: {n} offending rows, e.g.:\n{}",
        sample(c, sql, 20)
    );
}

/// [`outbox_copy_keyed`] of a table keyed by `id`: `<copy>_replay(pipeline)` replays onto it.
pub fn outbox_copy(c: &Cluster, source: &str, relation: &str, copy: &str) {
    outbox_copy_keyed(c, source, relation, copy, &["id"]);
}

/// An empty copy of `source` (same columns and key) named `copy`, and a plpgsql function
/// `<copy>_replay(pipeline, skip_deletes DEFAULT false)` that replays the outbox events of
/// `relation` onto it in id order (upsert by the key columns `keys`, delete unless
/// `skip_deletes`, truncate — of one partition: its `where`; schema events are skipped, the
/// copy having the source's shape; unchanged TOAST columns are refused; between a `resync`
/// event's `start` and `end` phases the keys of read, inserted and updated rows are noted, and at
/// the `end` the copy drops every row not noted: the rows the source no longer had, as
/// README's Outbox format tells consumers) and returns how many. Static
/// SQL, so plans are cached: ~tens of thousands of events per second.
pub fn outbox_copy_keyed(c: &Cluster, source: &str, relation: &str, copy: &str, keys: &[&str]) {
    let matches = keys
        .iter()
        .map(|k| format!("c.\"{k}\" = k.\"{k}\""))
        .collect::<Vec<_>>()
        .join(" AND ");
    let rel = relation.replace('\'', "''");
    // The replay's note of the keys a resync read again: a temporary table, so unqualified.
    let seen = format!("{}_seen", copy.replace('.', "_"));
    c.execute(&format!(
        r#"
CREATE TABLE {copy} (LIKE {source} INCLUDING ALL);
CREATE FUNCTION {copy}_replay(p_pipeline text, p_skip_deletes boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql AS $f$
DECLARE
    e record;
    n bigint := 0;
    resyncing boolean := false;
BEGIN
    CREATE TEMP TABLE IF NOT EXISTS {seen} (k jsonb PRIMARY KEY);
    FOR e IN SELECT o.id, o.op, o.key, o."row", o.unchanged FROM tide.outbox o
              WHERE o.pipeline = p_pipeline AND o.relation = '{rel}' ORDER BY o.id
    LOOP
        n := n + 1;
        IF e.op IN ('read', 'insert', 'update') THEN
            IF coalesce(cardinality(e.unchanged), 0) > 0 THEN
                RAISE EXCEPTION 'event % has unchanged columns %; this replay does not merge them', e.id, e.unchanged;
            END IF;
            -- upsert by key
            DELETE FROM {copy} c USING jsonb_populate_record(NULL::{copy}, e.key) k WHERE {matches};
            INSERT INTO {copy} SELECT * FROM jsonb_populate_record(NULL::{copy}, e."row");
            IF resyncing THEN
                INSERT INTO {seen} VALUES (e.key) ON CONFLICT DO NOTHING;
            END IF;
        ELSIF e.op = 'delete' THEN
            IF NOT p_skip_deletes THEN
                DELETE FROM {copy} c USING jsonb_populate_record(NULL::{copy}, e.key) k WHERE {matches};
            END IF;
        ELSIF e.op = 'truncate' THEN
            -- A partition of a partitioned source alone: the rows its constraint holds for.
            IF e."row" ? 'where' THEN
                EXECUTE format('DELETE FROM {copy} WHERE (%s)', e."row"->>'where');
            ELSE
                DELETE FROM {copy};
            END IF;
        ELSIF e.op = 'resync' AND e."row"->>'phase' = 'start' THEN
            resyncing := true;
            TRUNCATE {seen};
        ELSIF e.op = 'resync' AND e."row"->>'phase' = 'end' THEN
            IF NOT resyncing THEN
                RAISE EXCEPTION 'event % ends a resync that no event started', e.id;
            END IF;
            DELETE FROM {copy} c WHERE NOT EXISTS (
                SELECT 1 FROM {seen} s, jsonb_populate_record(NULL::{copy}, s.k) k WHERE {matches});
            resyncing := false;
        ELSIF e.op = 'schema' THEN
            -- The copy was made with the source's shape when it was created, and a test compares
            -- it after the last change: schema events are for consumers whose copy follows the
            -- changes (pg_test/tests/schema_events.rs applies them).
            NULL;
        ELSE
            RAISE EXCEPTION 'event % has unknown op %', e.id, e.op;
        END IF;
    END LOOP;
    RETURN n;
END
$f$;
"#
    ));
}
