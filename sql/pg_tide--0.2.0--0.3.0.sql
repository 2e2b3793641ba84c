-- pg_tide 0.2.0 -> 0.3.0 (ALTER EXTENSION pg_tide UPDATE).
--
-- Install the 0.3.0 library first and restart the server: the 0.3.0 library runs no pipeline
-- and its functions refuse to act until this script has run (tide.check() says so), and the
-- pipelines resume by themselves once it commits. The objects below are the same as a fresh
-- install of 0.3.0 makes (pg_test/tests/upgrade.rs compares the two catalogs; the `upgrade`
-- golden file runs 0.1.0 -> 0.2.0 -> 0.3.0).
\echo Use "ALTER EXTENSION pg_tide UPDATE" to load this file. \quit

-- Issue 45: a table captured through a schema's follow leaves the pipeline when it leaves the
-- schema (tide.pipeline_table.followed_nspid; NULL for the tables captured before, which stay).
ALTER TABLE tide.pipeline_table ADD COLUMN followed_nspid oid;

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

-- The launcher's (pipeline definitions for pg_dump).
REVOKE ALL ON FUNCTION tide._definition(text), tide._save_definitions() FROM PUBLIC;
REVOKE ALL ON PROCEDURE tide.restore_pipelines() FROM PUBLIC;
GRANT EXECUTE ON PROCEDURE tide.restore_pipelines() TO tide_admin;

-- Re-create a pipeline from its restored definition (api/restore.rs).
CREATE FUNCTION tide."restore_pipeline"(
	"name" TEXT,
	"owner" TEXT DEFAULT NULL
) RETURNS void
LANGUAGE c
AS 'MODULE_PATHNAME', 'restore_pipeline_wrapper';
REVOKE ALL ON FUNCTION tide.restore_pipeline(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tide.restore_pipeline(text, text) TO tide_admin;
COMMENT ON FUNCTION tide.restore_pipeline(text, text) IS 'Re-creates a pipeline from the definition a restored pg_dump holds (tide.pipeline_definition), as its owner: its tables, filters, columns, masks and followed schemas, every table backfilled anew.';

CREATE FUNCTION tide."restorable_pipelines"() RETURNS TABLE (
	"name" TEXT,
	"owner" TEXT,
	"saved_at" timestamp with time zone
)
STRICT
LANGUAGE c
AS 'MODULE_PATHNAME', 'restorable_pipelines_wrapper';
REVOKE ALL ON FUNCTION tide.restorable_pipelines() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION tide.restorable_pipelines() TO tide_admin;
COMMENT ON FUNCTION tide.restorable_pipelines() IS 'The pipeline definitions a restored pg_dump holds that have no pipeline yet and that the caller may restore.';

-- The definitions of the pipelines there are now (the launcher keeps them up to date after).
SELECT tide._save_definitions();
