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
COMMENT ON FUNCTION tide._schema_marker() IS 'pg_tide internal: the event trigger that writes a schema marker when an ALTER TABLE changes a captured table''s columns or key, and refuses a replica identity other than FULL for a table captured without a key.';
