-- Tags (SPEC 21): a job may carry up to 16 short labels, stored in job.tags and filtered by
-- `jobbus jobs list --tag`, the dashboard and `App.update_many(tag=...)`.
--
-- * The column is nullable without a default: adding it rewrites nothing, and a job without tags
--   stores NULL, as it did before (the GIN index of migration 0031 holds only rows that have tags).
-- * The SQL API (`schedule`, `schedule_many`) takes `tags`, a JSON array of strings, validated as the
--   Python producer validates them (option_tags): each a non-blank string of at most 64 characters,
--   repeats dropped (the first kept, in order), at most 16 left; an empty array is no tags.
-- * schedule_spec (follow-ups, callbacks, spawned children) writes the spec's `tags`.
-- * Moving a queued job to another queue (`App.update`, `update_many`) must make its concurrency key
--   claimable there: the trigger job_key_moved notes the key in the new queue as an insert would.
-- * Roles granted the dashboard's columns of the job table may change priority, queue and tags too.

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

CREATE OR REPLACE FUNCTION {schema}.schedule_job(p_job jsonb, p_where text, p_channel text) RETURNS uuid
LANGUAGE plpgsql AS $$
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
    v_tags text[];
BEGIN
    SELECT k INTO v_unknown FROM jsonb_object_keys(p_job) AS k
    WHERE k NOT IN ('type', 'configuration', 'queue', 'priority', 'name', 'unique_key', 'group_id', 'max_attempts',
                    'available_at', 'delay_seconds', 'timeout_seconds', 'concurrency_key', 'expires_at', 'tags')
    ORDER BY k LIMIT 1;
    IF FOUND THEN
        PERFORM {schema}.refuse_option(p_where, v_unknown,
            'is not an option (queue, priority, name, unique_key, group_id, max_attempts, available_at, '
            'delay_seconds, timeout_seconds, concurrency_key, expires_at, tags)');
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
    FOR v_round IN 1 .. 10 LOOP
        INSERT INTO {schema}.job AS j (id, type, queue, name, group_id, unique_key, priority, configuration_data,
                                      max_attempts, available_at, timeout_seconds, concurrency_key, expires_at, tags)
        VALUES ({schema}.uuid_generate_v7(), v_type, v_queue, {schema}.option_text(p_job, 'name', 1000, p_where),
                v_group, v_unique, coalesce({schema}.option_integer(p_job, 'priority', -2147483648, 2147483647, p_where), 0),
                v_configuration,
                coalesce({schema}.option_integer(p_job, 'max_attempts', 1, 2147483647, p_where), 3),
                coalesce(v_available, now() + make_interval(secs => coalesce(v_delay, 0))),
                {schema}.option_seconds(p_job, 'timeout_seconds', false, p_where),
                {schema}.option_text(p_job, 'concurrency_key', 1000, p_where),
                {schema}.option_time(p_job, 'expires_at', p_where), v_tags)
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
$$;

CREATE OR REPLACE FUNCTION {schema}.schedule_spec(p_spec jsonb, p_channel text) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
BEGIN
    IF pg_trigger_depth() > 0 THEN
        PERFORM set_config('jobbus.finishing', 'on', true);
    END IF;
    INSERT INTO {schema}.job AS j (id, type, queue, name, group_id, unique_key, priority, configuration_data,
                                  max_attempts, available_at, timeout_seconds, concurrency_key, expires_at, tags)
    VALUES ((p_spec ->> 'id')::uuid, p_spec ->> 'type', p_spec ->> 'queue', p_spec ->> 'name',
            (p_spec ->> 'group_id')::uuid, p_spec ->> 'unique_key', (p_spec ->> 'priority')::integer,
            p_spec -> 'configuration', (p_spec ->> 'max_attempts')::integer,
            coalesce((p_spec ->> 'available_at')::timestamptz,
                     now() + make_interval(secs => coalesce((p_spec ->> 'delay')::float8, 0))),
            (p_spec ->> 'timeout')::float8, p_spec ->> 'concurrency_key',
            coalesce((p_spec ->> 'expires_at')::timestamptz,
                     now() + make_interval(secs => (p_spec ->> 'expires_in')::float8)),
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
$$;

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
        EXECUTE format('GRANT UPDATE (priority, queue, tags) ON {schema}.job TO %s', v_grantee);
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
