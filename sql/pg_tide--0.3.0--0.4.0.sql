-- pg_tide 0.3.0 -> 0.4.0 (ALTER EXTENSION pg_tide UPDATE).
--
-- Install the 0.4.0 library first and restart the server: the 0.4.0 library runs no pipeline
-- and its functions refuse to act until this script has run (tide.check() says so), and the
-- pipelines resume by themselves once it commits. The objects below are the same as a fresh
-- install of 0.4.0 makes (pg_test/tests/upgrade.rs compares the two catalogs; the `upgrade`
-- golden file runs 0.1.0 -> 0.2.0 -> 0.3.0 -> 0.4.0).
\echo Use "ALTER EXTENSION pg_tide UPDATE" to load this file. \quit

-- Tables without a key (REPLICA IDENTITY FULL): the schema event trigger refuses another replica
-- identity for such a table while it is captured.
CREATE OR REPLACE FUNCTION tide._schema_marker() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    now_shape jsonb;
    marker_id bigint;
BEGIN
    -- A table captured without a key keeps REPLICA IDENTITY FULL while it is captured: with any
    -- other identity its updates and deletes would carry no old row, and the row they change
    -- could not be found at a table target (README, Tables without a key).
    FOR r IN
        SELECT t.pipeline, t.relation
          FROM tide.pipeline_table t JOIN pg_class c ON c.oid = t.relid
         WHERE t.relid IN (SELECT d.objid FROM pg_event_trigger_ddl_commands() d
                            WHERE d.classid = 'pg_catalog.pg_class'::regclass)
           AND cardinality(t.key_columns) = 0 AND NOT t.removing AND c.relreplident <> 'f'
         ORDER BY t.relid, t.pipeline
         LIMIT 1
    LOOP
        RAISE EXCEPTION '% is captured by pipeline "%" without a key, so its replica identity must stay FULL', r.relation, r.pipeline
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = format('Keep REPLICA IDENTITY FULL while it is captured, or remove it from the pipeline first: SELECT tide.remove_table(%L, %L);', r.pipeline, r.relation);
    END LOOP;
    FOR r IN
        WITH RECURSIVE rels(relid) AS (
            SELECT d.objid FROM pg_event_trigger_ddl_commands() d
             WHERE d.classid = 'pg_catalog.pg_class'::regclass
            UNION
            SELECT i.inhrelid FROM pg_inherits i JOIN rels ON i.inhparent = rels.relid
        )
        SELECT t.pipeline, t.relid, t.shape, t.columns
          FROM tide.pipeline_table t
         WHERE t.relid IN (SELECT relid FROM rels)
         ORDER BY t.relid, t.pipeline
    LOOP
        now_shape := tide._listed_shape(r.relid, r.columns);
        CONTINUE WHEN now_shape IS NULL OR now_shape IS NOT DISTINCT FROM r.shape;
        UPDATE tide.pipeline_table SET shape = now_shape WHERE pipeline = r.pipeline AND relid = r.relid;
        INSERT INTO tide.marker (pipeline, op, relid, payload)
        VALUES (r.pipeline, 'schema', r.relid, tide._schema_change(r.shape, now_shape, r.relid))
        RETURNING id INTO marker_id;
        DELETE FROM tide.marker WHERE id = marker_id;
    END LOOP;
END
$$;
COMMENT ON FUNCTION tide._schema_marker() IS 'pg_tide internal: the event trigger that writes a schema marker when an ALTER TABLE changes a captured table''s columns or key, and refuses a replica identity other than FULL for a table captured without a key.';

-- tide.pipelines: slot_failover and slot_synced (PostgreSQL 17 and later), and on a standby
-- whether a promotion resumes from a synchronised slot (docs/high-availability.md).
CREATE OR REPLACE VIEW tide.pipelines WITH (security_barrier) AS
SELECT p.name,
       p.target,
       CASE WHEN NOT p.enabled AND w.pid IS NOT NULL THEN 'paused'
            WHEN w.pid IS NULL THEN 'stopped'
            WHEN p.resync = 'slot lost' THEN 'slot lost'
            WHEN p.resync = 'resyncing' AND w.state = 'streaming' THEN 'resyncing'
            ELSE w.state END                                          AS state,
       p.enabled,
       w.pid                                                          AS worker_pid,
       p.slot_name,
       s.confirmed_flush_lsn                                          AS confirmed_lsn,
       p.applied_lsn,
       cur.lsn                                                        AS current_lsn,
       pg_wal_lsn_diff(cur.lsn, s.confirmed_flush_lsn)::bigint        AS lag_bytes,
       -- How stale the target may be, in every state (paused, error, stopped, catching up):
       -- while a lost slot is recovered, the time since the loss (the changes made meanwhile
       -- reach the target only once its tables have been read again); else 0 when the slot or
       -- the worker has passed every WAL byte written, else the time since the latest moment
       -- the target is known to reflect: the worker's last look that found nothing left to
       -- apply, the commit of the last transaction applied, or the creation.
       CASE WHEN p.resync IS NOT NULL
            THEN greatest(0, extract(epoch FROM now() - coalesce(p.slot_lost_at, p.created_at)))
            WHEN greatest(s.confirmed_flush_lsn, w.caught_up_lsn::pg_lsn) >= cur.lsn THEN 0
            ELSE greatest(0, extract(epoch FROM now() - greatest(w.caught_up_at, p.applied_commit_time, p.created_at))) END::float8
                                                                      AS apply_lag_seconds,
       p.applied_commit_time                                          AS last_commit_time,
       pg_wal_lsn_diff(cur.lsn, s.restart_lsn)::bigint                AS wal_retained_bytes,
       s.wal_status,
       coalesce(w.events, 0)                                          AS events_applied,
       coalesce(w.txns, 0)                                            AS transactions_applied,
       w.started_at                                                   AS worker_started_at,
       (SELECT count(*) FROM tide.pipeline_table t WHERE t.pipeline = p.name) AS tables,
       -- (the error can show row values: only for viewers who may SELECT every captured table)
       CASE WHEN p.last_error IS NULL AND w.pid IS NULL THEN stopped.reason
            WHEN p.last_error IS NULL
              OR NOT EXISTS (SELECT 1 FROM tide.pipeline_table t
                              WHERE t.pipeline = p.name
                                AND NOT coalesce(has_table_privilege(t.relid, 'SELECT'), true))
            THEN p.last_error
            ELSE 'hidden: the error may show values of a table you cannot SELECT' END AS last_error,
       p.last_error_sqlstate,
       p.last_error_at,
       CASE WHEN p.last_error IS NULL AND w.pid IS NULL THEN stopped.remedy
            -- a remedy that counts on the slot keeping the WAL, while the slot is about to go
            WHEN sw.warning IS NOT NULL AND p.remedy IS NOT NULL
            THEN p.remedy || ' But the slot may not keep it: ' || sw.warning || '.'
            ELSE p.remedy END                                         AS remedy,
       p.created_at,
       s.safe_wal_size,
       sw.warning                                                     AS slot_warning,
       p.resync,
       p.slot_lost_at,
       p.slot_lost_reason,
       p.attempts,
       -- backfills that failed (a chunk the target refused, say) and were not resumed,
       -- cancelled or started again since: tide.backfills has their error and remedy
       (SELECT count(*) FROM tide.backfill b
         WHERE b.pipeline = p.name AND b.state = 'failed'
           AND EXISTS (SELECT 1 FROM tide.pipeline_table t WHERE t.pipeline = p.name AND t.relid = b.relid)
           AND NOT EXISTS (SELECT 1 FROM tide.backfill l
                            WHERE l.pipeline = p.name AND l.relid = b.relid AND l.id > b.id)) AS failed_backfills,
       p.options,
       -- PostgreSQL 17 and later (NULL before): whether the slot is a failover slot, and
       -- whether it was synchronised from a primary (on a standby: the position a promotion
       -- resumes from); see docs/high-availability.md
       (to_jsonb(s) ->> 'failover')::boolean                          AS slot_failover,
       (to_jsonb(s) ->> 'synced')::boolean                            AS slot_synced
  FROM tide.pipeline p
  LEFT JOIN pg_replication_slots s ON s.slot_name = p.slot_name
  LEFT JOIN tide._worker_status() w ON w.pipeline = p.name
  -- where the WAL ends: written on a primary, replayed on a standby (pg_current_wal_lsn()
  -- fails during recovery)
  CROSS JOIN LATERAL (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                                  ELSE pg_current_wal_lsn() END AS lsn) cur
  -- (see README, Concepts > Lost slots; the margin is tide.slot_warning_size)
  CROSS JOIN LATERAL (SELECT CASE
            WHEN s.slot_name IS NULL
            THEN 'the slot does not exist: the worker creates a new one and reads every table again, unless tide.on_slot_lost = ''error'''
            WHEN s.wal_status = 'lost'
            THEN 'the slot was invalidated (max_slot_wal_keep_size): the worker creates a new one and reads every table again, unless tide.on_slot_lost = ''error'''
            WHEN s.wal_status = 'unreserved'
            THEN format('the slot retains more WAL than max_wal_size: the next checkpoint invalidates it once it is past max_slot_wal_keep_size (%s left)',
                        pg_size_pretty(s.safe_wal_size))
            WHEN s.safe_wal_size < pg_size_bytes(coalesce(current_setting('tide.slot_warning_size', true), '1GB'))
            THEN format('the slot is %s of WAL from being invalidated by max_slot_wal_keep_size (tide.slot_warning_size)',
                        pg_size_pretty(s.safe_wal_size))
            WHEN NOT p.enabled AND pg_size_bytes(coalesce(current_setting('tide.max_paused_wal_size', true), '-1')) >= 0
                 AND pg_size_bytes(coalesce(current_setting('tide.max_paused_wal_size', true), '-1'))
                     - pg_wal_lsn_diff(cur.lsn, s.restart_lsn)
                     < pg_size_bytes(coalesce(current_setting('tide.slot_warning_size', true), '1GB'))
            THEN format('the paused pipeline''s slot is %s of WAL from being dropped by tide.max_paused_wal_size (tide.slot_warning_size)',
                        pg_size_pretty(greatest(0, pg_size_bytes(current_setting('tide.max_paused_wal_size', true))
                                                   - pg_wal_lsn_diff(cur.lsn, s.restart_lsn))))
            END AS warning) sw
  -- why no worker runs, when the pipeline has no error of its own
  CROSS JOIN LATERAL (SELECT
            CASE WHEN pg_is_in_recovery()
                 THEN 'no worker runs: this server is a standby (in recovery); pipelines run on the primary'
                      || CASE WHEN coalesce((to_jsonb(s) ->> 'synced')::boolean, false)
                              THEN format('; the slot is synchronised from the primary (confirmed at %s): once promoted, the pipeline resumes from it', s.confirmed_flush_lsn)
                              ELSE '; no slot synchronised from the primary here: once promoted, the pipeline resyncs' END
                 ELSE 'no worker runs for this pipeline' END AS reason,
            CASE WHEN pg_is_in_recovery()
                 THEN 'Nothing to do on a standby: once it is promoted, its launcher starts the workers by itself (see docs/high-availability.md).'
                 ELSE 'The pg_tide launcher starts one within seconds of the pipeline''s creation, a restart or a worker''s exit. If it stays stopped: SELECT tide.check() says whether the launcher runs in this database (pg_tide preloaded, tide.database, wal_level, the extension''s version), and the server log says why a worker could not start (each pipeline needs a background worker: max_worker_processes).' END AS remedy) stopped
 WHERE tide._visible(p.owner);
COMMENT ON VIEW tide.pipelines IS 'One row per pipeline: is it healthy, how far behind, and why not.';

-- Tables without a key are backfilled by one copy at a point of the stream (README, Tables
-- without a key): the copy's snapshot and the WAL position after it.
ALTER TABLE tide.backfill ADD COLUMN copy_snapshot text, ADD COLUMN copy_until pg_lsn;
-- (tide.readiness again: its SELECT * of tide.backfill takes the new columns.)
CREATE OR REPLACE VIEW tide.readiness WITH (security_barrier) AS
SELECT t.pipeline, t.relation, t.relid::regclass AS source, b.id AS backfill_id, b.state AS backfill_state,
       coalesce(b.state = 'done' OR b.read_complete, false)                     AS snapshot_read_complete,
       coalesce(b.state = 'done', false)                                       AS snapshot_emitted,
       coalesce(b.state = 'done' AND w.caught_up_lsn::pg_lsn >= b.finished_lsn, false)  AS target_caught_up,
       CASE WHEN b.id IS NULL THEN 'no backfill'
            WHEN b.state IN ('queued', 'running', 'paused') THEN 'backfilling'
            WHEN b.state <> 'done' THEN 'backfill ' || b.state
            WHEN NOT coalesce(w.caught_up_lsn::pg_lsn >= b.finished_lsn, false) THEN 'catching up'
            -- a backfill into a target that already held rows: ready once a verification
            -- since found no difference, or its repair is done
            WHEN h.held_since IS NOT NULL AND NOT EXISTS (
                     SELECT 1 FROM tide.verification v LEFT JOIN tide.backfill r ON r.id = v.repair_backfill_id
                      WHERE v.pipeline = t.pipeline AND v.relid = t.relid AND v.started_at > h.held_since
                        AND v.finished_at IS NOT NULL
                        AND (coalesce(v.missing, 0) + coalesce(v.extra, 0) + coalesce(v.changed, 0) = 0
                             OR r.state = 'done'))
            THEN 'target not verified'
            ELSE 'ready' END                                                    AS readiness
  FROM tide.pipeline_table t
  LEFT JOIN LATERAL (SELECT * FROM tide.backfill b WHERE b.pipeline = t.pipeline AND b.relid = t.relid
                      ORDER BY b.id DESC LIMIT 1) b ON true
  LEFT JOIN LATERAL (SELECT max(f.created_at) AS held_since FROM tide.backfill f
                      WHERE f.pipeline = t.pipeline AND f.relid = t.relid AND f.target_held_rows
                        AND f.created_at >= t.added_at) h ON true
  LEFT JOIN tide._worker_status() w ON w.pipeline = t.pipeline
 WHERE tide._visible((SELECT p.owner FROM tide.pipeline p WHERE p.name = t.pipeline));
