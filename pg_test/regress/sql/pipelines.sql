-- Pipelines: create (each target kind that needs no other server), pause, resume, drop, as
-- tide.pipelines and the catalogs show them. LSNs, pids and times are masked (has_x); states
-- the worker reaches on its own are waited for with regress_wait (../setup.sql).
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/pipelines.out.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
-- Each create_pipeline in a transaction of its own (it creates a slot: before any write).
SELECT tide.create_pipeline('events');
SELECT tide.create_pipeline('copy', 'table', '{"schema": "replica"}');
SELECT tide.create_pipeline('copy_paused', 'table', '{"schema": "replica2", "schema_changes": "pause"}');
SELECT tide.wait_for_pipeline('events', '60 seconds') AS events_caught_up,
       tide.wait_for_pipeline('copy', '60 seconds') AS copy_caught_up,
       tide.wait_for_pipeline('copy_paused', '60 seconds') AS copy_paused_caught_up;
SELECT regress_wait($$(SELECT count(*) FROM tide.pipelines WHERE state = 'streaming') = 3$$);
SELECT name, target, state, enabled, worker_pid IS NOT NULL AS has_worker, slot_name,
       confirmed_lsn IS NOT NULL AS has_confirmed_lsn, applied_lsn IS NOT NULL AS has_applied_lsn,
       wal_status, tables, last_error, last_error_sqlstate, remedy
  FROM tide.pipelines ORDER BY name;
-- What is recorded: target kind and options (typed: defaults filled in).
SELECT name, target, options, owner, enabled FROM tide.pipeline ORDER BY name;
-- One logical slot per pipeline, through pg_tide's own output plugin, and a replication origin.
SELECT slot_name, plugin, slot_type, database, temporary FROM pg_replication_slots ORDER BY slot_name;
SELECT roname FROM pg_replication_origin ORDER BY roname;
-- One worker per pipeline, besides the launcher.
SELECT backend_type, count(*) FROM pg_stat_activity
 WHERE backend_type LIKE 'pg_tide%' GROUP BY backend_type ORDER BY backend_type;
-- A table target's schema is not created yet: the first add_table creates it (table_target.sql).
SELECT nspname FROM pg_namespace WHERE nspname LIKE 'replica%' ORDER BY 1;

-- Pause: the worker stops applying; the slot keeps the changes.
SELECT tide.pause_pipeline('events');
SELECT regress_wait($$(SELECT state = 'paused' FROM tide.pipelines WHERE name = 'events')$$);
SELECT name, state, enabled FROM tide.pipelines WHERE name = 'events';
-- Pausing twice is not an error; wait_for_pipeline of a paused pipeline times out (false) once
-- there is WAL after the pause (catalog writes here): the paused worker reads none of it. (Right
-- after the pause it may be true: the worker may have read up to the pause's own commit.)
SELECT tide.pause_pipeline('events');
CREATE TABLE regress_after_pause ();
DROP TABLE regress_after_pause;
SELECT tide.wait_for_pipeline('events', '100 milliseconds') AS caught_up_while_paused;
SELECT tide.resume_pipeline('events');
SELECT tide.wait_for_pipeline('events', '60 seconds') AS caught_up_after_resume;
SELECT regress_wait($$(SELECT state = 'streaming' FROM tide.pipelines WHERE name = 'events')$$);
SELECT name, state, enabled FROM tide.pipelines WHERE name = 'events';

-- Drop: the worker stops, the slot and the origin go, the pipeline is forgotten.
SELECT tide.drop_pipeline('copy_paused');
SELECT name FROM tide.pipelines ORDER BY name;
SELECT slot_name FROM pg_replication_slots ORDER BY slot_name;
SELECT roname FROM pg_replication_origin ORDER BY roname;
SELECT regress_wait($$(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide worker') = 2$$);
-- The name can be used again.
SELECT tide.create_pipeline('copy_paused', 'table', '{"schema": "replica2"}');
SELECT name, target, options FROM tide.pipeline WHERE name = 'copy_paused';
SELECT tide.drop_pipeline('copy_paused');
SELECT tide.drop_pipeline('copy');
SELECT tide.drop_pipeline('events');
SELECT count(*) AS pipelines, (SELECT count(*) FROM pg_replication_slots) AS slots FROM tide.pipelines;
SELECT regress_wait($$(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_tide worker') = 0$$);
