-- Named queries of the leader and its maintenance services. Each block starts with
-- `-- name: <query_name>`; {schema} is the quoted schema identifier.

-- name: hold_leadership
-- Takes the leadership lease when it is free or expired, or renews it for its holder; returns when the
-- holder was elected, or no row when another live worker leads.
INSERT INTO {schema}.leader AS l (name, worker_id, instance_id, elected_at, expires_at)
VALUES ('maintenance', %(worker_id)s, %(instance_id)s, now(), now() + make_interval(secs => %(ttl_seconds)s))
ON CONFLICT (name) DO UPDATE
SET worker_id = excluded.worker_id,
    instance_id = excluded.instance_id,
    elected_at = CASE WHEN l.instance_id = excluded.instance_id THEN l.elected_at ELSE now() END,
    expires_at = excluded.expires_at
WHERE l.instance_id = excluded.instance_id OR l.expires_at < now()
RETURNING elected_at;

-- name: resign_leadership
-- A leader that stops hands the lease back at once, so another worker takes over without waiting.
DELETE FROM {schema}.leader WHERE name = 'maintenance' AND instance_id = %(instance_id)s;

-- name: delete_finished_jobs
SELECT {schema}.delete_finished_jobs(%(status)s, %(older_than_seconds)s, %(limit)s);

-- name: delete_old_events
SELECT {schema}.delete_old_events(%(older_than_seconds)s, %(limit)s);

-- name: delete_finished_groups
SELECT {schema}.delete_finished_groups(%(older_than_seconds)s, %(limit)s);

-- name: queued_pairs
SELECT queue, type FROM {schema}.queued_pairs();

-- name: sample_queues
-- One sample of every queue for the whole fleet: the gauges from the queued and running rows (each
-- through its own partial index), and the jobs finished since the previous sample (through
-- job_finished_idx). Never a scan of the finished rows. The rows written come back: the leader's metrics
-- gauges are set from them, so Prometheus never causes a query of its own.
WITH sample AS (
    SELECT now() AS at,
           coalesce((SELECT max(sampled_at) FROM {schema}.queue_stat), now() - make_interval(secs => %(interval_seconds)s)) AS since
), queued AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.available_at <= s.at) AS available,
           count(*) FILTER (WHERE j.available_at > s.at) AS scheduled,
           extract(epoch FROM s.at - min(j.available_at) FILTER (WHERE j.available_at <= s.at))::float8 AS oldest
    FROM {schema}.job AS j, sample AS s
    WHERE j.status = 'queued'
    GROUP BY j.queue, s.at
), running AS (
    SELECT j.queue, count(*) AS running FROM {schema}.job AS j WHERE j.status = 'running' GROUP BY j.queue
), finished AS (
    SELECT j.queue,
           count(*) FILTER (WHERE j.status = 'completed') AS completed,
           count(*) FILTER (WHERE j.status = 'failed') AS failed,
           count(*) FILTER (WHERE j.status = 'cancelled') AS cancelled
    FROM {schema}.job AS j, sample AS s
    WHERE j.finished_at > s.since AND j.finished_at <= s.at
    GROUP BY j.queue, s.since, s.at
), queues AS (
    -- A queue of the previous sample gets one more row, of zeros when it went idle: readers of the
    -- latest sample (metrics, the dashboard) never keep showing the last jobs a queue had.
    SELECT queue FROM queued UNION SELECT queue FROM running UNION SELECT queue FROM finished
    UNION SELECT st.queue FROM {schema}.queue_stat AS st, sample AS s
          WHERE st.sampled_at = s.since AND st.available + st.scheduled + st.running + st.completed + st.failed
                                            + st.cancelled > 0
)
INSERT INTO {schema}.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, cancelled,
                                 oldest_available_seconds)
SELECT s.at, q.queue, coalesce(qd.available, 0), coalesce(qd.scheduled, 0), coalesce(r.running, 0),
       coalesce(f.completed, 0), coalesce(f.failed, 0), coalesce(f.cancelled, 0), qd.oldest
FROM queues AS q
CROSS JOIN sample AS s
LEFT JOIN queued AS qd ON qd.queue = q.queue
LEFT JOIN running AS r ON r.queue = q.queue
LEFT JOIN finished AS f ON f.queue = q.queue
ON CONFLICT (sampled_at, queue) DO NOTHING
RETURNING queue, available, scheduled, running, completed, failed, cancelled, oldest_available_seconds;

-- name: compact_queue_stats
-- Samples older than %(raw_seconds)s seconds are merged into one row per queue and %(step_seconds)s
-- seconds (whole steps only): the jobs finished in the step summed, the gauges of its last sample, the
-- longest wait. The row keeps the last sample's instant, so the newest sample is never changed, and a
-- merged row merges again without loss. Seven days of charts then read about 1,400 rows per queue.
-- Exact with two leaders for a moment: a sample is summed by the statement whose DELETE removed it, and
-- only by it (one that meets a row another is deleting waits for it and, the row gone, skips it), so no
-- count is merged twice or lost. A clock set back leaves samples ahead of now(), which are not merged
-- before their time, and puts new samples into steps merged before, whose row merges again with them.
WITH cutoff AS (
    SELECT to_timestamp(floor(extract(epoch FROM now() - make_interval(secs => %(raw_seconds)s::int))
                              / %(step_seconds)s::int) * %(step_seconds)s::int) AS at
), steps AS (
    SELECT s.queue, floor(extract(epoch FROM s.sampled_at) / %(step_seconds)s::int) AS step
    FROM {schema}.queue_stat AS s, cutoff AS c
    WHERE s.sampled_at < c.at
    GROUP BY 1, 2
    HAVING count(*) > 1
), merged AS (
    DELETE FROM {schema}.queue_stat AS s
    USING steps AS t, cutoff AS c
    WHERE s.sampled_at < c.at AND s.queue = t.queue
      AND floor(extract(epoch FROM s.sampled_at) / %(step_seconds)s::int) = t.step
    RETURNING s.*
)
INSERT INTO {schema}.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, cancelled,
                                 oldest_available_seconds)
SELECT max(sampled_at), queue,
       (array_agg(available ORDER BY sampled_at DESC))[1], (array_agg(scheduled ORDER BY sampled_at DESC))[1],
       (array_agg(running ORDER BY sampled_at DESC))[1], sum(completed), sum(failed), sum(cancelled),
       max(oldest_available_seconds)
FROM merged
GROUP BY queue, floor(extract(epoch FROM sampled_at) / %(step_seconds)s::int);

-- name: prune_queue_stats
DELETE FROM {schema}.queue_stat WHERE sampled_at < now() - make_interval(secs => %(keep_seconds)s);
