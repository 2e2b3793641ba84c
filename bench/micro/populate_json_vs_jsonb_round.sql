-- One round of populate_json_vs_jsonb.sql: each function once into empty tables, in both orders.
TRUNCATE t1, t2;
EXECUTE jb(:'payload');
EXECUTE js(:'payload');
TRUNCATE t1, t2;
EXECUTE js(:'payload');
EXECUTE jb(:'payload');
