-- The B1 row shape (bench/tide_bench/b1.py) in a 5000-row source s, and two empty targets t1, t2
-- like it: the set-up of the micro-benchmarks here (\ir b1_shape.sql).
DROP TABLE IF EXISTS s, t1, t2;
CREATE TABLE s (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12,2) NOT NULL, created_at timestamptz NOT NULL, qty integer NOT NULL, ref uuid NOT NULL, attrs jsonb NOT NULL, note text);
INSERT INTO s SELECT g, 'customer-' || md5(g::text), ((g * 7919) % 10000000) / 100.0, timestamptz '2024-01-01 00:00:00+00' + g * interval '7 seconds', (g % 1000)::int, md5(g::text || 'ref')::uuid,
 jsonb_build_object('kind', (ARRAY['order','refund','invoice','credit'])[1 + g % 4], 'seq', g, 'tag', substr(md5((g * 31)::text), 1, 10)), 'note ' || substr(md5((g * 13)::text), 1, 24) FROM generate_series(1, 5000) g;
CREATE TABLE t1 (LIKE s INCLUDING ALL); CREATE INDEX ON t1 (qty);
CREATE TABLE t2 (LIKE s INCLUDING ALL); CREATE INDEX ON t2 (qty);
