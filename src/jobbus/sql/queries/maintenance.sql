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

-- name: delete_old_audit
SELECT {schema}.delete_old_audit(%(older_than_seconds)s, %(limit)s);

-- name: queued_pairs
SELECT queue, type FROM {schema}.queued_pairs();

-- name: sample_queues
-- One sample of every queue for the whole fleet, each finished job counted once (the function, in
-- sql/current.sql, says how); returns the rows written, from which the leader's metrics gauges are set, so
-- Prometheus never causes a query of its own.
SELECT * FROM {schema}.sample_queues(%(interval_seconds)s, %(late_seconds)s, %(keep_seconds)s);

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
