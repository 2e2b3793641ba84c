-- The functions of schema tide: signature, result, volatility, SECURITY DEFINER or not, the
-- settings pinned on them, their COMMENT, and who may execute them (README, SQL API: nothing
-- is executable by PUBLIC; GRANT tide_admin gives the whole API). Functions whose name starts
-- with "_" are pg_tide's internals (used by its views, policies and event trigger).
-- Run by pg_test/tests/regress.rs; compared verbatim with ../expected/functions.out.
\pset format unaligned
\pset fieldsep ' | '
SELECT p.proname || '(' || pg_get_function_arguments(p.oid) || ')' AS function,
       pg_get_function_result(p.oid) AS returns
  FROM pg_proc p WHERE p.pronamespace = 'tide'::regnamespace
 ORDER BY p.proname, pg_get_function_identity_arguments(p.oid);
\pset format aligned
\pset fieldsep '|'

CREATE ROLE regress_member IN ROLE tide_admin;
CREATE ROLE regress_nobody;
SELECT p.proname AS function, l.lanname AS lang,
       CASE p.provolatile WHEN 'i' THEN 'immutable' WHEN 's' THEN 'stable' ELSE 'volatile' END AS volatility,
       p.proisstrict AS strict, p.prosecdef AS secdef, p.proparallel AS parallel,
       array_to_string(p.proconfig, ', ') AS config,
       has_function_privilege('tide_admin', p.oid, 'EXECUTE') AS admin,
       has_function_privilege('regress_member', p.oid, 'EXECUTE') AS member,
       has_function_privilege('regress_nobody', p.oid, 'EXECUTE') AS public
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = 'tide'::regnamespace
 ORDER BY p.proname, pg_get_function_identity_arguments(p.oid);

-- Comments (\df+ style); a function without one is listed with an empty comment.
\pset format unaligned
\pset fieldsep ': '
SELECT p.proname AS function, coalesce(obj_description(p.oid, 'pg_proc'), '') AS comment
  FROM pg_proc p WHERE p.pronamespace = 'tide'::regnamespace
 ORDER BY p.proname, pg_get_function_identity_arguments(p.oid);
\pset format aligned
\pset fieldsep '|'

-- The SQL API's functions without a COMMENT (none: a new function needs one).
SELECT p.oid::regprocedure AS uncommented FROM pg_proc p
 WHERE p.pronamespace = 'tide'::regnamespace AND p.proname !~ '^_'
   AND obj_description(p.oid, 'pg_proc') IS NULL ORDER BY 1::text;

-- The event trigger that writes schema markers, and the tide_kafka foreign data wrapper.
SELECT evtname, evtevent, evtfoid::regproc AS function, evtenabled, evttags
  FROM pg_event_trigger ORDER BY evtname;
SELECT fdwname, fdwhandler::regproc AS handler, fdwvalidator::regproc AS validator
  FROM pg_foreign_data_wrapper WHERE fdwname = 'tide_kafka';
