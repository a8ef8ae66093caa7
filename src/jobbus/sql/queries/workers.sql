-- Named queries of the worker registry and the worker's side of the control plane. Each block starts
-- with `-- name: <query_name>`; {schema} is the quoted schema identifier. Parameters are psycopg named
-- placeholders.
--
-- A worker is silent when its row has not been refreshed for the shorter of its own lease and its own
-- dead-after time: it died, hangs, or lost the database. Silent workers' ids can be taken over.

-- name: register_worker
-- Takes the id for this process (a new instance) unless a live, different instance holds it. A row
-- that stopped or went silent is taken over, and so is the instance named by %(replaces)s (a process
-- of this host that no longer exists); the acknowledged generation restarts at the latest, since
-- one-shot commands are for the processes alive when they were issued. Returns no row when the id is
-- held by a live worker: the caller refuses to start.
INSERT INTO {schema}.worker AS w (id, instance_id, host, pid, queues, types, concurrency, state, acked_generation,
                                 lease_seconds, dead_after_seconds, heartbeat_seconds, pool_size, clock_at)
VALUES (%(id)s, %(instance_id)s, %(host)s, %(pid)s, %(queues)s, %(types)s, %(concurrency)s, 'running',
        (SELECT coalesce(max(generation), 0) FROM {schema}.command),
        %(lease_seconds)s, %(dead_after_seconds)s, %(heartbeat_seconds)s, %(pool_size)s, %(clock_at)s)
ON CONFLICT (id) DO UPDATE
SET instance_id = excluded.instance_id, host = excluded.host, pid = excluded.pid, queues = excluded.queues,
    types = excluded.types, concurrency = excluded.concurrency, state = 'running', in_flight = 0, completed = 0,
    failed = 0, acked_generation = excluded.acked_generation, started_at = now(), last_seen_at = now(),
    stopped_at = NULL, declared_dead_at = NULL, lease_seconds = excluded.lease_seconds,
    dead_after_seconds = excluded.dead_after_seconds, heartbeat_seconds = excluded.heartbeat_seconds,
    pool_size = excluded.pool_size, clock_at = excluded.clock_at
WHERE w.state = 'stopped'
   OR w.last_seen_at < now() - make_interval(secs => least(w.lease_seconds, w.dead_after_seconds))
   OR w.instance_id = %(replaces)s::uuid
RETURNING acked_generation;

-- name: worker_holding_id
-- Who holds an id that `register_worker` could not take, for the refusal message.
SELECT host, pid, extract(epoch FROM now() - last_seen_at)::float8, state, instance_id,
       least(lease_seconds, dead_after_seconds)
FROM {schema}.worker
WHERE id = %(id)s;

-- name: touch_worker
-- Refreshes this instance's row; no row back means the id now belongs to another instance (or the row
-- was forgotten). `was_declared_dead` tells the worker that its jobs were recovered while it was silent
-- (the row is read locked: a refresh that waited for a declaration sees it). `clock_at` is the worker's
-- own clock as it sent the refresh: `jobbus doctor` compares it with `last_seen_at`.
UPDATE {schema}.worker AS w
SET last_seen_at = now(), clock_at = %(clock_at)s, state = %(state)s, in_flight = %(in_flight)s, completed = %(completed)s,
    failed = %(failed)s, acked_generation = greatest(w.acked_generation, %(acked_generation)s),
    stopped_at = CASE WHEN %(state)s = 'stopped' THEN now() END,
    declared_dead_at = NULL
FROM (SELECT declared_dead_at FROM {schema}.worker WHERE id = %(id)s FOR UPDATE) AS before
WHERE w.id = %(id)s AND w.instance_id = %(instance_id)s
RETURNING before.declared_dead_at IS NOT NULL;

-- name: read_control
-- Everything a worker needs to steer itself, in one round trip: the durable pause targets, the one-shot
-- commands issued since the generation it acknowledged last whose target matches it now (so a command
-- issued while it was away reaches it when it is back), and the latest generation.
SELECT 'pause' AS kind, target_kind, target, 0::bigint AS generation FROM {schema}.pause
UNION ALL
SELECT 'command', action, '', generation
FROM {schema}.command
WHERE generation > %(acked_generation)s
  AND CASE target_kind
          WHEN 'all' THEN true
          WHEN 'worker' THEN target = %(worker_id)s
          ELSE %(queues)s::text[] IS NULL OR target = ANY(%(queues)s::text[])
      END
UNION ALL
SELECT 'latest', '', '', coalesce(max(generation), 0) FROM {schema}.command;

-- name: declare_dead_workers
-- One statement declares silent workers dead and takes back what they held, so nothing can happen
-- between the two: a worker whose registry row has been silent longer than its own dead-after time is
-- declared dead (once; a worker that speaks again clears the mark), and the jobs it holds that started
-- before that instant are requeued at once instead of after lease expiry. A job whose cancellation was
-- asked for becomes cancelled, one out of attempts fails (the attempt was counted at claim time) with its
-- failure group (fold_error, sql/current.sql).
--
-- Never a job of a live worker: the worker row is locked by the declaration, so a refresh that
-- committed first leaves the row not silent (it is re-read under the lock) and one that comes later
-- sees the mark; a job claimed by a process that resumed, or by a new process under the same id, has
-- a started_at later than the declaration (both read the database's clock) or a claim this statement's
-- snapshot cannot see, and is left to its lease. One row per declared worker with each job taken back
-- (a worker that held none: one row of NULL job columns).
WITH declared AS (
    UPDATE {schema}.worker
    SET declared_dead_at = now()
    WHERE declared_dead_at IS NULL
      AND state <> 'stopped'
      AND last_seen_at < now() - make_interval(secs => dead_after_seconds)
    RETURNING id, declared_dead_at, extract(epoch FROM now() - last_seen_at)::float8 AS silent
), held AS (
    SELECT j.id, w.why,
           format('worker %%s died during attempt %%s of %%s (%%s)', j.worker_id, j.attempts, j.max_attempts,
                  w.why) AS error
    FROM {schema}.job AS j
    JOIN declared AS d ON d.id = j.worker_id
    CROSS JOIN LATERAL (SELECT format('declared dead after %%s s of silence', round(d.silent::numeric)) AS why) AS w
    WHERE j.status = 'running' AND j.started_at < d.declared_dead_at
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
), recovered AS (
    UPDATE {schema}.job AS j
    SET status = CASE WHEN j.cancellation_requested_at IS NOT NULL THEN 'cancelled'
                      WHEN j.attempts >= j.max_attempts THEN 'failed'
                      ELSE 'queued' END,
        finished_at = CASE WHEN j.cancellation_requested_at IS NOT NULL OR j.attempts >= j.max_attempts
                           THEN now() END,
        available_at = now(),
        last_error = held.error,
        error_group = CASE WHEN j.cancellation_requested_at IS NULL AND j.attempts >= j.max_attempts
                           THEN {schema}.fold_error(held.error) END,
        lease_token = NULL,
        lease_expires_at = NULL,
        history = (CASE WHEN jsonb_array_length(j.history) >= 50 THEN j.history - 0 ELSE j.history END)
                  || jsonb_build_array(jsonb_build_object(
                         'attempt', j.attempts, 'outcome', 'recovered', 'at', now(), 'worker_id', j.worker_id,
                         'error', held.why))
    FROM held
    WHERE j.id = held.id
    RETURNING j.id, j.worker_id, j.type, j.queue, j.status, j.attempts, j.last_error,
              (SELECT pg_notify(%(channel)s, json_build_array(j.queue, j.type)::text) IS NULL) AS notified
)
SELECT d.id, d.silent, r.id, r.type, r.queue, r.status, r.attempts, r.last_error, r.notified
FROM declared AS d
LEFT JOIN recovered AS r ON r.worker_id = d.id
ORDER BY d.id, r.id;

-- name: reclaim_predecessor_jobs
-- A process that took over a worker id takes back, at once, what an earlier process under that id
-- left running: only jobs that started before this instance registered (its row's started_at), so a
-- job claimed under the id since, by this process, is never touched. Requeued, failed when out of
-- attempts (with its failure group), cancelled when cancellation was asked for, as above.
UPDATE {schema}.job AS j
SET status = CASE WHEN j.cancellation_requested_at IS NOT NULL THEN 'cancelled'
                  WHEN j.attempts >= j.max_attempts THEN 'failed'
                  ELSE 'queued' END,
    finished_at = CASE WHEN j.cancellation_requested_at IS NOT NULL OR j.attempts >= j.max_attempts
                       THEN now() END,
    available_at = now(),
    last_error = left_behind.error,
    error_group = CASE WHEN j.cancellation_requested_at IS NULL AND j.attempts >= j.max_attempts
                       THEN {schema}.fold_error(left_behind.error) END,
    lease_token = NULL,
    lease_expires_at = NULL,
    history = (CASE WHEN jsonb_array_length(j.history) >= 50 THEN j.history - 0 ELSE j.history END)
              || jsonb_build_array(jsonb_build_object(
                     'attempt', j.attempts, 'outcome', 'recovered', 'at', now(), 'worker_id', j.worker_id,
                     'error', 'reclaimed when a new process took over its id'))
FROM (
    SELECT j.id,
           format('worker %%s died during attempt %%s of %%s (reclaimed when a new process took over its id)',
                  j.worker_id, j.attempts, j.max_attempts) AS error
    FROM {schema}.job AS j
    JOIN {schema}.worker AS w ON w.id = j.worker_id
    WHERE w.id = %(worker_id)s AND w.instance_id = %(instance_id)s
      AND j.status = 'running' AND j.started_at < w.started_at
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
) AS left_behind
WHERE j.id = left_behind.id
RETURNING j.id, j.type, j.queue, j.status, j.attempts, j.last_error,
          (SELECT pg_notify(%(channel)s, json_build_array(j.queue, j.type)::text) IS NULL);
