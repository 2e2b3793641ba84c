-- The SQL API's refusals, as a transcript: every bad call is an ERROR with a specific SQLSTATE
-- (shown after "ERROR:") and a hint, and changes nothing. Run by pg_test/tests/regress.rs;
-- compared verbatim with ../expected/api_errors.out (LOCATION lines, which name source lines,
-- are left out).
\set VERBOSITY verbose
\set SHOW_CONTEXT never
CREATE TABLE public.orders (id int PRIMARY KEY, v text);
CREATE TABLE public.nokey (v text);
CREATE VIEW public.v AS SELECT * FROM public.orders;
CREATE MATERIALIZED VIEW public.mv AS SELECT * FROM public.orders;
CREATE TABLE public.parted (id int PRIMARY KEY) PARTITION BY RANGE (id);
CREATE TABLE public.parted_1 PARTITION OF public.parted FOR VALUES FROM (0) TO (100);
CREATE TABLE public.parted_2 PARTITION OF public.parted FOR VALUES FROM (100) TO (200);
ALTER TABLE public.parted_2 REPLICA IDENTITY NOTHING;
CREATE UNLOGGED TABLE public.unlogged_t (id int PRIMARY KEY);
CREATE TEMP TABLE tmp (id int PRIMARY KEY);
CREATE ROLE regress_nobody;
GRANT USAGE ON SCHEMA tide TO regress_nobody;

-- Pipelines: names, target kinds, options.
SELECT tide.create_pipeline(NULL);
SELECT tide.create_pipeline('Bad Name');
SELECT tide.create_pipeline(repeat('x', 49));
SELECT tide.create_pipeline('1abc');
SELECT tide.create_pipeline('');
SELECT tide.create_pipeline('has-dash');
SELECT tide.create_pipeline('x;drop');
SELECT tide.create_pipeline('p', 'kafka');
SELECT tide.create_pipeline('p', 'no_such_kind');
SELECT tide.create_pipeline('p', 'outbox', '[]');
SELECT tide.create_pipeline('p', 'outbox', '"x"');
SELECT tide.create_pipeline('p', 'outbox', '{"batch": 1}');
SELECT tide.create_pipeline('p', 'outbox', '{"schema": "r"}');
SELECT tide.create_pipeline('p', 'table');
SELECT tide.create_pipeline('p', 'table', '{"schema": 5}');
SELECT tide.create_pipeline('p', 'table', '{"schema": "r", "scheme": "x"}');
SELECT tide.create_pipeline('p', 'table', '{"schema": "r", "schema_changes": "later"}');
SELECT tide.create_pipeline('p', 'postgres', '{}');
SELECT tide.create_pipeline('p', 'postgres', '{"server": "nosuch"}');
SELECT tide.create_pipeline('p');
SELECT tide.create_pipeline('p');
SELECT name, target, enabled FROM tide.pipelines ORDER BY name;

-- Unknown pipelines.
SELECT tide.drop_pipeline('nosuch');
SELECT tide.pause_pipeline('nosuch');
SELECT tide.resume_pipeline('nosuch');
SELECT tide.add_table('nosuch', 'public.orders');
SELECT tide.remove_table('nosuch', 'public.orders');
SELECT tide.wait_for_pipeline('nosuch', '1 second');
SELECT tide.skip_transaction('nosuch', '0/1');

-- Tables.
SELECT tide.add_table('p', 'public.nosuch');
SELECT tide.add_table('p', 'public.nokey');
SELECT tide.add_table('p', 'tide.pipeline');
SELECT tide.add_table('p', 'tide.outbox');
SELECT tide.add_table('p', 'public.v');
SELECT tide.add_table('p', 'public.mv');
SELECT tide.add_table('p', 'public.parted');
SELECT tide.add_table('p', 'tmp');
SELECT tide.add_table('p', 'public.unlogged_t');
SELECT tide.add_table('p', 'public.orders', backfill => false);
SELECT tide.add_table('p', 'public.orders', backfill => false);
SELECT tide.remove_table('p', 'public.nokey');

-- Backfills.
SELECT tide.start_backfill('public.nokey', 'p');
SELECT tide.start_backfill('public.orders', 'p', chunk_size => 0);
SELECT tide.start_backfill('public.orders', 'p', chunk_size => 1000001);
SELECT tide.start_backfill('public.orders', 'p', chunk_size => 3000000000);
SELECT tide.start_backfill('public.orders', 'p', condition => '');
SELECT tide.start_backfill('public.orders', 'p', condition => '   ');
SELECT tide.pause_backfill('public.orders', 'p');

-- Controls: pausing what is paused, or resuming what is not, is a no-op with a NOTICE.
SELECT tide.pause_pipeline('p');
SELECT tide.pause_pipeline('p');
SELECT tide.resume_pipeline('p');
SELECT tide.resume_pipeline('p');

-- Skipping a transaction: by its commit LSN, one the pipeline has not applied.
SELECT tide.skip_transaction('p', NULL);
SELECT tide.skip_transaction(NULL, '0/1');
SELECT tide.skip_transaction('p', '0/0');
SELECT tide.skip_transaction('p', 'not an lsn');
SELECT tide.start_backfill('public.orders', 'nosuch');

-- Verification and repair need a table target.
SELECT * FROM tide.verify('public.orders', 'p');
SELECT * FROM tide.repair('public.orders', 'p');

-- A table target never writes into pg_tide's or the system's schemas.
SELECT tide.create_pipeline('t', 'table', '{"schema": "tide"}');
SELECT tide.create_pipeline('t', 'table', '{"schema": "pg_catalog"}');
SELECT tide.create_pipeline('t', 'table', '{"schema": "rep"}');
SELECT tide.add_table('t', 'public.orders', target_table => 'tide.orders', backfill => false);
-- Consumers read the outbox: not a table target's pipeline.
SELECT tide.create_consumer('t', 'c');
SELECT tide.drop_pipeline('t');

-- Outbox consumers (pipeline p has written no event yet).
SELECT tide.create_consumer(NULL, 'c');
SELECT tide.create_consumer('p', NULL);
SELECT tide.create_consumer('nosuch', 'c');
SELECT tide.create_consumer('p', 'Bad Name');
SELECT tide.create_consumer('p', repeat('c', 64));
SELECT tide.create_consumer('p', 'c', 'middle');
SELECT tide.create_consumer('p', 'c', NULL);
SELECT tide.create_consumer('p', 'c');
SELECT tide.create_consumer('p', 'c', 'latest');
SELECT * FROM tide.read_outbox('p', 'nosuch');
SELECT * FROM tide.read_outbox('nosuch', 'c');
SELECT * FROM tide.read_outbox('p', 'c', 0);
SELECT * FROM tide.read_outbox('p', 'c', NULL);
SELECT count(*) FROM tide.read_outbox('p', 'c');
SELECT tide.commit_consumer('p', 'c', NULL);
SELECT tide.commit_consumer('p', 'nosuch', 1);
SELECT tide.commit_consumer('p', 'c', 5);
SELECT tide.commit_consumer('p', 'c', -1);
SELECT tide.commit_consumer('p', 'c', 0);
SELECT tide.seek_consumer('p', 'c', 3);
SELECT tide.seek_consumer('p', 'nosuch', 0);
SELECT tide.drop_consumer('p', 'nosuch');
SELECT tide.drop_consumer(NULL, 'c');
SELECT pipeline, consumer, committed_id, committed_lsn, events_behind, bytes_behind FROM tide.consumers;
SELECT pipeline, consumers, committed_by_all, oldest_id, events_pruned FROM tide.outbox_retention;

-- A role without pg_tide's rights.
SET ROLE regress_nobody;
SELECT tide.create_pipeline('q');
SELECT tide.drop_pipeline('p');
SELECT tide.create_consumer('p', 'x');
SELECT * FROM tide.read_outbox('p', 'c');
SELECT tide.commit_consumer('p', 'c', 0);
SELECT tide.skip_transaction('p', '0/1');
RESET ROLE;
SELECT tide.drop_consumer('p', 'c');

SELECT tide.drop_pipeline('p');
SELECT count(*) AS pipelines_left FROM tide.pipelines;

-- The kafka target: its wrapper's servers and user mappings, and the pipeline's options.
CREATE SERVER regress_k0 FOREIGN DATA WRAPPER tide_kafka;
CREATE SERVER regress_k1 FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers '127.0.0.1:1', sasl_password 'secret');
CREATE SERVER regress_k2 FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers '127.0.0.1:1', "enable.idempotence" 'false');
CREATE SERVER regress_k3 FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers '127.0.0.1:1', no_such_setting 'x');
CREATE SERVER regress_k4 FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers '127.0.0.1:1', "message.timeout.ms" 'soon');
CREATE SERVER regress_k FOREIGN DATA WRAPPER tide_kafka OPTIONS (brokers '127.0.0.1:1', "security.protocol" 'plaintext');
CREATE USER MAPPING FOR regress_nobody SERVER regress_k OPTIONS (acks '1');
CREATE USER MAPPING FOR regress_nobody SERVER regress_k OPTIONS (brokers '127.0.0.1:2');
CREATE USER MAPPING FOR regress_nobody SERVER regress_k OPTIONS (sasl_username 'nobody', sasl_password 'secret');
SELECT tide.create_pipeline('k', 'kafka', '{}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "no_such_server"}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "brokers": "x"}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "topic": "{prefix}.{tabel}"}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "value_format": "avro"}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "value_format": "debezium-schema", "key_format": "avro"}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "key_format": "json-schema"}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "partitions": 0}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "producer": {"acks": "1"}}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "producer": {"enable_idempotence": false}}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "producer": {"sasl.password": "x"}}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "producer": {"linger.ms": [5]}}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "producer": {"plugin.library.paths": "/tmp/x.so"}}');
SELECT tide.create_pipeline('k', 'kafka', '{"server": "regress_k", "producer": {"security.protocol": "plaintext"}}');
SELECT count(*) AS pipelines_left FROM tide.pipelines;
