-- Run by pg_test/tests/regress.rs before each sql/NAME.sql, in the same database (its output is
-- not part of the transcript): helpers the transcripts share.

-- regress_wait(condition, timeout): poll a boolean SQL expression every 10 ms until it is true;
-- ERROR (with the condition) if it is not within the timeout. For states the worker reaches
-- asynchronously, so a transcript never depends on timing: it shows "ok" or fails loudly.
CREATE FUNCTION public.regress_wait(condition text, timeout interval DEFAULT '60 seconds')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + timeout;
    ok boolean;
BEGIN
    LOOP
        EXECUTE 'SELECT (' || condition || ')' INTO ok;
        IF ok THEN
            RETURN 'ok';
        END IF;
        IF clock_timestamp() > deadline THEN
            RAISE EXCEPTION 'regress_wait: still false after %: %', timeout, condition;
        END IF;
        PERFORM pg_sleep(0.01);
    END LOOP;
END $$;
