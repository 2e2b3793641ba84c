//! The SQL objects of the extension that are not functions: catalog tables, the outbox, views
//! and privileges. The Rust code that reads and writes these tables lives in `catalog`.

use pgrx::extension_sql;

extension_sql!(
    r#"
-- Pipelines: one logical slot, one worker, one target each.
CREATE TABLE tide.pipeline (
    name         text PRIMARY KEY,
    target       text NOT NULL CHECK (target IN ('outbox')),
    options      jsonb NOT NULL DEFAULT '{}',
    slot_name    name NOT NULL UNIQUE,
    enabled      boolean NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Written by the worker in the same transaction as the events it applies:
    -- end LSN and commit time of the last source transaction applied to the target.
    applied_lsn  pg_lsn,
    applied_commit_time timestamptz,
    -- Written by the worker when an iteration fails (and cleared when one succeeds).
    last_error   text,
    last_error_sqlstate text,
    last_error_at timestamptz,
    remedy       text
);
COMMENT ON TABLE tide.pipeline IS 'pg_tide pipelines (one slot, one worker, one target). Use tide.create_pipeline/tide.drop_pipeline; read tide.pipelines.';

-- Tables captured by a pipeline.
CREATE TABLE tide.pipeline_table (
    pipeline     text NOT NULL REFERENCES tide.pipeline(name) ON DELETE CASCADE,
    relid        oid NOT NULL,
    relation     text NOT NULL,
    key_columns  text[] NOT NULL,
    added_at     timestamptz NOT NULL DEFAULT now(),
    -- Commit LSN of the add_table marker, set by the worker when it reaches it in the stream.
    -- Changes committed before it are not delivered; every change committed after it is.
    added_lsn    pg_lsn,
    PRIMARY KEY (pipeline, relid)
);
COMMENT ON TABLE tide.pipeline_table IS 'Tables captured by each pipeline. Use tide.add_table/tide.remove_table.';

-- The outbox target: one row per change, transactions contiguous and in commit order.
CREATE TABLE tide.outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline     text NOT NULL,
    commit_lsn   pg_lsn NOT NULL,
    xid          bigint NOT NULL,
    commit_time  timestamptz NOT NULL,
    position     integer NOT NULL,
    relation     text NOT NULL,
    op           text NOT NULL CHECK (op IN ('insert', 'update', 'delete', 'truncate', 'read')),
    key          jsonb,
    "row"        jsonb,
    unchanged    text[],
    backfill_id  bigint,
    chunk        bigint
);
CREATE INDEX outbox_pipeline_id ON tide.outbox (pipeline, id);
COMMENT ON TABLE tide.outbox IS 'Change events written by pg_tide outbox pipelines; see README "Outbox format".';
COMMENT ON COLUMN tide.outbox.commit_lsn IS 'LSN of the source commit record; (commit_lsn, position) identifies an event, use it to de-duplicate.';
COMMENT ON COLUMN tide.outbox.position IS 'Position of the event within its source transaction, from 1.';
COMMENT ON COLUMN tide.outbox.key IS 'The key columns (replica identity / primary key) of the row, as jsonb.';
COMMENT ON COLUMN tide.outbox."row" IS 'The new row as jsonb (NULL for delete and truncate); jsonb_populate_record(NULL::source, row) rebuilds it. Columns listed in unchanged are absent.';
COMMENT ON COLUMN tide.outbox.unchanged IS 'Columns whose value did not change and was not sent (unchanged TOAST); keep the value you have.';
"#,
    name = "catalog",
    bootstrap
);

extension_sql!(
    r#"
CREATE VIEW tide.pipelines AS
SELECT p.name,
       p.target,
       CASE WHEN NOT p.enabled AND w.pid IS NOT NULL THEN 'paused'
            WHEN w.pid IS NULL THEN 'stopped'
            ELSE w.state END                                          AS state,
       p.enabled,
       w.pid                                                          AS worker_pid,
       p.slot_name,
       s.confirmed_flush_lsn                                          AS confirmed_lsn,
       p.applied_lsn,
       pg_current_wal_lsn()                                           AS current_lsn,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint AS lag_bytes,
       CASE WHEN w.pid IS NULL OR w.drained OR p.applied_commit_time IS NULL THEN 0
            ELSE greatest(0, extract(epoch FROM now() - p.applied_commit_time)) END::float8
                                                                      AS apply_lag_seconds,
       p.applied_commit_time                                          AS last_commit_time,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint   AS wal_retained_bytes,
       s.wal_status,
       coalesce(w.events, 0)                                          AS events_applied,
       coalesce(w.txns, 0)                                            AS transactions_applied,
       w.started_at                                                   AS worker_started_at,
       (SELECT count(*) FROM tide.pipeline_table t WHERE t.pipeline = p.name) AS tables,
       p.last_error,
       p.last_error_sqlstate,
       p.last_error_at,
       p.remedy,
       p.created_at
  FROM tide.pipeline p
  LEFT JOIN pg_replication_slots s ON s.slot_name = p.slot_name
  LEFT JOIN tide._worker_status() w ON w.pipeline = p.name;
COMMENT ON VIEW tide.pipelines IS 'One row per pipeline: is it healthy, how far behind, and why not.';

CREATE VIEW tide.tables AS
SELECT t.pipeline, t.relation, t.relid::regclass AS source, t.key_columns, t.added_at, t.added_lsn,
       t.added_lsn IS NOT NULL AS capturing
  FROM tide.pipeline_table t;
COMMENT ON VIEW tide.tables IS 'Tables captured by each pipeline; capturing is true once the worker reached the add_table point in the stream.';

-- Nothing in pg_tide is for PUBLIC by default: grant what a role needs explicitly.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA tide FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA tide FROM PUBLIC;
"#,
    name = "views",
    finalize
);
