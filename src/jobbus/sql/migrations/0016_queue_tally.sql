-- The leader's queue samples count every finished job once, whatever happens: two leaders for a moment,
-- a job whose transaction commits after a sample it predates, a database clock set back.
--
-- Before, a sample counted the jobs whose finished_at lay between the newest sample and now(). Two
-- leaders sampling at once both counted from the same newest sample, so the jobs between were counted
-- twice. A finishing transaction dates its jobs at its start and commits a little later: one that
-- committed just after a sample's snapshot was before the next sample's range, and never counted. And
-- with the clock set back, now() stayed behind the newest sample until the clock passed it again, so
-- every job finished meanwhile was lost.
--
-- queue_tally is what the samples have counted, per queue and 10 seconds of finished_at (`bucket`, the
-- start of those 10 seconds). A sample counts the jobs finished after the newest sample, as before, and
-- reads again the buckets where a job can still appear in time already sampled: those of the last
-- p_late_seconds before the newest sample (transactions that committed since), and, the clock being
-- behind the newest sample, those around the clock (jobs finishing now, in seconds sampled before the
-- clock went back). A job found there beyond the bucket's tally is new: the sample counts it, and the
-- tally becomes what the bucket holds. Tallies are kept p_keep_seconds.

CREATE TABLE {schema}.queue_tally (
    bucket     timestamptz NOT NULL,
    queue      text NOT NULL,
    completed  bigint NOT NULL,
    failed     bigint NOT NULL,
    cancelled  bigint NOT NULL,
    PRIMARY KEY (bucket, queue)
);

-- One row: the samples take turns on it, and it says where the tallies start. Buckets before have no
-- tally (samples of the release before this one counted them, or none did, or the tally was deleted with
-- age): no job is counted late there.
CREATE TABLE {schema}.queue_tally_start (
    single         boolean PRIMARY KEY DEFAULT true CHECK (single),
    tallied_since  timestamptz
);
INSERT INTO {schema}.queue_tally_start DEFAULT VALUES;

-- The bucket of an instant: the start of its 10 seconds. STABLE, as date_part() of a timestamptz is, so
-- the planner inlines it: declared IMMUTABLE it was called once per job read, and a sample of 20,000 jobs
-- took 460 ms instead of 22. date_part() (double precision, exact to the microsecond at today's epochs)
-- rather than extract() (numeric): 22 ms against 43.
CREATE FUNCTION {schema}.tally_bucket(p_at timestamptz) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT to_timestamp(floor(date_part('epoch', p_at) / 10) * 10)
$$;

-- One sample of every queue for the whole fleet, written to queue_stat and returned (the leader's metrics
-- gauges are set from the rows): the gauges from the queued and running rows (each through its own
-- partial index), and the finished jobs this sample is the first to count, through job_finished_idx: the
-- time since the newest sample and the p_late_seconds before it, widened to whole buckets (the clock
-- being set back: p_interval_seconds and p_late_seconds before the clock to the end of its bucket, and
-- the p_late_seconds before the newest sample), never a scan of the finished rows. With 1,000 jobs
-- finishing a second and a sample every 10 s, that is about 25,000 jobs, 2.5 times what the statement
-- before read: 18 to 25 ms a sample against 5 to 8 (a loaded 2-core machine, 2 million finished jobs).
-- Samples take turns on queue_tally_start's row, and each reads with snapshots taken once the previous one
-- committed, so a second leader counts from the first one's sample; a sample's instant is the clock once
-- it has its turn. SECURITY DEFINER: the worker role needs no grant on the tallies. Planned with the
-- values of its ranges (force_custom_plan), which the planner then sees are small.
CREATE FUNCTION {schema}.sample_queues(p_interval_seconds double precision, p_late_seconds double precision,
                                       p_keep_seconds double precision)
RETURNS TABLE (queue text, available bigint, scheduled bigint, running bigint, completed bigint, failed bigint,
               cancelled bigint, oldest_available_seconds double precision)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_tallied_since timestamptz;
    v_at timestamptz;
    v_newest timestamptz;
    v_since timestamptz;   -- finished_at up to here was counted by the samples before
    v_low timestamptz;
    v_clock_end timestamptz;
    v_high timestamptz;
BEGIN
    SELECT s.tallied_since INTO v_tallied_since FROM {schema}.queue_tally_start AS s FOR UPDATE;
    v_at := clock_timestamp();
    DELETE FROM {schema}.queue_tally AS t WHERE t.bucket < v_at - make_interval(secs => p_keep_seconds);
    IF v_tallied_since IS NOT NULL THEN
        v_tallied_since := greatest(v_tallied_since, v_at - make_interval(secs => p_keep_seconds));
    END IF;
    v_newest := (SELECT max(s.sampled_at) FROM {schema}.queue_stat AS s);
    v_since := coalesce(v_newest, v_at - make_interval(secs => p_interval_seconds));
    -- What is read, in whole buckets: from v_low to the end of the clock's bucket, up to the clock (or, set
    -- back, up to v_since); and, set back, the last p_late_seconds before v_since, from v_high.
    v_low := {schema}.tally_bucket(least(v_since, v_at - make_interval(secs => p_interval_seconds))
                                   - make_interval(secs => p_late_seconds));
    v_clock_end := {schema}.tally_bucket(v_at) + interval '10 seconds';
    v_high := {schema}.tally_bucket(v_since - make_interval(secs => p_late_seconds));
    RETURN QUERY
    WITH finished AS (
        SELECT j.finished_at, j.queue, j.status
        FROM {schema}.job AS j
        WHERE j.finished_at >= v_low AND j.finished_at < v_clock_end AND j.finished_at <= greatest(v_at, v_since)
        UNION ALL
        SELECT j.finished_at, j.queue, j.status
        FROM {schema}.job AS j
        WHERE j.finished_at >= greatest(v_high, v_clock_end) AND j.finished_at <= v_since
    ), read AS (
        -- Per bucket and queue: the jobs of time sampled before (`seen_*`) and the others (`new_*`).
        SELECT {schema}.tally_bucket(f.finished_at) AS bucket, f.queue,
               count(*) FILTER (WHERE f.status = 'completed' AND f.finished_at <= v_since) AS seen_completed,
               count(*) FILTER (WHERE f.status = 'failed' AND f.finished_at <= v_since) AS seen_failed,
               count(*) FILTER (WHERE f.status = 'cancelled' AND f.finished_at <= v_since) AS seen_cancelled,
               count(*) FILTER (WHERE f.status = 'completed' AND f.finished_at > v_since) AS new_completed,
               count(*) FILTER (WHERE f.status = 'failed' AND f.finished_at > v_since) AS new_failed,
               count(*) FILTER (WHERE f.status = 'cancelled' AND f.finished_at > v_since) AS new_cancelled
        FROM finished AS f
        GROUP BY 1, 2
    ), tallies AS (
        SELECT t.*
        FROM {schema}.queue_tally AS t
        WHERE (t.bucket >= v_low AND t.bucket < v_clock_end)
           OR (t.bucket >= greatest(v_high, v_clock_end) AND t.bucket <= v_since)
    ), compared AS (
        -- A tallied bucket's jobs beyond its tally are late. A tally above what the bucket holds now (jobs
        -- retried or deleted since) takes nothing back, so such a job and one of the same queue and outcome
        -- landing late in its bucket before the next sample offset each other (counts cannot tell them apart).
        SELECT coalesce(r.bucket, t.bucket) AS bucket, coalesce(r.queue, t.queue) AS queue,
               coalesce(r.seen_completed, 0) AS seen_completed, coalesce(r.seen_failed, 0) AS seen_failed,
               coalesce(r.seen_cancelled, 0) AS seen_cancelled, coalesce(r.new_completed, 0) AS new_completed,
               coalesce(r.new_failed, 0) AS new_failed, coalesce(r.new_cancelled, 0) AS new_cancelled,
               coalesce(t.completed, 0) AS tally_completed, coalesce(t.failed, 0) AS tally_failed,
               coalesce(t.cancelled, 0) AS tally_cancelled,
               v_newest IS NOT NULL AND coalesce(r.bucket, t.bucket) >= v_tallied_since AS tallied
        FROM read AS r
        FULL JOIN tallies AS t ON t.bucket = r.bucket AND t.queue = r.queue
    ), tallied AS (
        INSERT INTO {schema}.queue_tally AS t (bucket, queue, completed, failed, cancelled)
        SELECT c.bucket, c.queue, c.seen_completed + c.new_completed, c.seen_failed + c.new_failed,
               c.seen_cancelled + c.new_cancelled
        FROM compared AS c
        ON CONFLICT (bucket, queue) DO UPDATE
        SET completed = excluded.completed, failed = excluded.failed, cancelled = excluded.cancelled
    ), counted AS (
        SELECT l.queue, sum(l.completed)::bigint AS completed, sum(l.failed)::bigint AS failed,
               sum(l.cancelled)::bigint AS cancelled
        FROM (SELECT c.queue,
                     c.new_completed + CASE WHEN c.tallied THEN greatest(c.seen_completed - c.tally_completed, 0)
                                            ELSE 0 END AS completed,
                     c.new_failed + CASE WHEN c.tallied THEN greatest(c.seen_failed - c.tally_failed, 0)
                                         ELSE 0 END AS failed,
                     c.new_cancelled + CASE WHEN c.tallied THEN greatest(c.seen_cancelled - c.tally_cancelled, 0)
                                            ELSE 0 END AS cancelled
              FROM compared AS c) AS l
        GROUP BY l.queue
        HAVING sum(l.completed + l.failed + l.cancelled) > 0
    ), queued AS (
        SELECT j.queue,
               count(*) FILTER (WHERE j.available_at <= v_at) AS available,
               count(*) FILTER (WHERE j.available_at > v_at) AS scheduled,
               extract(epoch FROM v_at - min(j.available_at) FILTER (WHERE j.available_at <= v_at))::float8
                   AS oldest
        FROM {schema}.job AS j
        WHERE j.status = 'queued'
        GROUP BY j.queue
    ), running AS (
        SELECT j.queue, count(*) AS running FROM {schema}.job AS j WHERE j.status = 'running' GROUP BY j.queue
    ), queues AS (
        -- A queue of the newest sample gets one more row, of zeros when it went idle: readers of the
        -- latest sample (metrics, the dashboard) never keep showing the last jobs a queue had.
        SELECT q.queue FROM queued AS q UNION SELECT r.queue FROM running AS r UNION SELECT c.queue FROM counted AS c
        UNION SELECT s.queue FROM {schema}.queue_stat AS s
              WHERE s.sampled_at = v_newest
                AND s.available + s.scheduled + s.running + s.completed + s.failed + s.cancelled > 0
    ), written AS (
        INSERT INTO {schema}.queue_stat AS s (sampled_at, queue, available, scheduled, running, completed, failed,
                                              cancelled, oldest_available_seconds)
        SELECT v_at, q.queue, coalesce(qd.available, 0), coalesce(qd.scheduled, 0), coalesce(r.running, 0),
               coalesce(c.completed, 0), coalesce(c.failed, 0), coalesce(c.cancelled, 0), qd.oldest
        FROM queues AS q
        LEFT JOIN queued AS qd ON qd.queue = q.queue
        LEFT JOIN running AS r ON r.queue = q.queue
        LEFT JOIN counted AS c ON c.queue = q.queue
        ON CONFLICT (sampled_at, queue) DO NOTHING
        RETURNING s.queue, s.available, s.scheduled, s.running, s.completed, s.failed, s.cancelled,
                  s.oldest_available_seconds
    )
    SELECT w.queue, w.available, w.scheduled, w.running, w.completed, w.failed, w.cancelled,
           w.oldest_available_seconds
    FROM written AS w;
    UPDATE {schema}.queue_tally_start
    SET tallied_since = greatest(coalesce(tallied_since, v_low), v_at - make_interval(secs => p_keep_seconds));
END
$$;
