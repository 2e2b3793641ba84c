-- A local table target (target 'table'): add_table creates the target table with the source's
-- columns and key, the backfill and the stream converge it, schema changes propagate, and an
-- existing target of another shape is refused with each difference listed.
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/table_target.out.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
SELECT tide.create_pipeline('copy', 'table', '{"schema": "replica"}');
CREATE TABLE public.accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2), opened date, tags text[]);
INSERT INTO public.accounts VALUES (1, 'ann', 10.00, '2024-01-02', '{a,b}'), (2, 'bob', NULL, NULL, NULL);
SELECT tide.add_table('copy', 'accounts');
SELECT tide.wait_for_backfill('accounts', 'copy', '60 seconds') AS backfilled;
-- The target: same columns, types and key, owned by the pipeline's owner.
SELECT a.attname AS column, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull AS not_null
  FROM pg_attribute a WHERE a.attrelid = 'replica.accounts'::regclass AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum;
SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'replica.accounts'::regclass;
SELECT relname, relowner::regrole AS owner FROM pg_class WHERE relnamespace = 'replica'::regnamespace AND relkind = 'r';
SELECT * FROM replica.accounts ORDER BY id;
SELECT pipeline, relation, state, key_columns FROM tide.tables ORDER BY relation;
-- Changes: insert, update, delete, in one transaction and alone.
BEGIN;
INSERT INTO public.accounts VALUES (3, 'cy', 3.33, '2024-03-03', '{}');
UPDATE public.accounts SET balance = 20.00, tags = array_append(tags, 'c') WHERE id = 1;
COMMIT;
DELETE FROM public.accounts WHERE id = 2;
UPDATE public.accounts SET id = 4 WHERE id = 3;
SELECT tide.wait_for_pipeline('copy', '60 seconds') AS caught_up;
SELECT * FROM replica.accounts ORDER BY id;
SELECT (SELECT count(*) FROM (SELECT * FROM public.accounts EXCEPT SELECT * FROM replica.accounts) d) AS only_at_source,
       (SELECT count(*) FROM (SELECT * FROM replica.accounts EXCEPT SELECT * FROM public.accounts) d) AS only_at_target;
-- A schema change ('propagate', the default): the column is added at the target, with its value.
ALTER TABLE public.accounts ADD COLUMN status text DEFAULT 'open';
ALTER TABLE public.accounts RENAME COLUMN owner TO holder;
INSERT INTO public.accounts (id, holder) VALUES (5, 'dee');
SELECT tide.wait_for_pipeline('copy', '60 seconds') AS caught_up;
SELECT a.attname AS column, format_type(a.atttypid, a.atttypmod) AS type
  FROM pg_attribute a WHERE a.attrelid = 'replica.accounts'::regclass AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum;
SELECT * FROM replica.accounts ORDER BY id;
-- TRUNCATE empties the target.
TRUNCATE public.accounts;
SELECT tide.wait_for_pipeline('copy', '60 seconds') AS caught_up;
SELECT count(*) AS target_rows FROM replica.accounts;
-- An existing target table must match (42P16, the differences in the DETAIL). Here: key type
-- bigint for int, column a int for text, b missing, c only at the target.
CREATE TABLE public.other (id int PRIMARY KEY, a text, b int);
CREATE TABLE replica.other (id bigint PRIMARY KEY, a int, c int);
SELECT tide.add_table('copy', 'other', backfill => false);
-- A target that matches is used as it is.
DROP TABLE replica.other;
CREATE TABLE replica.other (id int PRIMARY KEY, a text, b int);
SELECT tide.add_table('copy', 'other', backfill => false);
SELECT name, state, tables, last_error FROM tide.pipelines;
SELECT tide.drop_pipeline('copy');
-- Dropping the pipeline keeps the target tables.
SELECT relname FROM pg_class WHERE relnamespace = 'replica'::regnamespace AND relkind = 'r' ORDER BY 1;
