-- pg_tide 0.1.0 -> 0.2.0 (ALTER EXTENSION pg_tide UPDATE).
--
-- Install the 0.2.0 library first and restart the server: the 0.2.0 library runs no pipeline
-- and its functions refuse to act until this script has run (tide.check() says so), and the
-- pipelines resume by themselves once it commits. The objects below are the same as a fresh
-- install of 0.2.0 makes (pg_test/tests/upgrade.rs compares the two catalogs).
\echo Use "ALTER EXTENSION pg_tide UPDATE" to load this file. \quit

-- Backfill progress when the table has no statistics (reltuples = -1 before the first ANALYZE):
-- estimate the rows as the planner does. The 0.2.0 worker refreshes tide.backfill.estimated_rows
-- with it after every chunk.
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
REVOKE ALL ON FUNCTION tide._estimate_rows(oid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tide._estimate_rows(oid) TO tide_admin;

-- fraction_done is 0 (not NULL) while a backfill with no estimate yet is active, and
-- estimated_time_left uses the speed so far until there are two chunks to measure.
CREATE OR REPLACE VIEW tide.backfills AS
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
       b.remedy
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

-- Partitioned tables are captured through their root: the partitions read so far.
ALTER TABLE tide.pipeline_table ADD COLUMN partitions oid[];
