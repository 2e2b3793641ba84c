-- The outbox target: the events of insert, update (also of the key), delete, truncate, a
-- schema change and a backfill, as tide.outbox holds them (README, Outbox format). Ids,
-- LSNs, xids and times are replaced: n numbers the events in id order, txn the source
-- transactions in commit order.
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/outbox.out.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
SELECT tide.create_pipeline('p');
CREATE TABLE public.orders (id int PRIMARY KEY, customer text, total numeric(10,2), paid boolean DEFAULT false, note text);
INSERT INTO public.orders VALUES (100, 'existing', 1.50, true, NULL), (101, 'existing too', 0, false, 'x');
SELECT tide.add_table('p', 'public.orders');
SELECT tide.wait_for_backfill('public.orders', 'p', '60 seconds') AS backfilled;
-- One transaction of three events, then one event per transaction.
BEGIN;
INSERT INTO public.orders VALUES (1, 'ann', 12.30, false, 'first');
INSERT INTO public.orders VALUES (2, 'bob', 99999999.99, true, NULL);
UPDATE public.orders SET total = total + 1 WHERE id = 1;
COMMIT;
UPDATE public.orders SET note = 'quote '' and "double" and \ backslash' WHERE id = 2;
UPDATE public.orders SET id = 3 WHERE id = 2;
DELETE FROM public.orders WHERE id = 1;
ALTER TABLE public.orders ADD COLUMN region text DEFAULT 'eu';
INSERT INTO public.orders (id, customer, total) VALUES (4, 'cy', -0.01);
TRUNCATE public.orders;
SELECT tide.wait_for_pipeline('p', '60 seconds') AS caught_up;

-- (The schema event's row is shown in full below.)
SELECT row_number() OVER (ORDER BY id) AS n,
       dense_rank() OVER (ORDER BY commit_lsn) AS txn, position, pipeline, relation, op, key,
       CASE WHEN op = 'schema' THEN '(below)' ELSE "row"::text END AS "row", unchanged,
       backfill_id IS NOT NULL AS from_backfill, chunk
  FROM tide.outbox ORDER BY id;
SELECT jsonb_pretty("row") AS schema_event FROM tide.outbox WHERE op = 'schema';
-- Each event's transaction: commit_lsn, xid and commit_time are set, and ids increase with them.
SELECT count(*) AS events, count(commit_lsn) AS with_lsn, count(xid) AS with_xid, count(commit_time) AS with_time,
       bool_and(position >= 1) AS positions_from_1
  FROM tide.outbox;
SELECT count(*) AS out_of_order
  FROM (SELECT commit_lsn, lag(commit_lsn) OVER (ORDER BY id) AS prev FROM tide.outbox) s WHERE commit_lsn < prev;
-- (commit_lsn, position) identifies an event.
SELECT count(*) = count(DISTINCT (commit_lsn, position)) AS unique_identity FROM tide.outbox;
-- A row rebuilds the source row with jsonb_populate_record.
SELECT r.* FROM tide.outbox o, jsonb_populate_record(NULL::public.orders, o."row") r
 WHERE o.op = 'insert' AND o.key = '{"id": 4}';
-- The outbox's columns.
SELECT a.attname AS column, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null,
       col_description(a.attrelid, a.attnum) IS NOT NULL AS has_comment
  FROM pg_attribute a WHERE a.attrelid = 'tide.outbox'::regclass AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum;
-- Dropping the pipeline deletes its events.
SELECT tide.drop_pipeline('p');
SELECT count(*) AS events_left FROM tide.outbox;
