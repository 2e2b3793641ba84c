-- Captured tables: tide.add_table and tide.remove_table, as tide.tables shows them (key
-- columns; state pending -> capturing once the worker reaches the add_table marker; removing
-- until it reaches the remove_table marker). wait_for_pipeline makes each state deterministic.
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/tables.out.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
SELECT tide.create_pipeline('p');
CREATE TABLE public.orders (id int PRIMARY KEY, customer text, total numeric(10,2));
CREATE TABLE public."Order Lines" (order_id int, line int, sku text, PRIMARY KEY (order_id, line));
CREATE TABLE public.by_index (code text NOT NULL, v int);
CREATE UNIQUE INDEX by_index_code ON public.by_index (code);
ALTER TABLE public.by_index REPLICA IDENTITY USING INDEX by_index_code;
CREATE TABLE public.parted (id int PRIMARY KEY, v text) PARTITION BY RANGE (id);
CREATE TABLE public.parted_1 PARTITION OF public.parted FOR VALUES FROM (0) TO (100);
SELECT tide.add_table('p', 'public.orders', backfill => false);
SELECT tide.add_table('p', 'public."Order Lines"', backfill => false);
SELECT tide.add_table('p', 'by_index', backfill => false);
SELECT tide.add_table('p', 'parted', backfill => false);
SELECT tide.wait_for_pipeline('p', '60 seconds') AS caught_up;
SELECT pipeline, relation, source, key_columns, state, added_lsn IS NOT NULL AS has_added_lsn
  FROM tide.tables ORDER BY relation;
SELECT name, tables FROM tide.pipelines;
-- add_table and remove_table write marker rows (tide.marker); once the worker has reached them
-- they are gone.
SELECT pipeline, op, relid::regclass AS relation, payload FROM tide.marker ORDER BY id;

-- Inside add_table's own transaction the worker cannot have reached the marker: pending.
CREATE TABLE public.pending_t (id int PRIMARY KEY);
BEGIN;
SELECT tide.add_table('p', 'pending_t', backfill => false);
SELECT relation, state, added_lsn IS NULL AS no_added_lsn FROM tide.tables WHERE relation = 'public.pending_t';
COMMIT;
SELECT tide.wait_for_pipeline('p', '60 seconds') AS caught_up;
SELECT relation, state, added_lsn IS NULL AS no_added_lsn FROM tide.tables WHERE relation = 'public.pending_t';
-- Removing inside a transaction: removing until the worker reaches the remove_table marker.
BEGIN;
SELECT tide.remove_table('p', 'pending_t');
SELECT relation, state FROM tide.tables WHERE relation = 'public.pending_t';
COMMIT;

-- add_table with its default backfill queues one (the table is empty: nothing to read).
CREATE TABLE public.items (id bigint PRIMARY KEY, name text);
SELECT tide.add_table('p', 'items');
SELECT tide.wait_for_backfill('items', 'p', '60 seconds') AS backfilled;
SELECT pipeline, relation, state, rows_read, rows_emitted FROM tide.backfills ORDER BY id;

-- Removing: captured until the worker reaches the marker, then gone.
SELECT tide.remove_table('p', 'public."Order Lines"');
SELECT tide.remove_table('p', 'items');
SELECT tide.wait_for_pipeline('p', '60 seconds') AS caught_up;
SELECT relation, state FROM tide.tables ORDER BY relation;
-- Added again after removal.
SELECT tide.add_table('p', 'public."Order Lines"', backfill => false);
SELECT tide.wait_for_pipeline('p', '60 seconds') AS caught_up;
SELECT relation, key_columns, state FROM tide.tables ORDER BY relation;
-- Dropping a captured table (no remove_table first): what tide.tables shows afterwards.
DROP TABLE public.by_index;
SELECT tide.wait_for_pipeline('p', '60 seconds') AS caught_up;
SELECT relation, state, to_regclass(relation) IS NULL AS source_gone FROM tide.tables ORDER BY relation;
-- Following a schema: a table created there later is captured by its CREATE TABLE; one that
-- cannot be is skipped with a WARNING (the CREATE TABLE succeeds) and recorded.
CREATE SCHEMA shop;
SELECT tide.add_tables_in_schema('p', 'shop', backfill => false, follow => true) AS added;
SELECT pipeline, schema, backfill, tables, skipped FROM tide.followed_schemas;
CREATE TABLE shop.orders (id int PRIMARY KEY, v text);
CREATE TABLE shop.notes (line text);
SELECT tide.wait_for_pipeline('p', '60 seconds') AS caught_up;
SELECT relation, state FROM tide.tables WHERE relation LIKE 'shop.%' ORDER BY relation;
SELECT relation, kind, sqlstate, reason, hint FROM tide.skipped_tables;
-- Stopping (twice: a NOTICE); a table created afterwards is not captured.
SELECT tide.stop_following_schema('p', 'shop');
SELECT tide.stop_following_schema('p', 'shop');
CREATE TABLE shop.later (id int PRIMARY KEY);
SELECT relation FROM tide.tables WHERE relation LIKE 'shop.%' ORDER BY relation;
SELECT count(*) AS follows FROM tide.followed_schemas;
SELECT tide.drop_pipeline('p');
SELECT count(*) AS tables_left FROM tide.tables;
