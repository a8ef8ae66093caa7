-- Named queries of the web dashboard (jobbus/dashboard). Each block starts with `-- name: <query_name>`;
-- {schema} is the quoted schema identifier.
--
-- Every query here is bounded whatever the size of the job table: it walks an index in its order, and
-- what it counts it reads along an index up to a bound (past it, the planner estimates). The lists of
-- jobs and their counts are the views' (sql/queries/views.sql).

-- name: dashboard_failures
-- Every failed job, grouped by its error with what varies from job to job folded into placeholders
-- (error_group, written with each failure by fold_error, sql/current.sql): the groups are found by a
-- loose index scan of job_failure_group_idx, one probe each, whatever the number of failed jobs. Per
-- group, the newest failure (its message as the example) and the oldest, each one more probe, and a
-- count read along the index up to %(cap)s + 1 (past it, the caller estimates); the types and queues
-- of its newest %(sample)s failures. A failure without a stored group (written by a release before
-- migration 15, or by hand) is folded as it is read, by the same function. The most recent first.
WITH RECURSIVE groups AS (
    (SELECT j.error_group FROM {schema}.job AS j
     WHERE j.status = 'failed' AND j.error_group IS NOT NULL ORDER BY j.error_group LIMIT 1)
    UNION ALL
    SELECT n.error_group
    FROM groups AS g
    CROSS JOIN LATERAL (
        SELECT j.error_group FROM {schema}.job AS j
        WHERE j.status = 'failed' AND j.error_group > g.error_group ORDER BY j.error_group LIMIT 1
    ) AS n
), stored AS (
    SELECT g.error_group, newest.last_error, newest.finished_at AS last_at, oldest.finished_at AS first_at,
           (SELECT count(*) FROM (SELECT 1 FROM {schema}.job AS j
                                  WHERE j.status = 'failed' AND j.error_group = g.error_group
                                  LIMIT %(cap)s + 1) AS c) AS n,
           sample.types, sample.queues
    FROM groups AS g
    CROSS JOIN LATERAL (
        SELECT j.last_error, j.finished_at FROM {schema}.job AS j
        WHERE j.status = 'failed' AND j.error_group = g.error_group ORDER BY j.finished_at DESC, j.id DESC LIMIT 1
    ) AS newest
    CROSS JOIN LATERAL (
        SELECT j.finished_at FROM {schema}.job AS j
        WHERE j.status = 'failed' AND j.error_group = g.error_group ORDER BY j.finished_at, j.id LIMIT 1
    ) AS oldest
    CROSS JOIN LATERAL (
        SELECT array_agg(DISTINCT s.type ORDER BY s.type) AS types,
               array_agg(DISTINCT s.queue ORDER BY s.queue) AS queues
        FROM (SELECT j.type, j.queue FROM {schema}.job AS j
              WHERE j.status = 'failed' AND j.error_group = g.error_group
              ORDER BY j.finished_at DESC, j.id DESC LIMIT %(sample)s) AS s
    ) AS sample
), unfolded AS (
    SELECT {schema}.fold_error(j.last_error) AS error_group, j.last_error, j.finished_at, j.type, j.queue
    FROM {schema}.job AS j
    WHERE j.status = 'failed' AND j.error_group IS NULL
), folded AS (
    SELECT u.error_group, (array_agg(u.last_error ORDER BY u.finished_at DESC))[1] AS last_error,
           max(u.finished_at) AS last_at, min(u.finished_at) AS first_at, count(*) AS n,
           array_agg(DISTINCT u.type ORDER BY u.type) AS types, array_agg(DISTINCT u.queue ORDER BY u.queue) AS queues
    FROM unfolded AS u
    GROUP BY u.error_group
)
SELECT coalesce(s.error_group, f.error_group), coalesce(s.last_error, f.last_error),
       greatest(s.last_at, f.last_at), least(s.first_at, f.first_at),
       coalesce(s.n, 0) + coalesce(f.n, 0),
       ARRAY(SELECT DISTINCT t FROM unnest(coalesce(s.types, '{{}}') || coalesce(f.types, '{{}}')) AS t ORDER BY t),
       ARRAY(SELECT DISTINCT q FROM unnest(coalesce(s.queues, '{{}}') || coalesce(f.queues, '{{}}')) AS q ORDER BY q)
FROM stored AS s
FULL JOIN folded AS f ON f.error_group = s.error_group
ORDER BY 3 DESC, 1;

-- name: dashboard_failure_estimate
-- The planner's estimate of one failure group's jobs, for a count past its bound.
EXPLAIN (FORMAT JSON) SELECT 1 FROM {schema}.job
WHERE status = 'failed' AND (error_group = %(group)s OR (error_group IS NULL AND {schema}.fold_error(last_error) = %(group)s));

-- name: dashboard_sample_age
-- Seconds since the leader's latest queue sample (NULL: none yet); one probe of queue_stat's key.
SELECT extract(epoch FROM now() - max(sampled_at))::float8 FROM {schema}.queue_stat;

-- name: dashboard_series
-- The overview's charts: %(buckets)s buckets of %(width)s seconds ending at the next multiple of the
-- width (so the time axis falls on round instants), summed over the queues (or one queue): jobs
-- completed, failed and cancelled in each bucket, the queue depth and running jobs at its last sample,
-- the longest wait, and its first sample (how much of the range the samples cover). The leader keeps
-- every sample for an hour and one row per queue and 10 minutes for seven days, so this reads at most
-- about 1,400 rows per queue.
WITH bounds AS (
    SELECT to_timestamp(ceil(extract(epoch FROM now()) / %(width)s::float8) * %(width)s::float8
                        - %(width)s::float8 * %(buckets)s::int) AS since
), per_sample AS (
    SELECT s.sampled_at, sum(s.completed) AS completed, sum(s.failed) AS failed, sum(s.cancelled) AS cancelled,
           sum(s.available) AS available, sum(s.running) AS running, max(s.oldest_available_seconds) AS oldest
    FROM {schema}.queue_stat AS s, bounds AS b
    WHERE s.sampled_at >= b.since AND (%(queue)s::text IS NULL OR s.queue = %(queue)s::text)
    GROUP BY s.sampled_at
), bucketed AS (
    SELECT least(floor(extract(epoch FROM p.sampled_at - b.since) / %(width)s::float8)::int, %(buckets)s::int - 1)
               AS bucket, p.*
    FROM per_sample AS p, bounds AS b
)
SELECT (SELECT since FROM bounds), bucket, sum(completed), sum(failed), sum(cancelled),
       (array_agg(available ORDER BY sampled_at DESC))[1], (array_agg(running ORDER BY sampled_at DESC))[1],
       max(oldest), min(sampled_at)
FROM bucketed
GROUP BY bucket
UNION ALL
SELECT since, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM bounds
ORDER BY 2 NULLS FIRST;

-- name: dashboard_estimates
-- The planner's estimate of the job table's rows (pg_class.reltuples, kept by autovacuum/ANALYZE): what
-- the header shows instead of count(*).
SELECT c.reltuples::bigint  -- -1: never analyzed yet
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema_name)s AND c.relname = 'job';

-- name: dashboard_recent_groups
-- Groups among the %(window)s newest jobs, the newest first, with their progress (each group counted
-- along job_group_idx, at most %(group_window)s jobs per group).
WITH recent AS (
    SELECT group_id, max(created_at) AS newest
    FROM (SELECT group_id, created_at FROM {schema}.job ORDER BY id DESC LIMIT %(window)s) AS j
    WHERE group_id IS NOT NULL
    GROUP BY group_id
    ORDER BY newest DESC
    LIMIT %(limit)s
)
SELECT r.group_id, c.queued, c.running, c.completed, c.failed, c.cancelled, c.total, c.names
FROM recent AS r
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'completed') AS completed,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
           count(*) AS total,
           (array_agg(DISTINCT type))[1:3] AS names
    FROM (SELECT status, type FROM {schema}.job WHERE group_id = r.group_id LIMIT %(group_window)s) AS g
) AS c
ORDER BY r.newest DESC;

-- name: dashboard_commands
-- The latest control commands, and for each addressed worker whether it acknowledged (its process
-- applied the command: acked_generation reached it) and when it was last seen.
SELECT c.generation, c.action, c.target_kind, c.target, c.issued_at, c.worker_ids,
       coalesce(array_agg(w.id ORDER BY w.id) FILTER (WHERE w.acked_generation >= c.generation), '{{}}'),
       coalesce(array_agg(w.id ORDER BY w.id) FILTER (WHERE w.acked_generation < c.generation), '{{}}')
FROM (SELECT * FROM {schema}.command ORDER BY generation DESC LIMIT %(limit)s) AS c
LEFT JOIN {schema}.worker AS w ON w.id = ANY(c.worker_ids)
GROUP BY c.generation, c.action, c.target_kind, c.target, c.issued_at, c.worker_ids
ORDER BY c.generation DESC;

-- name: dashboard_running_of_worker
-- The jobs one worker runs now (job_running_idx).
SELECT id, type, queue, started_at, progress_current, progress_total, lease_expires_at
FROM {schema}.job
WHERE status = 'running' AND worker_id = %(worker_id)s
ORDER BY started_at
LIMIT %(limit)s;

-- name: dashboard_pulse
-- What the live updates compare, once per interval per dashboard process (never per browser tab):
-- the newest finish (one probe of job_finished_idx), the newest sample, the latest command, the
-- running jobs (bounded by the fleet's concurrency) and the workers' reported state.
SELECT (SELECT max(finished_at) FROM {schema}.job WHERE finished_at IS NOT NULL),
       (SELECT max(sampled_at) FROM {schema}.queue_stat),
       (SELECT max(generation) FROM {schema}.command),
       (SELECT count(*) FROM {schema}.job WHERE status = 'running'),
       (SELECT md5(coalesce(string_agg(id || state || in_flight || acked_generation || (stopped_at IS NULL)::text,
                                       ',' ORDER BY id), ''))
        FROM {schema}.worker),
       (SELECT md5(coalesce(string_agg(target_kind || target, ',' ORDER BY target_kind, target), ''))
        FROM {schema}.pause);

-- name: dashboard_job
-- One job for its page: its parent (type and status too) and no steps. App.find reads every step, which
-- for a parent of 10,000 children is 10,000 spawn steps; the page reads them bounded instead
-- (dashboard_job_steps, dashboard_job_children).
SELECT {columns}, parent_id, NULL::jsonb, expires_at, tags, weight,
       (SELECT p.type FROM {schema}.job AS p WHERE p.id = j.parent_id),
       (SELECT p.status FROM {schema}.job AS p WHERE p.id = j.parent_id)
FROM (SELECT *, (SELECT c.parent_id FROM {schema}.job_child AS c WHERE c.child_id = job.id) AS parent_id
      FROM {schema}.job WHERE id = %(id)s) AS j;

-- name: dashboard_job_steps
-- A job's durable steps in the order they were recorded, spawn steps left out (its children are listed
-- instead): the first %(limit)s among at most %(window)s rows of job_step's key, and how many of those
-- rows are not spawn steps. A result larger than %(max_bytes)s bytes as stored is not read (NULL; its
-- size comes along).
WITH scanned AS (
    SELECT name, result, attempt, created_at FROM {schema}.job_step WHERE job_id = %(id)s LIMIT %(window)s
), steps AS (
    SELECT * FROM scanned WHERE name NOT LIKE 'spawn:%%'
)
SELECT name, CASE WHEN pg_column_size(result) <= %(max_bytes)s THEN result END, pg_column_size(result),
       attempt, created_at, count(*) OVER ()
FROM steps
ORDER BY created_at, name
LIMIT %(limit)s;

-- name: dashboard_job_children
-- A parent's children in creation order (UUIDv7 ids) after %(after)s: the first %(limit)s among at most
-- %(window)s entries of job_child_parent_idx, with their statuses; how many entries the window held; and
-- the parent's count of children not yet terminal (job_parent, kept by the trigger job_finished).
WITH kids AS (
    SELECT child_id FROM {schema}.job_child
    WHERE parent_id = %(id)s AND (%(after)s::uuid IS NULL OR child_id > %(after)s::uuid)
    LIMIT %(window)s
), shown AS (
    SELECT child_id FROM kids ORDER BY child_id LIMIT %(limit)s
)
SELECT n.total, (SELECT p.active FROM {schema}.job_parent AS p WHERE p.parent_id = %(id)s),
       j.id, j.type, j.status, j.attempts, j.finished_at
FROM (SELECT count(*) AS total FROM kids) AS n
LEFT JOIN (shown JOIN {schema}.job AS j ON j.id = shown.child_id) ON true
ORDER BY j.id;
