-- The functions of uniqueness windows and debounce (`unique_for=`, `debounce=`; SPEC 21), over the
-- columns and indexes of 0029.
--
-- schedule_keyed schedules one job given as the JSON object `jobbus.requests.spec_json` writes (the
-- Python producers, follow-ups, group callbacks and the SQL API all come here for a window or debounce).
-- Calls for one (type, unique_key) are serialized by a transaction-level advisory lock, and each
-- statement after it reads a new snapshot (READ COMMITTED): a call sees every job of its key that a
-- call before it committed, so two calls can never both find the key free. Calls without a window or
-- debounce take no lock; they meet the jobs of windowed and debounced calls through the unique index.
-- A window: the newest job of the key created less than unique_for ago answers the call; else it is
-- inserted with unique_until = now() + unique_for (retention keeps it until then).
-- Debounce: the key's queued job that never started (at most one: the unique index, and a parked job
-- only beside a run) is locked FOR UPDATE, so no claim takes it while this call commits (the claim skips
-- locked rows), and given this call's configuration and expiry, available `debounce` from now; without
-- one, a new job is inserted. Either way, while another job of the key runs (or waits for its next
-- attempt) the job is parked at never() with debounce_until, and the trigger debounce_released makes it
-- available when that run ends: one job of a key runs at a time, and a call during a run is not lost.
CREATE OR REPLACE FUNCTION {schema}.schedule_keyed(p_spec jsonb, p_channel text)
 RETURNS uuid
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_id uuid := (p_spec ->> 'id')::uuid;
    v_type text := p_spec ->> 'type';
    v_key text := p_spec ->> 'unique_key';
    v_for double precision := (p_spec ->> 'unique_for')::float8;
    v_debounce double precision := (p_spec ->> 'debounce')::float8;
    v_expires timestamptz := coalesce((p_spec ->> 'expires_at')::timestamptz,
                                      now() + make_interval(secs => (p_spec ->> 'expires_in')::float8));
    v_found uuid;
    v_new uuid;
    v_queue text;
    v_parked boolean := false;
    v_round integer;
    v_weight integer := coalesce((p_spec ->> 'weight')::integer, 1);
    v_then jsonb := p_spec;
BEGIN
    -- Weights (0028): a job, or a follow-up of it, heavier than a limit of its queue is refused here as
    -- insert_jobs_weighted refuses it; a follow-up scheduled by the trigger that finishes its parent was
    -- checked with its parent.
    IF pg_trigger_depth() = 0 THEN
        WHILE jsonb_typeof(v_then) = 'object' LOOP
            IF coalesce((v_then ->> 'weight')::integer, 1) > 1 THEN
                PERFORM {schema}.refuse_heavy_jobs(ARRAY[v_then ->> 'queue'], ARRAY[v_then ->> 'concurrency_key' IS NOT NULL],
                                                   ARRAY[(v_then ->> 'weight')::integer], '');
            END IF;
            v_then := CASE WHEN jsonb_typeof(v_then -> 'then') = 'string' THEN (v_then ->> 'then')::jsonb
                           ELSE v_then -> 'then' END;
        END LOOP;
    END IF;
    IF v_key IS NOT NULL AND (v_for IS NOT NULL OR v_debounce IS NOT NULL) THEN
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'unique_for and debounce need a READ COMMITTED transaction (this one is %): a later '
                'snapshot would not see the calls committed before it', current_setting('transaction_isolation')
                USING ERRCODE = 'feature_not_supported';
        END IF;
        PERFORM pg_advisory_xact_lock({schema}.wait_lock('unique:' || json_build_array(v_type, v_key)::text));
    END IF;
    FOR v_round IN 1 .. 10 LOOP
        IF v_for IS NOT NULL THEN
            SELECT j.id INTO v_found FROM {schema}.job AS j
            WHERE j.type = v_type AND j.unique_key = v_key AND j.created_at > now() - make_interval(secs => v_for)
            ORDER BY j.created_at DESC LIMIT 1;
            IF v_found IS NOT NULL THEN
                RETURN v_found;
            END IF;
        ELSIF v_debounce IS NOT NULL THEN
            SELECT j.id INTO v_found FROM {schema}.job AS j
            WHERE j.type = v_type AND j.unique_key = v_key AND j.status = 'queued' AND j.started_at IS NULL
            ORDER BY j.created_at LIMIT 1
            FOR UPDATE;
            -- Another job of the key runs, or waits for its next attempt: this one waits for its end.
            v_parked := EXISTS (SELECT 1 FROM {schema}.job AS r
                                WHERE r.type = v_type AND r.unique_key = v_key AND r.id IS DISTINCT FROM v_found
                                  AND (r.status = 'running' OR (r.status = 'queued' AND r.started_at IS NOT NULL)));
            IF v_found = v_id THEN
                RETURN v_id;  -- this very call, repeated after a lost connection: written already
            ELSIF v_found IS NOT NULL THEN
                PERFORM set_config('jobbus.debounce', v_found::text, true);
                UPDATE {schema}.job AS j
                SET configuration_data = p_spec -> 'configuration',
                    expires_at = v_expires,
                    available_at = CASE WHEN v_parked THEN {schema}.never()
                                        ELSE now() + make_interval(secs => v_debounce) END,
                    debounce_until = CASE WHEN v_parked THEN now() + make_interval(secs => v_debounce) END
                WHERE j.id = v_found
                RETURNING j.queue INTO v_queue;
                PERFORM set_config('jobbus.debounce', '', true);
                IF NOT v_parked THEN
                    PERFORM pg_notify(p_channel, json_build_array(v_queue, v_type)::text);
                END IF;
                RETURN v_found;
            END IF;
        END IF;
        IF pg_trigger_depth() > 0 THEN
            PERFORM set_config('jobbus.finishing', 'on', true);
        END IF;
        INSERT INTO {schema}.job AS j (id, type, queue, name, group_id, unique_key, priority, configuration_data,
                                      execution_data, max_attempts, available_at, timeout_seconds, concurrency_key,
                                      expires_at, unique_until, debounce_until, weight)
        VALUES (v_id, v_type, p_spec ->> 'queue', p_spec ->> 'name', (p_spec ->> 'group_id')::uuid, v_key,
                (p_spec ->> 'priority')::integer, p_spec -> 'configuration',
                coalesce(p_spec -> 'execution', '{{}}'), (p_spec ->> 'max_attempts')::integer,
                CASE WHEN v_parked THEN {schema}.never()
                     WHEN v_debounce IS NOT NULL THEN now() + make_interval(secs => v_debounce)
                     ELSE coalesce((p_spec ->> 'available_at')::timestamptz,
                                   now() + make_interval(secs => coalesce((p_spec ->> 'delay')::float8, 0))) END,
                (p_spec ->> 'timeout')::float8, p_spec ->> 'concurrency_key', v_expires,
                now() + make_interval(secs => v_for),
                CASE WHEN v_parked THEN now() + make_interval(secs => v_debounce) END, v_weight)
        ON CONFLICT DO NOTHING
        RETURNING j.id INTO v_new;
        PERFORM set_config('jobbus.finishing', '', true);
        IF v_new IS NOT NULL THEN
            IF p_spec ? 'parent_id' THEN
                INSERT INTO {schema}.job_child (child_id, parent_id) VALUES (v_new, (p_spec ->> 'parent_id')::uuid);
                INSERT INTO {schema}.job_parent AS p (parent_id, active) VALUES ((p_spec ->> 'parent_id')::uuid, 1)
                ON CONFLICT (parent_id) DO UPDATE SET active = p.active + 1;
            END IF;
            IF jsonb_typeof(p_spec -> 'then') = 'object' THEN
                INSERT INTO {schema}.job_follow_up (job_id, spec) VALUES (v_new, p_spec -> 'then') ON CONFLICT DO NOTHING;
            END IF;
            IF NOT v_parked THEN
                PERFORM pg_notify(p_channel, json_build_array(p_spec ->> 'queue', v_type)::text);
            END IF;
            RETURN v_new;
        END IF;
        -- The insert met a row: its own (this call repeated after a lost connection) or, each statement
        -- reading a new snapshot, the active job of its key, seen now (or ended in between: try again).
        IF EXISTS (SELECT 1 FROM {schema}.job AS j WHERE j.id = v_id) THEN
            RETURN v_id;
        END IF;
        IF v_debounce IS NULL THEN
            SELECT j.id INTO v_found FROM {schema}.job AS j
            WHERE j.type = v_type AND j.unique_key = v_key AND j.status IN ('queued', 'running')
              AND j.debounce_until IS NULL;
            IF v_found IS NOT NULL THEN
                RETURN v_found;
            END IF;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'unique_key %: the active job holding it changed 10 times in a row', v_key
        USING ERRCODE = 'serialization_failure';
END
$function$;

-- The SQL API's job object as schedule_keyed reads it, the options validated as schedule_job validates
-- them. A window or debounce needs a unique_key; they exclude each other, and debounce sets the start.
CREATE OR REPLACE FUNCTION {schema}.keyed_spec(p_job jsonb, p_where text, p_type text, p_queue text,
                                               p_configuration jsonb, p_group uuid, p_unique text,
                                               p_available timestamptz, p_delay double precision,
                                               p_for double precision, p_debounce double precision)
 RETURNS jsonb
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF p_unique IS NULL THEN
        PERFORM {schema}.refuse_option(p_where, CASE WHEN p_for IS NOT NULL THEN 'unique_for' ELSE 'debounce' END,
                                       'needs a unique_key: it deduplicates the jobs of one (type, unique_key)');
    END IF;
    IF p_for IS NOT NULL AND p_debounce IS NOT NULL THEN
        PERFORM {schema}.refuse_option(p_where, 'debounce', 'and unique_for exclude each other: give one');
    END IF;
    IF p_debounce IS NOT NULL AND (p_available IS NOT NULL OR p_delay IS NOT NULL) THEN
        PERFORM {schema}.refuse_option(p_where, 'debounce',
            'sets when the job starts (debounce seconds from the last call): give no available_at or delay_seconds');
    END IF;
    RETURN jsonb_build_object(
        'id', {schema}.uuid_generate_v7(), 'type', p_type, 'queue', p_queue,
        'name', {schema}.option_text(p_job, 'name', 1000, p_where), 'group_id', p_group, 'unique_key', p_unique,
        'priority', coalesce({schema}.option_integer(p_job, 'priority', -2147483648, 2147483647, p_where), 0),
        'configuration', p_configuration,
        'max_attempts', coalesce({schema}.option_integer(p_job, 'max_attempts', 1, 2147483647, p_where), 3),
        'available_at', p_available, 'delay', coalesce(p_delay, 0),
        'timeout', {schema}.option_seconds(p_job, 'timeout_seconds', false, p_where),
        'concurrency_key', {schema}.option_text(p_job, 'concurrency_key', 1000, p_where),
        'expires_at', {schema}.option_time(p_job, 'expires_at', p_where),
        'unique_for', p_for, 'debounce', p_debounce);
END
$function$;

-- When a run of a key ends (its job finished, or was deleted while waiting for its next attempt), the
-- debounced job parked behind it becomes available: at its debounce_until, or now if that passed. Only
-- keyed jobs that end call it (the triggers' WHEN), and it returns after one probe of the (almost always
-- empty) index of parked jobs. Should another job of the key have become active meanwhile (a manual
-- retry), the parked job stays parked and that job's end releases it.
CREATE OR REPLACE FUNCTION {schema}.debounce_released()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_queue text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {schema}.job AS w
                   WHERE w.type = OLD.type AND w.unique_key = OLD.unique_key AND w.debounce_until IS NOT NULL
                     AND w.status = 'queued') THEN
        RETURN NULL;
    END IF;
    BEGIN
        UPDATE {schema}.job AS w
        SET available_at = greatest(w.debounce_until, now()), debounce_until = NULL
        WHERE w.type = OLD.type AND w.unique_key = OLD.unique_key AND w.debounce_until IS NOT NULL
          AND w.status = 'queued'
          AND NOT EXISTS (SELECT 1 FROM {schema}.job AS r
                          WHERE r.type = w.type AND r.unique_key = w.unique_key AND r.id <> w.id
                            AND (r.status = 'running' OR (r.status = 'queued' AND r.started_at IS NOT NULL)))
        RETURNING w.queue INTO v_queue;
    EXCEPTION WHEN unique_violation THEN
        RETURN NULL;
    END;
    IF v_queue IS NOT NULL THEN
        PERFORM pg_notify({schema}.channel_name(TG_TABLE_SCHEMA, ''), json_build_array(v_queue, OLD.type)::text);
    END IF;
    RETURN NULL;
END
$function$;

CREATE TRIGGER job_debounce_finished AFTER UPDATE OF status ON {schema}.job
    FOR EACH ROW
    WHEN (NEW.unique_key IS NOT NULL AND OLD.status IN ('queued', 'running')
          AND NEW.status IN ('completed', 'failed', 'cancelled'))
    EXECUTE FUNCTION {schema}.debounce_released();

CREATE TRIGGER job_debounce_deleted AFTER DELETE ON {schema}.job
    FOR EACH ROW
    WHEN (OLD.unique_key IS NOT NULL AND OLD.status = 'queued' AND OLD.started_at IS NOT NULL)
    EXECUTE FUNCTION {schema}.debounce_released();

-- schedule_job: the options unique_for and debounce (seconds), handed to schedule_keyed.
CREATE OR REPLACE FUNCTION {schema}.schedule_job(p_job jsonb, p_where text, p_channel text)
 RETURNS uuid
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_unknown text;
    v_type text;
    v_queue text;
    v_configuration jsonb := p_job -> 'configuration';
    v_group uuid;
    v_unique text;
    v_delay double precision;
    v_available timestamptz;
    v_id uuid;
    v_round integer;
    v_weight integer;
    v_for double precision;
    v_debounce double precision;
BEGIN
    SELECT k INTO v_unknown FROM jsonb_object_keys(p_job) AS k
    WHERE k NOT IN ('type', 'configuration', 'queue', 'priority', 'name', 'unique_key', 'group_id', 'max_attempts',
                    'available_at', 'delay_seconds', 'timeout_seconds', 'concurrency_key', 'expires_at',
                    'weight', 'unique_for', 'debounce')
    ORDER BY k LIMIT 1;
    IF FOUND THEN
        PERFORM {schema}.refuse_option(p_where, v_unknown,
            'is not an option (queue, priority, name, unique_key, group_id, max_attempts, available_at, '
            'delay_seconds, timeout_seconds, concurrency_key, expires_at, weight, unique_for, debounce)');
    END IF;
    v_type := {schema}.option_text(p_job, 'type', 255, p_where);
    IF v_type IS NULL THEN
        PERFORM {schema}.refuse_option(p_where, 'type', 'is missing');
    END IF;
    IF v_configuration IS NULL OR jsonb_typeof(v_configuration) = 'null' THEN
        v_configuration := '{{}}';
    ELSIF jsonb_typeof(v_configuration) <> 'object' THEN
        PERFORM {schema}.refuse_option(p_where, 'configuration',
                                       'must be a JSON object, got ' || jsonb_typeof(v_configuration));
    ELSIF jsonb_path_exists(v_configuration, 'strict $.**{{200}} ? (@.type() == "object" || @.type() == "array")') THEN
        PERFORM {schema}.refuse_option(p_where, 'configuration', 'is nested too deeply (at most 200 levels)');
    END IF;
    v_queue := coalesce({schema}.option_text(p_job, 'queue', 255, p_where), 'default');
    IF jsonb_typeof(p_job -> 'group_id') NOT IN ('string', 'null') THEN
        PERFORM {schema}.refuse_option(p_where, 'group_id', 'must be a UUID string, got ' || (p_job -> 'group_id')::text);
    END IF;
    BEGIN
        v_group := (p_job ->> 'group_id')::uuid;
    EXCEPTION WHEN invalid_text_representation THEN
        PERFORM {schema}.refuse_option(p_where, 'group_id', 'must be a UUID string, got ' || (p_job -> 'group_id')::text);
    END;
    v_unique := {schema}.option_text(p_job, 'unique_key', 1000, p_where);
    v_available := {schema}.option_time(p_job, 'available_at', p_where);
    v_delay := {schema}.option_seconds(p_job, 'delay_seconds', true, p_where);
    IF v_available IS NOT NULL AND v_delay IS NOT NULL THEN
        PERFORM {schema}.refuse_option(p_where, 'delay_seconds', 'and available_at exclude each other: give one');
    END IF;
    -- Compared in seconds: now() plus a delay far out of range would overflow before the comparison.
    IF v_delay IS NOT NULL AND NOT v_delay BETWEEN extract(epoch FROM '0002-01-01 00:00:00+00'::timestamptz - now())
                                               AND extract(epoch FROM '9999-01-01 00:00:00+00'::timestamptz - now()) THEN
        PERFORM {schema}.refuse_option(p_where, 'delay_seconds',
                                       'is out of range: it must land between 0002-01-01 and 9999-01-01 UTC');
    END IF;
    IF v_group IS NOT NULL THEN
        PERFORM {schema}.refuse_callback_group(v_group, p_where);
    END IF;
    v_weight := coalesce({schema}.option_integer(p_job, 'weight', 1, 1000000, p_where), 1);
    IF v_weight > 1 THEN
        PERFORM {schema}.refuse_heavy_jobs(ARRAY[v_queue], ARRAY[jsonb_typeof(p_job -> 'concurrency_key') = 'string'],
                                           ARRAY[v_weight], p_where);
    END IF;
    -- A uniqueness window or debounce (SPEC 21): validated here, scheduled by schedule_keyed.
    v_for := {schema}.option_seconds(p_job, 'unique_for', false, p_where);
    v_debounce := {schema}.option_seconds(p_job, 'debounce', false, p_where);
    IF v_for IS NOT NULL OR v_debounce IS NOT NULL THEN
        RETURN {schema}.schedule_keyed({schema}.keyed_spec(p_job, p_where, v_type, v_queue, v_configuration, v_group,
                                                           v_unique, v_available, v_delay, v_for, v_debounce)
                                       || jsonb_build_object('weight', v_weight), p_channel);
    END IF;
    FOR v_round IN 1 .. 10 LOOP
        INSERT INTO {schema}.job AS j (id, type, queue, name, group_id, unique_key, priority, configuration_data,
                                      max_attempts, available_at, timeout_seconds, concurrency_key, expires_at,
                                      weight)
        VALUES ({schema}.uuid_generate_v7(), v_type, v_queue, {schema}.option_text(p_job, 'name', 1000, p_where),
                v_group, v_unique, coalesce({schema}.option_integer(p_job, 'priority', -2147483648, 2147483647, p_where), 0),
                v_configuration,
                coalesce({schema}.option_integer(p_job, 'max_attempts', 1, 2147483647, p_where), 3),
                coalesce(v_available, now() + make_interval(secs => coalesce(v_delay, 0))),
                {schema}.option_seconds(p_job, 'timeout_seconds', false, p_where),
                {schema}.option_text(p_job, 'concurrency_key', 1000, p_where),
                {schema}.option_time(p_job, 'expires_at', p_where),
                v_weight)
        ON CONFLICT DO NOTHING
        RETURNING j.id INTO v_id;
        IF v_id IS NOT NULL THEN
            PERFORM pg_notify(p_channel, json_build_array(v_queue, v_type)::text);
            RETURN v_id;
        END IF;
        -- Each statement reads a new snapshot: the holder that made the insert conflict is seen, or it
        -- ended in between and the insert is tried again.
        SELECT j.id INTO v_id FROM {schema}.job AS j
        WHERE j.type = v_type AND j.unique_key = v_unique AND j.status IN ('queued', 'running');
        IF v_id IS NOT NULL THEN
            RETURN v_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION '%', p_where || 'unique_key ' || v_unique || ': the active job holding it changed 10 times in a row'
        USING ERRCODE = 'serialization_failure';
END
$function$;

-- schedule_spec: a follow-up or a group's callback with a window or debounce goes
-- through schedule_keyed.
CREATE OR REPLACE FUNCTION {schema}.schedule_spec(p_spec jsonb, p_channel text)
 RETURNS uuid
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_id uuid;
BEGIN
    IF p_spec ? 'unique_for' OR p_spec ? 'debounce' THEN
        RETURN {schema}.schedule_keyed(p_spec, p_channel);
    END IF;
    IF pg_trigger_depth() > 0 THEN
        PERFORM set_config('jobbus.finishing', 'on', true);
    ELSIF coalesce((p_spec ->> 'weight')::integer, 1) > 1 THEN
        -- A spawned child is refused like any job; a follow-up or a callback (scheduled from the
        -- trigger that finishes its parent) was checked when its parent was scheduled.
        PERFORM {schema}.refuse_heavy_jobs(ARRAY[p_spec ->> 'queue'], ARRAY[p_spec ->> 'concurrency_key' IS NOT NULL],
                                           ARRAY[(p_spec ->> 'weight')::integer], '');
    END IF;
    INSERT INTO {schema}.job AS j (id, type, queue, name, group_id, unique_key, priority, configuration_data,
                                  max_attempts, available_at, timeout_seconds, concurrency_key, expires_at,
                                  weight)
    VALUES ((p_spec ->> 'id')::uuid, p_spec ->> 'type', p_spec ->> 'queue', p_spec ->> 'name',
            (p_spec ->> 'group_id')::uuid, p_spec ->> 'unique_key', (p_spec ->> 'priority')::integer,
            p_spec -> 'configuration', (p_spec ->> 'max_attempts')::integer,
            coalesce((p_spec ->> 'available_at')::timestamptz,
                     now() + make_interval(secs => coalesce((p_spec ->> 'delay')::float8, 0))),
            (p_spec ->> 'timeout')::float8, p_spec ->> 'concurrency_key',
            coalesce((p_spec ->> 'expires_at')::timestamptz,
                     now() + make_interval(secs => (p_spec ->> 'expires_in')::float8)),
            coalesce((p_spec ->> 'weight')::integer, 1))
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
$function$;

-- delete_finished_jobs (retention): a job keeps its row until its uniqueness window ends.
CREATE OR REPLACE FUNCTION {schema}.delete_finished_jobs(p_status text, p_older_than_seconds double precision, p_limit integer)
 RETURNS integer
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET jit TO 'off'
AS $function$
    WITH deleted AS (
        DELETE FROM {schema}.job
        WHERE id = ANY (ARRAY(
            SELECT j.id FROM {schema}.job AS j
            WHERE j.status = p_status
              AND p_status IN ('completed', 'failed', 'cancelled')
              AND j.finished_at < now() - make_interval(secs => p_older_than_seconds)
              AND (j.unique_until IS NULL OR j.unique_until <= now())
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
$function$;

-- reject_configuration_change: debounce's one exception (see schedule_keyed).
CREATE OR REPLACE FUNCTION {schema}.reject_configuration_change()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NEW.configuration_data::text IS DISTINCT FROM OLD.configuration_data::text
       -- debounce (schedule_keyed) gives a queued job that never started the configuration of a later call
       AND NOT (OLD.status = 'queued' AND OLD.started_at IS NULL
                AND current_setting('jobbus.debounce', true) IS NOT DISTINCT FROM OLD.id::text) THEN
        RAISE EXCEPTION 'configuration_data of job % is immutable', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$function$;

-- schedule_keyed runs as the schema's owner (a debounced call updates a queued job, which producers may
-- not do otherwise); as migration 0019 does, it is executable only by the roles granted it: those that
-- insert jobs.
REVOKE EXECUTE ON FUNCTION {schema}.schedule_keyed(jsonb, text) FROM PUBLIC;
DO $grant$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE acl.grantee::regrole::text END
        FROM pg_class AS c, aclexplode(c.relacl) AS acl
        WHERE c.oid = '{schema}.job'::regclass AND acl.privilege_type = 'INSERT'
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.schedule_keyed(jsonb, text) TO %s', v_grantee);
    END LOOP;
END
$grant$;
