-- Named queries of queue settings (flow control). Each block starts with `-- name: <query_name>`;
-- {schema} is the quoted schema identifier.

-- name: upsert_queue_setting
-- Sets the limits given and keeps the others (keep_*): one statement, so concurrent changes of different
-- limits never undo each other. A limit lowered below the weight of a job queued or running in the queue
-- is refused first (refuse_limits_below_weights of sql/current.sql, SQLSTATE JB412): nothing is written.
INSERT INTO {schema}.queue_setting AS q (queue, concurrency, concurrency_per_key, rate_count, rate_period_seconds,
                                        key_rate_count, key_rate_period_seconds)
SELECT %(queue)s, %(concurrency)s, %(concurrency_per_key)s, %(rate_count)s, %(rate_period_seconds)s,
       %(key_rate_count)s, %(key_rate_period_seconds)s
WHERE {schema}.refuse_limits_below_weights(%(queue)s, %(concurrency)s, %(concurrency_per_key)s, %(rate_count)s,
                                           %(key_rate_count)s)
ON CONFLICT (queue) DO UPDATE
SET concurrency = CASE WHEN %(keep_concurrency)s THEN q.concurrency ELSE excluded.concurrency END,
    concurrency_per_key = CASE WHEN %(keep_concurrency_per_key)s THEN q.concurrency_per_key
                               ELSE excluded.concurrency_per_key END,
    rate_count = CASE WHEN %(keep_rate)s THEN q.rate_count ELSE excluded.rate_count END,
    rate_period_seconds = CASE WHEN %(keep_rate)s THEN q.rate_period_seconds ELSE excluded.rate_period_seconds END,
    key_rate_count = CASE WHEN %(keep_key_rate)s THEN q.key_rate_count ELSE excluded.key_rate_count END,
    key_rate_period_seconds = CASE WHEN %(keep_key_rate)s THEN q.key_rate_period_seconds
                                   ELSE excluded.key_rate_period_seconds END,
    updated_at = now();

-- name: delete_queue_setting_if_empty
-- A queue left without any limit loses its row: its claims take the path without limits again.
DELETE FROM {schema}.queue_setting
WHERE queue = %(queue)s
  AND concurrency IS NULL AND concurrency_per_key IS NULL AND rate_count IS NULL AND key_rate_count IS NULL;

-- name: list_queue_settings
SELECT queue, concurrency, concurrency_per_key, rate_count, rate_period_seconds, key_rate_count,
       key_rate_period_seconds
FROM {schema}.queue_setting
WHERE %(queue)s::text IS NULL OR queue = %(queue)s::text
ORDER BY queue;

-- name: limited_queues
-- The queues whose claims go through take_limited; the worker reads it every poll interval.
SELECT queue FROM {schema}.queue_setting;

-- name: queue_usage
-- How close each limited queue is to its limits now: jobs holding a valid lease, starts in its window,
-- each counted by its weight (and spends by their units), as the limits count them.
SELECT q.queue,
       (SELECT coalesce(sum(j.weight), 0) FROM {schema}.job AS j
        WHERE j.status = 'running' AND j.queue = q.queue AND j.lease_expires_at > now()),
       CASE WHEN q.rate_count IS NOT NULL THEN
           (SELECT coalesce(sum(s.units), 0) FROM {schema}.queue_start AS s
            WHERE s.queue = q.queue AND s.started_at > now() - make_interval(secs => q.rate_period_seconds))
       END
FROM {schema}.queue_setting AS q
ORDER BY q.queue;

-- name: seconds_until_rate_capacity
-- How long until a rate-limited queue among these may start a job again (the oldest start in its
-- window leaves it); NULL when none is held back by its rate. A worker whose claim came back short
-- sleeps this long instead of its poll interval, so a rate limit is used up to its rate.
SELECT extract(epoch FROM min(frees_at) - clock_timestamp())::float8
FROM (
    SELECT (SELECT min(s.started_at) FROM {schema}.queue_start AS s
            WHERE s.queue = q.queue AND s.started_at > now() - make_interval(secs => q.rate_period_seconds))
           + make_interval(secs => q.rate_period_seconds) AS frees_at
    FROM {schema}.queue_setting AS q
    WHERE q.queue = ANY(%(queues)s::text[]) AND q.rate_count IS NOT NULL
    UNION ALL
    SELECT (SELECT min(s.started_at) FROM {schema}.queue_start AS s
            WHERE s.queue = q.queue AND s.concurrency_key IS NOT NULL
              AND s.started_at > now() - make_interval(secs => q.key_rate_period_seconds))
           + make_interval(secs => q.key_rate_period_seconds)
    FROM {schema}.queue_setting AS q
    WHERE q.queue = ANY(%(queues)s::text[]) AND q.key_rate_count IS NOT NULL
) AS waits;

-- name: spend_units
-- `App.consume`: the function spend_units of sql/current.sql (once per call id; false: no rate limit).
SELECT {schema}.spend_units(%(id)s, %(queue)s, %(key)s, %(units)s);
