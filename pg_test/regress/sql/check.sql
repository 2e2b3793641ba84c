-- tide.check() on the test cluster (pg_tide preloaded, wal_level = logical, no pipelines yet,
-- so no launcher): the readiness report, the version, and what CREATE EXTENSION made. A
-- launcher's pid would be masked ("pid N").
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/check.out.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
SELECT regexp_replace(tide.check(), 'pid [0-9]+', 'pid N') AS check;
SELECT tide.version();
SELECT extname, extversion, extnamespace::regnamespace AS schema, extrelocatable
  FROM pg_extension WHERE extname = 'pg_tide';
SELECT current_setting('shared_preload_libraries') AS preload, current_setting('wal_level') AS wal_level;
-- The role the API is granted through (README, Security): NOLOGIN, no special attribute.
SELECT rolname, rolcanlogin, rolsuper, rolreplication, rolbypassrls, rolinherit
  FROM pg_roles WHERE rolname = 'tide_admin';
-- The supervisor only: a database has a launcher only while it has pipelines.
SELECT backend_type, count(*) FROM pg_stat_activity
 WHERE backend_type LIKE 'pg_tide%' GROUP BY backend_type ORDER BY backend_type;
-- tide.check() from a role with EXECUTE but no superuser: the same report.
CREATE ROLE regress_member IN ROLE tide_admin;
SET ROLE regress_member;
SELECT regexp_replace(tide.check(), 'pid [0-9]+', 'pid N') AS check;
RESET ROLE;
-- A role without tide_admin may not call it.
CREATE ROLE regress_nobody;
GRANT USAGE ON SCHEMA tide TO regress_nobody;
SET ROLE regress_nobody;
SELECT tide.check();
RESET ROLE;
