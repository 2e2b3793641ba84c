-- Micro-benchmark: a local table target's upsert of one backfill chunk (5000 rows of the B1
-- shape) from JSON text (json_populate_recordset, as events are written) vs from row values
-- (unnest of an array of the source's row type, as chunks are written since issue 13).
-- Run: psql -X -q -f bench/micro/row_values_vs_json.sql on a scratch cluster. The function
-- times both, alternating, on an empty target and on a full one (every row conflicts), eight
-- rounds each, and prints the median of each; the last query must return 0 (same rows).
-- The JSON text is made once by json_agg; the worker renders it in Rust instead, which is not
-- counted here (it only adds to the JSON side).
\ir b1_shape.sql
CREATE OR REPLACE FUNCTION pg_temp.round_trip() RETURNS TABLE(what text, ms float8) LANGUAGE plpgsql AS $$
DECLARE arr s[]; pay text; t0 timestamptz; i int; conflicts bool;
BEGIN
  arr := (SELECT array_agg(c ORDER BY c.id) FROM s c);
  pay := (SELECT json_agg(row_to_json(c) ORDER BY c.id)::text FROM s c);
  FOR i IN 1..16 LOOP
    conflicts := i > 8;
    IF NOT conflicts THEN TRUNCATE t1, t2; END IF;
    -- alternate which goes first
    IF i % 2 = 0 THEN
      t0 := clock_timestamp();
      INSERT INTO t1 AS t (id, customer, amount, created_at, qty, ref, attrs, note) SELECT r.id, r.customer, r.amount, r.created_at, r.qty, r.ref, r.attrs, r.note FROM unnest(arr) r ON CONFLICT (id) DO UPDATE SET customer = EXCLUDED.customer, amount = EXCLUDED.amount, created_at = EXCLUDED.created_at, qty = EXCLUDED.qty, ref = EXCLUDED.ref, attrs = EXCLUDED.attrs, note = EXCLUDED.note;
      what := 'row values' || CASE WHEN conflicts THEN ', all conflict' ELSE ', empty target' END; ms := extract(epoch FROM clock_timestamp() - t0) * 1000; RETURN NEXT;
    END IF;
    t0 := clock_timestamp();
    INSERT INTO t2 AS t (id, customer, amount, created_at, qty, ref, attrs, note) SELECT r.id, r.customer, r.amount, r.created_at, r.qty, r.ref, r.attrs, r.note FROM json_populate_recordset(NULL::t2, pay::json) r ON CONFLICT (id) DO UPDATE SET customer = EXCLUDED.customer, amount = EXCLUDED.amount, created_at = EXCLUDED.created_at, qty = EXCLUDED.qty, ref = EXCLUDED.ref, attrs = EXCLUDED.attrs, note = EXCLUDED.note;
    what := 'json' || CASE WHEN conflicts THEN ', all conflict' ELSE ', empty target' END; ms := extract(epoch FROM clock_timestamp() - t0) * 1000; RETURN NEXT;
    IF i % 2 = 1 THEN
      t0 := clock_timestamp();
      INSERT INTO t1 AS t (id, customer, amount, created_at, qty, ref, attrs, note) SELECT r.id, r.customer, r.amount, r.created_at, r.qty, r.ref, r.attrs, r.note FROM unnest(arr) r ON CONFLICT (id) DO UPDATE SET customer = EXCLUDED.customer, amount = EXCLUDED.amount, created_at = EXCLUDED.created_at, qty = EXCLUDED.qty, ref = EXCLUDED.ref, attrs = EXCLUDED.attrs, note = EXCLUDED.note;
      what := 'row values' || CASE WHEN conflicts THEN ', all conflict' ELSE ', empty target' END; ms := extract(epoch FROM clock_timestamp() - t0) * 1000; RETURN NEXT;
    END IF;
  END LOOP;
END $$;
SELECT what, round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1) AS median_ms, count(*) AS runs
  FROM pg_temp.round_trip() GROUP BY what ORDER BY what;
SELECT count(*) AS differing_rows FROM (SELECT * FROM t1 EXCEPT SELECT * FROM t2) x;
