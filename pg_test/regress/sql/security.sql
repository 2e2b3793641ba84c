-- Security (README, Security) as a transcript: a tide_admin member creates and runs its own
-- pipeline; a second member neither sees nor touches it; a role with no pg_tide rights can
-- call nothing. Errors show their SQLSTATE.
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/security.out.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
CREATE ROLE regress_alice IN ROLE tide_admin;
CREATE ROLE regress_bob IN ROLE tide_admin;
CREATE ROLE regress_nobody;
GRANT USAGE ON SCHEMA tide TO regress_nobody;
CREATE TABLE public.orders (id int PRIMARY KEY, v text);
CREATE TABLE public.secret (id int PRIMARY KEY, v text);
GRANT SELECT ON public.orders TO regress_alice;
INSERT INTO public.orders VALUES (1, 'one');

-- alice: a member needs no superuser and no REPLICATION.
SET ROLE regress_alice;
SELECT tide.create_pipeline('alice_p');
SELECT tide.add_table('alice_p', 'orders');
-- A table alice may not SELECT is refused.
SELECT tide.add_table('alice_p', 'secret');
SELECT tide.wait_for_backfill('orders', 'alice_p', '60 seconds') AS backfilled;
SELECT name, state FROM tide.pipelines;
SELECT relation, op, key FROM tide.outbox ORDER BY id;
-- Members read the outbox but may not delete from it (trim through tide.trim_outbox).
DELETE FROM tide.outbox;
SELECT tide.trim_outbox('alice_p', 0) AS trimmed;
RESET ROLE;
SELECT owner FROM tide.pipeline WHERE name = 'alice_p';

-- bob: another member sees none of alice's pipelines, tables, backfills or events.
SET ROLE regress_bob;
SELECT count(*) AS pipelines FROM tide.pipelines;
SELECT count(*) AS tables FROM tide.tables;
SELECT count(*) AS backfills FROM tide.backfills;
SELECT count(*) AS events FROM tide.outbox;
SELECT tide.pause_pipeline('alice_p');
SELECT tide.drop_pipeline('alice_p');
SELECT tide.add_table('alice_p', 'orders');
SELECT tide.start_backfill('orders', 'alice_p');
SELECT tide.create_consumer('alice_p', 'c');
SELECT tide.trim_outbox('alice_p', 1000);
-- pg_tide's own tables are pg_tide's alone.
SELECT count(*) FROM tide.pipeline;
UPDATE tide.pipeline SET owner = 'regress_bob';
INSERT INTO tide.marker (pipeline, op, relid) VALUES ('alice_p', 'remove_table', 'public.orders'::regclass);
RESET ROLE;

-- nobody: no tide_admin, nothing to call or read.
SET ROLE regress_nobody;
SELECT tide.version();
SELECT tide.create_pipeline('nobody_p');
SELECT tide.wait_for_pipeline('alice_p');
SELECT count(*) FROM tide.pipelines;
SELECT count(*) FROM tide.outbox;
RESET ROLE;

-- A superuser sees everything; alice's pipeline is still there and streaming.
SELECT name, state FROM tide.pipelines;
SELECT tide.drop_pipeline('alice_p');
