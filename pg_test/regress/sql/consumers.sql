-- Outbox consumers (README, Consumers and retention): create at 'earliest' and 'latest', read
-- whole transactions, commit, seek, trim, drop; tide.consumers and tide.outbox_retention.
-- Event ids are shown relative to the first event of the pipeline (rel_id), LSNs masked; the
-- ids in messages are absolute (a fresh cluster's first outbox event has id 1).
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/consumers.out.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
SELECT tide.create_pipeline('p');
CREATE TABLE public.t (id int PRIMARY KEY, v text);
SELECT tide.add_table('p', 't', backfill => false);
-- Three transactions: of 2, 3 and 1 events.
INSERT INTO public.t VALUES (1, 'a'), (2, 'b');
INSERT INTO public.t VALUES (3, 'c'), (4, 'd'), (5, 'e');
UPDATE public.t SET v = 'a2' WHERE id = 1;
SELECT tide.wait_for_pipeline('p', '60 seconds') AS caught_up;
SELECT min(id) - 1 AS base FROM tide.outbox \gset
SELECT id - :base AS rel_id, position, op, key FROM tide.outbox ORDER BY id;

-- 'earliest' starts before the oldest event (the position returned, relative), 'latest' at the newest.
SELECT tide.create_consumer('p', 'billing') - :base AS billing_position;
SELECT tide.create_consumer('p', 'audit-2', 'latest') - :base AS audit_position;
SELECT consumer, owner, committed_id - :base AS committed, committed_lsn IS NOT NULL AS has_lsn,
       committed_position, events_behind, bytes_behind > 0 AS bytes_behind
  FROM tide.consumers ORDER BY consumer;
-- A batch is whole transactions: max 4 events gives the first transaction only (2 + 3 > 4).
SELECT id - :base AS rel_id, op, key FROM tide.read_outbox('p', 'billing', 4);
-- Reading again without a commit returns the same events.
SELECT id - :base AS rel_id FROM tide.read_outbox('p', 'billing', 4);
SELECT tide.commit_consumer('p', 'billing', :base + 2);
SELECT id - :base AS rel_id, op, key FROM tide.read_outbox('p', 'billing', 4);
-- A transaction bigger than max_events is split; the next read continues inside it.
SELECT id - :base AS rel_id FROM tide.read_outbox('p', 'billing', 2);
SELECT tide.commit_consumer('p', 'billing', :base + 4);
SELECT id - :base AS rel_id FROM tide.read_outbox('p', 'billing');
-- Committing the same id again does nothing; going back is refused.
SELECT tide.commit_consumer('p', 'billing', :base + 4);
SELECT tide.commit_consumer('p', 'billing', :base + 3);
SELECT consumer, committed_id - :base AS committed, committed_position, events_behind FROM tide.consumers ORDER BY consumer;
-- The latest consumer sees only what comes after its start.
SELECT count(*) AS audit_events FROM tide.read_outbox('p', 'audit-2');
INSERT INTO public.t VALUES (6, 'f');
SELECT tide.wait_for_pipeline('p', '60 seconds') AS caught_up;
SELECT id - :base AS rel_id, op, key FROM tide.read_outbox('p', 'audit-2');
-- Seek back to re-read.
SELECT tide.seek_consumer('p', 'billing', :base);
SELECT id - :base AS rel_id FROM tide.read_outbox('p', 'billing', 2);
SELECT tide.seek_consumer('p', 'billing', :base + 6);
SELECT tide.commit_consumer('p', 'audit-2', :base + 7);

-- Retention: what every consumer has committed may be deleted.
SELECT pipeline, consumers, committed_by_all - :base AS committed_by_all, oldest_id - :base AS oldest,
       newest_id - :base AS newest FROM tide.outbox_retention;
SELECT regress_wait($$(SELECT oldest_id FROM tide.outbox_retention) > $$ || :base + 6);
SELECT pipeline, consumers, committed_by_all - :base AS committed_by_all, oldest_id - :base AS oldest,
       newest_id - :base AS newest, events_pruned, last_prune_reason FROM tide.outbox_retention;
SELECT id - :base AS rel_id FROM tide.outbox ORDER BY id;
-- Events older than the oldest kept one can no longer be sought.
SELECT tide.seek_consumer('p', 'billing', :base + 1);
-- Dropping the consumers; then trimming by hand.
SELECT tide.drop_consumer('p', 'billing');
SELECT tide.drop_consumer('p', 'audit-2');
SELECT count(*) AS consumers FROM tide.consumers;
INSERT INTO public.t VALUES (7, 'g'), (8, 'h');
SELECT tide.wait_for_pipeline('p', '60 seconds') AS caught_up;
SELECT tide.trim_outbox('p', :base + 8) AS trimmed;
SELECT id - :base AS rel_id FROM tide.outbox ORDER BY id;
SELECT tide.drop_pipeline('p');
