-- pg_tide 0.2.0 -> 0.3.0 (ALTER EXTENSION pg_tide UPDATE).
--
-- Install the 0.3.0 library first and restart the server: the 0.3.0 library runs no pipeline
-- and its functions refuse to act until this script has run (tide.check() says so), and the
-- pipelines resume by themselves once it commits. The objects below are the same as a fresh
-- install of 0.3.0 makes (pg_test/tests/upgrade.rs compares the two catalogs; the `upgrade`
-- golden file runs 0.1.0 -> 0.2.0 -> 0.3.0).
\echo Use "ALTER EXTENSION pg_tide UPDATE" to load this file. \quit

-- Issue 45: a table captured through a schema's follow leaves the pipeline when it leaves the
-- schema (tide.pipeline_table.followed_nspid; NULL for the tables captured before, which stay).
ALTER TABLE tide.pipeline_table ADD COLUMN followed_nspid oid;
