-- Named queries of the web dashboard (jobbus/dashboard). Each block starts with `-- name: <query_name>`;
-- {schema} is the quoted schema identifier.
--
-- Every query here is bounded whatever the size of the job table: lists walk an index in its order and
-- stop after a window of %(window)s rows (filters such as the text search only look inside the window,
-- and the next page starts where the window ended); counts come from the leader's samples
-- (queue_stat) or the planner's estimate, never from count(*) over the job table.

-- name: dashboard_jobs_all
-- The newest jobs first, by the primary key (UUIDv7: creation order); keyset on id.
WITH scanned AS (
    SELECT id, status, queue, type, name, unique_key, last_error
    FROM {schema}.job
    WHERE (%(id)s::uuid IS NULL OR id < %(id)s::uuid)
    ORDER BY id DESC
    LIMIT %(window)s
), hits AS (
    SELECT id FROM scanned
    WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(type)s::text IS NULL OR type = %(type)s::text)
      AND (%(text)s::text IS NULL OR name ILIKE %(text)s OR unique_key ILIKE %(text)s
           OR last_error ILIKE %(text)s OR id::text ILIKE %(text)s)
    ORDER BY id DESC
    LIMIT %(limit)s
)
SELECT 'job', j.id, j.created_at, j.status, j.queue, j.type, j.name, j.attempts, j.max_attempts, j.priority,
       j.created_at, j.available_at, j.started_at, j.finished_at, left(j.last_error, 300), j.worker_id,
       j.progress_current, j.progress_total, j.group_id,
       CASE WHEN pg_column_size(j.configuration_data) <= %(preview_bytes)s THEN j.configuration_data END,
       pg_column_size(j.configuration_data)
FROM hits AS h JOIN {schema}.job AS j ON j.id = h.id
UNION ALL
SELECT 'end', (SELECT id FROM scanned ORDER BY id LIMIT 1), NULL, (SELECT count(*) FROM scanned)::text,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;

-- name: dashboard_jobs_finished
-- Finished jobs, the most recently finished first, along job_finished_idx; keyset on (finished_at, id).
WITH scanned AS (
    SELECT id, finished_at, status, queue, type, name, unique_key, last_error
    FROM {schema}.job
    WHERE finished_at IS NOT NULL
      AND (%(at)s::timestamptz IS NULL
           OR (finished_at <= %(at)s::timestamptz AND (finished_at, id) < (%(at)s::timestamptz, %(id)s::uuid)))
    ORDER BY finished_at DESC, id DESC
    LIMIT %(window)s
), hits AS (
    SELECT id, finished_at FROM scanned
    WHERE (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(type)s::text IS NULL OR type = %(type)s::text)
      AND (%(text)s::text IS NULL OR name ILIKE %(text)s OR unique_key ILIKE %(text)s
           OR last_error ILIKE %(text)s OR id::text ILIKE %(text)s)
    ORDER BY finished_at DESC, id DESC
    LIMIT %(limit)s
), last AS (
    SELECT id, finished_at FROM scanned ORDER BY finished_at, id LIMIT 1
)
SELECT 'job', j.id, j.finished_at, j.status, j.queue, j.type, j.name, j.attempts, j.max_attempts, j.priority,
       j.created_at, j.available_at, j.started_at, j.finished_at, left(j.last_error, 300), j.worker_id,
       j.progress_current, j.progress_total, j.group_id,
       CASE WHEN pg_column_size(j.configuration_data) <= %(preview_bytes)s THEN j.configuration_data END,
       pg_column_size(j.configuration_data)
FROM hits AS h JOIN {schema}.job AS j ON j.id = h.id
UNION ALL
SELECT 'end', (SELECT id FROM last), (SELECT finished_at FROM last), (SELECT count(*) FROM scanned)::text,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;

-- name: dashboard_jobs_queued
-- Queued jobs in the order of job_queue_claim_idx: by queue and type, then claim order (priority, then
-- available_at). Keyset on (queue, type, priority, available_at, id); the index orders priority
-- descending and the rest ascending, which one row comparison cannot express, so the page after a
-- cursor is three index range scans in a row: the rest of the cursor's priority, the lower priorities
-- of its (queue, type), then the (queue, type) pairs after it.
WITH scanned AS (
    (SELECT 1 AS part, id, queue, type, priority, available_at, name, unique_key, last_error,
            attempts, CASE WHEN %(view)s::text IS NOT NULL AND available_at > now()
                           THEN history -> -1 ->> 'outcome' END AS last_outcome
     FROM {schema}.job
     WHERE status = 'queued' AND %(id)s::uuid IS NOT NULL
       AND queue = %(cursor_queue)s::text AND type = %(cursor_type)s::text AND priority = %(priority)s::int
       AND (available_at, id) > (%(at)s::timestamptz, %(id)s::uuid)
     ORDER BY available_at, id
     LIMIT %(window)s)
    UNION ALL
    (SELECT 2, id, queue, type, priority, available_at, name, unique_key, last_error,
            attempts, CASE WHEN %(view)s::text IS NOT NULL AND available_at > now()
                           THEN history -> -1 ->> 'outcome' END AS last_outcome
     FROM {schema}.job
     WHERE status = 'queued' AND %(id)s::uuid IS NOT NULL
       AND queue = %(cursor_queue)s::text AND type = %(cursor_type)s::text AND priority < %(priority)s::int
     ORDER BY priority DESC, available_at, id
     LIMIT %(window)s)
    UNION ALL
    (SELECT 3, id, queue, type, priority, available_at, name, unique_key, last_error,
            attempts, CASE WHEN %(view)s::text IS NOT NULL AND available_at > now()
                           THEN history -> -1 ->> 'outcome' END AS last_outcome
     FROM {schema}.job
     WHERE status = 'queued'
       AND (%(id)s::uuid IS NULL OR (queue, type) > (%(cursor_queue)s::text, %(cursor_type)s::text))
       AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
       AND (%(type)s::text IS NULL OR type = %(type)s::text)
     ORDER BY queue, type, priority DESC, available_at, id
     LIMIT %(window)s)
), windowed AS (
    SELECT * FROM scanned ORDER BY part, queue, type, priority DESC, available_at, id LIMIT %(window)s
), hits AS (
    SELECT id, part, queue, type, priority, available_at FROM windowed
    WHERE (%(view)s::text IS NULL
           OR (%(view)s::text = 'waiting' AND last_outcome = 'waiting')
           OR (%(view)s::text = 'retrying' AND attempts > 0 AND last_outcome IS DISTINCT FROM 'waiting')
           OR (%(view)s::text = 'scheduled' AND available_at > now() AND attempts = 0
               AND last_outcome IS DISTINCT FROM 'waiting'))
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(type)s::text IS NULL OR type = %(type)s::text)
      AND (%(text)s::text IS NULL OR name ILIKE %(text)s OR unique_key ILIKE %(text)s
           OR last_error ILIKE %(text)s OR id::text ILIKE %(text)s)
    ORDER BY part, queue, type, priority DESC, available_at, id
    LIMIT %(limit)s
), last AS (
    SELECT id, queue, type, priority, available_at FROM windowed
    ORDER BY part DESC, queue DESC, type DESC, priority, available_at DESC, id DESC
    LIMIT 1
)
-- In the database's order (its collation sorts the queue and type names, not Python's).
(SELECT 'job', j.id, j.available_at, j.status, j.queue, j.type, j.name, j.attempts, j.max_attempts, j.priority,
        j.created_at, j.available_at, j.started_at, j.finished_at, left(j.last_error, 300), j.worker_id,
        j.progress_current, j.progress_total, j.group_id,
       CASE WHEN pg_column_size(j.configuration_data) <= %(preview_bytes)s THEN j.configuration_data END,
       pg_column_size(j.configuration_data)
 FROM hits AS h JOIN {schema}.job AS j ON j.id = h.id
 ORDER BY h.part, h.queue, h.type, h.priority DESC, h.available_at, h.id)
UNION ALL
SELECT 'end', (SELECT id FROM last), (SELECT available_at FROM last), (SELECT count(*) FROM windowed)::text,
       (SELECT queue FROM last), (SELECT type FROM last), NULL, NULL, NULL, (SELECT priority FROM last), NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;

-- name: dashboard_job_counts
-- The tabs of the jobs page: a count per status and per view of queued jobs, each bounded. Queued and
-- running jobs are read along their partial indexes, at most %(cap)s rows each (the views are counted
-- among those queued rows); finished ones among the %(cap)s most recently finished (job_finished_idx).
-- A count that reached its bound is a lower bound, and the page says so ("5,000+").
WITH queued AS (
    SELECT available_at, attempts,
           CASE WHEN available_at > now() THEN history -> -1 ->> 'outcome' END AS last_outcome
    FROM {schema}.job
    WHERE status = 'queued'
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(type)s::text IS NULL OR type = %(type)s::text)
    ORDER BY queue, type, priority DESC, available_at, id  -- along job_queue_claim_idx, never a table scan
    LIMIT %(cap)s
), running AS (
    SELECT 1 FROM {schema}.job
    WHERE status = 'running'
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(type)s::text IS NULL OR type = %(type)s::text)
    LIMIT %(cap)s
), finished AS (
    SELECT status, queue, type FROM {schema}.job
    WHERE finished_at IS NOT NULL
    ORDER BY finished_at DESC
    LIMIT %(cap)s
)
SELECT (SELECT count(*) FROM queued), (SELECT count(*) FROM running),
       (SELECT count(*) FROM finished),
       count(*) FILTER (WHERE f.status = 'completed'), count(*) FILTER (WHERE f.status = 'failed'),
       count(*) FILTER (WHERE f.status = 'cancelled'),
       (SELECT count(*) FROM queued WHERE available_at > now() AND attempts = 0
                                      AND last_outcome IS DISTINCT FROM 'waiting'),
       (SELECT count(*) FROM queued WHERE attempts > 0 AND last_outcome IS DISTINCT FROM 'waiting'),
       (SELECT count(*) FROM queued WHERE last_outcome = 'waiting')
FROM finished AS f
WHERE (%(queue)s::text IS NULL OR f.queue = %(queue)s::text)
  AND (%(type)s::text IS NULL OR f.type = %(type)s::text);

-- name: dashboard_job_choices
-- The queue and type choices of the jobs page: a count per (queue, type) of the jobs of the chosen
-- status or view (all: queued, running and recently finished), each bounded like the tabs' counts.
-- Queued jobs: the distinct queued pairs (queued_pairs(): one index probe each), then at most %(cap)s
-- entries of job_queue_claim_idx per pair; a view's jobs among the first %(view_cap)s queued rows in
-- claim order (as the tab counts them, so the choices add up to the tab); running jobs: at
-- most %(cap)s; finished ones: among the %(cap)s most recently finished (job_finished_idx). The
-- last column says whether a count reached its bound.
WITH pairs AS (
    SELECT queue, type FROM {schema}.queued_pairs() WHERE %(queued)s AND %(view)s::text IS NULL
), viewed_rows AS (
    SELECT j.queue, j.type, j.available_at, j.attempts,
           CASE WHEN j.available_at > now() THEN j.history -> -1 ->> 'outcome' END AS last_outcome
    FROM {schema}.job AS j
    WHERE j.status = 'queued' AND %(view)s::text IS NOT NULL
    ORDER BY j.queue, j.type, j.priority DESC, j.available_at, j.id  -- along job_queue_claim_idx
    LIMIT %(view_cap)s
), queued AS (
    SELECT p.queue, p.type, c.n, c.n >= %(cap)s AS capped
    FROM pairs AS p
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM (
            SELECT 1 FROM {schema}.job AS j
            WHERE j.status = 'queued' AND j.queue = p.queue AND j.type = p.type
            LIMIT %(cap)s) AS q
    ) AS c
    WHERE %(view)s::text IS NULL
), viewed AS (
    -- A view's jobs are counted among the first %(view_cap)s queued rows in claim order, as its tab's count
    -- is, so the choices add up to the tab.
    SELECT q.queue, q.type,
           count(*) FILTER (
               WHERE (%(view)s::text = 'waiting' AND q.last_outcome = 'waiting')
                  OR (%(view)s::text = 'retrying' AND q.attempts > 0 AND q.last_outcome IS DISTINCT FROM 'waiting')
                  OR (%(view)s::text = 'scheduled' AND q.available_at > now() AND q.attempts = 0
                      AND q.last_outcome IS DISTINCT FROM 'waiting')) AS n,
           (SELECT count(*) FROM viewed_rows) >= %(view_cap)s AS capped
    FROM viewed_rows AS q
    GROUP BY q.queue, q.type
), running AS (
    SELECT queue, type, count(*) AS n, false AS capped
    FROM (SELECT queue, type FROM {schema}.job WHERE status = 'running' AND %(running)s LIMIT %(cap)s) AS r
    GROUP BY queue, type
), recent AS (
    SELECT status, queue, type FROM {schema}.job
    WHERE finished_at IS NOT NULL AND %(finished)s
    ORDER BY finished_at DESC
    LIMIT %(cap)s
), finished AS (
    SELECT f.queue, f.type, count(*) AS n, (SELECT count(*) FROM recent) >= %(cap)s AS capped
    FROM recent AS f
    WHERE %(statuses)s::text[] IS NULL OR f.status = ANY(%(statuses)s::text[])
    GROUP BY f.queue, f.type
)
SELECT queue, type, sum(n)::bigint, bool_or(capped)
FROM (SELECT * FROM queued UNION ALL SELECT * FROM viewed UNION ALL SELECT * FROM running
      UNION ALL SELECT * FROM finished) AS c
WHERE n > 0
GROUP BY queue, type;

-- name: dashboard_jobs_running
-- Running jobs: as many as the fleet's concurrency, never millions; the newest attempt first.
WITH scanned AS (
    SELECT id, started_at, queue, type, name, unique_key, last_error
    FROM {schema}.job
    WHERE status = 'running'
      AND (%(at)s::timestamptz IS NULL OR (started_at, id) < (%(at)s::timestamptz, %(id)s::uuid))
    ORDER BY started_at DESC, id DESC
    LIMIT %(window)s
), hits AS (
    SELECT id, started_at FROM scanned
    WHERE (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(type)s::text IS NULL OR type = %(type)s::text)
      AND (%(text)s::text IS NULL OR name ILIKE %(text)s OR unique_key ILIKE %(text)s
           OR last_error ILIKE %(text)s OR id::text ILIKE %(text)s)
    ORDER BY started_at DESC, id DESC
    LIMIT %(limit)s
), last AS (
    SELECT id, started_at FROM scanned ORDER BY started_at, id LIMIT 1
)
SELECT 'job', j.id, j.started_at, j.status, j.queue, j.type, j.name, j.attempts, j.max_attempts, j.priority,
       j.created_at, j.available_at, j.started_at, j.finished_at, left(j.last_error, 300), j.worker_id,
       j.progress_current, j.progress_total, j.group_id,
       CASE WHEN pg_column_size(j.configuration_data) <= %(preview_bytes)s THEN j.configuration_data END,
       pg_column_size(j.configuration_data)
FROM hits AS h JOIN {schema}.job AS j ON j.id = h.id
UNION ALL
SELECT 'end', (SELECT id FROM last), (SELECT started_at FROM last), (SELECT count(*) FROM scanned)::text,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;

-- name: dashboard_jobs_in_group
-- One group's jobs along job_group_idx, the newest first; keyset on id.
WITH scanned AS (
    SELECT id, status, queue, type, name, unique_key, last_error
    FROM {schema}.job
    WHERE group_id = %(group_id)s::uuid AND (%(id)s::uuid IS NULL OR id < %(id)s::uuid)
    ORDER BY id DESC
    LIMIT %(window)s
), hits AS (
    SELECT id FROM scanned
    WHERE (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(type)s::text IS NULL OR type = %(type)s::text)
      AND (%(text)s::text IS NULL OR name ILIKE %(text)s OR unique_key ILIKE %(text)s
           OR last_error ILIKE %(text)s OR id::text ILIKE %(text)s)
    ORDER BY id DESC
    LIMIT %(limit)s
)
SELECT 'job', j.id, j.created_at, j.status, j.queue, j.type, j.name, j.attempts, j.max_attempts, j.priority,
       j.created_at, j.available_at, j.started_at, j.finished_at, left(j.last_error, 300), j.worker_id,
       j.progress_current, j.progress_total, j.group_id,
       CASE WHEN pg_column_size(j.configuration_data) <= %(preview_bytes)s THEN j.configuration_data END,
       pg_column_size(j.configuration_data)
FROM hits AS h JOIN {schema}.job AS j ON j.id = h.id
UNION ALL
SELECT 'end', (SELECT id FROM scanned ORDER BY id LIMIT 1), NULL, (SELECT count(*) FROM scanned)::text,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;

-- name: dashboard_failures
-- Failed jobs among the %(window)s most recently finished, grouped by their error with what varies
-- from job to job folded into placeholders (the function fold_error of migration 0015, which says how).
-- The fold is stored with the failure (error_group), so the page only groups: folding 20,000 failed rows
-- of 150 characters here took 0.7 to 1.3 s. Rows failed before that migration, or by a worker of the
-- previous release, have none and are folded as they are read, by the same function.
-- The newest ids of each group (up to %(ids)s) come along for a bulk retry.
WITH scanned AS (
    SELECT id, finished_at, status, queue, type, last_error, error_group
    FROM {schema}.job
    WHERE finished_at IS NOT NULL
    ORDER BY finished_at DESC
    LIMIT %(window)s
), failed AS (
    SELECT id, finished_at, queue, type, coalesce(last_error, '') AS error,
           coalesce(error_group, {schema}.fold_error(last_error)) AS pattern
    FROM scanned
    WHERE status = 'failed'
)
SELECT split_part(pattern, ':', 1), pattern, min(error), count(*), max(finished_at), min(finished_at),
       array_agg(DISTINCT type), array_agg(DISTINCT queue),
       (array_agg(id ORDER BY finished_at DESC))[1:%(ids)s]
FROM failed
GROUP BY pattern
ORDER BY count(*) DESC, max(finished_at) DESC
LIMIT %(limit)s;

-- name: dashboard_latest_sample
-- Every queue as the leader last sampled it (one index probe for the newest instant), with the queue's
-- pause state and its limits.
WITH latest AS (
    SELECT s.* FROM {schema}.queue_stat AS s
    WHERE s.sampled_at = (SELECT max(sampled_at) FROM {schema}.queue_stat)
), names AS (
    SELECT queue FROM latest
    UNION SELECT target FROM {schema}.pause WHERE target_kind = 'queue'
    UNION SELECT queue FROM {schema}.queue_setting
)
SELECT n.queue, coalesce(l.available, 0), coalesce(l.scheduled, 0), coalesce(l.running, 0),
       l.oldest_available_seconds, l.sampled_at,
       EXISTS (SELECT 1 FROM {schema}.pause AS p WHERE p.target_kind = 'queue' AND p.target = n.queue)
FROM names AS n
LEFT JOIN latest AS l ON l.queue = n.queue
ORDER BY n.queue;

-- name: dashboard_sample_age
-- Seconds since the leader's latest queue sample (NULL: none yet); one probe of queue_stat's key.
SELECT extract(epoch FROM now() - max(sampled_at))::float8 FROM {schema}.queue_stat;

-- name: dashboard_counts_now
-- What the queue table shows when the samples are stale (no leader): counts read now, each at most
-- %(cap)s rows of a partial index (job_queue_claim_idx for queued jobs, found queue by queue from
-- queued_pairs(); job_running_queue_idx for running ones), never the finished rows. The oldest wait
-- is known only when the available rows were all read (fewer than the cap).
WITH queued_queues AS (
    SELECT DISTINCT queue FROM {schema}.queued_pairs()
), running AS (
    SELECT queue, count(*) AS running
    FROM (SELECT queue FROM {schema}.job WHERE status = 'running' LIMIT %(cap)s) AS r
    GROUP BY queue
), names AS (
    SELECT queue FROM queued_queues
    UNION SELECT queue FROM running
    UNION SELECT target FROM {schema}.pause WHERE target_kind = 'queue'
    UNION SELECT queue FROM {schema}.queue_setting
)
SELECT n.queue, coalesce(a.available, 0), coalesce(s.scheduled, 0), coalesce(r.running, 0),
       CASE WHEN a.available < %(cap)s THEN extract(epoch FROM now() - a.oldest)::float8 END, NULL::timestamptz,
       EXISTS (SELECT 1 FROM {schema}.pause AS p WHERE p.target_kind = 'queue' AND p.target = n.queue)
FROM names AS n
LEFT JOIN LATERAL (
    SELECT count(*) AS available, min(available_at) AS oldest
    FROM (SELECT j.available_at FROM {schema}.job AS j
          WHERE j.status = 'queued' AND j.queue = n.queue AND j.available_at <= now() LIMIT %(cap)s) AS q
) AS a ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS scheduled
    FROM (SELECT 1 FROM {schema}.job AS j
          WHERE j.status = 'queued' AND j.queue = n.queue AND j.available_at > now() LIMIT %(cap)s) AS q
) AS s ON true
LEFT JOIN running AS r ON r.queue = n.queue
ORDER BY n.queue;

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
SELECT {columns}, parent_id, NULL::jsonb, expires_at,
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
