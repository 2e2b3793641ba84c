-- pg_tide 0.3.0 -> 0.4.0 (ALTER EXTENSION pg_tide UPDATE).
--
-- Install the 0.4.0 library first and restart the server: the 0.4.0 library runs no pipeline
-- and its functions refuse to act until this script has run (tide.check() says so), and the
-- pipelines resume by themselves once it commits. The objects below are the same as a fresh
-- install of 0.4.0 makes (pg_test/tests/upgrade.rs compares the two catalogs; the `upgrade`
-- golden file runs 0.1.0 -> 0.2.0 -> 0.3.0 -> 0.4.0).
\echo Use "ALTER EXTENSION pg_tide UPDATE" to load this file. \quit
