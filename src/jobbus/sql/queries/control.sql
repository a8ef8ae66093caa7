-- Named queries of the operator control plane: issuing commands, reading acknowledgements, the worker
-- listing and the status overview. Each block starts with `-- name: <query_name>`; {schema} is the
-- quoted schema identifier. Parameters are psycopg named placeholders.
--
-- A worker is "live" when it is not stopped and its registry row was refreshed within the shorter of
-- its own lease_seconds and dead_after_seconds; otherwise it is gone (silent: died, hangs or lost the
-- database) or stopped.

-- name: lock_commands
-- Serialises command issuers for the rest of the transaction. Workers read "everything after the
-- generation I acknowledged", so generations must become visible in order: without this lock a
-- command could commit generation 8 before another commits 7, and a worker acknowledging 8 would
-- never see 7. SHARE ROW EXCLUSIVE conflicts with itself and with inserts, not with plain SELECTs,
-- so workers reading control state never wait on it.
LOCK TABLE {schema}.command IN SHARE ROW EXCLUSIVE MODE;

-- name: issue_command
-- One command in one statement (run under lock_commands in the same transaction): the durable pause
-- state changes (pause inserts the target, resume deletes it), the command row records the workers
-- (and their instances) it addresses now, and pg_notify (delivered at commit) wakes them instead of
-- waiting for their next poll. A queue target reaches the workers whose queues contain it or who
-- serve every queue. Silent workers that were not declared dead are addressed too: a worker cut off
-- from the database applies the command when it is back, and `--wait` waits for it. Workers read
-- commands by target, not from this list, so the list only says whom to wait for.
WITH targeted AS (
    SELECT coalesce(array_agg(w.id ORDER BY w.id), '{{}}'::text[]) AS ids,
           coalesce(array_agg(w.instance_id ORDER BY w.id), '{{}}'::uuid[]) AS instances
    FROM {schema}.worker AS w
    WHERE w.state <> 'stopped'
      AND w.declared_dead_at IS NULL
      AND CASE %(target_kind)s::text
              WHEN 'all' THEN true
              WHEN 'queue' THEN w.queues IS NULL OR %(target)s::text = ANY(w.queues)
              ELSE w.id = %(target)s::text
          END
), paused AS (
    INSERT INTO {schema}.pause (target_kind, target)
    SELECT %(target_kind)s::text, %(target)s::text
    WHERE %(action)s::text = 'pause'
    ON CONFLICT (target_kind, target) DO NOTHING
    RETURNING 1
), resumed AS (
    DELETE FROM {schema}.pause
    WHERE %(action)s::text = 'resume' AND target_kind = %(target_kind)s::text AND target = %(target)s::text
    RETURNING 1
), issued AS (
    INSERT INTO {schema}.command (action, target_kind, target, worker_ids, instance_ids)
    SELECT %(action)s::text, %(target_kind)s::text, %(target)s::text, targeted.ids, targeted.instances
    FROM targeted
    RETURNING generation, worker_ids, instance_ids, issued_at
)
SELECT issued.generation, issued.worker_ids, issued.instance_ids, issued.issued_at,
       (SELECT count(*) FROM paused) + (SELECT count(*) FROM resumed) AS pause_changed,
       pg_notify(%(channel)s, issued.generation::text) IS NULL AS notified
FROM issued;

-- name: worker_acks
-- Where each addressed worker stands: its current instance, acknowledged generation, state, whether it
-- is silent and whether it was declared dead. A worker whose row was deleted meanwhile does not come
-- back.
SELECT id, instance_id, acked_generation, state,
       state <> 'stopped'
           AND last_seen_at < now() - make_interval(secs => least(lease_seconds, dead_after_seconds)) AS silent,
       declared_dead_at IS NOT NULL AS declared_dead
FROM {schema}.worker
WHERE id = ANY(%(ids)s::text[]);

-- name: forget_workers
-- Deletes registry rows of workers that stopped or went silent longer ago than forget_after, so the
-- registry does not grow with every deploy. Separate from list_workers so read-only roles can list.
DELETE FROM {schema}.worker
WHERE coalesce(stopped_at, last_seen_at) < now() - make_interval(secs => %(forget_after_seconds)s::float8)
  AND (state = 'stopped'
       OR last_seen_at < now() - make_interval(secs => least(lease_seconds, dead_after_seconds)));

-- name: list_workers
SELECT w.id, w.host, w.pid, w.queues, w.types, w.concurrency, w.state, w.in_flight, w.completed, w.failed,
       w.acked_generation, w.started_at, w.last_seen_at, w.stopped_at,
       w.state <> 'stopped'
           AND w.last_seen_at < now() - make_interval(secs => least(w.lease_seconds, w.dead_after_seconds)) AS gone,
       extract(epoch FROM now() - w.last_seen_at)::float8 AS seen_seconds_ago,
       EXISTS (SELECT 1 FROM {schema}.leader AS l WHERE l.instance_id = w.instance_id AND l.expires_at > now())
           AS leader
FROM {schema}.worker AS w
ORDER BY w.started_at, w.id;

-- name: unhandled_work
-- Queued jobs nobody can take, per (queue, type): no live worker (not stopped, not silent; a paused one
-- counts as live) serves the queue with a handler for the type. With no live worker at all, every
-- queued pair is listed. The pairs come from queued_pairs() (one index probe each, never a walk of
-- the jobs); each pair left is counted along job_queue_claim_idx, at most %(cap)s rows (NULL: all).
WITH live AS (
    SELECT queues, types FROM {schema}.worker
    WHERE state <> 'stopped'
      AND last_seen_at >= now() - make_interval(secs => least(lease_seconds, dead_after_seconds))
), unhandled AS (
    SELECT p.queue, p.type FROM {schema}.queued_pairs() AS p
    WHERE NOT EXISTS (SELECT 1 FROM live AS w
                      WHERE (w.queues IS NULL OR p.queue = ANY(w.queues)) AND p.type = ANY(w.types))
)
SELECT u.queue, u.type,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.job AS j
                              WHERE j.status = 'queued' AND j.queue = u.queue AND j.type = u.type
                              LIMIT %(cap)s) AS c)
FROM unhandled AS u
ORDER BY u.queue, u.type;

-- name: pause_targets
SELECT target_kind, target, paused_at FROM {schema}.pause ORDER BY target_kind, target;

-- name: count_prunable
-- What `prune` would delete now (its --dry-run); same predicate as prune_jobs.
SELECT count(*)
FROM {schema}.job
WHERE finished_at < now() - make_interval(secs => %(older_than_seconds)s)
  AND status = ANY(%(statuses)s::text[]);
