-- Durable waits stay durable (SPEC 16).
--
-- 1. A timed-out `wait_for_event` leaves nothing a later `emit_event` could wake: the wait's row in
--    `event_wait` goes when the timeout is recorded (under the key's advisory lock, like the emit), so a
--    job retried or snoozed after its wait timed out keeps its backoff when the event comes later.
CREATE OR REPLACE FUNCTION {schema}.wait_for_event(p_id uuid, p_token uuid, p_key text, p_step text, p_timeout float8)
RETURNS TABLE (state text, step jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_attempts integer;
    v_step jsonb;
    v_until timestamptz;
    v_payload jsonb;
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
    SELECT e.payload INTO v_payload FROM {schema}.event AS e WHERE e.key = p_key;
    IF FOUND THEN
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
    END IF;
    v_until := (v_step ->> 'until')::timestamptz;
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


-- 2. `wait_for_children()` answers the same on every later run of the handler, also once retention has
--    deleted the children: the children's terminal rows are kept with the parent when a wait resolves,
--    by wait number within a run of the handler ("0", "1", ...). A column of job_parent, which goes with
--    the parent (trigger job_deleted); adding a nullable column rewrites nothing.
ALTER TABLE {schema}.job_parent ADD COLUMN snapshots jsonb;

-- The answer of the `p_index`-th `wait_for_children()` of a run, called once wait_for_children said
-- 'ready': the stored one if any; else, while `p_token` holds the lease, the children as they are now
-- (each row of the job table as JSON, with `parent_id` and `steps`), stored for good. Returns (state,
-- children): 'ready' with the children, or 'lost'. The parent's row is locked first, in the order
-- wait_for_children and the trigger job_finished take it.
CREATE FUNCTION {schema}.children_snapshot(p_id uuid, p_token uuid, p_index integer)
RETURNS TABLE (state text, children jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_snapshots jsonb;
    v_children jsonb;
BEGIN
    SELECT p.snapshots INTO v_snapshots FROM {schema}.job_parent AS p WHERE p.parent_id = p_id FOR UPDATE;
    IF {schema}.held_attempts(p_id, p_token) IS NULL THEN
        RETURN QUERY SELECT 'lost', NULL::jsonb;
        RETURN;
    END IF;
    IF v_snapshots ? p_index::text THEN
        RETURN QUERY SELECT 'ready', v_snapshots -> p_index::text;
        RETURN;
    END IF;
    SELECT coalesce(jsonb_agg(to_jsonb(j) || jsonb_build_object(
               'parent_id', p_id,
               'steps', coalesce((SELECT jsonb_object_agg(s.name, s.result) FROM {schema}.job_step AS s
                                  WHERE s.job_id = j.id), '{{}}'::jsonb))
               ORDER BY j.id), '[]'::jsonb)
    INTO v_children
    FROM {schema}.job_child AS c JOIN {schema}.job AS j ON j.id = c.child_id
    WHERE c.parent_id = p_id;
    UPDATE {schema}.job_parent AS p
    SET snapshots = coalesce(p.snapshots, '{{}}'::jsonb) || jsonb_build_object(p_index::text, v_children)
    WHERE p.parent_id = p_id;
    RETURN QUERY SELECT 'ready', v_children;
END
$$;

-- 3. Emitted events and finished groups' bookkeeping are deleted by the leader's cleaner once
--    `retention_event_seconds` has passed (SPEC 16): in batches by primary key, oldest first, skipping
--    rows someone holds, like delete_finished_jobs. SECURITY DEFINER: the worker role needs no DELETE
--    right. The indexes are built in this transaction: both tables are small next to the job table
--    (one row per event key, one per group with a callback).
CREATE INDEX event_emitted_idx ON {schema}.event (emitted_at);
CREATE INDEX job_group_scheduled_idx ON {schema}.job_group (scheduled_at) WHERE scheduled_at IS NOT NULL;

CREATE FUNCTION {schema}.delete_old_events(p_older_than_seconds double precision, p_limit integer)
RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH deleted AS (
        DELETE FROM {schema}.event
        WHERE key = ANY (ARRAY(
            SELECT key FROM {schema}.event
            WHERE emitted_at < now() - make_interval(secs => p_older_than_seconds)
            ORDER BY emitted_at
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ))
        RETURNING 1
    )
    SELECT count(*)::integer FROM deleted
$$;

-- A group is finished once its callback is scheduled (`scheduled_at`).
CREATE FUNCTION {schema}.delete_finished_groups(p_older_than_seconds double precision, p_limit integer)
RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH deleted AS (
        DELETE FROM {schema}.job_group
        WHERE group_id = ANY (ARRAY(
            SELECT group_id FROM {schema}.job_group
            WHERE scheduled_at < now() - make_interval(secs => p_older_than_seconds)
            ORDER BY scheduled_at
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ))
        RETURNING 1
    )
    SELECT count(*)::integer FROM deleted
$$;

-- 4. Groups are what they were scheduled as (SPEC 16). `schedule_group` with a group id that already has
--    jobs, and any other insert of a job into a group that has a callback, is refused (SQLSTATE JB409,
--    `InvalidStateError` in Python) and writes nothing. Both sides take the group's advisory lock before
--    they look, so of two concurrent calls the second sees what the first committed (READ COMMITTED:
--    each statement of a function reads with a new snapshot): exactly one of two schedule_group calls
--    on one id wins, and a job racing the creation of a callback is either refused or counted.
--    `created_in`/`created_stmt` name the statement that wrote a group's row: its own members (the
--    statement's rows, checked when it ends) are the only jobs let into a group with a callback.
ALTER TABLE {schema}.job_group
    ADD COLUMN created_in xid8 NOT NULL DEFAULT pg_current_xact_id(),
    ADD COLUMN created_stmt timestamptz NOT NULL DEFAULT statement_timestamp();

-- Called by the App's insert of a group (query insert_group), after its members are inserted: refuses
-- an id that already has other jobs, then writes the callback's row (counting the inserted members).
-- A repeat of the statement (every member already there, none inserted) changes nothing.
CREATE FUNCTION {schema}.group_scheduled(p_group uuid, p_ids uuid[], p_inserted integer, p_spec jsonb)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({schema}.wait_lock('group:' || p_group::text));
    IF p_inserted = 0 THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.job AS j WHERE j.group_id = p_group AND NOT (j.id = ANY (p_ids)))
       OR EXISTS (SELECT 1 FROM {schema}.job_group AS g WHERE g.group_id = p_group) THEN
        RAISE EXCEPTION 'group % already has jobs: schedule_group makes a new group (pick another group_id)',
            p_group USING ERRCODE = 'JB409';
    END IF;
    IF p_spec IS NOT NULL THEN
        INSERT INTO {schema}.job_group (group_id, spec, remaining) VALUES (p_group, p_spec, p_inserted);
    END IF;
END
$$;

-- After each inserted row that names a group (the WHEN clause: a job without a group costs nothing, and
-- an AFTER trigger leaves COPY's batched inserts as they were). A job inserted while another job
-- finishes (a follow-up, `then=`, whose group got a callback after it was scheduled) is counted in the
-- group instead of refused: the outcome that inserts it must not fail.
CREATE FUNCTION {schema}.job_grouped() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_own boolean;
BEGIN
    PERFORM pg_advisory_xact_lock({schema}.wait_lock('group:' || NEW.group_id::text));
    IF pg_trigger_depth() > 1 THEN
        UPDATE {schema}.job_group SET remaining = remaining + 1
        WHERE group_id = NEW.group_id AND scheduled_at IS NULL;
        RETURN NULL;
    END IF;
    SELECT g.created_in = pg_current_xact_id() AND g.created_stmt = statement_timestamp() INTO v_own
    FROM {schema}.job_group AS g WHERE g.group_id = NEW.group_id;
    IF FOUND AND NOT v_own THEN
        RAISE EXCEPTION 'group % has a callback: its members are the jobs schedule_group scheduled with it',
            NEW.group_id USING ERRCODE = 'JB409';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_grouped
    AFTER INSERT ON {schema}.job
    FOR EACH ROW WHEN (NEW.group_id IS NOT NULL)
    EXECUTE FUNCTION {schema}.job_grouped();
