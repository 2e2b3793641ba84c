-- Pipelines: one logical slot, one worker, one target each.
CREATE TABLE tide.pipeline (
    name         text PRIMARY KEY,
    target       text NOT NULL CHECK (target IN ('outbox', 'table', 'postgres', 'kafka')),
    options      jsonb NOT NULL DEFAULT '{}',
    owner        name NOT NULL DEFAULT current_user,
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
    remedy       text,
    -- A lost slot (README, Concepts > Lost slots). Written by the worker only: 'slot lost' when it
    -- finds its slot invalidated, missing or not pg_tide's (with when and why), 'resyncing' once
    -- a new slot exists and every table is queued to be read again, NULL again when those
    -- backfills are done (slot_lost_at and slot_lost_reason stay, as the last loss).
    resync       text CHECK (resync IN ('slot lost', 'resyncing')),
    slot_lost_at timestamptz,
    slot_lost_reason text,
    -- Written by the worker: its slot's confirmed position when it found the pipeline paused
    -- (NULL again once it runs). A slot further on at resume was consumed, advanced or
    -- re-created by someone else meanwhile: it is lost.
    paused_lsn   pg_lsn,
    -- Written by the worker with the error: the iterations that failed in a row (0 again after
    -- one succeeds).
    attempts     integer NOT NULL DEFAULT 0
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
    -- Set by tide.remove_table; the worker deletes the row when it reaches the remove marker.
    removing     boolean NOT NULL DEFAULT false,
    -- Table targets: where the table's changes go (NULL for the outbox).
    target_schema text,
    target_name   text,
    -- The table's shape (tide._shape) as of the last schema marker or of add_table, kept by the
    -- event trigger tide._schema_marker in the DDL's own transaction, so each schema change is
    -- described against the shape before it (NULL only for a table dropped before 0.2.0).
    shape         jsonb,
    -- Partitioned tables: the partitions holding rows whose rows were read or queued to be read
    -- (set by add_table; the worker queues a backfill for each partition attached since and
    -- updates it). NULL for other tables.
    partitions   oid[],
    -- tide.add_table's row_filter: one boolean expression on the table's columns; only the rows
    -- it passes are delivered, by the stream (the output plugin) and every backfill (its WHERE).
    row_filter   text,
    -- tide.add_table's columns: the attribute numbers of the columns delivered (the key always
    -- among them), in attribute order; NULL: every column. By number, so a rename follows.
    columns      int2[],
    -- Set by tide.alter_table, cleared by the worker at its 'alter_table' marker (or by a resync
    -- after a lost slot): the shaping in effect before it, {"row_filter": ..., "columns": [attnum,
    -- ...], "masks": {...}, "xid": ...} (NULLs: every row, every column, no mask). While set, the
    -- stream and the backfills still shape the table this way; row_filter, columns and masks
    -- already hold the new shaping (the event trigger describes later ALTER TABLEs with them).
    shaping_before jsonb,
    -- tide.add_table's masks: a JSON object of attribute number -> mask ("hash", "null",
    -- {"truncate": N}, {"constant": "text"}); NULL: no column is masked. By number, so a rename
    -- follows. Applied by the output plugin and the chunk reader (tide_core::mask).
    masks        jsonb,
    -- The schema through whose follow (tide.add_tables_in_schema(..., follow => true), or the
    -- event trigger tide_followed_schemas) the table is captured; NULL for a table added with
    -- tide.add_table. While the pipeline follows that schema, a table moved out of it (ALTER
    -- TABLE ... SET SCHEMA) into a schema it does not follow leaves the pipeline there, as a
    -- publication's FOR TABLES IN SCHEMA lets it go.
    followed_nspid oid,
    PRIMARY KEY (pipeline, relid)
);
COMMENT ON TABLE tide.pipeline_table IS 'Tables captured by each pipeline. Use tide.add_table/tide.remove_table.';

-- The salt of each pipeline's hash masks: made when its first masked table is added, replaced by
-- tide.rotate_mask_salt. No role but superusers reads this table; the pipeline's owner reads its
-- salt with tide.mask_salt.
CREATE TABLE tide.mask_salt (
    pipeline     text PRIMARY KEY REFERENCES tide.pipeline(name) ON DELETE CASCADE,
    salt         bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    rotated_at   timestamptz
);
COMMENT ON TABLE tide.mask_salt IS 'The secret salt of each pipeline''s hash masks (superusers only; the owner: tide.mask_salt(pipeline)).';

-- The outbox target: one row per change, transactions contiguous and in commit order.
CREATE TABLE tide.outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline     text NOT NULL,
    commit_lsn   pg_lsn NOT NULL,
    xid          bigint NOT NULL,
    commit_time  timestamptz NOT NULL,
    position     integer NOT NULL,
    relation     text NOT NULL,
    op           text NOT NULL CHECK (op IN ('insert', 'update', 'delete', 'truncate', 'read', 'schema', 'resync')),
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
COMMENT ON COLUMN tide.outbox."row" IS 'The new row as jsonb (NULL for delete and truncate); jsonb_populate_record(NULL::source, row) rebuilds it. Columns listed in unchanged are absent. For op schema: the schema change (columns, key, added, dropped, changed, renamed, rewrite; see README "Outbox format").';
COMMENT ON COLUMN tide.outbox.unchanged IS 'Columns whose value did not change and was not sent (unchanged TOAST); keep the value you have.';

-- The signal table: the worker's watermark writes. One row per pipeline, updated in place, so it
-- stays one row whatever the number of chunks. Written only by pipeline workers.
CREATE TABLE tide.signal (
    pipeline     text PRIMARY KEY,
    watermark    bigint NOT NULL,       -- unique per watermark pair, never reused (tide.watermark_seq)
    kind         text NOT NULL CHECK (kind IN ('low', 'high')),
    backfill_id  bigint NOT NULL,
    chunk        bigint NOT NULL,
    written_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE tide.signal IS 'Watermark writes of the backfill (low/high per chunk). Written only by pg_tide workers.';
CREATE SEQUENCE tide.watermark_seq;

-- Markers: add_table/remove_table write a row here (and delete it in the same transaction), so
-- the worker meets the marker exactly at that transaction's commit position in the stream; the
-- event trigger tide_schema_changes writes a 'schema' marker (with the change in payload) in the
-- transaction of an ALTER TABLE that changed a captured table's columns or key, and the event
-- trigger tide_dropped_tables a 'remove_table' marker (payload: the relation and
-- "table_dropped": true) in the transaction that dropped a captured table. Only pg_tide
-- can write this table, so a marker cannot be forged (a logical message could be: any role may
-- call pg_logical_emit_message).
CREATE TABLE tide.marker (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline  text NOT NULL,
    op        text NOT NULL CHECK (op IN ('add_table', 'remove_table', 'schema', 'alter_table')),
    relid     oid NOT NULL,
    payload   jsonb
);
COMMENT ON TABLE tide.marker IS 'add_table/remove_table/schema/alter_table markers, decoded by the worker at their commit position. Written only by pg_tide.';

-- Backfills: one row per (re-)seed of a table for a pipeline.
CREATE TABLE tide.backfill (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline        text NOT NULL REFERENCES tide.pipeline(name) ON DELETE CASCADE,
    relid           oid NOT NULL,
    relation        text NOT NULL,
    key_columns     text[] NOT NULL,
    owner           name NOT NULL,          -- the pipeline's owner: the chunk SELECTs run as this role
    -- queued, running, paused, done, cancelled, failed. Set by the SQL API (queued, paused,
    -- cancelled, running on resume) and by the worker (running, done, failed).
    state           text NOT NULL DEFAULT 'queued'
                    CHECK (state IN ('queued', 'running', 'paused', 'done', 'cancelled', 'failed')),
    generation      integer NOT NULL,
    chunk_size      integer NOT NULL CHECK (chunk_size > 0),
    rows_per_second integer CHECK (rows_per_second > 0),
    condition       text,
    -- Durable progress, written by the worker in the same transaction as the chunk's rows.
    chunks_done     bigint NOT NULL DEFAULT 0,
    rows_read       bigint NOT NULL DEFAULT 0,
    rows_dropped    bigint NOT NULL DEFAULT 0,
    rows_emitted    bigint NOT NULL DEFAULT 0,
    last_key        text[],                 -- key (text output per key column) of the last row emitted
    read_complete   boolean NOT NULL DEFAULT false,  -- the last chunk has been read
    estimated_rows  bigint,
    created_at      timestamptz NOT NULL DEFAULT now(),
    started_at      timestamptz,
    finished_at     timestamptz,
    finished_lsn    pg_lsn,                 -- commit LSN of the last chunk's high watermark
    -- Repairs (tide.repair): keys (text per key column) to delete at a high watermark when the
    -- chunk covering them shows they no longer exist at the source.
    repair_deletes  jsonb,
    error           text,
    remedy          text,
    -- Set by the worker when a table-rewriting ALTER TABLE committed at this position makes the
    -- backfill carry changes of the stream (the rewritten values, which no row event delivers):
    -- tide.wait_for_pipeline waits for it as for the stream itself.
    required_lsn    pg_lsn,
    -- Set by tide.add_table when the target table already held rows: rows the source does not
    -- have may stay there, so tide.readiness waits for a verification that finds none.
    target_held_rows boolean NOT NULL DEFAULT false,
    -- Queued by the worker when the pipeline's slot was lost (tide.pipeline.resync): the whole
    -- table is read again, and at each high watermark a table target (local, or remote:
    -- 'postgres') also loses the rows of the chunk's key range that the source no longer has.
    resync          boolean NOT NULL DEFAULT false,
    -- Set by the worker with error: the SQLSTATE of a failure (NULL for a reason to wait) and
    -- when it happened; attempts: the writes of the backfill's next chunk that failed (a chunk
    -- the target refuses fails the backfill; one that fails for a passing reason, such as the
    -- target being unreachable, is tried again). Cleared when a chunk is written.
    error_sqlstate  text,
    error_at        timestamptz,
    attempts        integer NOT NULL DEFAULT 0,
    -- A table without a key is copied whole at one point of the stream (README, Tables without
    -- a key): the copy's snapshot (pg_current_snapshot()) and the WAL insert position read after
    -- it. Written by the worker with the copy; the stream skips the table's changes of the
    -- transactions the snapshot sees that commit before copy_until (they are in the copy).
    copy_snapshot   text,
    copy_until      pg_lsn
);
CREATE UNIQUE INDEX backfill_one_active ON tide.backfill (pipeline, relid)
    WHERE state IN ('queued', 'running', 'paused');
COMMENT ON TABLE tide.backfill IS 'Backfills (watermark snapshots) per pipeline and table; read tide.backfills.';

-- Verifications (tide.verify, tide.repair): one row per run, and the ranges that differed.
CREATE TABLE tide.verification (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline           text NOT NULL REFERENCES tide.pipeline(name) ON DELETE CASCADE,
    relid              oid NOT NULL,
    relation           text NOT NULL,
    started_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at        timestamptz,
    ranges_checked     integer,
    ranges_differing   integer,
    source_rows        bigint,
    target_rows        bigint,
    missing            bigint,
    extra              bigint,
    changed            bigint,
    repair_backfill_id bigint
);
CREATE TABLE tide.verification_range (
    verification_id bigint NOT NULL REFERENCES tide.verification(id) ON DELETE CASCADE,
    range           integer NOT NULL,
    key_from        text[],
    key_to          text[],
    source_rows     bigint,
    target_rows     bigint,
    missing         bigint,
    extra           bigint,
    changed         bigint,
    kinds           text,
    extra_keys      jsonb,
    PRIMARY KEY (verification_id, range)
);

-- Recent chunks (bounded: the worker keeps the last 1000 per backfill).
CREATE TABLE tide.chunk (
    backfill_id   bigint NOT NULL REFERENCES tide.backfill(id) ON DELETE CASCADE,
    chunk         bigint NOT NULL,
    key_from      text[],
    key_to        text[],
    low_lsn       pg_lsn,
    high_lsn      pg_lsn,
    rows_read     integer NOT NULL,
    rows_dropped  integer NOT NULL,
    rows_emitted  integer NOT NULL,
    read_at       timestamptz NOT NULL,
    emitted_at    timestamptz NOT NULL DEFAULT now(),
    written_as    text CHECK (written_as IN ('events', 'bulk', 'upsert', 'copy')),
    PRIMARY KEY (backfill_id, chunk)
);

-- Named outbox consumers: each has a committed position in its pipeline's events (the id of
-- the last event it has processed; ids of one pipeline increase in its stream order). Written by
-- the SQL API only (tide.create_consumer, tide.commit_consumer, tide.seek_consumer,
-- tide.drop_consumer); read by the launcher's outbox retention.
CREATE TABLE tide.consumer (
    pipeline           text NOT NULL REFERENCES tide.pipeline(name) ON DELETE CASCADE,
    name               text NOT NULL,
    owner              name NOT NULL DEFAULT current_user,
    -- Every event of the pipeline with id <= committed_id has been processed.
    committed_id       bigint NOT NULL,
    -- (commit_lsn, position) of the event at committed_id when it was committed (kept here: the
    -- event itself may be pruned since).
    committed_lsn      pg_lsn,
    committed_position integer,
    committed_at       timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, name)
);
COMMENT ON TABLE tide.consumer IS 'Named outbox consumers and their committed positions. Use tide.create_consumer/tide.commit_consumer; read tide.consumers.';

-- What the outbox retention has deleted per pipeline: written by the launcher in the same
-- transaction as each batch it deletes.
CREATE TABLE tide.outbox_prune (
    pipeline      text PRIMARY KEY REFERENCES tide.pipeline(name) ON DELETE CASCADE,
    events        bigint NOT NULL,
    transactions  bigint NOT NULL,
    last_id       bigint NOT NULL,
    last_reason   text NOT NULL CHECK (last_reason IN ('consumers', 'age')),
    last_at       timestamptz NOT NULL
);
COMMENT ON TABLE tide.outbox_prune IS 'Outbox events deleted by the retention, per pipeline (events, delete transactions, the last one). Written only by the pg_tide launcher; read tide.outbox_retention.';

-- Source transactions a pipeline is told to skip (tide.skip_transaction), by commit LSN, with
-- who asked and when; the worker sets skipped_at (and the xid) in the iteration that passes the
-- transaction without applying it. Kept afterwards: the history of what never reached the target.
CREATE TABLE tide.skipped_transaction (
    pipeline      text NOT NULL REFERENCES tide.pipeline(name) ON DELETE CASCADE,
    lsn           pg_lsn NOT NULL,
    requested_by  name NOT NULL,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    skipped_at    timestamptz,
    xid           bigint,
    PRIMARY KEY (pipeline, lsn)
);
COMMENT ON TABLE tide.skipped_transaction IS 'Source transactions a pipeline skips (tide.skip_transaction): commit LSN, who asked, when, when the worker skipped it. Read tide.skipped_transactions.';

-- Schemas a pipeline follows (tide.add_tables_in_schema(..., follow => true), like a
-- publication's FOR TABLES IN SCHEMA): a table created in one later (or moved into it, or made
-- capturable there by an ALTER TABLE) is captured in that DDL's own transaction by the event
-- trigger tide_followed_schemas, as tide.add_table would capture it for the pipeline's owner,
-- with the backfill choice recorded here. By schema OID (a renamed schema stays followed); DROP
-- SCHEMA (tide._drop_marker), tide.stop_following_schema and drop_pipeline delete the row.
CREATE TABLE tide.followed_schema (
    pipeline      text NOT NULL REFERENCES tide.pipeline(name) ON DELETE CASCADE,
    nspid         oid NOT NULL,
    backfill      boolean NOT NULL,
    requested_by  name NOT NULL,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, nspid)
);
COMMENT ON TABLE tide.followed_schema IS 'Schemas whose later tables a pipeline captures (tide.add_tables_in_schema(..., follow => true)): backfill choice, who asked, when. Read tide.followed_schemas.';

-- Tables of a followed schema the pipeline does not capture, and why: 'skipped' (the follow, or
-- the DDL that created or changed the table, could not capture it: the error it met, and the
-- role whose call or DDL met it; the next ALTER TABLE of it tries again), or 'removed'
-- (tide.remove_table took it out: the follow does not capture it again). Deleted when the table
-- is captured (tide.add_table), dropped, or its schema no longer followed.
CREATE TABLE tide.follow_skip (
    pipeline   text NOT NULL,
    nspid      oid NOT NULL,
    relid      oid NOT NULL,
    relation   text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('skipped', 'removed')),
    reason     text NOT NULL,
    hint       text,
    sqlstate   text,
    by_role    name NOT NULL,
    at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, relid)
    -- No foreign key to tide.followed_schema (or tide.pipeline): its check would make a DDL
    -- that records a skip wait for any transaction holding the followed schema's row (a
    -- tide.stop_following_schema left open: issue 44). The rows go with their schema's row
    -- (tide.stop_following_schema, DROP SCHEMA) and their pipeline (tide.drop_pipeline), and
    -- the views show only those of schemas still followed.
);
COMMENT ON TABLE tide.follow_skip IS 'Tables of followed schemas a pipeline does not capture (skipped, with the reason; or removed with tide.remove_table). Read tide.skipped_tables.';
