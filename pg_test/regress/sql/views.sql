-- The views of schema tide: every column with its type, in order, and who may read each view.
-- A changed, added or removed column shows here first. Each view is a security_barrier (a
-- function in a viewer's WHERE clause sees only the rows the view shows: README, Security).
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/views.out.
SELECT c.relname AS view, a.attnum AS "#", a.attname AS column, format_type(a.atttypid, a.atttypmod) AS type
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
 WHERE c.relnamespace = 'tide'::regnamespace AND c.relkind = 'v'
 ORDER BY c.relname, a.attnum;

-- Options and privileges: tide_admin reads every view; PUBLIC none (README, Security).
CREATE ROLE regress_member IN ROLE tide_admin;
CREATE ROLE regress_nobody;
SELECT c.relname AS view, array_to_string(c.reloptions, ',') AS options,
       has_table_privilege('tide_admin', c.oid, 'SELECT') AS admin_select,
       has_table_privilege('regress_member', c.oid, 'SELECT') AS member_select,
       has_table_privilege('regress_nobody', c.oid, 'SELECT') AS public_select,
       has_table_privilege('tide_admin', c.oid, 'INSERT,UPDATE,DELETE,TRUNCATE') AS admin_writes
  FROM pg_class c
 WHERE c.relnamespace = 'tide'::regnamespace AND c.relkind = 'v'
 ORDER BY c.relname;

-- The tables of schema tide: only tide.outbox is readable by tide_admin (with row-level
-- security: a role reads its own pipelines' events); the rest are pg_tide's alone.
SELECT c.relname AS "table", c.relrowsecurity AS rls,
       has_table_privilege('tide_admin', c.oid, 'SELECT') AS admin_select,
       has_table_privilege('tide_admin', c.oid, 'INSERT,UPDATE,DELETE,TRUNCATE') AS admin_writes,
       has_table_privilege('regress_nobody', c.oid, 'SELECT') AS public_select
  FROM pg_class c
 WHERE c.relnamespace = 'tide'::regnamespace AND c.relkind IN ('r', 'p')
 ORDER BY c.relname;
SELECT polname, polcmd, polpermissive, array(SELECT CASE WHEN r = 0 THEN 'public' ELSE r::regrole::text END FROM unnest(polroles) r) AS roles,
       pg_get_expr(polqual, polrelid) AS using
  FROM pg_policy WHERE polrelid = 'tide.outbox'::regclass ORDER BY polname;

-- The schema: tide_admin may use it; PUBLIC may not.
SELECT has_schema_privilege('tide_admin', 'tide', 'USAGE') AS admin_usage,
       has_schema_privilege('regress_nobody', 'tide', 'USAGE') AS public_usage,
       has_schema_privilege('tide_admin', 'tide', 'CREATE') AS admin_create;
