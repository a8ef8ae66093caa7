-- Named queries of the operator's views of jobs (jobbus/store/views.py), shared by the dashboard's jobs
-- page and `jobbus jobs list`. Each block starts with `-- name: <query_name>`; {schema} is the quoted
-- schema identifier, {summary} the columns a list shows of a job (views.SUMMARY), {filters} the
-- conditions of `Filters` (queues, types, name, text, tags: views.FILTERS), {search} the text's alone,
-- {tagged} the tags' alone.
--
-- Every list reaches every matching job: it walks the index of its view in the view's own order from
-- a keyset cursor, never a window of recent entries, so a page is empty only when nothing older
-- matches. A queue and a type are found by index probes (never by walking the jobs of other queues
-- and types); a name and a text are tested on the rows of the view's walk, so they cost what the walk
-- meets before it has a page (docs/dashboard.md, "Lists").

-- name: fragment_finished_triples
-- The body of `WITH RECURSIVE triples AS (...)`: the (status, queue, type) triples of the finished jobs
-- of %(statuses)s, by a loose index scan of job_finished_view_idx (one probe each).
    SELECT s.status, f.queue, f.type
    FROM unnest(%(statuses)s::text[]) AS s(status)
    CROSS JOIN LATERAL (
        SELECT j.queue, j.type FROM {schema}.job AS j
        WHERE j.status = s.status AND j.finished_at IS NOT NULL
        ORDER BY j.status, j.queue, j.type LIMIT 1
    ) AS f
    UNION ALL
    SELECT t.status, n.queue, n.type
    FROM triples AS t
    CROSS JOIN LATERAL (
        SELECT j.queue, j.type FROM {schema}.job AS j
        WHERE j.status = t.status AND j.finished_at IS NOT NULL AND (j.queue, j.type) > (t.queue, t.type)
        ORDER BY j.status, j.queue, j.type LIMIT 1
    ) AS n

-- name: fragment_queued_levels
-- The body of `WITH RECURSIVE levels AS (...)`: the (queue, type, priority) ranges of job_queue_claim_idx
-- of the queued jobs of %(queues)s and %(types)s (NULL: any), from queued_pairs() and one probe a level.
    SELECT p.queue, p.type, top.priority
    FROM {schema}.queued_pairs() AS p
    CROSS JOIN LATERAL (
        SELECT j.priority FROM {schema}.job AS j
        WHERE j.status = 'queued' AND j.queue = p.queue AND j.type = p.type
        ORDER BY j.priority DESC LIMIT 1
    ) AS top
    WHERE (%(queues)s::text[] IS NULL OR p.queue = ANY(%(queues)s::text[])) AND (%(types)s::text[] IS NULL OR p.type = ANY(%(types)s::text[]))
    UNION ALL
    SELECT l.queue, l.type, lower.priority
    FROM levels AS l
    CROSS JOIN LATERAL (
        SELECT j.priority FROM {schema}.job AS j
        WHERE j.status = 'queued' AND j.queue = l.queue AND j.type = l.type AND j.priority < l.priority
        ORDER BY j.priority DESC LIMIT 1
    ) AS lower

-- name: view_finished
-- Completed, failed or cancelled jobs (%(statuses)s), the most recently finished first. The (status,
-- queue, type) triples of job_finished_view_idx are found by a loose index scan (one probe each), the
-- head of each triple's walk in finish order is read after the cursor (finished_at, id), and the heads
-- are merged: a page costs the number of triples times the page, whatever the table holds.
WITH RECURSIVE triples AS (
{finished_triples}
), page AS (
    SELECT r.id, r.finished_at
    FROM triples AS t
    CROSS JOIN LATERAL (
        SELECT j.id, j.finished_at FROM {schema}.job AS j
        WHERE j.status = t.status AND j.queue = t.queue AND j.type = t.type AND j.finished_at IS NOT NULL
          AND (%(at)s::timestamptz IS NULL OR (j.finished_at, j.id) < (%(at)s::timestamptz, %(id)s::uuid))
          AND (%(finished_after)s::timestamptz IS NULL OR j.finished_at > %(finished_after)s::timestamptz)
          AND (%(name)s::text IS NULL OR j.name = %(name)s::text)
          AND {tagged}
          AND (%(text)s::text IS NULL OR {search})
        ORDER BY j.finished_at DESC, j.id DESC
        LIMIT %(limit)s
    ) AS r
    WHERE (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[])) AND (%(types)s::text[] IS NULL OR t.type = ANY(%(types)s::text[]))
    ORDER BY r.finished_at DESC, r.id DESC
    LIMIT %(limit)s
)
SELECT {summary}
FROM page AS p JOIN {schema}.job AS j ON j.id = p.id
ORDER BY j.finished_at DESC, j.id DESC;

-- name: view_queued
-- Queued jobs by when they run next (available_at, id); with %(scheduled)s only those available later,
-- never attempted and not parked. The (queue, type) pairs come from queued_pairs() and their priority
-- levels from probes of job_queue_claim_idx, whose (queue, type, priority) ranges are each in
-- (available_at, id) order: the head of each range after the cursor is read, and the heads merged.
WITH RECURSIVE levels AS (
{queued_levels}
), page AS (
    SELECT r.id, r.available_at
    FROM levels AS l
    CROSS JOIN LATERAL (
        SELECT j.id, j.available_at FROM {schema}.job AS j
        WHERE j.status = 'queued' AND j.queue = l.queue AND j.type = l.type AND j.priority = l.priority
          AND (NOT %(scheduled)s OR (j.available_at > now() AND j.attempts = 0
                                     AND (j.history -> -1 ->> 'outcome') IS DISTINCT FROM 'waiting'))
          AND (%(at)s::timestamptz IS NULL OR (j.available_at, j.id) > (%(at)s::timestamptz, %(id)s::uuid))
          AND (%(name)s::text IS NULL OR j.name = %(name)s::text)
          AND {tagged}
          AND (%(text)s::text IS NULL OR {search})
        ORDER BY j.available_at, j.id
        LIMIT %(limit)s
    ) AS r
    ORDER BY r.available_at, r.id
    LIMIT %(limit)s
)
SELECT {summary}
FROM page AS p JOIN {schema}.job AS j ON j.id = p.id
ORDER BY j.available_at, j.id;

-- name: view_retrying
-- Queued after a failed attempt and not parked, by when they run next, along job_retrying_view_idx.
SELECT {summary}
FROM {schema}.job AS j
WHERE j.status = 'queued' AND j.attempts > 0 AND (j.history -> -1 ->> 'outcome') IS DISTINCT FROM 'waiting'
  AND (%(at)s::timestamptz IS NULL OR (j.available_at, j.id) > (%(at)s::timestamptz, %(id)s::uuid))
  AND {filters}
ORDER BY j.available_at, j.id
LIMIT %(limit)s;

-- name: view_waiting
-- Parked in a durable sleep or wait, by when they wake, along job_waiting_view_idx.
SELECT {summary}
FROM {schema}.job AS j
WHERE j.status = 'queued' AND (j.history -> -1 ->> 'outcome') = 'waiting'
  AND (%(at)s::timestamptz IS NULL OR (j.available_at, j.id) > (%(at)s::timestamptz, %(id)s::uuid))
  AND {filters}
ORDER BY j.available_at, j.id
LIMIT %(limit)s;

-- name: view_running
-- Running jobs, the latest start first: as many as the fleet's concurrency, never millions.
SELECT {summary}
FROM {schema}.job AS j
WHERE j.status = 'running'
  AND (%(at)s::timestamptz IS NULL OR (j.started_at, j.id) < (%(at)s::timestamptz, %(id)s::uuid))
  AND {filters}
ORDER BY j.started_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: view_group
-- One group's jobs, the newest first, along job_group_idx.
SELECT {summary}
FROM {schema}.job AS j
WHERE j.group_id = %(group_id)s::uuid
  AND (%(id)s::uuid IS NULL OR j.id < %(id)s::uuid)
  AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
  AND {filters}
ORDER BY j.id DESC
LIMIT %(limit)s;

-- name: count_finished
-- How many completed, failed or cancelled jobs (%(statuses)s) match, read along the triples of
-- job_finished_view_idx (as view_finished finds them), at most %(cap)s + 1.
WITH RECURSIVE triples AS (
{finished_triples}
)
SELECT count(*) FROM (
    SELECT 1
    FROM triples AS t
    CROSS JOIN LATERAL (
        SELECT 1 FROM {schema}.job AS j
        WHERE j.status = t.status AND j.queue = t.queue AND j.type = t.type AND j.finished_at IS NOT NULL
          AND (%(finished_after)s::timestamptz IS NULL OR j.finished_at > %(finished_after)s::timestamptz)
          AND (%(name)s::text IS NULL OR j.name = %(name)s::text)
          AND {tagged}
          AND (%(text)s::text IS NULL OR {search})
        LIMIT %(cap)s + 1
    ) AS r
    WHERE (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[])) AND (%(types)s::text[] IS NULL OR t.type = ANY(%(types)s::text[]))
    LIMIT %(cap)s + 1
) AS c;

-- name: count_queued
-- How many queued jobs (with %(scheduled)s: those of the scheduled view) match, read along the
-- (queue, type, priority) ranges of job_queue_claim_idx (as view_queued reads them), at most %(cap)s + 1.
WITH RECURSIVE levels AS (
{queued_levels}
)
SELECT count(*) FROM (
    SELECT 1
    FROM levels AS l
    CROSS JOIN LATERAL (
        SELECT 1 FROM {schema}.job AS j
        WHERE j.status = 'queued' AND j.queue = l.queue AND j.type = l.type AND j.priority = l.priority
          AND (NOT %(scheduled)s OR (j.available_at > now() AND j.attempts = 0
                                     AND (j.history -> -1 ->> 'outcome') IS DISTINCT FROM 'waiting'))
          AND (%(name)s::text IS NULL OR j.name = %(name)s::text)
          AND {tagged}
          AND (%(text)s::text IS NULL OR {search})
        LIMIT %(cap)s + 1
    ) AS r
    LIMIT %(cap)s + 1
) AS c;

-- name: count_retrying
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.job AS j
    WHERE j.status = 'queued' AND j.attempts > 0 AND (j.history -> -1 ->> 'outcome') IS DISTINCT FROM 'waiting'
      AND {filters}
    LIMIT %(cap)s + 1
) AS c;

-- name: count_waiting
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.job AS j
    WHERE j.status = 'queued' AND (j.history -> -1 ->> 'outcome') = 'waiting'
      AND {filters}
    LIMIT %(cap)s + 1
) AS c;

-- name: count_running
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.job AS j
    WHERE j.status = 'running'
      AND {filters}
    LIMIT %(cap)s + 1
) AS c;

-- name: count_group
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.job AS j
    WHERE j.group_id = %(group_id)s::uuid
      AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))
      AND {filters}
    LIMIT %(cap)s + 1
) AS c;

-- name: finished_span
-- The oldest and the newest finish (two probes of job_finished_idx): where a search walking finished
-- jobs window by window ends and starts.
SELECT min(finished_at), max(finished_at) FROM {schema}.job WHERE finished_at IS NOT NULL;

-- name: count_searched
-- How many queued or running jobs of a view hold a text, at most %(cap)s + 1: {predicate} is the view's
-- and the filters'. A search tests every job of the view, whatever the order, so the planner chooses
-- how to read them (a bitmap of the view's rows, read in parallel): 65 ms for 100,000 queued jobs
-- against 112 ms along the claim index's ranges.
SELECT count(*) FROM (SELECT 1 FROM {schema}.job AS j WHERE {predicate} LIMIT %(cap)s + 1) AS c;

-- name: estimate_rows
-- The planner's estimate of the rows of a view past the count's bound, from its statistics (those over
-- status, queue and type together, job_status_queue_type in sql/current.sql): EXPLAIN of the view's
-- predicate, {predicate}.
EXPLAIN (FORMAT JSON) SELECT 1 FROM {schema}.job AS j WHERE {predicate};

-- name: pairs_finished
-- The (queue, type) pairs of the completed, failed or cancelled jobs (%(statuses)s): the choices of a
-- finished tab, complete, by the loose index scan view_finished walks.
WITH RECURSIVE triples AS (
{finished_triples}
)
SELECT DISTINCT queue, type FROM triples ORDER BY 1, 2;

-- name: pairs_queued
-- The (queue, type) pairs of queued jobs, whatever their view (one index probe each).
SELECT queue, type FROM {schema}.queued_pairs() ORDER BY 1, 2;

-- name: pairs_running
SELECT DISTINCT queue, type FROM {schema}.job WHERE status = 'running' ORDER BY 1, 2;

-- name: queue_counts_queued
-- Per queue, what `jobbus status` and the dashboard's overview show of its queued and running jobs, read
-- now along the claim index: (queue, what, n, capped) with `what` in queued, available (due now),
-- scheduled (the view) and running; n is summed over the queue's (type, priority) ranges, each read up
-- to %(cap)s + 1 rows (capped: some range went past it, and n is a lower bound the caller replaces by
-- an estimate); and (queue, 'oldest', seconds the oldest available job has waited, false).
WITH RECURSIVE levels AS (
{queued_levels}
), queued AS (
    SELECT l.queue,
           (SELECT count(*) FROM (SELECT 1 FROM {schema}.job AS j
                                  WHERE j.status = 'queued' AND j.queue = l.queue AND j.type = l.type
                                    AND j.priority = l.priority
                                  LIMIT %(cap)s + 1) AS c) AS queued,
           (SELECT count(*) FROM (SELECT 1 FROM {schema}.job AS j
                                  WHERE j.status = 'queued' AND j.queue = l.queue AND j.type = l.type
                                    AND j.priority = l.priority AND j.available_at <= now()
                                  LIMIT %(cap)s + 1) AS c) AS available,
           (SELECT count(*) FROM (SELECT 1 FROM {schema}.job AS j
                                  WHERE j.status = 'queued' AND j.queue = l.queue AND j.type = l.type
                                    AND j.priority = l.priority AND j.available_at > now() AND j.attempts = 0
                                    AND (j.history -> -1 ->> 'outcome') IS DISTINCT FROM 'waiting'
                                  LIMIT %(cap)s + 1) AS c) AS scheduled,
           (SELECT min(j.available_at) FROM {schema}.job AS j
            WHERE j.status = 'queued' AND j.queue = l.queue AND j.type = l.type AND j.priority = l.priority
              AND j.available_at <= now()) AS oldest
    FROM levels AS l
)
SELECT queue, 'queued', sum(queued)::bigint, bool_or(queued > %(cap)s) FROM queued GROUP BY queue
UNION ALL
SELECT queue, 'available', sum(available)::bigint, bool_or(available > %(cap)s) FROM queued GROUP BY queue
UNION ALL
SELECT queue, 'scheduled', sum(scheduled)::bigint, bool_or(scheduled > %(cap)s) FROM queued GROUP BY queue
UNION ALL
SELECT queue, 'oldest', extract(epoch FROM now() - min(oldest))::bigint, false FROM queued GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*), false FROM {schema}.job WHERE status = 'running' GROUP BY queue;

-- name: queue_counts_finished
-- Per queue, its completed, failed and cancelled jobs and those finished lately (completed_minute, in
-- the last minute; failed_hour), read now along job_finished_view_idx: (queue, what, n, capped) as
-- queue_counts_queued, n summed over the queue's (status, type) triples.
WITH RECURSIVE triples AS (
{finished_triples}
), finished AS (
    -- Per (queue, status), its triples read together up to the bound: a queue of many types costs the
    -- bound, not the bound per type.
    SELECT q.queue, q.status,
           (SELECT count(*) FROM (
                SELECT 1 FROM triples AS t
                CROSS JOIN LATERAL (
                    SELECT 1 FROM {schema}.job AS j
                    WHERE j.status = t.status AND j.queue = t.queue AND j.type = t.type AND j.finished_at IS NOT NULL
                    LIMIT %(cap)s + 1) AS r
                WHERE t.queue = q.queue AND t.status = q.status
                LIMIT %(cap)s + 1) AS c) AS n,
           (SELECT count(*) FROM (
                SELECT 1 FROM triples AS t
                CROSS JOIN LATERAL (
                    SELECT 1 FROM {schema}.job AS j
                    WHERE j.status = t.status AND j.queue = t.queue AND j.type = t.type
                      AND j.finished_at > now() - CASE WHEN t.status = 'completed' THEN interval '1 minute'
                                                       ELSE interval '1 hour' END
                    LIMIT %(cap)s + 1) AS r
                WHERE t.queue = q.queue AND t.status = q.status
                LIMIT %(cap)s + 1) AS c) AS recent
    FROM (SELECT DISTINCT queue, status FROM triples) AS q
)
SELECT queue, status, sum(n)::bigint, bool_or(n > %(cap)s) FROM finished GROUP BY queue, status
UNION ALL
SELECT queue, CASE WHEN status = 'completed' THEN 'completed_minute' ELSE status || '_hour' END,
       sum(recent)::bigint, bool_or(recent > %(cap)s)
FROM finished WHERE status <> 'cancelled' GROUP BY queue, status;

-- name: view_finished_search
-- view_finished with a search, where the search index exists (`jobbus search-index create`): every job
-- holding the text comes from the index (a bitmap of the rows whose search document has its trigrams),
-- then the page in finish order. MATERIALIZED keeps the planner from walking job_finished_idx in finish
-- order instead, hoping to meet the page early (11.9 s for a text no job holds among 10 million); a
-- text held by millions makes this read long, and views.page then walks instead.
WITH matched AS MATERIALIZED (
    SELECT j.id, j.finished_at
    FROM {schema}.job AS j
    WHERE j.status = ANY(%(statuses)s::text[]) AND j.finished_at IS NOT NULL
      AND (%(at)s::timestamptz IS NULL OR (j.finished_at, j.id) < (%(at)s::timestamptz, %(id)s::uuid))
      AND (%(finished_after)s::timestamptz IS NULL OR j.finished_at > %(finished_after)s::timestamptz)
      AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
      AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
      AND (%(name)s::text IS NULL OR j.name = %(name)s::text)
      AND {tagged}
      AND {search}
), page AS (
    SELECT id, finished_at FROM matched ORDER BY finished_at DESC, id DESC LIMIT %(limit)s
)
SELECT {summary}
FROM page AS p JOIN {schema}.job AS j ON j.id = p.id
ORDER BY j.finished_at DESC, j.id DESC;

-- name: count_finished_search
-- count_finished with a search, where the search index exists.
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.job AS j
    WHERE j.status = ANY(%(statuses)s::text[]) AND j.finished_at IS NOT NULL
      AND (%(finished_after)s::timestamptz IS NULL OR j.finished_at > %(finished_after)s::timestamptz)
      AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
      AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
      AND (%(name)s::text IS NULL OR j.name = %(name)s::text)
      AND {tagged}
      AND {search}
    LIMIT %(cap)s + 1
) AS c;

-- name: search_indexes
-- The optional search indexes (one per finished status) that exist and are valid: a CREATE INDEX
-- CONCURRENTLY cut short leaves an invalid one, which no query uses.
SELECT c.relname::text
FROM pg_index AS i
JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE c.relnamespace = %(schema_name)s::regnamespace AND c.relname LIKE 'job\_search\_%%\_idx' AND i.indisvalid;

-- name: view_finished_named
-- view_finished under a name filter, along job_finished_name_idx: the jobs of that name in finish order,
-- those of the statuses asked for kept.
SELECT {summary}
FROM {schema}.job AS j
WHERE j.name = %(name)s::text AND j.finished_at IS NOT NULL AND j.status = ANY(%(statuses)s::text[])
  AND (%(at)s::timestamptz IS NULL OR (j.finished_at, j.id) < (%(at)s::timestamptz, %(id)s::uuid))
  AND (%(finished_after)s::timestamptz IS NULL OR j.finished_at > %(finished_after)s::timestamptz)
  AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
  AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
  AND (%(text)s::text IS NULL OR {search})
  AND {tagged}
ORDER BY j.finished_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: count_finished_named
-- count_finished under a name filter, along job_finished_name_idx.
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.job AS j
    WHERE j.name = %(name)s::text AND j.finished_at IS NOT NULL AND j.status = ANY(%(statuses)s::text[])
      AND (%(finished_after)s::timestamptz IS NULL OR j.finished_at > %(finished_after)s::timestamptz)
      AND (%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))
      AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
      AND (%(text)s::text IS NULL OR {search})
      AND {tagged}
    LIMIT %(cap)s + 1
) AS c;

-- name: view_finished_tagged
-- view_finished under a tag filter: {predicate} is the view's and the filters'. The planner chooses the
-- read from the tag's statistics: the tag's jobs from job_tags_idx, then sorted, when it is rare; a
-- walk in finish order that tests each job when it is common.
SELECT {summary}
FROM {schema}.job AS j
WHERE {predicate}
  AND (%(at)s::timestamptz IS NULL OR (j.finished_at, j.id) < (%(at)s::timestamptz, %(id)s::uuid))
ORDER BY j.finished_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: view_queued_tagged
-- view_queued (and the views of queued jobs) under a tag filter, as view_finished_tagged.
SELECT {summary}
FROM {schema}.job AS j
WHERE {predicate}
  AND (%(at)s::timestamptz IS NULL OR (j.available_at, j.id) > (%(at)s::timestamptz, %(id)s::uuid))
ORDER BY j.available_at, j.id
LIMIT %(limit)s;
