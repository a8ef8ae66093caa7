-- Job logs (SPEC 22): an attempt that parks its job in a durable wait (sleep, wait_for_event,
-- wait_for_children) keeps what its handler logged in the `waiting` history entry it writes, as an
-- attempt's outcome keeps them (record_outcomes): the lines go in the parking statement itself. Each
-- function takes the lines as a last parameter, NULL by default, so a worker of the previous release
-- calls the new functions unchanged during a rolling upgrade. Only functions change: no table is
-- rewritten, and the one lock on `job` (ROW EXCLUSIVE, while park_job's UPDATE is checked at its
-- creation) conflicts with no reader or writer of jobs.
DROP FUNCTION {schema}.sleep_job(uuid, uuid, text, double precision);
DROP FUNCTION {schema}.wait_for_children(uuid, uuid);
DROP FUNCTION {schema}.wait_for_event(uuid, uuid, text, text, double precision);
DROP FUNCTION {schema}.park_job(uuid, timestamptz, text);

CREATE OR REPLACE FUNCTION {schema}.park_job(p_id uuid, p_until timestamp with time zone, p_waiting_for text, p_logs jsonb DEFAULT NULL)
 RETURNS void
 LANGUAGE sql
AS $$
    UPDATE {schema}.job AS j
    SET status = 'queued',
        available_at = p_until,
        attempts = j.attempts - 1,
        lease_token = NULL,
        lease_expires_at = NULL,
        history = (CASE WHEN jsonb_array_length(j.history) >= 50 THEN j.history - 0 ELSE j.history END)
                  || jsonb_build_array(jsonb_build_object(
                         'attempt', j.attempts, 'outcome', 'waiting', 'at', now(), 'worker_id', j.worker_id,
                         'waiting_for', p_waiting_for)
                     || CASE WHEN p_logs IS NULL THEN '{{}}'::jsonb
                             ELSE jsonb_strip_nulls(jsonb_build_object(
                                 'logs', p_logs -> 'lines',
                                 'logs_dropped', nullif((p_logs -> 'dropped')::int, 0))) END)
    WHERE j.id = p_id
$$;

CREATE OR REPLACE FUNCTION {schema}.sleep_job(p_id uuid, p_token uuid, p_step text, p_seconds double precision, p_logs jsonb DEFAULT NULL)
 RETURNS text
 LANGUAGE plpgsql
AS $$
DECLARE
    v_attempts integer := {schema}.held_attempts(p_id, p_token);
    v_until timestamptz;
BEGIN
    IF v_attempts IS NULL THEN
        RETURN 'lost';
    END IF;
    INSERT INTO {schema}.job_step (job_id, name, result, attempt)
    VALUES (p_id, p_step, jsonb_build_object('until', now() + make_interval(secs => p_seconds)), v_attempts)
    ON CONFLICT DO NOTHING;
    SELECT (result ->> 'until')::timestamptz INTO v_until FROM {schema}.job_step WHERE job_id = p_id AND name = p_step;
    IF v_until <= now() THEN
        RETURN 'ready';
    END IF;
    PERFORM {schema}.park_job(p_id, v_until, p_step, p_logs);
    RETURN 'parked';
END
$$;

CREATE OR REPLACE FUNCTION {schema}.wait_for_children(p_id uuid, p_token uuid, p_logs jsonb DEFAULT NULL)
 RETURNS text
 LANGUAGE plpgsql
AS $$
DECLARE
    v_active integer;
BEGIN
    SELECT active INTO v_active FROM {schema}.job_parent WHERE parent_id = p_id FOR UPDATE;
    IF {schema}.held_attempts(p_id, p_token) IS NULL THEN
        RETURN 'lost';
    END IF;
    IF coalesce(v_active, 0) <= 0 THEN
        RETURN 'ready';
    END IF;
    UPDATE {schema}.job_parent SET waiting = true WHERE parent_id = p_id;
    PERFORM {schema}.park_job(p_id, {schema}.never(), 'children', p_logs);
    RETURN 'parked';
END
$$;

CREATE OR REPLACE FUNCTION {schema}.wait_for_event(p_id uuid, p_token uuid, p_key text, p_step text, p_timeout double precision, p_logs jsonb DEFAULT NULL)
 RETURNS TABLE(state text, step jsonb)
 LANGUAGE plpgsql
AS $$
DECLARE
    v_attempts integer;
    v_step jsonb;
    v_until timestamptz;
    v_payload jsonb;
    v_emitted timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock({schema}.wait_lock('event:' || p_key));
    v_attempts := {schema}.held_attempts(p_id, p_token);
    IF v_attempts IS NULL THEN
        RETURN QUERY SELECT 'lost', NULL::jsonb;
        RETURN;
    END IF;
    SELECT result INTO v_step FROM {schema}.job_step WHERE job_id = p_id AND name = p_step;
    IF v_step ? 'payload' OR v_step ? 'timed_out' THEN
        RETURN QUERY SELECT CASE WHEN v_step ? 'payload' THEN 'ready' ELSE 'timeout' END, v_step;
        RETURN;
    END IF;
    v_until := (v_step ->> 'until')::timestamptz;
    SELECT e.payload, e.emitted_at INTO v_payload, v_emitted FROM {schema}.event AS e WHERE e.key = p_key;
    IF FOUND AND (v_until IS NULL OR v_emitted <= v_until) THEN
        v_step := jsonb_build_object('payload', v_payload);
        INSERT INTO {schema}.job_step (job_id, name, result, attempt) VALUES (p_id, p_step, v_step, v_attempts)
        ON CONFLICT (job_id, name) DO UPDATE SET result = EXCLUDED.result;
        DELETE FROM {schema}.event_wait WHERE key = 'event:' || p_key AND job_id = p_id;
        RETURN QUERY SELECT 'ready', v_step;
        RETURN;
    END IF;
    IF v_step IS NULL THEN
        v_step := jsonb_build_object('until', now() + make_interval(secs => p_timeout));
        INSERT INTO {schema}.job_step (job_id, name, result, attempt) VALUES (p_id, p_step, v_step, v_attempts);
        v_until := (v_step ->> 'until')::timestamptz;
    END IF;
    IF v_until <= now() THEN
        v_step := jsonb_build_object('timed_out', true);
        UPDATE {schema}.job_step SET result = v_step WHERE job_id = p_id AND name = p_step;
        DELETE FROM {schema}.event_wait WHERE key = 'event:' || p_key AND job_id = p_id;
        RETURN QUERY SELECT 'timeout', v_step;
        RETURN;
    END IF;
    INSERT INTO {schema}.event_wait (key, job_id) VALUES ('event:' || p_key, p_id) ON CONFLICT DO NOTHING;
    PERFORM {schema}.park_job(p_id, coalesce(v_until, {schema}.never()), 'event ' || p_key, p_logs);
    RETURN QUERY SELECT 'parked', v_step;
END
$$;
