-- Three promises an attack broke, kept in the claim and the SQL API:
--
-- * Expiry concerns the first start only (SPEC 18). A job that started once (its started_at is set)
--   runs its retries, durable sleeps and waits and its recovery after a crash as it would without
--   expires_at; only a job never started is cancelled as expired. started_at is the clock the claim
--   compared expires_at with, so no leased row says it started after it expired.
-- * A claim that meets expired jobs at a queue's head cancels them in bulk through the expiry index,
--   at most p_expiry_budget per call, instead of one slot at a time (each retake walked past every
--   row the statement had cancelled before it: 271 s for a claim of 10 behind 100,000 expired jobs).
--   When the budget runs out with expired jobs left ahead, the claim ends with a row whose id is NULL:
--   the caller claims again at once (the rescuer's sweep cancels the rest meanwhile), and a draining
--   worker does not take a short claim for an empty queue.
-- * max_payload_bytes compares the configuration's size as the worker would load it. pg_column_size
--   is the stored size, which for a compressed value is a fraction of it (60 MB of repetitive JSON
--   stored as 687 KB): a compressed value is measured as its JSON text. Values stored uncompressed
--   (every value under the TOAST threshold, about 2 KB) keep the free measure.
CREATE FUNCTION {schema}.claim_jobs(
    p_worker_id text,
    p_limit integer,
    p_pair_queues text[],
    p_pair_types text[],
    p_lease_seconds double precision,
    p_max_payload_bytes integer,
    p_limited_queues text[],
    p_expiry_budget integer
) RETURNS TABLE (
    id uuid, type text, queue text, name text, group_id uuid, priority integer, configuration_data jsonb,
    execution_data jsonb, attempts integer, max_attempts integer, lease_token uuid,
    cancellation_requested boolean, created_at timestamptz, available_at timestamptz, timeout_seconds double precision,
    oversized_bytes integer
)
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
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
    v_expired integer := 0;
    v_swept integer;
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
        -- One clock for the expiry test and for started_at; read at the update, not at the transaction's
        -- start: a claim that waited for a limited queue's lock must not date its starts before the rate
        -- window it was counted in.
        v_clock := clock_timestamp();
        RETURN QUERY
        WITH claimed AS (
            UPDATE {schema}.job AS j
            SET status = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN 'cancelled' ELSE 'running' END,
                attempts = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN j.attempts
                                ELSE j.attempts + 1 END,
                lease_token = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN NULL
                                   ELSE {schema}.uuid_generate_v7() END,
                lease_expires_at = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN NULL
                                        ELSE now() + make_interval(secs => p_lease_seconds) END,
                worker_id = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN j.worker_id
                                 ELSE p_worker_id END,
                started_at = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN NULL ELSE v_clock END,
                finished_at = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN now()
                                   ELSE j.finished_at END,
                last_error = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL
                                  THEN {schema}.expired_error(j.expires_at) ELSE j.last_error END
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
               CASE WHEN s.bytes <= p_max_payload_bytes THEN c.configuration_data END,
               c.execution_data, c.attempts, c.max_attempts, c.lease_token,
               c.cancellation_requested_at IS NOT NULL, c.created_at, c.available_at, c.timeout_seconds,
               CASE WHEN s.bytes > p_max_payload_bytes THEN s.bytes END
        FROM claimed AS c
        CROSS JOIN LATERAL (
            SELECT CASE WHEN pg_column_compression(c.configuration_data) IS NULL
                        THEN pg_column_size(c.configuration_data)
                        ELSE octet_length(c.configuration_data::text) END AS bytes
        ) AS s
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
        -- The expired jobs ahead go at once, through the expiry index, rather than a slot at a time.
        v_expired := v_expired + cardinality(v_ids) - v_claimed;
        WITH swept AS (
            UPDATE {schema}.job AS j
            SET status = 'cancelled', finished_at = now(), last_error = {schema}.expired_error(j.expires_at)
            WHERE j.id IN (
                SELECT e.id FROM {schema}.job AS e
                WHERE e.status = 'queued' AND e.expires_at <= v_clock AND e.started_at IS NULL
                  AND e.queue = ANY(v_queues) AND e.type = ANY(p_pair_types)
                ORDER BY e.expires_at
                LIMIT greatest(p_expiry_budget - v_expired, 0)
                FOR UPDATE SKIP LOCKED)
            RETURNING 1
        )
        SELECT count(*) INTO v_swept FROM swept;
        v_expired := v_expired + v_swept;
        IF v_expired >= p_expiry_budget THEN
            -- Expired jobs may be left ahead: the caller is told to claim again.
            RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::uuid, NULL::integer, NULL::jsonb,
                                NULL::jsonb, NULL::integer, NULL::integer, NULL::uuid, NULL::boolean, NULL::timestamptz,
                                NULL::timestamptz, NULL::double precision, NULL::integer;
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- The claim of migration 0022's signature, for workers of the previous release during a rolling
-- deploy: the same claim, its expiry budget fixed.
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
LANGUAGE sql VOLATILE
AS $$
    SELECT * FROM {schema}.claim_jobs(p_worker_id, p_limit, p_pair_queues, p_pair_types, p_lease_seconds,
                                      p_max_payload_bytes, p_limited_queues, 1000) AS c
    WHERE c.id IS NOT NULL
$$;

-- The SQL API refuses a configuration nested deeper than Python decodes (requests.MAX_JSON_DEPTH, 200
-- levels), as the Python producers do: a worker could not read it back. jsonpath's strict .**{200}
-- reaches every value at level 200 (the configuration itself is level 0), arrays included.
CREATE OR REPLACE FUNCTION {schema}.schedule_job(p_job jsonb, p_where text, p_channel text) RETURNS uuid
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
