-- Named queries of the worker registry and the control plane. Each block starts with `-- name: <query_name>`; {schema} is the
-- quoted schema identifier. Parameters are psycopg named placeholders.

-- name: reclaim_own_orphans
-- A worker restarted under the same id takes back what its dead predecessor held, at once instead of
-- after lease expiry. Worker ids must therefore be unique among live workers.
UPDATE {schema}.job
SET status = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'queued' END,
    finished_at = CASE WHEN attempts >= max_attempts THEN now() END,
    available_at = now(),
    last_error = format('worker %%s died during attempt %%s of %%s (reclaimed at its restart)',
                        worker_id, attempts, max_attempts),
    lease_token = NULL,
    lease_expires_at = NULL
WHERE worker_id = %(worker_id)s AND status = 'running'
RETURNING id, status;

-- name: register_worker
-- The worker row is the worker's registry entry; starting acknowledges every command issued before,
-- since one-shot commands are for the workers alive when they were issued.
INSERT INTO {schema}.worker AS w (id, host, pid, queues, types, concurrency, state, acked_generation)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(types)s, %(concurrency)s, 'running',
        (SELECT coalesce(max(generation), 0) FROM {schema}.command))
ON CONFLICT (id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, queues = excluded.queues, types = excluded.types,
    concurrency = excluded.concurrency, state = 'running', in_flight = 0, completed = 0, failed = 0,
    acked_generation = excluded.acked_generation, started_at = now(), last_seen_at = now(),
    stopped_at = NULL
RETURNING acked_generation;

-- name: touch_worker
UPDATE {schema}.worker
SET last_seen_at = now(), state = %(state)s, in_flight = %(in_flight)s, completed = %(completed)s,
    failed = %(failed)s, acked_generation = greatest(acked_generation, %(acked_generation)s),
    stopped_at = CASE WHEN %(state)s = 'stopped' THEN now() END
WHERE id = %(id)s;

-- name: read_control
-- Everything a worker needs to steer itself, in one round trip: the durable pause targets and the
-- one-shot commands addressed to it since the generation it acknowledged last.
SELECT 'pause' AS kind, target_kind, target, 0::bigint AS generation FROM {schema}.pause
UNION ALL
SELECT 'command', action, '', generation FROM {schema}.command
WHERE generation > %(acked_generation)s AND %(worker_id)s = ANY(worker_ids)
UNION ALL
SELECT 'latest', '', '', coalesce(max(generation), 0) FROM {schema}.command;
