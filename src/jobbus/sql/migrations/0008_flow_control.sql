-- Flow control: fleet-wide concurrency limits and rate limits per queue and per concurrency key, and
-- claims that rotate across keys. Exact under any number of claimers: every claim of a limited queue
-- locks the queue's settings row for its transaction (a row lock, never a session lock, so PgBouncer in
-- transaction mode is fine), counts what it may take, then takes it. Queues without limits never reach
-- any of this: the worker routes only queues with a settings row to take_limited.

CREATE TABLE {schema}.queue_setting (
    queue                    text PRIMARY KEY CHECK (length(queue) BETWEEN 1 AND 255),
    concurrency              integer CHECK (concurrency >= 1),
    concurrency_per_key      integer CHECK (concurrency_per_key >= 1),
    rate_count               integer CHECK (rate_count >= 1),
    rate_period_seconds      double precision CHECK (rate_period_seconds > 0),
    key_rate_count           integer CHECK (key_rate_count >= 1),
    key_rate_period_seconds  double precision CHECK (key_rate_period_seconds > 0),
    -- Per-key fairness: the next claim starts with the key after this one.
    cursor_key               text,
    updated_at               timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate_count IS NULL) = (rate_period_seconds IS NULL)),
    CHECK ((key_rate_count IS NULL) = (key_rate_period_seconds IS NULL))
);

-- When jobs of limited queues started: a sliding window per queue (and per key), never a fixed window
-- that bursts at its edges. Written by the claim (claim_jobs, with each job's started_at) only for
-- limited queues; rows older than the longest window are deleted by the next claim of the queue.
CREATE TABLE {schema}.queue_start (
    queue            text NOT NULL,
    concurrency_key  text,
    started_at       timestamptz NOT NULL
);
CREATE INDEX queue_start_idx ON {schema}.queue_start (queue, started_at);
CREATE INDEX queue_start_key_idx ON {schema}.queue_start (queue, concurrency_key, started_at);

-- Up to p_want available jobs of one concurrency key of a queue (claim order, the given types), locked.
-- The twin of take_from_queue on job_key_claim_idx (queue, concurrency_key, type, priority, ...): each
-- (type, priority) group of the key is found by index probes and only its available jobs are read.
CREATE FUNCTION {schema}.take_from_key(p_queue text, p_key text, p_types text[], p_want integer, p_exclude uuid[])
RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    v_type text;
    v_priority integer;
    v_ids uuid[] := '{{}}';
    v_more uuid[];
BEGIN
    FOREACH v_type IN ARRAY p_types LOOP
        SELECT j.priority INTO v_priority FROM {schema}.job AS j
        WHERE j.status = 'queued' AND j.queue = p_queue AND j.concurrency_key = p_key AND j.type = v_type
        ORDER BY j.priority DESC LIMIT 1;
        WHILE FOUND AND cardinality(v_ids) < p_want LOOP
            SELECT coalesce(array_agg(locked.id), '{{}}') INTO v_more
            FROM (
                SELECT j.id FROM {schema}.job AS j
                WHERE j.status = 'queued' AND j.queue = p_queue AND j.concurrency_key = p_key AND j.type = v_type
                  AND j.priority = v_priority AND j.available_at <= now() AND NOT (j.id = ANY(p_exclude || v_ids))
                ORDER BY j.available_at, j.id
                LIMIT p_want - cardinality(v_ids)
                FOR UPDATE SKIP LOCKED
            ) AS locked;
            v_ids := v_ids || v_more;
            SELECT j.priority INTO v_priority FROM {schema}.job AS j
            WHERE j.status = 'queued' AND j.queue = p_queue AND j.concurrency_key = p_key AND j.type = v_type
              AND j.priority < v_priority
            ORDER BY j.priority DESC LIMIT 1;
        END LOOP;
    END LOOP;
    RETURN v_ids;
END
$$;

-- Keyed claims: keys are served in rotation (the next claim starts after the last key served), each up
-- to what its own limits allow, so a key with 100,000 queued jobs never delays a key with one, and a key
-- at its limit never blocks the keys behind it. Jobs without a key are not bound by per-key limits; they
-- are served once per round, after the last key.
CREATE FUNCTION {schema}.take_per_key(
    p_setting {schema}.queue_setting, p_types text[], p_want integer, p_exclude uuid[], p_now timestamptz
) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    v_running jsonb := '{{}}';
    v_started jsonb := '{{}}';
    v_key text := p_setting.cursor_key;
    v_next text;
    v_first text;
    v_last text;
    v_wrapped boolean := false;
    v_allowed integer;
    v_more uuid[];
    v_ids uuid[] := '{{}}';
BEGIN
    IF p_setting.concurrency_per_key IS NOT NULL THEN
        SELECT coalesce(jsonb_object_agg(r.k, r.n), '{{}}') INTO v_running
        FROM (SELECT j.concurrency_key AS k, count(*) AS n FROM {schema}.job AS j
              WHERE j.status = 'running' AND j.queue = p_setting.queue AND j.concurrency_key IS NOT NULL
                AND j.lease_expires_at > p_now
              GROUP BY j.concurrency_key) AS r;
    END IF;
    IF p_setting.key_rate_count IS NOT NULL THEN
        SELECT coalesce(jsonb_object_agg(r.k, r.n), '{{}}') INTO v_started
        FROM (SELECT s.concurrency_key AS k, count(*) AS n FROM {schema}.queue_start AS s
              WHERE s.queue = p_setting.queue AND s.concurrency_key IS NOT NULL
                AND s.started_at > p_now - make_interval(secs => p_setting.key_rate_period_seconds)
              GROUP BY s.concurrency_key) AS r;
    END IF;
    LOOP
        EXIT WHEN cardinality(v_ids) >= p_want;
        IF v_key IS NULL THEN
            SELECT j.concurrency_key INTO v_next FROM {schema}.job AS j
            WHERE j.status = 'queued' AND j.queue = p_setting.queue AND j.concurrency_key IS NOT NULL
            ORDER BY j.concurrency_key LIMIT 1;
        ELSE
            SELECT j.concurrency_key INTO v_next FROM {schema}.job AS j
            WHERE j.status = 'queued' AND j.queue = p_setting.queue AND j.concurrency_key > v_key
            ORDER BY j.concurrency_key LIMIT 1;
        END IF;
        IF NOT FOUND THEN
            EXIT WHEN v_wrapped;
            -- End of the keys: jobs without a key get their turn, then the round starts over.
            v_ids := v_ids || ARRAY(
                SELECT j.id FROM {schema}.job AS j
                WHERE j.status = 'queued' AND j.queue = p_setting.queue AND j.concurrency_key IS NULL
                  AND j.type = ANY(p_types) AND j.available_at <= p_now AND NOT (j.id = ANY(p_exclude || v_ids))
                ORDER BY j.priority DESC, j.available_at, j.id
                LIMIT p_want - cardinality(v_ids)
                FOR UPDATE SKIP LOCKED
            );
            v_wrapped := true;
            v_key := NULL;
            CONTINUE;
        END IF;
        EXIT WHEN v_wrapped AND v_first IS NOT NULL AND v_next >= v_first;  -- a whole round done
        v_first := coalesce(v_first, v_next);
        v_allowed := p_want - cardinality(v_ids);
        IF p_setting.concurrency_per_key IS NOT NULL THEN
            v_allowed := least(v_allowed, p_setting.concurrency_per_key - coalesce((v_running ->> v_next)::integer, 0));
        END IF;
        IF p_setting.key_rate_count IS NOT NULL THEN
            v_allowed := least(v_allowed, p_setting.key_rate_count - coalesce((v_started ->> v_next)::integer, 0));
        END IF;
        IF v_allowed > 0 THEN
            v_more := {schema}.take_from_key(p_setting.queue, v_next, p_types, v_allowed, p_exclude || v_ids);
            IF cardinality(v_more) > 0 THEN
                v_ids := v_ids || v_more;
                v_last := v_next;
            END IF;
        END IF;
        v_key := v_next;
    END LOOP;
    IF v_last IS NOT NULL THEN
        UPDATE {schema}.queue_setting SET cursor_key = v_last WHERE queue = p_setting.queue;
    END IF;
    RETURN v_ids;
END
$$;

-- A limited queue's share of a claim: serialised on the queue's settings row for the rest of the claim's
-- transaction, then bounded by the valid leases it holds (an expired lease frees its slot; a job
-- scheduled for later never holds one) and by the starts in its sliding rate window, taken per key when
-- per-key limits are set, and recorded in the rate window.
CREATE FUNCTION {schema}.take_limited(p_queue text, p_types text[], p_want integer, p_exclude uuid[])
RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    v_setting {schema}.queue_setting;
    v_now timestamptz;
    v_want integer := p_want;
    v_count integer;
    v_ids uuid[];
BEGIN
    SELECT * INTO v_setting FROM {schema}.queue_setting AS s WHERE s.queue = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN {schema}.take_from_queue(p_queue, p_types, p_want, p_exclude);
    END IF;
    -- After the lock: claims of this queue are serialised, so their clock readings are in order.
    v_now := clock_timestamp();
    IF v_setting.concurrency IS NOT NULL THEN
        SELECT count(*) INTO v_count FROM {schema}.job AS j
        WHERE j.status = 'running' AND j.queue = p_queue AND j.lease_expires_at > v_now;
        v_want := least(v_want, v_setting.concurrency - v_count);
    END IF;
    IF v_setting.rate_count IS NOT NULL THEN
        SELECT count(*) INTO v_count FROM {schema}.queue_start AS s
        WHERE s.queue = p_queue AND s.started_at > v_now - make_interval(secs => v_setting.rate_period_seconds);
        v_want := least(v_want, v_setting.rate_count - v_count);
    END IF;
    IF v_want <= 0 THEN
        RETURN '{{}}';
    END IF;
    IF v_setting.concurrency_per_key IS NULL AND v_setting.key_rate_count IS NULL THEN
        v_ids := {schema}.take_from_queue(p_queue, p_types, v_want, p_exclude);
    ELSE
        v_ids := {schema}.take_per_key(v_setting, p_types, v_want, p_exclude, v_now);
    END IF;
    -- The starts of this claim are recorded by claim_jobs with their started_at; older ones go here.
    DELETE FROM {schema}.queue_start AS s
    WHERE s.queue = p_queue
      AND s.started_at < v_now - make_interval(secs => greatest(
          coalesce(v_setting.rate_period_seconds, 0), coalesce(v_setting.key_rate_period_seconds, 0)));
    RETURN v_ids;
END
$$;
