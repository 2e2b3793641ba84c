-- Whether the current user may see a pipeline owned by role `owner`: its owner, a member of the
-- owning role, or a superuser (RLS-style filtering of every view below).
CREATE FUNCTION tide._visible(owner name) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                    WHERE r.rolname = current_user AND r.rolsuper)
        OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles r
                    WHERE r.rolname = owner AND pg_catalog.pg_has_role(r.oid, 'MEMBER'))
$$;
COMMENT ON FUNCTION tide._visible(name) IS 'pg_tide internal: may the current user see pipelines owned by this role?';

-- The rows of a table as the planner estimates them (PostgreSQL's
-- table_block_relation_estimate_size): its current size in blocks times the rows per block, from
-- the last VACUUM/ANALYZE when there is one (reltuples / relpages), otherwise from the row width
-- (pg_statistic's average widths, else each type's width) as the planner does for a table never
-- analyzed. 0 for a table with no blocks; NULL only when the relation is not a table. A
-- partitioned table's is the sum of its partitions'.
CREATE FUNCTION tide._estimate_rows(rel oid) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    -- A partitioned table: the sum over its partitions that hold rows (0 with none).
    WITH r AS (
        SELECT t.relid FROM pg_partition_tree(rel) t
         WHERE t.isleaf AND t.relid <> rel AND (SELECT relkind FROM pg_class WHERE oid = rel) = 'p'
        UNION ALL
        SELECT rel WHERE (SELECT relkind FROM pg_class WHERE oid = rel) <> 'p'
    ), c AS (
        SELECT c.oid, c.reltuples::float8 AS reltuples, c.relpages::float8 AS relpages,
               (pg_relation_size(c.oid) / current_setting('block_size')::int8)::float8 AS curpages,
               current_setting('block_size')::float8 AS blcksz
          FROM pg_class c JOIN r ON c.oid = r.relid
         WHERE c.relkind IN ('r', 'm', 't')
    ), w AS (
        -- get_rel_data_width: per column the analyzed average width, else get_typavgwidth
        -- (fixed length; bpchar/varchar from their typmod, 4 bytes per UTF-8 character;
        -- otherwise 32)
        SELECT a.attrelid, coalesce(sum(coalesce(nullif(s.stawidth, 0),
                   CASE WHEN t.typlen > 0 THEN t.typlen
                        WHEN a.atttypid = 'bpchar'::regtype AND a.atttypmod > 4 THEN (a.atttypmod - 4) * 4 + 4
                        WHEN a.atttypid = 'varchar'::regtype AND a.atttypmod > 4
                             THEN least(32 + ((a.atttypmod - 4) * 4 + 4 - 32) / 2, 516)
                        ELSE 32 END)), 0)::float8 AS width
          FROM pg_attribute a
          JOIN pg_type t ON t.oid = a.atttypid
          LEFT JOIN pg_statistic s ON s.starelid = a.attrelid AND s.staattnum = a.attnum AND NOT s.stainherit
         WHERE a.attrelid IN (SELECT relid FROM r) AND a.attnum > 0 AND NOT a.attisdropped
         GROUP BY a.attrelid
    )
    SELECT coalesce(sum(CASE WHEN c.curpages = 0 THEN 0
                WHEN c.reltuples >= 0 AND c.relpages > 0 THEN round(c.reltuples / c.relpages * c.curpages)
                -- 24 bytes of page header; 24 of tuple header and 4 of line pointer per row
                ELSE floor((c.blcksz - 24) / (coalesce(w.width, 0) + 28)) * c.curpages END)::int8,
                CASE WHEN (SELECT relkind FROM pg_class WHERE oid = rel) = 'p' THEN 0 END)
      FROM c LEFT JOIN w ON w.attrelid = c.oid
$$;
COMMENT ON FUNCTION tide._estimate_rows(oid) IS 'pg_tide internal: the planner''s estimate of a table''s rows now, with or without statistics (backfill progress).';

CREATE VIEW tide.pipelines WITH (security_barrier) AS
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

CREATE VIEW tide.tables WITH (security_barrier) AS
SELECT t.pipeline, t.relation, t.relid::regclass AS source, t.key_columns, t.added_at, t.added_lsn,
       CASE WHEN t.removing THEN 'removing' WHEN t.added_lsn IS NULL THEN 'pending' ELSE 'capturing' END AS state,
       t.row_filter,
       CASE WHEN t.columns IS NOT NULL THEN ARRAY(SELECT a.attname::text FROM pg_attribute a
             WHERE a.attrelid = t.relid AND a.attnum = ANY (t.columns) AND NOT a.attisdropped ORDER BY a.attnum) END AS columns,
       (SELECT jsonb_object_agg(a.attname, m.value ORDER BY a.attnum) FROM jsonb_each(t.masks) m
          JOIN pg_attribute a ON a.attrelid = t.relid AND a.attnum = m.key::int2 AND NOT a.attisdropped) AS masks
  FROM tide.pipeline_table t
 WHERE tide._visible((SELECT p.owner FROM tide.pipeline p WHERE p.name = t.pipeline));
COMMENT ON VIEW tide.tables IS 'Tables captured by each pipeline: pending until the worker reaches the add_table point in the stream, then capturing; removing until it reaches the remove_table point; row_filter: only the rows it passes are delivered; columns: only these columns are (NULL: every column); masks: each masked column and its mask (NULL: none; never the salt).';

CREATE VIEW tide.backfills WITH (security_barrier) AS
SELECT b.id, b.pipeline, b.relation, b.relid::regclass AS source, b.state, b.generation, b.chunk_size,
       b.rows_per_second, b.condition, b.chunks_done, b.rows_read, b.rows_dropped, b.rows_emitted,
       CASE WHEN coalesce(has_table_privilege(b.relid, 'SELECT'), false) THEN b.last_key END AS last_key,
       b.estimated_rows,
       CASE WHEN b.state = 'done' THEN 1.0
            WHEN coalesce(b.estimated_rows, 0) <= 0
            THEN CASE WHEN b.state IN ('queued', 'running', 'paused') THEN 0.0 END
            ELSE least(1.0, b.rows_read::float8 / b.estimated_rows) END          AS fraction_done,
       r.rows_per_second_now,
       -- the speed of the last chunks, or (before there are two) of the backfill so far
       CASE WHEN b.state IN ('running', 'queued') AND b.estimated_rows IS NOT NULL
             AND coalesce(r.rows_per_second_now, o.rows_per_second_so_far) > 0
            THEN make_interval(secs => greatest(0, b.estimated_rows - b.rows_read)
                                       / coalesce(r.rows_per_second_now, o.rows_per_second_so_far)) END
                                                                                   AS estimated_time_left,
       b.created_at, b.started_at, b.finished_at, b.finished_lsn,
       CASE WHEN b.error IS NULL OR coalesce(has_table_privilege(b.relid, 'SELECT'), false) THEN b.error
            ELSE 'hidden: the error may show values of a table you cannot SELECT' END AS error,
       b.remedy,
       b.error_sqlstate,
       b.error_at,
       b.attempts
  FROM tide.backfill b
  LEFT JOIN LATERAL (
       SELECT CASE WHEN count(*) >= 2 AND extract(epoch FROM max(c.emitted_at) - min(c.read_at)) > 0
                   THEN sum(c.rows_read) / extract(epoch FROM max(c.emitted_at) - min(c.read_at)) END::float8
                   AS rows_per_second_now
         FROM (SELECT * FROM tide.chunk c WHERE c.backfill_id = b.id ORDER BY c.chunk DESC LIMIT 10) c
  ) r ON true
  LEFT JOIN LATERAL (
       SELECT CASE WHEN b.rows_read > 0 AND extract(epoch FROM now() - b.started_at) > 0
                   THEN b.rows_read / extract(epoch FROM now() - b.started_at) END::float8
                   AS rows_per_second_so_far
  ) o ON true
 WHERE tide._visible((SELECT p.owner FROM tide.pipeline p WHERE p.name = b.pipeline));
COMMENT ON VIEW tide.backfills IS 'One row per backfill: state, progress, speed, estimated time left, error and remedy.';

CREATE VIEW tide.chunks WITH (security_barrier) AS
SELECT c.backfill_id, b.pipeline, b.relation, c.chunk,
       CASE WHEN coalesce(has_table_privilege(b.relid, 'SELECT'), false) THEN c.key_from END AS key_from,
       CASE WHEN coalesce(has_table_privilege(b.relid, 'SELECT'), false) THEN c.key_to END AS key_to,
       c.low_lsn, c.high_lsn,
       c.rows_read, c.rows_dropped, c.rows_emitted, c.emitted_at - c.read_at AS duration, c.read_at, c.emitted_at,
       c.written_as
  FROM tide.chunk c JOIN tide.backfill b ON b.id = c.backfill_id
 WHERE tide._visible((SELECT p.owner FROM tide.pipeline p WHERE p.name = b.pipeline));
COMMENT ON VIEW tide.chunks IS 'Recent backfill chunks (the last 1000 per backfill).';

CREATE VIEW tide.verifications WITH (security_barrier) AS
SELECT DISTINCT ON (v.pipeline, v.relid)
       v.pipeline, v.relation, v.relid::regclass AS source, v.id AS verification_id, v.started_at, v.finished_at,
       v.finished_at IS NOT NULL AS finished, v.ranges_checked, v.ranges_differing, v.source_rows, v.target_rows,
       v.missing, v.extra, v.changed, v.repair_backfill_id, b.state AS repair_state
  FROM tide.verification v
  LEFT JOIN tide.backfill b ON b.id = v.repair_backfill_id
 WHERE tide._visible((SELECT p.owner FROM tide.pipeline p WHERE p.name = v.pipeline))
 ORDER BY v.pipeline, v.relid, v.id DESC;
COMMENT ON VIEW tide.verifications IS 'The last verification of each captured table: when, ranges checked, differences found, repair.';

CREATE VIEW tide.readiness WITH (security_barrier) AS
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
COMMENT ON VIEW tide.readiness IS 'Per pipeline and table: snapshot read complete, snapshot emitted, target caught up past the completion position; a target that held rows before its backfill is ready once verified or repaired.';

CREATE VIEW tide.consumers WITH (security_barrier) AS
SELECT c.pipeline, c.name AS consumer, c.owner, c.committed_id, c.committed_lsn, c.committed_position,
       c.committed_at,
       (SELECT count(*) FROM tide.outbox o WHERE o.pipeline = c.pipeline AND o.id > c.committed_id) AS events_behind,
       -- WAL between the first event the consumer has not committed and what the pipeline has
       -- applied (0 when it has committed everything)
       coalesce((SELECT greatest(0, pg_wal_lsn_diff(p.applied_lsn, o.commit_lsn))::bigint
                   FROM tide.outbox o WHERE o.pipeline = c.pipeline AND o.id > c.committed_id
                  ORDER BY o.id LIMIT 1), 0)                                      AS bytes_behind,
       p.applied_lsn,
       c.created_at
  FROM tide.consumer c
  JOIN tide.pipeline p ON p.name = c.pipeline
 WHERE tide._visible(p.owner);
COMMENT ON VIEW tide.consumers IS 'Outbox consumers: committed position (id and (commit_lsn, position)), events and WAL bytes behind the pipeline.';

CREATE VIEW tide.skipped_transactions WITH (security_barrier) AS
SELECT s.pipeline, s.lsn, s.xid, s.requested_by, s.requested_at, s.skipped_at
  FROM tide.skipped_transaction s
 WHERE tide._visible((SELECT p.owner FROM tide.pipeline p WHERE p.name = s.pipeline));
COMMENT ON VIEW tide.skipped_transactions IS 'Source transactions skipped (or to be skipped) by tide.skip_transaction: commit LSN, xid, who asked and when, when the worker skipped it.';

CREATE VIEW tide.outbox_retention WITH (security_barrier) AS
SELECT p.name AS pipeline,
       (SELECT count(*) FROM tide.consumer c WHERE c.pipeline = p.name)          AS consumers,
       (SELECT min(c.committed_id) FROM tide.consumer c WHERE c.pipeline = p.name) AS committed_by_all,
       (SELECT min(o.id) FROM tide.outbox o WHERE o.pipeline = p.name)           AS oldest_id,
       (SELECT max(o.id) FROM tide.outbox o WHERE o.pipeline = p.name)           AS newest_id,
       coalesce(r.events, 0)                                                     AS events_pruned,
       coalesce(r.transactions, 0)                                               AS prune_transactions,
       r.last_id                                                                 AS last_pruned_id,
       r.last_reason                                                             AS last_prune_reason,
       r.last_at                                                                 AS last_pruned_at
  FROM tide.pipeline p
  LEFT JOIN tide.outbox_prune r ON r.pipeline = p.name
 WHERE p.target = 'outbox' AND tide._visible(p.owner);
COMMENT ON VIEW tide.outbox_retention IS 'Per outbox pipeline: its consumers, the events retained, and what the retention has deleted (events, delete transactions, the last one and why).';

CREATE VIEW tide.followed_schemas WITH (security_barrier) AS
SELECT f.pipeline, n.nspname AS schema, f.backfill, f.requested_by, f.requested_at,
       (SELECT count(*) FROM tide.pipeline_table t JOIN pg_class c ON c.oid = t.relid
         WHERE t.pipeline = f.pipeline AND c.relnamespace = f.nspid AND NOT t.removing) AS tables,
       (SELECT count(*) FROM tide.follow_skip s
         WHERE s.pipeline = f.pipeline AND s.nspid = f.nspid AND s.kind = 'skipped')   AS skipped
  FROM tide.followed_schema f
  JOIN pg_namespace n ON n.oid = f.nspid
 WHERE tide._visible((SELECT p.owner FROM tide.pipeline p WHERE p.name = f.pipeline));
COMMENT ON VIEW tide.followed_schemas IS 'Schemas each pipeline follows (tables created there later are captured): backfill choice, who asked, tables captured there, tables skipped (tide.skipped_tables).';

CREATE VIEW tide.skipped_tables WITH (security_barrier) AS
SELECT s.pipeline, n.nspname AS schema, s.relation, s.relid AS source, s.kind, s.reason, s.hint,
       s.sqlstate, s.by_role, s.at
  FROM tide.follow_skip s
  JOIN tide.followed_schema f ON f.pipeline = s.pipeline AND f.nspid = s.nspid
  JOIN pg_namespace n ON n.oid = s.nspid
 WHERE tide._visible((SELECT p.owner FROM tide.pipeline p WHERE p.name = s.pipeline));
COMMENT ON VIEW tide.skipped_tables IS 'Tables of followed schemas a pipeline does not capture: skipped (why, with the SQLSTATE and hint, and whose DDL met it; an ALTER TABLE of it tries again) or removed with tide.remove_table.';

-- A consumer's next batch: the events after its committed position, in id order, ending at a
-- source transaction's end (tide._consumer_batch checks the caller and picks the bounds; the
-- rows are read as the caller, under the outbox's row security). With `wait`, it first waits
-- (tide._outbox_wait) until there is an event to read; the batch is read by the next statement,
-- with a snapshot taken after the wait.
CREATE FUNCTION tide.read_outbox(pipeline text, consumer text, max_events integer DEFAULT 1000, wait interval DEFAULT '0')
RETURNS SETOF tide.outbox
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
    SELECT tide._outbox_wait($1, $2, $4);
    SELECT o.*
      FROM (SELECT tide._consumer_batch($1, $2, $3) AS b) r, tide.outbox o
     WHERE o.pipeline = $1 AND o.id > r.b[1] AND o.id <= r.b[2]
     ORDER BY o.id
$$;
COMMENT ON FUNCTION tide.read_outbox(text, text, integer, interval) IS 'The next events of a consumer after its committed position, in id order, whole source transactions (see the README, Outbox consumers); with wait, it waits up to that long for the first event instead of returning nothing; commit with tide.commit_consumer.';

-- Schema changes of captured tables (see README, Concepts > Schema changes, and Outbox format).
-- The shape of a table as pg_tide describes it: its columns (attnum, name, format_type, type OID,
-- typmod; generated columns are not sent, so not listed) in attribute order, and its key (the
-- replica identity index, else the primary key: what tide.add_table records in key_columns).
CREATE FUNCTION tide._shape(rel oid) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT jsonb_build_object(
        'columns', coalesce((SELECT jsonb_agg(jsonb_build_object(
                                 'attnum', a.attnum, 'name', a.attname::text,
                                 'type', format_type(a.atttypid, a.atttypmod),
                                 'type_oid', a.atttypid::int8, 'typmod', a.atttypmod) ORDER BY a.attnum)
                               FROM pg_attribute a
                              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                                AND a.attgenerated = ''), '[]'::jsonb),
        'key', to_jsonb(ARRAY(SELECT a.attname::text
                 FROM pg_index i
                 JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON k.ord <= i.indnkeyatts
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                WHERE i.indrelid = c.oid
                  AND CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END
                ORDER BY k.ord)))
      FROM pg_class c
     WHERE c.oid = rel
$$;
COMMENT ON FUNCTION tide._shape(oid) IS 'pg_tide internal: a table''s columns (attnum, name, type) and key, as schema events describe them.';

-- The shape of `rel` as a pipeline delivers it: only the columns `cols` (attribute numbers) when
-- it has a column list (NULL: every column). Schema events of such a table only describe those.
CREATE FUNCTION tide._listed_shape(rel oid, cols int2[]) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN cols IS NULL OR s IS NULL THEN s
                ELSE jsonb_set(s, '{columns}', coalesce((SELECT jsonb_agg(e ORDER BY (e->>'attnum')::int)
                                                        FROM jsonb_array_elements(s->'columns') e
                                                       WHERE (e->>'attnum')::int2 = ANY (cols)), '[]'::jsonb)) END
      FROM tide._shape(rel) s
$$;
COMMENT ON FUNCTION tide._listed_shape(oid, int2[]) IS 'pg_tide internal: a table''s shape restricted to a column list (tide.add_table''s columns).';

-- The schema change from shape `old` to shape `new` of table `rel`, as the outbox's schema event
-- carries it: the relation; the new columns and key; columns added (by attnum: a column dropped and added again
-- under the same name is dropped and added), with the value existing rows got (attmissingval, or
-- NULL); columns dropped; columns whose type changed; columns renamed; the key before.
CREATE FUNCTION tide._schema_change(old jsonb, new jsonb, rel oid) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    WITH o AS (SELECT * FROM jsonb_to_recordset(coalesce(old->'columns', '[]'::jsonb)) AS x(attnum int, name text, type text)),
         n AS (SELECT * FROM jsonb_to_recordset(new->'columns') AS x(attnum int, name text, type text, type_oid int8, typmod int))
    SELECT jsonb_build_object(
        'relation', (SELECT format('%I.%I', s.nspname, c.relname)
                       FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE c.oid = rel),
        'columns', (SELECT coalesce(jsonb_agg(jsonb_build_object('name', n.name, 'type', n.type,
                                    'type_oid', n.type_oid, 'typmod', n.typmod) ORDER BY n.attnum), '[]'::jsonb) FROM n),
        'key', new->'key',
        'previous_key', old->'key',
        'added', (SELECT coalesce(jsonb_agg(jsonb_build_object('name', n.name, 'type', n.type,
                         'value', CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END) ORDER BY n.attnum), '[]'::jsonb)
                    FROM n JOIN pg_attribute a ON a.attrelid = rel AND a.attnum = n.attnum
                   WHERE NOT EXISTS (SELECT 1 FROM o WHERE o.attnum = n.attnum)),
        'dropped', (SELECT coalesce(jsonb_agg(o.name ORDER BY o.attnum), '[]'::jsonb)
                      FROM o WHERE NOT EXISTS (SELECT 1 FROM n WHERE n.attnum = o.attnum)),
        'changed', (SELECT coalesce(jsonb_agg(jsonb_build_object('name', n.name, 'from', o.type, 'to', n.type) ORDER BY n.attnum), '[]'::jsonb)
                      FROM o JOIN n USING (attnum) WHERE o.type <> n.type),
        'renamed', (SELECT coalesce(jsonb_agg(jsonb_build_object('from', o.name, 'to', n.name) ORDER BY n.attnum), '[]'::jsonb)
                      FROM o JOIN n USING (attnum) WHERE o.name <> n.name))
$$;
COMMENT ON FUNCTION tide._schema_change(jsonb, jsonb, oid) IS 'pg_tide internal: the schema event''s payload for a change of a table from one shape to another.';

-- At the end of every ALTER TABLE: for each captured table the command touched (and the tables
-- inheriting from it) whose shape changed, write a 'schema' marker with the change, in the DDL's
-- own transaction, so the worker meets it exactly where the change takes effect in the stream.
-- Does nothing else for a table no pipeline captures; runs as pg_tide (SECURITY DEFINER: any
-- table owner's ALTER TABLE fires it, and only pg_tide may write tide.marker).
CREATE FUNCTION tide._schema_marker() RETURNS event_trigger
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
CREATE EVENT TRIGGER tide_schema_changes ON ddl_command_end WHEN TAG IN ('ALTER TABLE')
    EXECUTE FUNCTION tide._schema_marker();
COMMENT ON EVENT TRIGGER tide_schema_changes IS 'pg_tide: schema events for captured tables (tide._schema_marker).';

-- At the end of every command that drops objects (DROP TABLE, DROP SCHEMA ... CASCADE, DROP
-- OWNED, ...): each captured table it dropped leaves its pipelines at that point of the stream,
-- as tide.remove_table does, with a remove marker whose payload says it was dropped (the worker
-- writes a schema event and a LOG line there, and forgets the table); its active backfills are
-- cancelled. A dropped schema is no longer followed (tide.followed_schema), a dropped table no
-- longer listed as skipped. Does nothing else when none of those was dropped; runs as pg_tide.
CREATE FUNCTION tide._drop_marker() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    marker_id bigint;
BEGIN
    -- (DROP EXTENSION pg_tide or DROP SCHEMA tide: pg_tide's own tables are gone)
    IF to_regclass('tide.pipeline_table') IS NULL OR to_regclass('tide.marker') IS NULL THEN
        RETURN;
    END IF;
    FOR r IN
        SELECT t.pipeline, t.relid, t.relation
          FROM tide.pipeline_table t
         WHERE t.relid IN (SELECT d.objid FROM pg_event_trigger_dropped_objects() d
                            WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objsubid = 0)
           AND NOT t.removing
         ORDER BY t.relid, t.pipeline
    LOOP
        UPDATE tide.pipeline_table SET removing = true WHERE pipeline = r.pipeline AND relid = r.relid;
        INSERT INTO tide.marker (pipeline, op, relid, payload)
        VALUES (r.pipeline, 'remove_table', r.relid, jsonb_build_object('relation', r.relation, 'table_dropped', true))
        RETURNING id INTO marker_id;
        DELETE FROM tide.marker WHERE id = marker_id;
        UPDATE tide.backfill SET state = 'cancelled', finished_at = now(), error = 'the table was dropped'
         WHERE pipeline = r.pipeline AND relid = r.relid AND state IN ('queued', 'running', 'paused');
    END LOOP;
    -- A dropped schema is no longer followed; a dropped table no longer skipped.
    IF to_regclass('tide.followed_schema') IS NOT NULL THEN
        DELETE FROM tide.followed_schema
         WHERE nspid IN (SELECT d.objid FROM pg_event_trigger_dropped_objects() d
                          WHERE d.classid = 'pg_catalog.pg_namespace'::regclass);
        DELETE FROM tide.follow_skip
         WHERE relid IN (SELECT d.objid FROM pg_event_trigger_dropped_objects() d
                          WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.objsubid = 0)
            OR nspid IN (SELECT d.objid FROM pg_event_trigger_dropped_objects() d
                          WHERE d.classid = 'pg_catalog.pg_namespace'::regclass);
    END IF;
END
$$;
COMMENT ON FUNCTION tide._drop_marker() IS 'pg_tide internal: the event trigger that takes a dropped captured table out of its pipelines at the DROP''s position in the stream, and forgets dropped followed schemas.';
CREATE EVENT TRIGGER tide_dropped_tables ON sql_drop
    EXECUTE FUNCTION tide._drop_marker();
COMMENT ON EVENT TRIGGER tide_dropped_tables IS 'pg_tide: a dropped captured table leaves its pipelines (tide._drop_marker).';

-- At the end of every CREATE TABLE, CREATE TABLE AS, SELECT INTO and ALTER TABLE: each ordinary
-- or partitioned table it created in, moved into or changed in a schema a pipeline follows, and
-- that the pipeline does not capture (nor was told to leave with tide.remove_table), is captured
-- in the DDL's own transaction, as tide.add_table captures it when the pipeline's owner calls it
-- (run as that owner, in a security-restricted operation), if the table and its column types
-- belong to the owner, a role whose privileges it has, or a superuser. One that cannot be is
-- skipped with a WARNING and a row in tide.skipped_tables; the DDL never fails because of it.
-- Runs as the role doing the DDL (not SECURITY DEFINER); a C function that refuses any call but
-- an event trigger's.
CREATE FUNCTION tide._follow_tables() RETURNS event_trigger
LANGUAGE c AS 'MODULE_PATHNAME', 'tide_follow_tables';
COMMENT ON FUNCTION tide._follow_tables() IS 'pg_tide internal: the event trigger that captures tables created in (or moved into) a followed schema.';
CREATE EVENT TRIGGER tide_followed_schemas ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE')
    EXECUTE FUNCTION tide._follow_tables();
COMMENT ON EVENT TRIGGER tide_followed_schemas IS 'pg_tide: tables created in a followed schema are captured (tide._follow_tables).';

-- The kafka target (README "Kafka target"): its brokers and settings are the options of a server
-- of this wrapper, its credentials those of the pipeline owner's user mapping (hidden from other
-- roles); the validator refuses secrets in a server's options and the settings pg_tide sets.
CREATE FOREIGN DATA WRAPPER tide_kafka VALIDATOR tide._kafka_fdw_validator;
COMMENT ON FOREIGN DATA WRAPPER tide_kafka IS 'pg_tide: servers of kafka targets (option brokers; credentials in user mappings).';

-- Pipeline definitions for pg_dump (README, Upgrading > Dump and restore): one row per pipeline,
-- by name, with what tide.restore_pipeline needs to make it again in a restored database: the
-- target and options, whether it was paused, its tables (by name, with their target table, row
-- filter, column list and masks by column name), its followed schemas (by name) and the tables
-- it was told to leave there. An extension configuration table, so pg_dump dumps its rows; no
-- runtime state is in it. Written by the launcher (tide._save_definitions, on each of its rounds,
-- in a transaction of its own that waits for no lock: no role's transaction can stall it, and it
-- stalls none), so a change shows here within a few seconds (saved_at); tide.drop_pipeline and a
-- rename delete the row of the name that goes. A row without a pipeline is a restored definition
-- waiting for tide.restore_pipeline. Superusers only (it names every owner's tables and
-- filters): a pg_dump by another role passes --exclude-table-data=tide.pipeline_definition.
CREATE TABLE tide.pipeline_definition (
    name        text PRIMARY KEY,
    owner       name NOT NULL,
    definition  jsonb NOT NULL,
    saved_at    timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON tide.pipeline_definition FROM PUBLIC;
COMMENT ON TABLE tide.pipeline_definition IS 'Each pipeline''s definition by name (target, options, tables, filters, columns, masks, followed schemas), dumped by pg_dump; tide.restore_pipeline re-creates a restored one. Superusers only.';
SELECT pg_catalog.pg_extension_config_dump('tide.pipeline_definition', '');

-- The definition of pipeline p as tide.pipeline_definition holds it (NULL for no pipeline).
CREATE FUNCTION tide._definition(p text) RETURNS jsonb
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT pg_catalog.jsonb_build_object(
        'target', x.target,
        'options', x.options,
        'enabled', x.enabled,
        'tables', COALESCE((
            SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                       'relation', pg_catalog.format('%I.%I', n.nspname, c.relname),
                       'target_table', CASE WHEN t.target_name IS NOT NULL
                                            THEN pg_catalog.format('%I.%I', t.target_schema, t.target_name) END,
                       'row_filter', t.row_filter,
                       'followed', t.followed_nspid IS NOT NULL,
                       'columns', (SELECT pg_catalog.jsonb_agg(a.attname ORDER BY a.attnum)
                                     FROM pg_catalog.pg_attribute a
                                    WHERE a.attrelid = t.relid AND a.attnum = ANY (t.columns)),
                       'masks', (SELECT pg_catalog.jsonb_object_agg(a.attname, m.value)
                                   FROM pg_catalog.jsonb_each(t.masks) m
                                   JOIN pg_catalog.pg_attribute a
                                     ON a.attrelid = t.relid AND a.attnum = m.key::pg_catalog.int2))
                     ORDER BY n.nspname, c.relname)
              FROM tide.pipeline_table t
              JOIN pg_catalog.pg_class c ON c.oid = t.relid
              JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE t.pipeline = x.name AND NOT t.removing), '[]'::pg_catalog.jsonb),
        'follows', COALESCE((
            SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('schema', n.nspname, 'backfill', f.backfill)
                     ORDER BY n.nspname)
              FROM tide.followed_schema f
              JOIN pg_catalog.pg_namespace n ON n.oid = f.nspid
             WHERE f.pipeline = x.name), '[]'::pg_catalog.jsonb),
        'not_followed', COALESCE((
            SELECT pg_catalog.jsonb_agg(pg_catalog.format('%I.%I', n.nspname, c.relname)
                     ORDER BY n.nspname, c.relname)
              FROM tide.follow_skip s
              JOIN pg_catalog.pg_class c ON c.oid = s.relid
              JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
             WHERE s.pipeline = x.name AND s.kind = 'removed'), '[]'::pg_catalog.jsonb))
      FROM tide.pipeline x
     WHERE x.name = p
$$;
COMMENT ON FUNCTION tide._definition(text) IS 'pg_tide internal: a pipeline''s definition as tide.pipeline_definition holds it.';

-- Bring tide.pipeline_definition up to date with every pipeline: the rows that differ only (no
-- row is written, nor locked, when nothing changed); rows without a pipeline are left (restored
-- definitions waiting for tide.restore_pipeline). Returns how many rows it wrote. Run by the
-- launcher.
CREATE FUNCTION tide._save_definitions() RETURNS bigint
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $$
    WITH now_defs AS (
        SELECT p.name, p.owner, tide._definition(p.name) AS definition FROM tide.pipeline p
    ), written AS (
        INSERT INTO tide.pipeline_definition AS d (name, owner, definition, saved_at)
        SELECT n.name, n.owner, n.definition, pg_catalog.now() FROM now_defs n
         WHERE NOT EXISTS (SELECT 1 FROM tide.pipeline_definition o
                            WHERE o.name = n.name AND o.owner = n.owner AND o.definition = n.definition)
        ON CONFLICT (name) DO UPDATE
           SET owner = excluded.owner, definition = excluded.definition, saved_at = excluded.saved_at
        RETURNING 1)
    SELECT pg_catalog.count(*) FROM written
$$;
COMMENT ON FUNCTION tide._save_definitions() IS 'pg_tide internal: brings tide.pipeline_definition up to date with the pipelines.';

-- Re-create every restored definition the caller may restore, each in a transaction of its own
-- (a replication slot is made before any write of its transaction). One that fails is a WARNING
-- with its reason; the others go on. CALL it outside a transaction block.
CREATE PROCEDURE tide.restore_pipelines()
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    restored integer := 0;
    failed integer := 0;
BEGIN
    FOR r IN SELECT name FROM tide.restorable_pipelines() LOOP
        BEGIN
            PERFORM tide.restore_pipeline(r.name);
            restored := restored OPERATOR(pg_catalog.+) 1;
        EXCEPTION WHEN OTHERS THEN
            failed := failed OPERATOR(pg_catalog.+) 1;
            RAISE WARNING 'pipeline "%" was not restored: %', r.name, SQLERRM;
        END;
        COMMIT;
    END LOOP;
    RAISE NOTICE 'pg_tide: % pipeline(s) restored, % failed', restored, failed;
END
$$;
COMMENT ON PROCEDURE tide.restore_pipelines() IS 'Re-creates every pipeline whose definition a restored dump holds and that the caller may restore, each in its own transaction (CALL it outside a transaction block); a failure is a WARNING and the rest go on.';

-- Nothing in pg_tide is for PUBLIC by default: grant what a role needs explicitly.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA tide FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA tide FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA tide FROM PUBLIC;

-- The outbox: a consumer reads the events of the pipelines it owns (or whose owning role it is
-- a member of), nothing else, and trims them with tide.trim_outbox (no role but pg_tide has
-- DELETE on it: that right would also let a role LOCK it and stop every outbox pipeline). Only
-- pg_tide's worker writes it.
ALTER TABLE tide.outbox ENABLE ROW LEVEL SECURITY;
CREATE POLICY outbox_owned_pipelines ON tide.outbox FOR SELECT
    USING (pipeline IN (SELECT tide._owned_pipelines()));

COMMENT ON TABLE tide.verification IS 'Runs of tide.verify and tide.repair per pipeline and table (counts, the repair''s backfill); read tide.verifications.';
COMMENT ON TABLE tide.verification_range IS 'The key ranges a tide.verify run found differing, with their counts and kinds.';
COMMENT ON TABLE tide.chunk IS 'The last 1000 chunks of each backfill (key range, watermarks, rows read, dropped and emitted); read tide.chunks.';

-- COMMENT ON FUNCTION for the SQL API (README, SQL API, says more), by name: every overload of a
-- name gets its comment, so a signature that grows an argument keeps it.
DO $comments$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT p.oid::regprocedure AS f, c.comment
          FROM pg_catalog.pg_proc p
          JOIN (VALUES
            ('version', 'The version of the pg_tide library.'),
            ('check', 'Checks that this server can run pipelines (pg_tide preloaded, wal_level = logical, the database allowed, its encoding); an ERROR with a hint otherwise.'),
            ('create_pipeline', 'Creates a pipeline: its replication slot, its target (outbox, table, postgres, kafka) and options; its worker starts after commit. Must run before any write in its transaction.'),
            ('drop_pipeline', 'Stops the pipeline''s worker, drops its slot, forgets its tables and deletes its outbox events. Refused inside a transaction block (the slot''s drop cannot be rolled back).'),
            ('alter_pipeline', 'Renames a pipeline or changes the options that can change without a new slot (the keys given replace the stored ones; null resets one).'),
            ('pause_pipeline', 'Stops applying; the slot keeps the changes until tide.resume_pipeline. A paused pipeline is a NOTICE.'),
            ('resume_pipeline', 'Resumes a paused pipeline where it stopped. A pipeline not paused is a NOTICE.'),
            ('claim_target', 'Makes this server the writer of the pipeline''s remote PostgreSQL target at once, whatever server owned it (the target''s epoch moves on, so that server''s pipeline writes nothing more there and pauses); returns the new epoch.'),
            ('skip_transaction', 'As ALTER SUBSCRIPTION ... SKIP: the source transaction committed at this LSN is not applied (pg_tide''s own rows in it are still followed).'),
            ('wait_for_pipeline', 'True once everything committed before the call has been applied (with the re-reads of tables rewritten before it); false on timeout.'),
            ('add_table', 'Starts capturing a table at this point of the stream and queues the backfill of its existing rows (unless backfill => false); optional row filter, column list and column masks.'),
            ('add_tables_in_schema', 'Adds every table of a schema that the pipeline does not capture yet, as tide.add_table does each; follow => true also captures tables created there later. Returns how many were added.'),
            ('alter_table', 'Changes a captured table''s row filter, column list or column masks (NULL: unchanged; clear_row_filter, clear_columns, clear_masks: every row, every column, no mask) from the commit of the calling transaction on, announced there by a schema event; the table is then read again under it.'),
            ('stop_following_schema', 'Ends a follow of add_tables_in_schema(..., follow => true); the tables already captured stay.'),
            ('remove_table', 'Stops capturing a table at this point of the stream (a dropped table by its OID or former name).'),
            ('start_backfill', 'Starts (or re-seeds, as a new generation) the watermark backfill of one table, optionally limited by a condition; returns its id.'),
            ('pause_backfill', 'Pauses the active backfill of a table (the stream keeps running).'),
            ('resume_backfill', 'Resumes a paused backfill from the chunk after the last one emitted.'),
            ('cancel_backfill', 'Cancels the active backfill of a table.'),
            ('alter_backfill', 'Changes the chunk size and the throttle (rows per second) of an active backfill; the next chunk uses them.'),
            ('wait_for_backfill', 'True once the latest backfill of the table is done and applied; false on timeout.'),
            ('verify', 'Compares a table target with its source range by range (and sampled rows column by column); one row per difference, then a summary.'),
            ('repair', 'Verifies, then re-seeds the differing ranges through the watermark backfill and deletes target rows whose key is gone at the source.'),
            ('create_consumer', 'Registers a named consumer of an outbox pipeline (start: earliest or latest) and returns its committed position.'),
            ('drop_consumer', 'Forgets a consumer; the events it had not committed are no longer kept for it.'),
            ('commit_consumer', 'Commits a consumer''s position (forward only), in the caller''s transaction.'),
            ('seek_consumer', 'Moves a consumer''s position anywhere between just before the oldest event still kept and the newest.'),
            ('trim_outbox', 'Deletes the pipeline''s outbox events up to an id and returns how many (for a consumer that keeps its own position).'),
            ('mask_salt', 'The secret salt of the pipeline''s hash masks, for its owner and superusers only.'),
            ('restore_pipeline', 'Re-creates a pipeline from the definition a restored pg_dump holds (tide.pipeline_definition), as its owner: its tables, filters, columns, masks and followed schemas, every table backfilled anew.'),
            ('restorable_pipelines', 'The pipeline definitions a restored pg_dump holds that have no pipeline yet and that the caller may restore.'),
            ('rotate_mask_salt', 'Replaces the salt of the pipeline''s hash masks; rows already at a target keep the old hash until written again.')
          ) AS c(name, comment) ON c.name = p.proname
         WHERE p.pronamespace = 'tide'::regnamespace
    LOOP
        EXECUTE format('COMMENT ON FUNCTION %s IS %L', r.f, r.comment);
    END LOOP;
END
$comments$;

-- The one documented grant: GRANT tide_admin TO <role>. Members may create pipelines, use the
-- whole API on the pipelines they own, read the views (filtered to those pipelines; every view
-- is a security_barrier, so a function in a viewer's WHERE clause never sees the rows filtered
-- out) and read their pipelines' outbox events. pg_tide's own tables stay out of reach: the API
-- writes them as pg_tide, after checking the caller. (A role outlives DROP EXTENSION.)
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'tide_admin') THEN
        CREATE ROLE tide_admin NOLOGIN;
    END IF;
END
$$;
COMMENT ON ROLE tide_admin IS 'pg_tide: members may create and run pg_tide pipelines (see the pg_tide README, Security).';
GRANT USAGE ON SCHEMA tide TO tide_admin;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA tide TO tide_admin;
GRANT SELECT ON tide.pipelines, tide.tables, tide.backfills, tide.chunks, tide.verifications, tide.readiness, tide.consumers, tide.outbox_retention, tide.skipped_transactions, tide.followed_schemas, tide.skipped_tables TO tide_admin;
-- Only an event trigger runs it (and it refuses any other call).
REVOKE EXECUTE ON FUNCTION tide._follow_tables() FROM tide_admin;
-- The launcher's (pipeline definitions for pg_dump).
REVOKE EXECUTE ON FUNCTION tide._definition(text), tide._save_definitions() FROM tide_admin;
-- A procedure is not among ALL FUNCTIONS: PUBLIC had EXECUTE on it.
REVOKE ALL ON PROCEDURE tide.restore_pipelines() FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE tide.restore_pipelines() TO tide_admin;
GRANT SELECT ON tide.outbox TO tide_admin;
-- Used by the outbox's row security for any reader; it only lists the caller's own pipelines.
GRANT EXECUTE ON FUNCTION tide._owned_pipelines() TO PUBLIC;
