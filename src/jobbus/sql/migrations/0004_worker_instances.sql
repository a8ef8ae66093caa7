-- Worker instances, their own timing, commands routed by target, and a server-side payload bound.

-- Each worker process registers a fresh instance id. A second process under the same worker id is
-- refused while the first is live; acknowledgements and registry refreshes are fenced by the instance,
-- so a restart under the same id never counts as the old process having applied a command.
ALTER TABLE {schema}.worker
    ADD COLUMN instance_id uuid,
    -- The worker's own settings: `status`/`workers` and the leader judge it by these, not by theirs.
    ADD COLUMN lease_seconds double precision NOT NULL DEFAULT 300,
    ADD COLUMN dead_after_seconds double precision NOT NULL DEFAULT 15,
    ADD COLUMN heartbeat_seconds double precision NOT NULL DEFAULT 5,
    -- Set when a silent worker was declared dead and its jobs recovered; cleared when it speaks again.
    ADD COLUMN declared_dead_at timestamptz;

-- Job columns of the production queue: a timeout per job (the handler's when NULL), the key that
-- per-key concurrency and rate limits count by, and the history of the job's attempts (what each ended
-- in: retried, snoozed, released, timed out, recovered, ...), kept bounded. ADD COLUMN with a constant
-- default changes the catalog only (no table rewrite).
ALTER TABLE {schema}.job
    ADD COLUMN timeout_seconds double precision,
    ADD COLUMN concurrency_key text,
    ADD COLUMN history jsonb NOT NULL DEFAULT '[]';

-- The workers (and their instances) a command was addressed to when it was issued: what `--wait`
-- waits for. Routing does not use this snapshot: a worker applies every command issued after it
-- started whose target matches it when it next reads control, also after an outage.
ALTER TABLE {schema}.command
    ADD COLUMN instance_ids uuid[] NOT NULL DEFAULT '{{}}';

-- The claim also returns when the job was created and became available, so a handler can measure its
-- own queueing delay. And it never loads a configuration larger than the worker accepts: producers other
-- than this library could store any size, which workers would then load in claim batches. Such a job is
-- claimed without its configuration (NULL, with its stored size) and the worker fails it at once.
-- pg_column_size reads the stored datum's size without decompressing it. A new overload: workers of the
-- previous version keep calling theirs during a rolling deploy.

CREATE FUNCTION {schema}.claim_jobs(
    p_worker_id text,
    p_limit integer,
    p_types text[],
    p_all_queues boolean,
    p_queues text[],
    p_paused_queues text[],
    p_lease_seconds double precision,
    p_max_payload_bytes integer
) RETURNS TABLE (
    id uuid, type text, queue text, name text, group_id uuid, priority integer, configuration_data jsonb,
    execution_data jsonb, attempts integer, max_attempts integer, lease_token uuid,
    cancellation_requested boolean, created_at timestamptz, available_at timestamptz, timeout_seconds double precision,
    oversized_bytes integer
)
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH next AS (
        SELECT candidate.id
        FROM {schema}.job AS candidate
        WHERE candidate.status = 'queued'
          AND candidate.available_at <= now()
          AND candidate.type = ANY(p_types)
          AND (p_all_queues OR candidate.queue = ANY(p_queues))
          AND NOT (candidate.queue = ANY(p_paused_queues))
        ORDER BY candidate.priority DESC, candidate.available_at, candidate.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE {schema}.job AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        lease_token = {schema}.uuid_generate_v7(),
        lease_expires_at = now() + make_interval(secs => p_lease_seconds),
        worker_id = p_worker_id,
        started_at = now()
    WHERE j.id = ANY(ARRAY(SELECT next.id FROM next))
    RETURNING j.id, j.type, j.queue, j.name, j.group_id, j.priority,
              CASE WHEN pg_column_size(j.configuration_data) <= p_max_payload_bytes THEN j.configuration_data END,
              j.execution_data, j.attempts, j.max_attempts, j.lease_token,
              j.cancellation_requested_at IS NOT NULL, j.created_at, j.available_at, j.timeout_seconds,
              CASE WHEN pg_column_size(j.configuration_data) > p_max_payload_bytes
                   THEN pg_column_size(j.configuration_data) END;
END
$$;
