-- Backfills: a backfill run to the end (tide.backfills, tide.chunks, tide.readiness), then the
-- controls — start, pause, alter (chunk size, throttle), resume, cancel — on a paused pipeline,
-- where the worker runs no chunk, so each state is the one the call leaves. Times, LSNs and
-- speeds are masked.
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/backfill.out.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
SELECT tide.create_pipeline('p');
CREATE TABLE public.items (id int PRIMARY KEY, name text);
INSERT INTO public.items SELECT g, 'item ' || g FROM generate_series(1, 10) g;
SELECT tide.add_table('p', 'items', backfill => false);
SELECT tide.start_backfill('items', 'p', chunk_size => 4) AS backfill_id;
SELECT tide.wait_for_backfill('items', 'p', '60 seconds') AS done;
SELECT id, pipeline, relation, source, state, generation, chunk_size, rows_per_second, condition,
       chunks_done, rows_read, rows_dropped, rows_emitted, last_key, estimated_rows, fraction_done,
       estimated_time_left, created_at IS NOT NULL AS has_created, started_at IS NOT NULL AS has_started,
       finished_at IS NOT NULL AS has_finished, finished_lsn IS NOT NULL AS has_finished_lsn, error, remedy
  FROM tide.backfills ORDER BY id;
SELECT backfill_id, pipeline, relation, chunk, key_from, key_to, rows_read, rows_dropped, rows_emitted,
       written_as, low_lsn <= high_lsn AS watermarks_ordered, duration >= '0' AS has_duration
  FROM tide.chunks ORDER BY backfill_id, chunk;
SELECT pipeline, relation, backfill_id, backfill_state, snapshot_read_complete, snapshot_emitted,
       target_caught_up, readiness FROM tide.readiness;
-- The outbox got one read event per row, in chunks of 4.
SELECT chunk, count(*) AS events, min((key->>'id')::int) AS first_key, max((key->>'id')::int) AS last_key FROM tide.outbox WHERE op = 'read'
 GROUP BY chunk ORDER BY chunk;

-- A condition limits the rows (a new generation of the same table's backfill).
SELECT tide.start_backfill('items', 'p', condition => 'id % 2 = 0') AS backfill_id;
SELECT tide.wait_for_backfill('items', 'p', '60 seconds') AS done;
SELECT id, state, generation, condition, chunk_size, rows_read, rows_emitted, fraction_done FROM tide.backfills ORDER BY id;

-- The controls, on a paused pipeline (no chunk runs).
SELECT tide.pause_pipeline('p');
SELECT regress_wait($$(SELECT state = 'paused' FROM tide.pipelines WHERE name = 'p')$$);
SELECT tide.start_backfill('items', chunk_size => 3) AS backfill_id;
SELECT id, state, generation, chunk_size, rows_per_second, chunks_done, fraction_done FROM tide.backfills WHERE id = 3;
SELECT readiness FROM tide.readiness;
-- Only one active backfill per table.
SELECT tide.start_backfill('items', 'p');
SELECT tide.alter_backfill('items', chunk_size => 2, rows_per_second => 100);
SELECT id, state, chunk_size, rows_per_second FROM tide.backfills WHERE id = 3;
SELECT tide.pause_backfill('items');
SELECT id, state FROM tide.backfills WHERE id = 3;
SELECT tide.pause_backfill('items');
SELECT tide.resume_backfill('items');
SELECT id, state FROM tide.backfills WHERE id = 3;
SELECT tide.resume_backfill('items');
-- While the pipeline is paused, waiting for the backfill times out (false).
SELECT tide.wait_for_backfill('items', 'p', '100 milliseconds') AS done;
SELECT tide.cancel_backfill('items');
SELECT id, state, fraction_done, estimated_time_left FROM tide.backfills WHERE id = 3;
SELECT tide.cancel_backfill('items');
SELECT readiness FROM tide.readiness;
SELECT tide.wait_for_backfill('items', 'p', '1 second') AS done;
-- A throttle of 0 is unlimited (stored as no throttle).
SELECT tide.resume_pipeline('p');
SELECT tide.start_backfill('items', 'p', chunk_size => 5) AS backfill_id;
SELECT tide.alter_backfill('items', rows_per_second => 0);
SELECT tide.wait_for_backfill('items', 'p', '60 seconds') AS done;
SELECT id, state, generation, chunk_size, rows_per_second, chunks_done, rows_read, rows_emitted FROM tide.backfills ORDER BY id;
SELECT readiness FROM tide.readiness;
SELECT tide.drop_pipeline('p');
SELECT count(*) AS backfills_left FROM tide.backfills;
