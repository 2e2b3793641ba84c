-- pg_tide's settings (README, Settings): every tide.* GUC with its built-in default, unit,
-- bounds, who may set it (context) and its description. The test cluster sets none of them,
-- so the current value is the default too.
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/settings.out.
SELECT name, vartype, boot_val AS "default", unit, min_val, max_val, context,
       setting = boot_val AS is_default
  FROM pg_settings WHERE name LIKE 'tide.%' ORDER BY name;
\pset format unaligned
\pset fieldsep ': '
SELECT name, short_desc || coalesce(' (' || nullif(extra_desc, '') || ')', '') AS description
  FROM pg_settings WHERE name LIKE 'tide.%' ORDER BY name;
\pset format aligned
\pset fieldsep '|'
-- What SHOW prints (the unit where there is one).
SHOW tide.poll_interval;
SHOW tide.chunk_timeout;
SHOW tide.max_paused_wal_size;
SHOW tide.outbox_retention;
-- All can be changed with a reload (context sighup): a session may not SET them.
\set VERBOSITY verbose
SET tide.batch_events = 10;
