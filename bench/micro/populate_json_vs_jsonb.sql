-- Micro-benchmark: INSERT ... SELECT FROM json_populate_recordset vs jsonb_populate_recordset ... ON CONFLICT
-- for 5000 rows of the B1 shape (as a table target writes a chunk), alternating.
-- Run: psql -X -q -f bench/micro/populate_json_vs_jsonb.sql on a scratch cluster; each of the
-- eight rounds (populate_json_vs_jsonb_round.sql) times jb (jsonb) then js (json) on empty tables, then js then jb; the \timing lines
-- follow that order. The last query must return 0 (same rows). Measured 2026-12-02 (8 rounds):
-- median 55 ms jsonb, 46 ms json.
\ir b1_shape.sql
SELECT json_agg(row_to_json(s))::text AS payload FROM s \gset
PREPARE jb(text) AS INSERT INTO t1 AS t (id, customer, amount, created_at, qty, ref, attrs, note) SELECT r.id, r.customer, r.amount, r.created_at, r.qty, r.ref, r.attrs, r.note FROM jsonb_populate_recordset(NULL::t1, $1::text::jsonb) r ON CONFLICT (id) DO UPDATE SET customer = EXCLUDED.customer, amount = EXCLUDED.amount, created_at = EXCLUDED.created_at, qty = EXCLUDED.qty, ref = EXCLUDED.ref, attrs = EXCLUDED.attrs, note = EXCLUDED.note;
PREPARE js(text) AS INSERT INTO t2 AS t (id, customer, amount, created_at, qty, ref, attrs, note) SELECT r.id, r.customer, r.amount, r.created_at, r.qty, r.ref, r.attrs, r.note FROM json_populate_recordset(NULL::t2, $1::text::json) r ON CONFLICT (id) DO UPDATE SET customer = EXCLUDED.customer, amount = EXCLUDED.amount, created_at = EXCLUDED.created_at, qty = EXCLUDED.qty, ref = EXCLUDED.ref, attrs = EXCLUDED.attrs, note = EXCLUDED.note;
\timing on
\ir populate_json_vs_jsonb_round.sql
\ir populate_json_vs_jsonb_round.sql
\ir populate_json_vs_jsonb_round.sql
\ir populate_json_vs_jsonb_round.sql
\ir populate_json_vs_jsonb_round.sql
\ir populate_json_vs_jsonb_round.sql
\ir populate_json_vs_jsonb_round.sql
\ir populate_json_vs_jsonb_round.sql
\timing off
SELECT count(*) AS differing_rows FROM (SELECT * FROM t1 EXCEPT SELECT * FROM t2) x;
