-- One leader for maintenance, retention without DELETE rights for workers, queue statistics, and claims
-- that cost what a worker can take: per queue, per job type, per priority level.

-- The leadership lease: at most one live worker holds it; it alone runs maintenance. A row in a table
-- (no session advisory lock), so it works behind PgBouncer in transaction mode.
CREATE TABLE {schema}.leader (
    name         text PRIMARY KEY,
    worker_id    text NOT NULL,
    instance_id  uuid NOT NULL,
    elected_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

-- What the leader samples about every queue at a fixed interval: gauges (queued, running, oldest
-- available) and the jobs that finished since the previous sample. Metrics and the dashboard read
-- these rows, never the job table, so no request path counts millions of rows.
CREATE TABLE {schema}.queue_stat (
    sampled_at                 timestamptz NOT NULL,
    queue                      text NOT NULL,
    available                  bigint NOT NULL,
    scheduled                  bigint NOT NULL,
    running                    bigint NOT NULL,
    completed                  bigint NOT NULL,  -- finished since the previous sample
    failed                     bigint NOT NULL,
    cancelled                  bigint NOT NULL,
    oldest_available_seconds   double precision,
    PRIMARY KEY (sampled_at, queue)
);

-- Retention: deletes finished jobs past their retention in one bounded batch. SECURITY DEFINER, owned
-- by the schema owner: a worker (the leader) may delete expired finished jobs and nothing else, so the
-- worker role still has no DELETE on the job table. Rows another session holds are skipped.
CREATE FUNCTION {schema}.delete_finished_jobs(p_status text, p_older_than_seconds double precision, p_limit integer)
RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH doomed AS (
        SELECT id FROM {schema}.job
        WHERE status = p_status
          AND p_status IN ('completed', 'failed', 'cancelled')
          AND finished_at < now() - make_interval(secs => p_older_than_seconds)
        ORDER BY finished_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), deleted AS (
        DELETE FROM {schema}.job AS j USING doomed WHERE j.id = doomed.id RETURNING 1
    )
    SELECT count(*)::integer FROM deleted
$$;

-- The (queue, type) pairs that have queued jobs, by a loose index scan over job_queue_claim_idx: one
-- index probe per pair, however many jobs each holds. Workers read it every poll interval to know what
-- they can take; it never walks the jobs themselves.
CREATE FUNCTION {schema}.queued_pairs() RETURNS TABLE (queue text, type text)
LANGUAGE sql STABLE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
    WITH RECURSIVE pairs AS (
        (SELECT j.queue, j.type FROM {schema}.job AS j WHERE j.status = 'queued' ORDER BY j.queue, j.type LIMIT 1)
        UNION ALL
        SELECT next.queue, next.type
        FROM pairs,
             LATERAL (SELECT j.queue, j.type FROM {schema}.job AS j
                      WHERE j.status = 'queued' AND (j.queue, j.type) > (pairs.queue, pairs.type)
                      ORDER BY j.queue, j.type LIMIT 1) AS next
    )
    SELECT queue, type FROM pairs
$$;

-- Up to p_want queued, available job ids of one queue, locked in claim order (priority, then
-- available_at, then id), among the given types. Never walks rows it cannot take: each (type,
-- priority) group is found by index probes, and inside a group the available jobs come first in the
-- index (jobs scheduled for later follow them and are not read). One group, the common case: one
-- locking range scan. Several: their heads are read without locks, merged in claim order, and each
-- group then locks what it contributes (SKIP LOCKED), so no row is locked that is not claimed.
CREATE FUNCTION {schema}.take_from_queue(p_queue text, p_types text[], p_want integer, p_exclude uuid[])
RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    v_types text[] := '{{}}';
    v_priorities integer[] := '{{}}';
    v_type text;
    v_priority integer;
    v_ids uuid[] := '{{}}';
    v_more uuid[];
    v_counts integer[];
    v_group integer;
BEGIN
    IF p_want <= 0 THEN
        RETURN v_ids;
    END IF;
    FOREACH v_type IN ARRAY p_types LOOP
        SELECT j.priority INTO v_priority FROM {schema}.job AS j
        WHERE j.status = 'queued' AND j.queue = p_queue AND j.type = v_type
        ORDER BY j.priority DESC LIMIT 1;
        WHILE FOUND LOOP
            v_types := v_types || v_type;
            v_priorities := v_priorities || v_priority;
            SELECT j.priority INTO v_priority FROM {schema}.job AS j
            WHERE j.status = 'queued' AND j.queue = p_queue AND j.type = v_type AND j.priority < v_priority
            ORDER BY j.priority DESC LIMIT 1;
        END LOOP;
    END LOOP;
    IF cardinality(v_types) = 0 THEN
        RETURN v_ids;
    END IF;
    IF cardinality(v_types) > 1 THEN
        -- How many each group contributes to the first p_want jobs in claim order.
        SELECT array_agg(coalesce(c.n, 0) ORDER BY g.g) INTO v_counts
        FROM generate_subscripts(v_types, 1) AS g(g)
        LEFT JOIN (
            SELECT top.g, count(*)::integer AS n
            FROM (
                SELECT heads.g
                FROM generate_subscripts(v_types, 1) AS groups(g)
                CROSS JOIN LATERAL (
                    SELECT groups.g, j.priority, j.available_at, j.id FROM {schema}.job AS j
                    WHERE j.status = 'queued' AND j.queue = p_queue AND j.type = v_types[groups.g]
                      AND j.priority = v_priorities[groups.g] AND j.available_at <= now()
                      AND NOT (j.id = ANY(p_exclude))
                    ORDER BY j.available_at, j.id LIMIT p_want
                ) AS heads
                ORDER BY heads.priority DESC, heads.available_at, heads.id
                LIMIT p_want
            ) AS top
            GROUP BY top.g
        ) AS c ON c.g = g.g;
    ELSE
        v_counts := ARRAY[p_want];
    END IF;
    FOR v_group IN 1 .. cardinality(v_types) LOOP
        CONTINUE WHEN v_counts[v_group] = 0;
        SELECT coalesce(array_agg(locked.id), '{{}}') INTO v_more
        FROM (
            SELECT j.id FROM {schema}.job AS j
            WHERE j.status = 'queued' AND j.queue = p_queue AND j.type = v_types[v_group]
              AND j.priority = v_priorities[v_group] AND j.available_at <= now()
              AND NOT (j.id = ANY(p_exclude))
            ORDER BY j.available_at, j.id
            LIMIT v_counts[v_group]
            FOR UPDATE SKIP LOCKED
        ) AS locked;
        v_ids := v_ids || v_more;
    END LOOP;
    RETURN v_ids;
END
$$;

-- The claim: one statement for the worker (one transaction), leasing up to p_limit jobs from the
-- (queue, type) pairs it can take, which the worker knows from queued_pairs(). Queues are served in
-- the order given (the worker rotates it): each first gets an equal share of the free slots, then
-- what a queue left unused goes to the others. Queues with limits (p_limited_queues, which the worker
-- reads from queue_setting) go through take_limited (migration 0008); the others pay nothing for it.
-- Each job comes back with when it was created and became available (a handler can measure its own
-- queueing delay) and without a configuration larger than the worker accepts: producers other than
-- this library could store any size, which workers would then load in claim batches. Such a job comes
-- back with a NULL configuration and its stored size (pg_column_size reads the datum's header, without
-- decompressing it), and the worker fails it at once.
CREATE FUNCTION {schema}.claim_jobs(
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
BEGIN
    SELECT array_agg(q.queue ORDER BY q.first) INTO v_queues
    FROM (SELECT p.queue, min(p.n) AS first FROM unnest(p_pair_queues) WITH ORDINALITY AS p(queue, n) GROUP BY p.queue) AS q;
    IF v_queues IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;
    v_share := ceil(p_limit::numeric / cardinality(v_queues));
    FOR v_pass IN 1 .. 2 LOOP
        FOREACH v_queue IN ARRAY v_queues LOOP
            EXIT WHEN cardinality(v_ids) >= p_limit;
            SELECT array_agg(p.type) INTO v_types
            FROM unnest(p_pair_queues, p_pair_types) AS p(queue, type) WHERE p.queue = v_queue;
            v_want := CASE WHEN v_pass = 1 THEN least(v_share, p_limit - cardinality(v_ids))
                           ELSE p_limit - cardinality(v_ids) END;
            IF v_queue = ANY(p_limited_queues) THEN
                v_ids := v_ids || {schema}.take_limited(v_queue, v_types, v_want, v_ids);
            ELSE
                v_ids := v_ids || {schema}.take_from_queue(v_queue, v_types, v_want, v_ids);
            END IF;
        END LOOP;
        EXIT WHEN cardinality(v_ids) >= p_limit OR cardinality(v_queues) = 1;
    END LOOP;
    -- started_at is the clock at the update, not the transaction's start: a claim that waited for a
    -- limited queue's lock must not date its starts before the rate window it was counted in.
    RETURN QUERY
    WITH claimed AS (
        UPDATE {schema}.job AS j
        SET status = 'running',
            attempts = j.attempts + 1,
            lease_token = {schema}.uuid_generate_v7(),
            lease_expires_at = now() + make_interval(secs => p_lease_seconds),
            worker_id = p_worker_id,
            started_at = clock_timestamp()
        WHERE j.id = ANY(v_ids)
        RETURNING j.*
    ), started AS (
        INSERT INTO {schema}.queue_start (queue, concurrency_key, started_at)
        SELECT c.queue, c.concurrency_key, c.started_at FROM claimed AS c WHERE c.queue = ANY(p_limited_queues)
    )
    SELECT c.id, c.type, c.queue, c.name, c.group_id, c.priority,
           CASE WHEN pg_column_size(c.configuration_data) <= p_max_payload_bytes THEN c.configuration_data END,
           c.execution_data, c.attempts, c.max_attempts, c.lease_token,
           c.cancellation_requested_at IS NOT NULL, c.created_at, c.available_at, c.timeout_seconds,
           CASE WHEN pg_column_size(c.configuration_data) > p_max_payload_bytes
                THEN pg_column_size(c.configuration_data) END
    FROM claimed AS c;
END
$$;
