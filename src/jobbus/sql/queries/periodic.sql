-- Named queries of periodic jobs. Each block starts with `-- name: <query_name>`; {schema} is the quoted
-- schema identifier.

-- name: upsert_periodic
-- Adds a periodic job or replaces its definition. A changed schedule restarts from %(next_run_at)s; an
-- unchanged one keeps its next run, and a pause (enabled) survives a redefinition. %(source)s = 'code'
-- never replaces a job added at run time, nor the reverse: the conflict comes back as no row.
INSERT INTO {schema}.periodic AS p (name, type, cron, every_seconds, timezone, configuration, queue, priority,
                                   overlap, source, next_run_at)
VALUES (%(name)s, %(type)s, %(cron)s, %(every_seconds)s, %(timezone)s, %(configuration)s::jsonb, %(queue)s,
        %(priority)s, %(overlap)s, %(source)s, %(next_run_at)s)
ON CONFLICT (name) DO UPDATE
SET type = excluded.type, cron = excluded.cron, every_seconds = excluded.every_seconds,
    timezone = excluded.timezone, configuration = excluded.configuration, queue = excluded.queue,
    priority = excluded.priority, overlap = excluded.overlap,
    next_run_at = CASE WHEN p.cron IS NOT DISTINCT FROM excluded.cron
                        AND p.every_seconds IS NOT DISTINCT FROM excluded.every_seconds
                        AND p.timezone = excluded.timezone
                       THEN p.next_run_at ELSE excluded.next_run_at END,
    updated_at = now()
WHERE p.source = excluded.source
RETURNING name;

-- name: retire_code_periodics
-- Periodic jobs declared in code that the code no longer declares, among the job types a worker knows
-- (a worker leaves other workers' types alone): deleted, so no schedule outlives its declaration.
DELETE FROM {schema}.periodic
WHERE source = 'code' AND type = ANY(%(types)s::text[]) AND NOT (name = ANY(%(declared)s::text[]))
RETURNING name;

-- name: remove_periodic
DELETE FROM {schema}.periodic WHERE name = %(name)s RETURNING name;

-- name: enable_periodic
UPDATE {schema}.periodic SET enabled = %(enabled)s, updated_at = now() WHERE name = %(name)s RETURNING name;

-- name: list_periodic
SELECT name, type, cron, every_seconds, timezone, enabled, next_run_at, last_run_at, last_job_id, queue, priority,
       overlap, configuration, source
FROM {schema}.periodic
WHERE %(name)s::text IS NULL OR name = %(name)s::text
ORDER BY name;

-- name: due_periodics
-- What is due now, with the database's clock (the unit of time of every tick).
SELECT name, type, cron, every_seconds, timezone, next_run_at, now()
FROM {schema}.periodic
WHERE enabled AND next_run_at <= now()
ORDER BY next_run_at
LIMIT 100;

-- name: next_periodic_run
SELECT extract(epoch FROM min(next_run_at) - now())::float8 FROM {schema}.periodic WHERE enabled;

-- name: enqueue_tick
-- One tick of one periodic job, exactly once: the row is locked and must still be due at the expected
-- next_run_at (another leader, or a redefinition, moves it); it moves to the next tick, and the job is
-- inserted in the same statement unless overlap is off and the previous job is still queued or
-- running. The tick must not be before the row's next run, and the next run must be later than the
-- tick: each enqueue moves next_run_at strictly forward, so the ticks enqueued for a row only ever
-- increase and none is enqueued twice, whatever the leaders computed.
WITH due AS (
    SELECT p.name,
           p.overlap OR NOT EXISTS (
               SELECT 1 FROM {schema}.job AS prev WHERE prev.id = p.last_job_id AND prev.status IN ('queued', 'running')
           ) AS enqueue
    FROM {schema}.periodic AS p
    WHERE p.name = %(name)s AND p.next_run_at = %(expected)s AND p.enabled
      AND %(tick)s::timestamptz >= p.next_run_at AND %(next_run_at)s::timestamptz > %(tick)s::timestamptz
    FOR UPDATE OF p
), advanced AS (
    UPDATE {schema}.periodic AS p
    SET next_run_at = %(next_run_at)s,
        last_run_at = CASE WHEN due.enqueue THEN %(tick)s ELSE p.last_run_at END,
        last_job_id = CASE WHEN due.enqueue THEN %(job_id)s ELSE p.last_job_id END
    FROM due
    WHERE p.name = due.name
    RETURNING p.name, p.type, p.queue, p.priority, p.configuration, due.enqueue
), inserted AS (
    INSERT INTO {schema}.job (id, type, queue, name, priority, configuration_data, max_attempts, available_at)
    SELECT %(job_id)s, a.type, a.queue, a.name, a.priority, a.configuration, %(max_attempts)s, %(tick)s
    FROM advanced AS a
    WHERE a.enqueue
    RETURNING id, queue, type
)
SELECT (SELECT count(*) FROM advanced), (SELECT count(*) FROM inserted),
       (SELECT pg_notify(%(channel)s, json_build_array(queue, type)::text) IS NULL FROM inserted);

-- name: run_periodic_now
-- An extra run of a periodic job now (`jobbus periodic run`), beside its schedule.
WITH p AS (SELECT * FROM {schema}.periodic WHERE name = %(name)s), inserted AS (
    INSERT INTO {schema}.job (id, type, queue, name, priority, configuration_data, max_attempts)
    SELECT %(job_id)s, p.type, p.queue, p.name, p.priority, p.configuration, %(max_attempts)s FROM p
    RETURNING id, queue, type
), recorded AS (
    UPDATE {schema}.periodic SET last_run_at = now(), last_job_id = %(job_id)s
    WHERE name IN (SELECT name FROM p)
    RETURNING name
)
SELECT i.type, (SELECT count(*) FROM recorded), pg_notify(%(channel)s, json_build_array(i.queue, i.type)::text) IS NULL
FROM inserted AS i;

-- name: periodic_type
SELECT type FROM {schema}.periodic WHERE name = %(name)s;

-- name: database_now
SELECT now();
