-- Expiry: a job not started by its expires_at never runs; it ends `cancelled` with a last_error that
-- says it expired.
--
-- The claim enforces it: the update that leases what the claim took marks the expired rows among them
-- `cancelled` instead (a CASE on a row the update writes anyway: jobs without expiry pay nothing), and
-- the claim takes again for the slots they left, so expired jobs at the head of a queue never shrink a
-- batch below what is available. It holds for every way a claim takes jobs (unlimited, limited, per
-- key) and for every start, a retry's and a woken wait's included. The leader's rescuer cancels the
-- expired jobs no claim meets (a queue no worker serves, a job whose start lies past its expiry) through
-- job_expiry_idx, which holds only queued jobs with an expiry.

ALTER TABLE {schema}.job ADD COLUMN expires_at timestamptz;

CREATE INDEX job_expiry_idx ON {schema}.job (expires_at) WHERE status = 'queued' AND expires_at IS NOT NULL;

-- The reason an expired job was cancelled with.
CREATE FUNCTION {schema}.expired_error(p_expires_at timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format('expired: not started by its expires_at %s', p_expires_at)
$$;

-- schedule_spec of migration 0010, restated whole: a follow-up or a group's callback may expire, at an
-- absolute `expires_at` or `expires_in` seconds after it is scheduled.
CREATE OR REPLACE FUNCTION {schema}.schedule_spec(p_spec jsonb, p_channel text) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
BEGIN
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

-- The claim of migration 0012, restated whole: the rows it took that expired are cancelled by the same
-- update, and the claim takes again for them. A later round counts what earlier rounds leased through
-- the table (running rows and recorded starts of this transaction), so it excludes nothing itself.
CREATE OR REPLACE FUNCTION {schema}.claim_jobs(
    p_worker_id text,
    p_limit integer,
    p_pair_queues text[],
    p_pair_types text[],
    p_lease_seconds double precision,
    p_max_payload_bytes integer,
    p_limited_queues text[]
) RETURNS TABLE (
    id uuid, type text, queue text, name text, group_id uuid, priority integer, configuration_data jsonb,
    execution_data jsonb, attempts integer, max_attempts integer, lease_token uuid,
    cancellation_requested boolean, created_at timestamptz, available_at timestamptz, timeout_seconds double precision,
    oversized_bytes integer
)
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_queues text[];
    v_queue text;
    v_types text[];
    v_share integer;
    v_ids uuid[] := '{{}}';
    v_pass integer;
    v_want integer;
    v_limit integer := p_limit;
    v_claimed integer;
    v_clock timestamptz;
BEGIN
    SELECT array_agg(q.queue ORDER BY q.first) INTO v_queues
    FROM (SELECT p.queue, min(p.n) AS first FROM unnest(p_pair_queues) WITH ORDINALITY AS p(queue, n) GROUP BY p.queue) AS q;
    IF v_queues IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;
    LOOP
        v_ids := '{{}}';
        v_share := ceil(v_limit::numeric / cardinality(v_queues));
        FOR v_pass IN 1 .. 2 LOOP
            FOREACH v_queue IN ARRAY v_queues LOOP
                EXIT WHEN cardinality(v_ids) >= v_limit;
                SELECT array_agg(p.type) INTO v_types
                FROM unnest(p_pair_queues, p_pair_types) AS p(queue, type) WHERE p.queue = v_queue;
                v_want := CASE WHEN v_pass = 1 THEN least(v_share, v_limit - cardinality(v_ids))
                               ELSE v_limit - cardinality(v_ids) END;
                IF v_queue = ANY(p_limited_queues) THEN
                    v_ids := v_ids || {schema}.take_limited(v_queue, v_types, v_want, v_ids, p_lease_seconds);
                ELSE
                    v_ids := v_ids || {schema}.take_from_queue(v_queue, v_types, v_want, v_ids);
                END IF;
            END LOOP;
            EXIT WHEN cardinality(v_ids) >= v_limit OR cardinality(v_queues) = 1;
        END LOOP;
        -- started_at is the clock at the update, not the transaction's start: a claim that waited for a
        -- limited queue's lock must not date its starts before the rate window it was counted in.
        v_clock := clock_timestamp();
        RETURN QUERY
        WITH claimed AS (
            UPDATE {schema}.job AS j
            SET status = CASE WHEN j.expires_at <= v_clock THEN 'cancelled' ELSE 'running' END,
                attempts = CASE WHEN j.expires_at <= v_clock THEN j.attempts ELSE j.attempts + 1 END,
                lease_token = CASE WHEN j.expires_at <= v_clock THEN NULL ELSE {schema}.uuid_generate_v7() END,
                lease_expires_at = CASE WHEN j.expires_at <= v_clock THEN NULL
                                        ELSE now() + make_interval(secs => p_lease_seconds) END,
                worker_id = CASE WHEN j.expires_at <= v_clock THEN j.worker_id ELSE p_worker_id END,
                started_at = CASE WHEN j.expires_at <= v_clock THEN j.started_at ELSE clock_timestamp() END,
                finished_at = CASE WHEN j.expires_at <= v_clock THEN now() ELSE j.finished_at END,
                last_error = CASE WHEN j.expires_at <= v_clock THEN {schema}.expired_error(j.expires_at)
                                  ELSE j.last_error END
            WHERE j.id = ANY(v_ids)
            RETURNING j.*
        ), started AS (
            INSERT INTO {schema}.queue_start (queue, concurrency_key, started_at)
            SELECT c.queue, c.concurrency_key, c.started_at FROM claimed AS c
            WHERE c.status = 'running' AND c.queue = ANY(p_limited_queues)
              AND EXISTS (SELECT 1 FROM {schema}.queue_setting AS s
                          WHERE s.queue = c.queue AND (s.rate_count IS NOT NULL OR s.key_rate_count IS NOT NULL))
        )
        SELECT c.id, c.type, c.queue, c.name, c.group_id, c.priority,
               CASE WHEN pg_column_size(c.configuration_data) <= p_max_payload_bytes THEN c.configuration_data END,
               c.execution_data, c.attempts, c.max_attempts, c.lease_token,
               c.cancellation_requested_at IS NOT NULL, c.created_at, c.available_at, c.timeout_seconds,
               CASE WHEN pg_column_size(c.configuration_data) > p_max_payload_bytes
                    THEN pg_column_size(c.configuration_data) END
        FROM claimed AS c
        WHERE c.status = 'running';
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
        -- Every row taken was leased: done. Some had expired: take again for the slots they left.
        EXIT WHEN v_claimed = cardinality(v_ids);
        v_limit := v_limit - v_claimed;
        -- A key whose taken job expired counted it as running or started: its limits are read again.
        UPDATE {schema}.queue_key AS k SET blocked_until = NULL
        FROM {schema}.job AS j
        WHERE j.id = ANY(v_ids) AND j.status = 'cancelled' AND j.concurrency_key IS NOT NULL
          AND k.queue = j.queue AND k.concurrency_key = j.concurrency_key AND k.blocked_until IS NOT NULL;
    END LOOP;
END
$$;

-- The SQL API (docs/sql.md): schedule(type, configuration, options) and schedule_many(jobs) enqueue
-- from a trigger, psql or any language's driver with what App.schedule and schedule_many check, the
-- same deduplication (the active job's id comes back) and the same notification to workers. A refusal
-- is SQLSTATE 22023 (invalid_parameter_value) with the field in the message and in the error's
-- COLUMN field; nothing is written. SECURITY INVOKER: the caller needs what a Python producer needs.

-- Refuse one field: the message names it (with its place in a schedule_many array).
CREATE FUNCTION {schema}.refuse_option(p_where text, p_field text, p_problem text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION '%', p_where || p_field || ' ' || p_problem
        USING ERRCODE = 'invalid_parameter_value', COLUMN = p_field;
END
$$;

-- A text option: a non-empty string of at most p_limit bytes (NULL when absent or JSON null).
CREATE FUNCTION {schema}.option_text(p_job jsonb, p_field text, p_limit integer, p_where text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := p_job -> p_field;
    v_text text;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'string' THEN
        PERFORM {schema}.refuse_option(p_where, p_field, 'must be a string, got ' || v::text);
    END IF;
    v_text := v #>> '{{}}';
    -- Empty or blank: the characters Python's str.strip() removes, whatever the database's locale.
    IF v_text ~ '^[\t\n\v\f\r\x1c-\x1f \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$' THEN
        PERFORM {schema}.refuse_option(p_where, p_field, 'must not be empty');
    END IF;
    IF octet_length(v_text) > p_limit THEN
        PERFORM {schema}.refuse_option(p_where, p_field, format('is %s bytes long in UTF-8, at most %s are allowed',
                                                               octet_length(v_text), p_limit));
    END IF;
    RETURN v_text;
END
$$;

-- An integer option (a JSON number without fraction or exponent) within [p_min, p_max].
CREATE FUNCTION {schema}.option_integer(p_job jsonb, p_field text, p_min bigint, p_max bigint, p_where text)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := p_job -> p_field;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'number' OR v::text ~ '[.eE]' THEN
        PERFORM {schema}.refuse_option(p_where, p_field, 'must be an integer, got ' || v::text);
    END IF;
    IF v::numeric < p_min OR v::numeric > p_max THEN
        PERFORM {schema}.refuse_option(p_where, p_field, format('must be between %s and %s, got %s', p_min, p_max, v));
    END IF;
    RETURN v::integer;
END
$$;

-- A number of seconds: finite, more than 0 (or any, p_any), at most a year.
CREATE FUNCTION {schema}.option_seconds(p_job jsonb, p_field text, p_any boolean, p_where text)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v jsonb := p_job -> p_field;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'number' THEN
        PERFORM {schema}.refuse_option(p_where, p_field, 'must be seconds (a number), got ' || v::text);
    END IF;
    IF NOT p_any AND (v::numeric <= 0 OR v::numeric > 31536000) THEN
        PERFORM {schema}.refuse_option(p_where, p_field,
                                       'must be more than 0 and at most 31536000 seconds (a year), got ' || v::text);
    END IF;
    RETURN v::double precision;
END
$$;

-- An absolute time: an ISO 8601 string with a timezone offset, between 0002-01-01 and 9999-01-01 UTC.
CREATE FUNCTION {schema}.option_time(p_job jsonb, p_field text, p_where text) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v jsonb := p_job -> p_field;
    v_text text;
    v_at timestamptz;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    v_text := v #>> '{{}}';
    IF jsonb_typeof(v) <> 'string' OR v_text !~ '^\d{{4}}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?([Zz]|[+-]\d\d(:?\d\d)?)$' THEN
        PERFORM {schema}.refuse_option(p_where, p_field,
            'must be an ISO 8601 timestamp with a timezone offset (e.g. 2026-05-01T09:00:00+02:00), got ' || v::text);
    END IF;
    BEGIN
        v_at := v_text::timestamptz;
    EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format OR invalid_time_zone_displacement_value THEN
        PERFORM {schema}.refuse_option(p_where, p_field, 'is not a valid timestamp: ' || v::text);
    END;
    IF NOT v_at BETWEEN '0002-01-01 00:00:00+00' AND '9999-01-01 00:00:00+00' THEN
        PERFORM {schema}.refuse_option(p_where, p_field, 'is out of range: it must land between 0002-01-01 and 9999-01-01 UTC');
    END IF;
    RETURN v_at;
END
$$;

-- Groups are what they were scheduled as (SPEC 16): a job naming a group that has a callback is refused,
-- under the group's lock as job_grouped takes it. job_grouped lets in what a trigger inserts (a
-- follow-up written while a job finishes), so the API checks itself: it is called from triggers too.
-- SECURITY DEFINER: a producer may not read job_group.
CREATE FUNCTION {schema}.refuse_callback_group(p_group uuid, p_where text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({schema}.wait_lock('group:' || p_group::text));
    IF EXISTS (SELECT 1 FROM {schema}.job_group AS g WHERE g.group_id = p_group) THEN
        RAISE EXCEPTION '%group % has a callback: its members are the jobs schedule_group scheduled with it',
            p_where, p_group USING ERRCODE = 'JB409';
    END IF;
END
$$;

-- One job of the API, validated and inserted (or the active job holding its unique key): its id.
CREATE FUNCTION {schema}.schedule_job(p_job jsonb, p_where text, p_channel text) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
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
BEGIN
    SELECT k INTO v_unknown FROM jsonb_object_keys(p_job) AS k
    WHERE k NOT IN ('type', 'configuration', 'queue', 'priority', 'name', 'unique_key', 'group_id', 'max_attempts',
                    'available_at', 'delay_seconds', 'timeout_seconds', 'concurrency_key', 'expires_at')
    ORDER BY k LIMIT 1;
    IF FOUND THEN
        PERFORM {schema}.refuse_option(p_where, v_unknown,
            'is not an option (queue, priority, name, unique_key, group_id, max_attempts, available_at, '
            'delay_seconds, timeout_seconds, concurrency_key, expires_at)');
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
    FOR v_round IN 1 .. 10 LOOP
        INSERT INTO {schema}.job AS j (id, type, queue, name, group_id, unique_key, priority, configuration_data,
                                      max_attempts, available_at, timeout_seconds, concurrency_key, expires_at)
        VALUES ({schema}.uuid_generate_v7(), v_type, v_queue, {schema}.option_text(p_job, 'name', 1000, p_where),
                v_group, v_unique, coalesce({schema}.option_integer(p_job, 'priority', -2147483648, 2147483647, p_where), 0),
                v_configuration,
                coalesce({schema}.option_integer(p_job, 'max_attempts', 1, 2147483647, p_where), 3),
                coalesce(v_available, now() + make_interval(secs => coalesce(v_delay, 0))),
                {schema}.option_seconds(p_job, 'timeout_seconds', false, p_where),
                {schema}.option_text(p_job, 'concurrency_key', 1000, p_where),
                {schema}.option_time(p_job, 'expires_at', p_where))
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

-- NULL (or JSON null) options are no options, as NULL configuration is an empty one: what a driver
-- sends for an argument it has nothing for.
CREATE FUNCTION {schema}.schedule(type text, configuration jsonb DEFAULT '{{}}', options jsonb DEFAULT '{{}}')
RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_options jsonb := coalesce(CASE WHEN jsonb_typeof(options) <> 'null' THEN options END, '{{}}');
BEGIN
    IF jsonb_typeof(v_options) <> 'object' THEN
        PERFORM {schema}.refuse_option('', 'options', 'must be a JSON object');
    END IF;
    IF v_options ? 'type' OR v_options ? 'configuration' THEN
        PERFORM {schema}.refuse_option('', CASE WHEN v_options ? 'type' THEN 'type' ELSE 'configuration' END,
                                       'is an argument of schedule, not an option');
    END IF;
    RETURN {schema}.schedule_job(
        v_options || jsonb_build_object('type', to_jsonb(type), 'configuration', coalesce(configuration, '{{}}')), '',
        {schema}.channel_name(trim(both '"' from '{schema}'), ''));
END
$$;

-- Jobs in input order; keyed jobs are inserted first, in (type, unique_key) order, so concurrent calls
-- with overlapping keys take the unique index's locks in one order (as App.schedule_many does).
CREATE FUNCTION {schema}.schedule_many(jobs jsonb) RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_channel text := {schema}.channel_name(trim(both '"' from '{schema}'), '');
    v_ids uuid[] := '{{}}';
    v_item record;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        PERFORM {schema}.refuse_option('', 'jobs', 'must be a JSON array of objects');
    END IF;
    FOR v_item IN
        SELECT e.value, e.n FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, n)
        ORDER BY (jsonb_typeof(e.value) = 'object' AND e.value ? 'unique_key') DESC,
                 e.value ->> 'type', e.value ->> 'unique_key', e.n
    LOOP
        IF jsonb_typeof(v_item.value) <> 'object' THEN
            PERFORM {schema}.refuse_option(format('jobs[%s]', v_item.n - 1), '', 'must be a JSON object');
        END IF;
        v_ids[v_item.n] := {schema}.schedule_job(v_item.value, format('jobs[%s].', v_item.n - 1), v_channel);
    END LOOP;
    RETURN QUERY SELECT i.id FROM unnest(v_ids) WITH ORDINALITY AS i(id, n) ORDER BY i.n;
END
$$;
