-- Guarantees in every configuration (SPEC 1 and 16), the holes an acceptance review found.

-- 1. `configuration_data` never changes: the trigger of migration 0001 compared the values as jsonb, and
--    jsonb holds 1 and 1.0 equal, so an UPDATE could turn an integer of the configuration into a float
--    (or 1e2 into 100) unrefused. Now any UPDATE that changes the stored text is refused; one that
--    writes back exactly what is stored (an ORM saving every column) changes nothing and passes.
CREATE OR REPLACE FUNCTION {schema}.reject_configuration_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.configuration_data::text IS DISTINCT FROM OLD.configuration_data::text THEN
        RAISE EXCEPTION 'configuration_data of job % is immutable', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

-- 2. Groups are what they were scheduled as, whoever inserts the job: the trigger job_grouped of
--    migration 0013 counted, instead of refusing, every job inserted below another trigger, so that a
--    follow-up written by job_finished never fails the outcome that writes it. A job that a user's own
--    trigger scheduled (the SQL API is meant for triggers) or inserted joined a group that has a callback
--    the same way (the SQL API checks the group itself since migration 0014; a plain INSERT did not).
--    Now only the jobs job_finished itself writes are counted: schedule_spec marks its insert when it
--    runs inside a trigger (job_finished is the only trigger that calls it; spawn_child calls it outside
--    any), for that one insert.
CREATE OR REPLACE FUNCTION {schema}.schedule_spec(p_spec jsonb, p_channel text) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
BEGIN
    IF pg_trigger_depth() > 0 THEN
        PERFORM set_config('jobbus.finishing', 'on', true);
    END IF;
    INSERT INTO {schema}.job AS j (id, type, queue, name, group_id, unique_key, priority, configuration_data,
                                  max_attempts, available_at, timeout_seconds, concurrency_key, expires_at)
    VALUES ((p_spec ->> 'id')::uuid, p_spec ->> 'type', p_spec ->> 'queue', p_spec ->> 'name',
            (p_spec ->> 'group_id')::uuid, p_spec ->> 'unique_key', (p_spec ->> 'priority')::integer,
            p_spec -> 'configuration', (p_spec ->> 'max_attempts')::integer,
            coalesce((p_spec ->> 'available_at')::timestamptz,
                     now() + make_interval(secs => coalesce((p_spec ->> 'delay')::float8, 0))),
            (p_spec ->> 'timeout')::float8, p_spec ->> 'concurrency_key',
            coalesce((p_spec ->> 'expires_at')::timestamptz,
                     now() + make_interval(secs => (p_spec ->> 'expires_in')::float8)))
    ON CONFLICT DO NOTHING
    RETURNING j.id INTO v_id;
    PERFORM set_config('jobbus.finishing', '', true);
    IF v_id IS NULL THEN
        RETURN NULL;
    END IF;
    IF p_spec ? 'parent_id' THEN
        INSERT INTO {schema}.job_child (child_id, parent_id) VALUES (v_id, (p_spec ->> 'parent_id')::uuid);
        INSERT INTO {schema}.job_parent AS p (parent_id, active) VALUES ((p_spec ->> 'parent_id')::uuid, 1)
        ON CONFLICT (parent_id) DO UPDATE SET active = p.active + 1;
    END IF;
    IF jsonb_typeof(p_spec -> 'then') = 'object' THEN
        INSERT INTO {schema}.job_follow_up (job_id, spec) VALUES (v_id, p_spec -> 'then') ON CONFLICT DO NOTHING;
    END IF;
    PERFORM pg_notify(p_channel, json_build_array(p_spec ->> 'queue', p_spec ->> 'type')::text);
    RETURN v_id;
END
$$;

-- job_grouped of migration 0013, restated: counted only when marked by schedule_spec; the refusal names
-- the field (the error's COLUMN, as the SQL API's refusals do).
CREATE OR REPLACE FUNCTION {schema}.job_grouped() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_own boolean;
BEGIN
    PERFORM pg_advisory_xact_lock({schema}.wait_lock('group:' || NEW.group_id::text));
    IF current_setting('jobbus.finishing', true) = 'on' THEN
        UPDATE {schema}.job_group SET remaining = remaining + 1
        WHERE group_id = NEW.group_id AND scheduled_at IS NULL;
        RETURN NULL;
    END IF;
    SELECT g.created_in = pg_current_xact_id() AND g.created_stmt = statement_timestamp() INTO v_own
    FROM {schema}.job_group AS g WHERE g.group_id = NEW.group_id;
    IF FOUND AND NOT v_own THEN
        RAISE EXCEPTION 'group % has a callback: its members are the jobs schedule_group scheduled with it',
            NEW.group_id USING ERRCODE = 'JB409', COLUMN = 'group_id';
    END IF;
    RETURN NULL;
END
$$;

-- refuse_callback_group of migration 0014 (the SQL API's own check), restated to name the field too.
CREATE OR REPLACE FUNCTION {schema}.refuse_callback_group(p_group uuid, p_where text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({schema}.wait_lock('group:' || p_group::text));
    IF EXISTS (SELECT 1 FROM {schema}.job_group AS g WHERE g.group_id = p_group) THEN
        RAISE EXCEPTION '%group % has a callback: its members are the jobs schedule_group scheduled with it',
            p_where, p_group USING ERRCODE = 'JB409', COLUMN = 'group_id';
    END IF;
END
$$;

-- group_scheduled of migration 0013, restated: a `schedule_group` that inserted nothing (every member's
-- unique key held by an active job) returned at once, so an id that already had other jobs was taken
-- without a word. An id with jobs other than this call's is now refused whatever was inserted; only a
-- repeat of the statement (its members already there, none inserted) changes nothing.
CREATE OR REPLACE FUNCTION {schema}.group_scheduled(p_group uuid, p_ids uuid[], p_inserted integer, p_spec jsonb)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({schema}.wait_lock('group:' || p_group::text));
    IF EXISTS (SELECT 1 FROM {schema}.job AS j WHERE j.group_id = p_group AND NOT (j.id = ANY (p_ids))) THEN
        RAISE EXCEPTION 'group % already has jobs: schedule_group makes a new group (pick another group_id)',
            p_group USING ERRCODE = 'JB409', COLUMN = 'group_id';
    END IF;
    IF p_inserted = 0 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.job_group AS g WHERE g.group_id = p_group) THEN
        RAISE EXCEPTION 'group % already has jobs: schedule_group makes a new group (pick another group_id)',
            p_group USING ERRCODE = 'JB409', COLUMN = 'group_id';
    END IF;
    IF p_spec IS NOT NULL THEN
        INSERT INTO {schema}.job_group (group_id, spec, remaining) VALUES (p_group, p_spec, p_inserted);
    END IF;
END
$$;

-- 3. Durable waits stay durable: `wait_for_children()` keeps its answer once it has given it (migration
--    0013), but a child that retention deleted before its parent's wait resolved was missing from that
--    answer (a parked parent runs again only when its queue is served; a first child may finish a day
--    before the last). Retention (and `prune`, query prune_jobs) keeps a finished child while its
--    parent is queued or running; it goes with the first batch after its parent finished. The check is
--    one probe of job_child's primary key per candidate row (most jobs are nobody's child), kept a
--    correlated probe by `OFFSET 0`: flattened into an anti-join, the generic plan scanned the whole job
--    table for the running parents, once per batch (tests/test_retention_plan.py).
CREATE OR REPLACE FUNCTION {schema}.delete_finished_jobs(
    p_status text, p_older_than_seconds double precision, p_limit integer
)
RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH deleted AS (
        DELETE FROM {schema}.job
        WHERE id = ANY (ARRAY(
            SELECT j.id FROM {schema}.job AS j
            WHERE j.status = p_status
              AND p_status IN ('completed', 'failed', 'cancelled')
              AND j.finished_at < now() - make_interval(secs => p_older_than_seconds)
              AND NOT EXISTS (SELECT 1 FROM {schema}.job_child AS c
                              JOIN {schema}.job AS parent ON parent.id = c.parent_id
                              WHERE c.child_id = j.id AND parent.status IN ('queued', 'running')
                              OFFSET 0)
            ORDER BY j.finished_at
            LIMIT p_limit
            FOR UPDATE OF j SKIP LOCKED
        ))
        RETURNING 1
    )
    SELECT count(*)::integer FROM deleted
$$;

-- 4. A timed-out `wait_for_event` is not woken by a later emit: an event emitted after the wait's
--    deadline, while its job waited for a worker to run it again (a busy or unserved queue), was
--    answered as if it had come in time. The wait now answers with the event only when it was emitted
--    by the deadline (the emit's transaction time against the stored `until`), else it times out.
CREATE OR REPLACE FUNCTION {schema}.wait_for_event(p_id uuid, p_token uuid, p_key text, p_step text, p_timeout float8)
RETURNS TABLE (state text, step jsonb)
LANGUAGE plpgsql AS $$
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
    PERFORM {schema}.park_job(p_id, coalesce(v_until, {schema}.never()), 'event ' || p_key);
    RETURN QUERY SELECT 'parked', v_step;
END
$$;
