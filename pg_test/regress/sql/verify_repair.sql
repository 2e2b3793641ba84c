-- tide.verify and tide.repair on a local table target (README, Verification): a converged
-- target verifies clean; differences planted at the target (a changed row, a missing row, an
-- extra row) are found range by range and by sampled columns; tide.repair re-seeds them and
-- the target verifies clean again. tide.verifications keeps the last verification.
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/verify_repair.out.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
SELECT tide.create_pipeline('copy', 'table', '{"schema": "replica"}');
CREATE TABLE public.t (id int PRIMARY KEY, v text, n int);
INSERT INTO public.t SELECT g, 'v' || g, g * 10 FROM generate_series(1, 2500) g;
SELECT tide.add_table('copy', 't');
SELECT tide.wait_for_backfill('t', 'copy', '60 seconds') AS backfilled;
SELECT * FROM tide.verify('t', 'copy');
SELECT pipeline, relation, finished, ranges_checked, ranges_differing, source_rows, target_rows,
       missing, extra, changed, repair_backfill_id, repair_state FROM tide.verifications;
-- Plant differences at the target (pg_tide never captures its own target).
UPDATE replica.t SET v = 'wrong' WHERE id = 5;
UPDATE replica.t SET n = -1 WHERE id = 1500;
DELETE FROM replica.t WHERE id = 2000;
INSERT INTO replica.t VALUES (9999, 'extra', 0);
SELECT range, key_from, key_to, source_rows, target_rows, missing, extra, changed, kind, columns
  FROM tide.verify('t', 'copy') ORDER BY range NULLS LAST, kind;
-- With a sample of every row: the differing columns are named.
SELECT kind, key_from, columns FROM tide.verify('t', 'copy', sample => 3000)
 WHERE kind = 'column values' ORDER BY key_from;
SELECT pipeline, relation, finished, ranges_checked, ranges_differing, source_rows, target_rows,
       missing, extra, changed, repair_backfill_id, repair_state FROM tide.verifications;
-- Repair: re-seed the differing ranges through the watermark backfill, delete the extra keys.
SELECT ranges_differing, rows_missing_or_changed, rows_extra, backfill_id IS NOT NULL AS has_backfill, action
  FROM tide.repair('t', 'copy');
SELECT tide.wait_for_backfill('t', 'copy', '60 seconds') AS repaired;
SELECT id, state, condition IS NOT NULL AS has_condition, rows_emitted FROM tide.backfills ORDER BY id;
SELECT * FROM replica.t WHERE id IN (5, 1500, 2000, 9999) ORDER BY id;
SELECT * FROM tide.verify('t', 'copy');
SELECT pipeline, relation, ranges_differing, missing, extra, changed, repair_state FROM tide.verifications;
-- Verify refuses while the pipeline is paused.
SELECT tide.pause_pipeline('copy');
SELECT * FROM tide.verify('t', 'copy');
SELECT tide.drop_pipeline('copy');
