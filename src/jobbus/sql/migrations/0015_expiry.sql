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
