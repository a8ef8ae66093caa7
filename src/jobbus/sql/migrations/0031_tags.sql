-- Tags (SPEC 21): a job may carry up to 16 short labels, stored in job.tags and filtered by
-- `jobbus jobs list --tag`, the dashboard and `App.update_many(tag=...)`.
--
-- * The column is nullable without a default: adding it rewrites nothing, and a job without tags
--   stores NULL, as it did before (the GIN index of migration 0032 holds only rows that have tags).
-- * The SQL API (`schedule`, `schedule_many`) takes `tags`, a JSON array of strings, validated as the
--   Python producer validates them (option_tags): each a non-blank string of at most 64 characters,
--   repeats dropped (the first kept, in order), at most 16 left; an empty array is no tags.
-- * schedule_spec (follow-ups, callbacks, spawned children) writes the spec's `tags`.
-- * Moving a queued job to another queue (`App.update`, `update_many`) must make its concurrency key
--   claimable there: the trigger job_key_moved notes the key in the new queue as an insert would.
-- * Roles granted the dashboard's columns of the job table may change priority, queue and tags too (and
--   debounce_until, the start of a parked debounced job; a move of a weighted job is checked by
--   refuse_heavy_jobs).

ALTER TABLE {schema}.job ADD COLUMN IF NOT EXISTS tags text[];

CREATE FUNCTION {schema}.option_tags(p_job jsonb, p_field text, p_where text) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := p_job -> p_field;
    v_tags text[] := '{{}}';
    v_item record;
    v_text text;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'array' THEN
        PERFORM {schema}.refuse_option(p_where, p_field, 'must be a JSON array of strings, got ' || v::text);
    END IF;
    FOR v_item IN SELECT e.value, e.n FROM jsonb_array_elements(v) WITH ORDINALITY AS e(value, n) ORDER BY e.n LOOP
        IF jsonb_typeof(v_item.value) <> 'string' THEN
            PERFORM {schema}.refuse_option(p_where, p_field,
                                           format('must hold strings only, item %s is %s', v_item.n - 1, v_item.value::text));
        END IF;
        v_text := v_item.value #>> '{{}}';
        -- Empty or blank: the characters Python's str.strip() removes (as option_text).
        IF v_text ~ '^[\t\n\v\f\r\x1c-\x1f \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$' THEN
            PERFORM {schema}.refuse_option(p_where, p_field, format('must not hold an empty tag (item %s)', v_item.n - 1));
        END IF;
        IF length(v_text) > 64 THEN
            PERFORM {schema}.refuse_option(p_where, p_field,
                format('holds a tag of %s characters (item %s), at most 64 are allowed', length(v_text), v_item.n - 1));
        END IF;
        IF NOT v_text = ANY (v_tags) THEN
            v_tags := v_tags || v_text;
        END IF;
    END LOOP;
    IF cardinality(v_tags) > 16 THEN
        PERFORM {schema}.refuse_option(p_where, p_field,
                                       format('has %s different tags, at most 16 are allowed', cardinality(v_tags)));
    END IF;
    RETURN CASE WHEN cardinality(v_tags) > 0 THEN v_tags END;
END
$$;

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
    v_tags text[];
BEGIN
    SELECT k INTO v_unknown FROM jsonb_object_keys(p_job) AS k
    WHERE k NOT IN ('type', 'configuration', 'queue', 'priority', 'name', 'unique_key', 'group_id', 'max_attempts',
                    'available_at', 'delay_seconds', 'timeout_seconds', 'concurrency_key', 'expires_at',
                    'weight', 'unique_for', 'debounce', 'tags')
    ORDER BY k LIMIT 1;
    IF FOUND THEN
        PERFORM {schema}.refuse_option(p_where, v_unknown,
            'is not an option (queue, priority, name, unique_key, group_id, max_attempts, available_at, '
            'delay_seconds, timeout_seconds, concurrency_key, expires_at, weight, unique_for, debounce, tags)');
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
    v_tags := {schema}.option_tags(p_job, 'tags', p_where);
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
                                       || jsonb_build_object('weight', v_weight, 'tags', to_jsonb(v_tags)), p_channel);
    END IF;
    FOR v_round IN 1 .. 10 LOOP
        INSERT INTO {schema}.job AS j (id, type, queue, name, group_id, unique_key, priority, configuration_data,
                                      max_attempts, available_at, timeout_seconds, concurrency_key, expires_at,
                                      weight, tags)
        VALUES ({schema}.uuid_generate_v7(), v_type, v_queue, {schema}.option_text(p_job, 'name', 1000, p_where),
                v_group, v_unique, coalesce({schema}.option_integer(p_job, 'priority', -2147483648, 2147483647, p_where), 0),
                v_configuration,
                coalesce({schema}.option_integer(p_job, 'max_attempts', 1, 2147483647, p_where), 3),
                coalesce(v_available, now() + make_interval(secs => coalesce(v_delay, 0))),
                {schema}.option_seconds(p_job, 'timeout_seconds', false, p_where),
                {schema}.option_text(p_job, 'concurrency_key', 1000, p_where),
                {schema}.option_time(p_job, 'expires_at', p_where),
                v_weight, v_tags)
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
                                  weight, tags)
    VALUES ((p_spec ->> 'id')::uuid, p_spec ->> 'type', p_spec ->> 'queue', p_spec ->> 'name',
            (p_spec ->> 'group_id')::uuid, p_spec ->> 'unique_key', (p_spec ->> 'priority')::integer,
            p_spec -> 'configuration', (p_spec ->> 'max_attempts')::integer,
            coalesce((p_spec ->> 'available_at')::timestamptz,
                     now() + make_interval(secs => coalesce((p_spec ->> 'delay')::float8, 0))),
            (p_spec ->> 'timeout')::float8, p_spec ->> 'concurrency_key',
            coalesce((p_spec ->> 'expires_at')::timestamptz,
                     now() + make_interval(secs => (p_spec ->> 'expires_in')::float8)),
            coalesce((p_spec ->> 'weight')::integer, 1),
            CASE WHEN jsonb_typeof(p_spec -> 'tags') = 'array'
                 THEN ARRAY(SELECT jsonb_array_elements_text(p_spec -> 'tags')) END)
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

-- schedule_keyed (0030) writes a windowed or debounced job's tags.
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
                                      expires_at, unique_until, debounce_until, weight,
                                      tags)
        VALUES (v_id, v_type, p_spec ->> 'queue', p_spec ->> 'name', (p_spec ->> 'group_id')::uuid, v_key,
                (p_spec ->> 'priority')::integer, p_spec -> 'configuration',
                coalesce(p_spec -> 'execution', '{{}}'), (p_spec ->> 'max_attempts')::integer,
                CASE WHEN v_parked THEN {schema}.never()
                     WHEN v_debounce IS NOT NULL THEN now() + make_interval(secs => v_debounce)
                     ELSE coalesce((p_spec ->> 'available_at')::timestamptz,
                                   now() + make_interval(secs => coalesce((p_spec ->> 'delay')::float8, 0))) END,
                (p_spec ->> 'timeout')::float8, p_spec ->> 'concurrency_key', v_expires,
                now() + make_interval(secs => v_for),
                CASE WHEN v_parked THEN now() + make_interval(secs => v_debounce) END, v_weight,
                CASE WHEN jsonb_typeof(p_spec -> 'tags') = 'array'
                     THEN ARRAY(SELECT jsonb_array_elements_text(p_spec -> 'tags')) END)
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

-- The dashboard's bulk edit changes a queued job's priority, queue and tags besides the columns a retry
-- changes: a role granted only those (the dashboard role of docs/security.md, granted before this
-- migration) may change these too, so its bulk edits work without new grants; roles with UPDATE on the
-- table have them.
DO $$
DECLARE
    v_grantee regrole;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT acl.grantee::regrole
        FROM pg_attribute AS a, aclexplode(a.attacl) AS acl
        WHERE a.attrelid = '{schema}.job'::regclass AND a.attname = 'error_group' AND acl.privilege_type = 'UPDATE'
          AND acl.grantee <> 0
    LOOP
        EXECUTE format('GRANT UPDATE (priority, queue, tags, debounce_until) ON {schema}.job TO %s', v_grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.refuse_heavy_jobs(text[], boolean[], integer[], text) TO %s',
                       v_grantee);
    END LOOP;
END
$$;

-- A queued job moved to another queue: its key is noted there (job_key_changed), so that a queue with
-- per-key limits claims it; the old queue's entry for the key finds no job and is retired by its claims.
CREATE TRIGGER job_key_moved AFTER UPDATE OF queue ON {schema}.job
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL AND NEW.status = 'queued' AND OLD.queue <> NEW.queue)
    EXECUTE FUNCTION {schema}.job_key_changed();

-- `App.update_many(add_tags=...)`: a job's tags with more added, repeats dropped (the first kept, in
-- order); more than 16 refuses the statement, naming the job (nothing of its batch is written).
CREATE FUNCTION {schema}.add_tags(p_id uuid, p_tags text[], p_add text[]) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_tags text[];
BEGIN
    SELECT array_agg(d.t ORDER BY d.n) INTO v_tags
    FROM (SELECT u.t, min(u.n) AS n FROM unnest(coalesce(p_tags, '{{}}') || p_add) WITH ORDINALITY AS u(t, n)
          GROUP BY u.t) AS d;
    IF cardinality(v_tags) > 16 THEN
        RAISE EXCEPTION 'job % would have % different tags, at most 16 are allowed', p_id, cardinality(v_tags)
            USING ERRCODE = 'invalid_parameter_value', COLUMN = 'add_tags';
    END IF;
    RETURN v_tags;
END
$$;
