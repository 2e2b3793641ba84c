//! Tests of the table-target planner: the statement text, the grouping rules, and a model check
//! (proptest) that applying the planned statements gives every table the state that applying
//! the events one by one gives.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn table(name: &str) -> TableRef {
    TableRef {
        schema: "rep".into(),
        name: name.into(),
        key: vec!["id".into()],
    }
}

fn upsert(k: i64, v: i64) -> Change {
    Change::Upsert {
        key: format!("{{\"id\":{k}}}"),
        values: vec![Some(k.to_string()), Some(v.to_string())],
        cols: vec![
            ("id".into(), "integer".into()),
            ("v".into(), "bigint".into()),
        ],
    }
}

fn delete(k: i64) -> Change {
    Change::Delete {
        key: format!("{{\"id\":{k}}}"),
        values: vec![Some(k.to_string())],
        types: vec!["integer".into()],
    }
}

/// A model of PostgreSQL's `array_in` for one-dimensional arrays of text: what the statement's
/// parameters mean at the target.
fn parse_text_array(s: &str) -> Result<Vec<Option<String>>, String> {
    let inner = s
        .strip_prefix('{')
        .and_then(|s| s.strip_suffix('}'))
        .ok_or_else(|| format!("not an array literal: {s}"))?;
    let mut out = Vec::new();
    if inner.is_empty() {
        return Ok(out);
    }
    let mut chars = inner.chars().peekable();
    loop {
        match chars.peek() {
            Some('"') => {
                chars.next();
                let mut v = String::new();
                loop {
                    match chars.next() {
                        Some('\\') => v.push(chars.next().ok_or("dangling backslash")?),
                        Some('"') => break,
                        Some(c) => v.push(c),
                        None => return Err("unterminated element".into()),
                    }
                }
                out.push(Some(v));
            }
            _ => {
                let word: String = chars.by_ref().take_while(|c| *c != ',').collect();
                if word != "NULL" {
                    return Err(format!("unquoted element {word:?}"));
                }
                out.push(None);
                if chars.peek().is_none() {
                    return Ok(out);
                }
                continue;
            }
        }
        match chars.next() {
            None => return Ok(out),
            Some(',') => {}
            Some(c) => return Err(format!("{c:?} after an element")),
        }
    }
}

#[test]
fn quoting() {
    assert_eq!(quote_ident("t"), "t");
    assert_eq!(quote_ident("order_2"), "order_2");
    assert_eq!(quote_ident("Order"), "\"Order\"");
    assert_eq!(quote_ident("2x"), "\"2x\"");
    assert_eq!(quote_ident(""), "\"\"");
    assert_eq!(quote_ident("select"), "\"select\"");
    assert_eq!(
        quote_ident("json_table"),
        "\"json_table\"",
        "a keyword of later versions"
    );
    assert_eq!(quote_ident("name"), "name", "an unreserved keyword");
    assert_eq!(quote_ident("we\"ird Name"), "\"we\"\"ird Name\"");
    let mut sorted = QUOTED_KEYWORDS.to_vec();
    sorted.sort_unstable();
    assert_eq!(
        sorted, QUOTED_KEYWORDS,
        "binary search needs the list sorted"
    );
    assert_eq!(quote_literal("it's"), "'it''s'");
    assert_eq!(quote_literal("a\\b"), "E'a\\\\b'");
    assert_eq!(table("t").qualified(), "rep.t");
}

#[test]
fn statement_text() {
    let mut p = Planner::new();
    assert!(p.push(1, &table("t"), upsert(1, 10)).is_empty());
    assert!(p.push(1, &table("t"), upsert(2, 20)).is_empty());
    let out = p.push(1, &table("t"), delete(1));
    assert_eq!(out.len(), 1, "the delete closes the upsert run");
    assert_eq!(
        out[0].sql,
        "INSERT INTO rep.t AS t (id, v) SELECT r.id::integer, r.v::bigint FROM unnest($1::text[], $2::text[]) AS r(id, v) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v"
    );
    assert_eq!(out[0].params, vec!["{\"1\",\"2\"}", "{\"10\",\"20\"}"]);
    let out = p.finish();
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].sql,
        "DELETE FROM rep.t t USING unnest($1::text[]) AS d(id) WHERE t.id = d.id::integer"
    );
    assert_eq!(out[0].params, vec!["{\"1\"}"]);
    assert!(p.is_empty());
}

#[test]
fn row_value_upsert_text() {
    let t = TableRef {
        schema: "rep".into(),
        name: "Order".into(),
        key: vec!["id".into(), "at".into()],
    };
    let cols: Vec<String> = vec!["id".into(), "at".into(), "select".into()];
    assert_eq!(
        upsert_rows(&t, &cols),
        "INSERT INTO rep.\"Order\" AS t (id, at, \"select\") SELECT r.id, r.at, r.\"select\" FROM unnest($1) r ON CONFLICT (id, at) DO UPDATE SET \"select\" = EXCLUDED.\"select\""
    );
    // Only key columns: nothing to update on conflict.
    assert_eq!(
        upsert_rows(&t, &cols[..2]),
        "INSERT INTO rep.\"Order\" AS t (id, at) SELECT r.id, r.at FROM unnest($1) r ON CONFLICT (id, at) DO NOTHING"
    );
}

#[test]
fn range_check_text() {
    let t = TableRef {
        schema: "rep".into(),
        name: "Order".into(),
        key: vec!["id".into(), "at".into()],
    };
    assert_eq!(
        range_has_rows(&t),
        "SELECT EXISTS (SELECT 1 FROM rep.\"Order\" t WHERE (t.id, t.at) >= (($1).id, ($1).at) AND (t.id, t.at) <= (($2).id, ($2).at))"
    );
}

#[test]
fn staged_upsert_text() {
    let t = TableRef {
        schema: "rep".into(),
        name: "Order".into(),
        key: vec!["id".into()],
    };
    let cols: Vec<(String, String)> = vec![
        ("id".into(), "integer".into()),
        ("select".into(), "public.\"My Type\"".into()),
        ("Note".into(), "character varying(10)".into()),
    ];
    let s = staged_upsert(&t, &cols, true);
    assert_eq!(
        s.probe,
        "SELECT EXISTS (SELECT 1 FROM rep.\"Order\" t WHERE (t.id) > ($1::integer) AND (t.id) <= ($2::integer))"
    );
    assert_eq!(
        s.direct,
        "COPY rep.\"Order\" (id, \"select\", \"Note\") FROM STDIN"
    );
    assert_eq!(
        s.create,
        "CREATE TEMP TABLE tide_stage (id integer, \"select\" public.\"My Type\", \"Note\" character varying(10)) ON COMMIT DROP"
    );
    assert_eq!(
        s.copy,
        "COPY pg_temp.tide_stage (id, \"select\", \"Note\") FROM STDIN"
    );
    assert_eq!(
        s.upsert,
        "INSERT INTO rep.\"Order\" AS t (id, \"select\", \"Note\") SELECT r.id, r.\"select\", r.\"Note\" FROM pg_temp.tide_stage r ON CONFLICT (id) DO UPDATE SET \"select\" = EXCLUDED.\"select\", \"Note\" = EXCLUDED.\"Note\"; DROP TABLE pg_temp.tide_stage"
    );
}

#[test]
fn staged_probe_of_a_first_chunk_and_a_composite_key() {
    let t = TableRef {
        schema: "rep".into(),
        name: "t".into(),
        key: vec!["b".into(), "a".into()],
    };
    let cols: Vec<(String, String)> =
        vec![("a".into(), "integer".into()), ("b".into(), "text".into())];
    // No lower bound: the parameters are the upper bound's, in key order.
    assert_eq!(
        staged_upsert(&t, &cols, false).probe,
        "SELECT EXISTS (SELECT 1 FROM rep.t t WHERE (t.b, t.a) <= ($1::text, $2::integer))"
    );
    assert_eq!(
        staged_upsert(&t, &cols, true).probe,
        "SELECT EXISTS (SELECT 1 FROM rep.t t WHERE (t.b, t.a) > ($1::text, $2::integer) AND (t.b, t.a) <= ($3::text, $4::integer))"
    );
}

#[test]
fn key_only_table_does_nothing_on_conflict() {
    let mut p = Planner::new();
    let t = table("k");
    p.push(
        1,
        &t,
        Change::Upsert {
            key: "{\"id\":1}".into(),
            values: vec![Some("1".into())],
            cols: vec![("id".into(), "integer".into())],
        },
    );
    let out = p.finish();
    assert!(
        out[0].sql.ends_with("ON CONFLICT (id) DO NOTHING"),
        "{}",
        out[0].sql
    );
}

#[test]
fn repeated_key_closes_the_run_and_tables_are_independent() {
    let mut p = Planner::new();
    assert!(p.push(1, &table("a"), upsert(1, 1)).is_empty());
    assert!(
        p.push(2, &table("b"), upsert(1, 1)).is_empty(),
        "another table's run stays open"
    );
    let out = p.push(1, &table("a"), upsert(1, 2));
    assert_eq!(
        out.len(),
        1,
        "a key twice in one statement would fail ON CONFLICT"
    );
    assert!(out[0].sql.contains("rep.a"));
    // Deleting a key twice in one run deletes it once.
    let mut p = Planner::new();
    p.push(1, &table("a"), delete(5));
    p.push(1, &table("a"), delete(5));
    assert_eq!(p.finish()[0].params, vec!["{\"5\"}"]);
}

#[test]
fn truncate_runs_after_the_tables_open_run() {
    let mut p = Planner::new();
    p.push(1, &table("a"), upsert(1, 1));
    p.push(2, &table("b"), upsert(1, 1));
    let out = p.push(1, &table("a"), Change::Truncate);
    assert_eq!(out.len(), 2);
    assert!(out[0].sql.starts_with("INSERT INTO rep.a"));
    assert_eq!(out[1].sql, "TRUNCATE rep.a");
    assert!(out[1].params.is_empty());
    assert_eq!(p.finish().len(), 1, "b's run is still open");
}

#[test]
fn a_truncate_of_several_tables_is_one_statement_after_their_open_runs() {
    let mut p = Planner::new();
    p.push(1, &table("a"), upsert(1, 1));
    p.push(2, &table("b"), upsert(1, 1));
    p.push(3, &table("c"), upsert(1, 1));
    let out = p.truncate(&[(1, table("a")), (2, table("b"))], false);
    assert_eq!(out.len(), 3);
    assert!(out[0].sql.starts_with("INSERT INTO rep.a"));
    assert!(out[1].sql.starts_with("INSERT INTO rep.b"));
    assert_eq!(out[2].sql, "TRUNCATE rep.a, rep.b");
    assert!(out[2].params.is_empty());
    assert_eq!(p.finish().len(), 1, "c's run is still open");
    let out = p.truncate(&[(2, table("b")), (1, table("a"))], true);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].sql, "TRUNCATE rep.b, rep.a RESTART IDENTITY");
    assert!(p.truncate(&[], true).is_empty());
}

#[test]
fn a_partition_truncate_deletes_what_its_predicate_says_after_the_open_run() {
    let mut p = Planner::new();
    p.push(1, &table("a"), upsert(1, 1));
    let out = p.push(
        1,
        &table("a"),
        Change::TruncateWhere {
            predicate: "((id IS NOT NULL) AND (id < 10))".into(),
        },
    );
    assert_eq!(out.len(), 2);
    assert!(out[0].sql.starts_with("INSERT INTO rep.a"));
    assert_eq!(
        out[1].sql,
        "DELETE FROM rep.a WHERE (\n((id IS NOT NULL) AND (id < 10))\n)"
    );
    assert!(p.finish().is_empty(), "nothing is left open");
}

#[test]
fn a_full_run_is_closed() {
    let mut p = Planner::new();
    let t = table("a");
    for k in 0..RUN_ROWS as i64 - 1 {
        assert!(p.push(1, &t, upsert(k, 0)).is_empty());
    }
    let out = p.push(1, &t, upsert(RUN_ROWS as i64, 0));
    assert_eq!(out.len(), 1);
    let rows = parse_text_array(&out[0].params[0]).unwrap_or_default();
    assert_eq!(rows.len(), RUN_ROWS);
    assert!(p.is_empty());
}

#[test]
fn shape_plans() {
    let src = |n: &str, t: &str, m: Option<&str>| SourceColumn {
        name: n.into(),
        ty: t.into(),
        missing: m.map(str::to_string),
    };
    let tgt = |n: &str, t: &str| (n.to_string(), t.to_string());
    let plan = plan_shape(
        "rep.t",
        &[
            src("id", "integer", None),
            src("v", "bigint", None),
            src("n", "text", Some("it's")),
            src("w", "text", None),
            src("x", "integer", None),
        ],
        &[
            tgt("id", "bigint"),
            tgt("v", "integer"),
            tgt("x", "text"),
            tgt("extra", "date"),
        ],
    );
    assert_eq!(
        plan.ddl,
        vec![
            (
                "ALTER TABLE rep.t ALTER COLUMN v TYPE bigint".to_string(),
                "widen column v from integer to bigint".to_string()
            ),
            (
                "ALTER TABLE rep.t ADD COLUMN n text DEFAULT 'it''s'::text".to_string(),
                "add column n text".to_string()
            ),
            (
                "ALTER TABLE rep.t ADD COLUMN w text".to_string(),
                "add column w text".to_string()
            ),
        ]
    );
    assert_eq!(
        plan.refused,
        vec!["column x changed from text to integer, which is not a safe widening".to_string()]
    );
    assert_eq!(
        plan.shape,
        vec![
            tgt("id", "bigint"),
            tgt("v", "bigint"),
            tgt("x", "text"),
            tgt("extra", "date"),
            tgt("n", "text"),
            tgt("w", "text"),
        ]
    );
    let same = plan_shape("t", &[src("id", "integer", None)], &[tgt("id", "integer")]);
    assert!(same.ddl.is_empty() && same.refused.is_empty());
}

#[test]
fn widening_rules() {
    assert!(holds("bigint", "integer"));
    assert!(!holds("integer", "bigint"));
    assert!(holds("numeric(12,2)", "integer"));
    assert!(!holds("numeric(10,2)", "integer"));
    assert!(holds("numeric", "bigint"));
    assert!(holds("numeric(14,4)", "numeric(12,2)"));
    assert!(!holds("numeric(12,4)", "numeric(12,2)"));
    assert!(holds("text", "character varying(20)"));
    assert!(holds("character varying(30)", "character varying(20)"));
    assert!(!holds("character varying(10)", "character varying(20)"));
    assert!(holds("double precision", "real"));
    assert!(!holds("integer", "text"));
}

/// A target table in the model: key → value.
type State = BTreeMap<String, BTreeMap<i64, i64>>;

/// Apply one event directly (the reference semantics).
fn apply_event(s: &mut State, t: &str, ch: &Change) {
    let rows = s.entry(t.to_string()).or_default();
    let num = |v: &Option<String>| v.as_deref().and_then(|v| v.parse().ok()).unwrap_or(-1);
    match ch {
        Change::Upsert { values, .. } => {
            rows.insert(num(&values[0]), num(&values[1]));
        }
        Change::Delete { values, .. } => {
            rows.remove(&num(&values[0]));
        }
        Change::Truncate => rows.clear(),
        Change::TruncateWhere { .. } => panic!("the model does not generate partition truncates"),
        Change::Insert { .. } | Change::RowMatch { .. } => {
            panic!("the model does not generate keyless changes")
        }
    }
}

/// Apply one planned statement the way PostgreSQL would, checking what PostgreSQL would refuse
/// (a key twice in one `ON CONFLICT DO UPDATE`, arrays of different lengths).
fn apply_statement(s: &mut State, st: &Statement) -> Result<(), String> {
    let t = ["a", "b"]
        .into_iter()
        .find(|t| st.sql.contains(&format!("rep.{t} ")) || st.sql.ends_with(&format!("rep.{t}")))
        .ok_or("statement names no table")?;
    let rows = s.entry(t.to_string()).or_default();
    if st.sql.starts_with("TRUNCATE") {
        rows.clear();
        return Ok(());
    }
    let columns = st
        .params
        .iter()
        .map(|p| parse_text_array(p))
        .collect::<Result<Vec<_>, _>>()?;
    let n = columns.first().ok_or("no parameter")?.len();
    if columns.iter().any(|c| c.len() != n) {
        return Err("arrays of different lengths".into());
    }
    if n > RUN_ROWS {
        return Err(format!("{n} rows in one statement"));
    }
    let num = |v: &Option<String>| -> Result<i64, String> {
        v.as_deref()
            .ok_or("NULL")?
            .parse()
            .map_err(|e| format!("{e}"))
    };
    let mut seen = HashSet::new();
    for i in 0..n {
        let k = num(&columns[0][i])?;
        if st.sql.starts_with("INSERT") {
            if !seen.insert(k) {
                return Err(format!(
                    "ON CONFLICT DO UPDATE command cannot affect row a second time (key {k})"
                ));
            }
            rows.insert(k, num(&columns.get(1).ok_or("no v")?[i])?);
        } else {
            rows.remove(&k);
        }
    }
    Ok(())
}

proptest! {
    /// `array_in` (the model) reads back every value exactly, NULLs, quotes, backslashes,
    /// commas, braces and the word NULL included.
    #[test]
    fn text_arrays_round_trip(values in prop::collection::vec(
        prop::option::of(prop_oneof!["[a-z]{0,3}", "[\"\\\\,{} NUL\\t\\né]{0,6}", Just("NULL".to_string())]), 0..8)) {
        let lit = text_array(values.iter().map(|v| v.as_deref()));
        prop_assert_eq!(parse_text_array(&lit), Ok(values));
    }
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        6 => (0i64..6, 0i64..100).prop_map(|(k, v)| upsert(k, v)),
        3 => (0i64..6).prop_map(delete),
        1 => Just(Change::Truncate),
    ]
}

proptest! {
    #[test]
    fn planned_statements_give_the_same_tables(events in prop::collection::vec((0u32..2, change()), 0..200)) {
        let names = ["a", "b"];
        let mut expected = State::new();
        let mut got = State::new();
        let mut p = Planner::new();
        for (rel, ch) in &events {
            let t = names[*rel as usize];
            apply_event(&mut expected, t, ch);
            for st in p.push(*rel, &table(t), ch.clone()) {
                apply_statement(&mut got, &st).map_err(TestCaseError::fail)?;
            }
        }
        for st in p.finish() {
            apply_statement(&mut got, &st).map_err(TestCaseError::fail)?;
        }
        expected.retain(|_, rows| !rows.is_empty());
        got.retain(|_, rows| !rows.is_empty());
        prop_assert_eq!(got, expected);
    }
}

fn cols(c: &[(&str, &str)]) -> Vec<(String, String)> {
    c.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn schema_change_adds_widens_drops_and_renames() {
    use crate::model::SchemaChange;
    let change = SchemaChange {
        columns: cols(&[
            ("id", "integer"),
            ("v", "bigint"),
            ("Note", "text"),
            ("b2", "text"),
        ]),
        key: vec!["id".into()],
        previous_key: vec!["id".into()],
        added: vec![("Note".into(), "text".into(), Some("it's".into()))],
        dropped: vec!["gone".into(), "never_there".into()],
        changed: vec![("v".into(), "integer".into(), "bigint".into())],
        renamed: vec![("b".into(), "b2".into())],
    };
    let target = cols(&[
        ("id", "integer"),
        ("v", "integer"),
        ("gone", "text"),
        ("b", "text"),
    ]);
    let plan = plan_schema_change("rep.t", &change, &target, &["id".to_string()]);
    let ddl: Vec<&str> = plan.ddl.iter().map(|(d, _)| d.as_str()).collect();
    assert_eq!(
        ddl,
        [
            "ALTER TABLE rep.t RENAME COLUMN b TO b2",
            "ALTER TABLE rep.t DROP COLUMN gone",
            "ALTER TABLE rep.t ALTER COLUMN v TYPE bigint",
            "ALTER TABLE rep.t ADD COLUMN \"Note\" text DEFAULT 'it''s'::text",
        ]
    );
    assert!(plan.refused.is_empty(), "{:?}", plan.refused);
    assert!(!plan.key_changed);
    assert_eq!(
        plan.shape,
        cols(&[
            ("id", "integer"),
            ("v", "bigint"),
            ("b2", "text"),
            ("Note", "text")
        ])
    );
}

#[test]
fn schema_change_refuses_a_key_change_a_dropped_key_column_and_a_narrowing() {
    use crate::model::SchemaChange;
    let change = SchemaChange {
        columns: cols(&[("id2", "integer"), ("v", "text")]),
        key: vec!["id2".into()],
        previous_key: vec!["id".into()],
        dropped: vec!["id".into()],
        ..SchemaChange::default()
    };
    let target = cols(&[("id", "integer"), ("id2", "integer"), ("v", "integer")]);
    let plan = plan_schema_change("rep.t", &change, &target, &["id".to_string()]);
    assert!(plan.key_changed);
    assert_eq!(plan.refused.len(), 3, "{:?}", plan.refused);
    assert!(plan
        .refused
        .iter()
        .any(|r| r.contains("not a safe widening")));
    assert!(plan
        .refused
        .iter()
        .any(|r| r.contains("part of the target's key")));
    assert!(plan
        .refused
        .iter()
        .any(|r| r.contains("key changed from (id) to (id2)")));
    // a column dropped and added again under its name is dropped and added at the target
    let again = SchemaChange {
        columns: cols(&[("id", "integer"), ("v", "text")]),
        key: vec!["id".into()],
        previous_key: vec!["id".into()],
        added: vec![("v".into(), "text".into(), None)],
        dropped: vec!["v".into()],
        ..SchemaChange::default()
    };
    let plan = plan_schema_change(
        "rep.t",
        &again,
        &cols(&[("id", "integer"), ("v", "text")]),
        &["id".to_string()],
    );
    let ddl: Vec<&str> = plan.ddl.iter().map(|(d, _)| d.as_str()).collect();
    assert_eq!(
        ddl,
        [
            "ALTER TABLE rep.t DROP COLUMN v",
            "ALTER TABLE rep.t ADD COLUMN v text"
        ]
    );
    assert!(plan.refused.is_empty(), "{plan:?}");
}

#[test]
fn keyless_tables_insert_plainly_and_match_one_row_by_every_column() {
    let t = TableRef {
        schema: "rep".into(),
        name: "h".into(),
        key: Vec::new(),
    };
    let cols = vec![
        ("a".to_string(), "integer".to_string()),
        ("doc".to_string(), "json".to_string()),
    ];
    let mut p = Planner::new();
    let row = |a: &str| vec![Some(a.to_string()), None];
    // Two identical inserts stay two rows of one plain INSERT (no ON CONFLICT).
    for _ in 0..2 {
        let out = p.push(
            1,
            &t,
            Change::Insert {
                values: row("1"),
                cols: cols.clone(),
            },
        );
        assert!(out.is_empty());
    }
    // A delete closes the run first, then matches one row by every column.
    let out = p.push(
        1,
        &t,
        Change::RowMatch {
            old: row("1"),
            old_cols: cols.clone(),
            new: None,
        },
    );
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(
        out[0].sql,
        "INSERT INTO rep.h (a, doc) SELECT r.a::integer, r.doc::json FROM unnest($1::text[], $2::text[]) AS r(a, doc)"
    );
    assert_eq!(out[0].params, ["{\"1\",\"1\"}", "{NULL,NULL}"]);
    assert_eq!(
        out[1].sql,
        "DELETE FROM rep.h t WHERE (t.tableoid, t.ctid) = (SELECT s.tableoid, s.ctid FROM rep.h s WHERE s.a IS NOT DISTINCT FROM ($1::text[])[1]::integer AND s.doc::text IS NOT DISTINCT FROM ($2::text[])[1]::json::text LIMIT 1)"
    );
    assert_eq!(out[1].params, ["{\"1\"}", "{NULL}"]);
    // An update sets the sent columns of one matching row; its parameters follow the old row's.
    let out = p.push(
        1,
        &t,
        Change::RowMatch {
            old: row("1"),
            old_cols: cols.clone(),
            new: Some((vec![Some("2".into())], vec![cols[0].clone()])),
        },
    );
    assert_eq!(out.len(), 1);
    assert!(
        out[0].sql.starts_with(
            "UPDATE rep.h t SET a = ($3::text[])[1]::integer WHERE (t.tableoid, t.ctid) = (SELECT"
        ),
        "{}",
        out[0].sql
    );
    assert_eq!(out[0].params, ["{\"1\"}", "{NULL}", "{\"2\"}"]);
    assert!(p.finish().is_empty());
}
