-- The upgrade script's result (README, Upgrading): the oldest release's catalog, made by its
-- own install script (CREATE EXTENSION ... VERSION), then ALTER EXTENSION pg_tide UPDATE, with
-- the library of the version under test loaded. Shown: the functions refuse to act between
-- the two (55000); what the update changes in the catalog; and that the updated catalog equals
-- a fresh install's. :catalog_snapshot is pg_test::CATALOG_SNAPSHOT (pg_test/src/release.rs):
-- one line per property of every object of the extension (functions, relations, columns,
-- constraints, policies, triggers, privileges, comments; OIDs left out; function bodies as md5).
-- Run by pg_test/tests/regress.rs (test `upgrade`); compared verbatim with ../expected/upgrade.out.
\set VERBOSITY verbose
\set SHOW_CONTEXT never
CREATE EXTENSION pg_tide VERSION '0.1.0';
SELECT extversion FROM pg_extension WHERE extname = 'pg_tide';
-- The new library does not act on the old catalog.
SELECT tide.check();
SELECT tide.create_pipeline('p');
CREATE TABLE public.catalog_before AS :catalog_snapshot;
ALTER EXTENSION pg_tide UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'pg_tide';
SELECT regexp_replace(tide.check(), 'pid [0-9]+', 'pid N') AS check;
CREATE TABLE public.catalog_after AS :catalog_snapshot;
-- What the update changed: lines of the catalog listing gone and new (a changed property is
-- one of each). Lines are cut at 160 characters (view definitions: their first line).
\pset format unaligned
\pset fieldsep ' '
SELECT 'gone' AS change, left(translate(line, E'\n', ' '), 160) AS line FROM (SELECT line FROM public.catalog_before EXCEPT SELECT line FROM public.catalog_after) d
UNION ALL
SELECT 'new', left(translate(line, E'\n', ' '), 160) FROM (SELECT line FROM public.catalog_after EXCEPT SELECT line FROM public.catalog_before) d
ORDER BY 2, 1;
\pset format aligned
\pset fieldsep '|'
-- A fresh install of the new version in another database, for comparison.
CREATE DATABASE fresh;
\c fresh
CREATE EXTENSION pg_tide;
SELECT jsonb_agg(line ORDER BY line) AS fresh_catalog FROM (:catalog_snapshot) s \gset
\c postgres
-- The updated catalog equals the fresh one: both lists are empty.
SELECT line AS only_after_update FROM public.catalog_after
EXCEPT SELECT jsonb_array_elements_text(:'fresh_catalog');
SELECT jsonb_array_elements_text(:'fresh_catalog') AS only_in_fresh_install
EXCEPT SELECT line FROM public.catalog_after;
SELECT count(*) > 100 AS snapshot_has_lines, count(*) = jsonb_array_length(:'fresh_catalog') AS same_count FROM public.catalog_after;
-- The updated database runs pipelines.
SELECT tide.create_pipeline('p');
SELECT tide.wait_for_pipeline('p', '60 seconds') AS caught_up;
SELECT tide.drop_pipeline('p');
DROP DATABASE fresh;
