-- Limits exact whatever a worker serves, and per-key claims that cost what they take.
--
-- 1. One claim counts the jobs it takes itself: claim_jobs asks a limited queue again in its second pass
--    (what other queues left unused), and take_limited then counts the jobs the first pass picked as
--    running and started, in total and per key.
-- 2. The keys of a queue with per-key limits are kept in queue_key, one row per key with queued jobs,
--    with the time a claim next needs to look at it (wake_at): its slots are taken until the earliest
--    lease of its running jobs ends, its rate budget is spent until the oldest start leaves the window,
--    its queued jobs are not available before next_at. A claim walks only the keys due, the one served
--    longest ago first, so a key at its limit is never read and never keeps another key waiting.
--    Claims of the queue are serialised on its settings row (take_limited), so they alone write its rows.
-- 3. Producers and outcomes never touch queue_key: they append to queue_key_note (a key got a queued
--    job, or a job of the key stopped running), which waits for no row lock, and the next claim of the
--    queue reads the notes. Only jobs with a concurrency key in a queue with per-key limits write notes.

CREATE TABLE {schema}.queue_key (
    queue            text NOT NULL,
    concurrency_key  text NOT NULL,
    -- Its per-key limits allow no start before this (NULL: they allow one as far as is known). An
    -- ending job of the key clears it (through a note).
    blocked_until    timestamptz,
    -- None of its queued jobs is available before this: a lower bound, lowered by notes.
    next_at          timestamptz NOT NULL,
    -- When a claim last took a job of the key: the rotation.
    served_at        timestamptz NOT NULL DEFAULT '-infinity',
    wake_at          timestamptz GENERATED ALWAYS AS (greatest(blocked_until, next_at, served_at)) STORED,
    PRIMARY KEY (queue, concurrency_key)
);
CREATE INDEX queue_key_wake_idx ON {schema}.queue_key (queue, wake_at, concurrency_key);

-- What happened to keys since the last claim: available_at of a job that became queued, or NULL for a
-- job of the key that stopped running (a slot is free).
CREATE TABLE {schema}.queue_key_note (
    queue            text NOT NULL,
    concurrency_key  text NOT NULL,
    available_at     timestamptz
);
CREATE INDEX queue_key_note_idx ON {schema}.queue_key_note (queue);

-- Jobs without a key in a queue with per-key limits get their turn in the rotation at this time.
ALTER TABLE {schema}.queue_setting ADD COLUMN unkeyed_at timestamptz NOT NULL DEFAULT '-infinity';
-- The rotation is queue_key's now.
ALTER TABLE {schema}.queue_setting DROP COLUMN cursor_key;

-- The transaction-level lock that orders the notes of a queue's keyed jobs against the change of its
-- settings that starts keeping its keys: producers take it shared, that change exclusive.
CREATE FUNCTION {schema}.queue_key_lock(p_queue text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtextextended('jobbus-queue-key:' || p_queue, 0) $$;

-- The notes of a job with a concurrency key (row trigger, only such jobs reach it): it became queued
-- (inserted, retried, recovered, parked, woken earlier) or stopped running. Only queues with per-key
-- limits keep their keys. SECURITY DEFINER: producers need no rights on the notes.
CREATE FUNCTION {schema}.job_key_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.status = 'queued' THEN
        PERFORM pg_advisory_xact_lock_shared({schema}.queue_key_lock(NEW.queue));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM {schema}.queue_setting AS s
                   WHERE s.queue = NEW.queue AND (s.concurrency_per_key IS NOT NULL OR s.key_rate_count IS NOT NULL)) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.status = 'running' THEN
        INSERT INTO {schema}.queue_key_note (queue, concurrency_key, available_at)
        VALUES (OLD.queue, OLD.concurrency_key, NULL);
    END IF;
    IF NEW.status = 'queued' THEN
        INSERT INTO {schema}.queue_key_note (queue, concurrency_key, available_at)
        VALUES (NEW.queue, NEW.concurrency_key, NEW.available_at);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_key_inserted
    AFTER INSERT ON {schema}.job
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL AND NEW.status = 'queued')
    EXECUTE FUNCTION {schema}.job_key_changed();

CREATE TRIGGER job_key_updated
    AFTER UPDATE OF status, available_at ON {schema}.job
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL AND (
        (OLD.status = 'running' AND NEW.status <> 'running')
        OR (NEW.status = 'queued' AND (OLD.status <> 'queued' OR NEW.available_at < OLD.available_at))))
    EXECUTE FUNCTION {schema}.job_key_changed();

-- The keys of a queue's queued jobs join queue_key (one index probe per key, over job_key_claim_idx),
-- after the transactions that are adding keyed jobs to it without a note have ended.
CREATE FUNCTION {schema}.keep_queue_keys(p_queue text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({schema}.queue_key_lock(p_queue));
    INSERT INTO {schema}.queue_key (queue, concurrency_key, next_at)
    WITH RECURSIVE keys AS (
        (SELECT j.concurrency_key FROM {schema}.job AS j
         WHERE j.status = 'queued' AND j.queue = p_queue AND j.concurrency_key IS NOT NULL
         ORDER BY j.concurrency_key LIMIT 1)
        UNION ALL
        SELECT (SELECT j.concurrency_key FROM {schema}.job AS j
                WHERE j.status = 'queued' AND j.queue = p_queue AND j.concurrency_key > keys.concurrency_key
                ORDER BY j.concurrency_key LIMIT 1)
        FROM keys WHERE keys.concurrency_key IS NOT NULL
    )
    SELECT p_queue, keys.concurrency_key, '-infinity' FROM keys WHERE keys.concurrency_key IS NOT NULL
    ON CONFLICT DO NOTHING;
END
$$;

-- A queue starts keeping its keys when it gains per-key limits and forgets them when it loses them.
-- SECURITY DEFINER: whoever may change the settings (an operator, the dashboard) needs no rights on keys.
CREATE FUNCTION {schema}.queue_setting_keys() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        DELETE FROM {schema}.queue_key WHERE queue = OLD.queue;
        DELETE FROM {schema}.queue_key_note WHERE queue = OLD.queue;
    END IF;
    IF TG_OP <> 'DELETE' AND (NEW.concurrency_per_key IS NOT NULL OR NEW.key_rate_count IS NOT NULL) THEN
        PERFORM {schema}.keep_queue_keys(NEW.queue);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER queue_setting_keys_inserted
    AFTER INSERT ON {schema}.queue_setting
    FOR EACH ROW WHEN (NEW.concurrency_per_key IS NOT NULL OR NEW.key_rate_count IS NOT NULL)
    EXECUTE FUNCTION {schema}.queue_setting_keys();

CREATE TRIGGER queue_setting_keys_updated
    AFTER UPDATE ON {schema}.queue_setting
    FOR EACH ROW WHEN ((OLD.concurrency_per_key IS NULL AND OLD.key_rate_count IS NULL)
                       <> (NEW.concurrency_per_key IS NULL AND NEW.key_rate_count IS NULL))
    EXECUTE FUNCTION {schema}.queue_setting_keys();

CREATE TRIGGER queue_setting_keys_deleted
    AFTER DELETE ON {schema}.queue_setting
    FOR EACH ROW EXECUTE FUNCTION {schema}.queue_setting_keys();

-- The queues that have per-key limits today start keeping their keys.
SELECT {schema}.keep_queue_keys(queue) FROM {schema}.queue_setting
WHERE concurrency_per_key IS NOT NULL OR key_rate_count IS NOT NULL;

-- When the earliest queued job of a key is available (NULL: it has none): one index probe per (type,
-- priority) group of the key, over job_key_claim_idx, whatever the jobs in each.
CREATE FUNCTION {schema}.key_next_at(p_queue text, p_key text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    v_type text;
    v_priority integer;
    v_at timestamptz;
    v_next timestamptz;
BEGIN
    SELECT j.type INTO v_type FROM {schema}.job AS j
    WHERE j.status = 'queued' AND j.queue = p_queue AND j.concurrency_key = p_key
    ORDER BY j.type LIMIT 1;
    WHILE FOUND LOOP
        SELECT j.priority, j.available_at INTO v_priority, v_at FROM {schema}.job AS j
        WHERE j.status = 'queued' AND j.queue = p_queue AND j.concurrency_key = p_key AND j.type = v_type
        ORDER BY j.priority DESC, j.available_at LIMIT 1;
        WHILE FOUND LOOP
            v_next := least(v_next, v_at);
            SELECT j.priority, j.available_at INTO v_priority, v_at FROM {schema}.job AS j
            WHERE j.status = 'queued' AND j.queue = p_queue AND j.concurrency_key = p_key AND j.type = v_type
              AND j.priority < v_priority
            ORDER BY j.priority DESC, j.available_at LIMIT 1;
        END LOOP;
        SELECT j.type INTO v_type FROM {schema}.job AS j
        WHERE j.status = 'queued' AND j.queue = p_queue AND j.concurrency_key = p_key AND j.type > v_type
        ORDER BY j.type LIMIT 1;
    END LOOP;
    RETURN v_next;
END
$$;

-- The notes written since the last claim of the queue, each read once (a claim's cost for them is the
-- jobs enqueued and ended since the previous claim, whatever the keys of the queue): keys with a queued job join queue_key or have their next_at lowered; keys with a job that
-- stopped running may have a free slot.
CREATE FUNCTION {schema}.read_key_notes(p_queue text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    v_keys text[];
    v_next timestamptz[];
    v_freed boolean[];
BEGIN
    WITH notes AS (
        DELETE FROM {schema}.queue_key_note AS n WHERE n.queue = p_queue
        RETURNING n.concurrency_key, n.available_at
    )
    SELECT array_agg(k), array_agg(next_at), array_agg(freed) INTO v_keys, v_next, v_freed
    FROM (SELECT n.concurrency_key AS k, min(n.available_at) AS next_at, bool_or(n.available_at IS NULL) AS freed
          FROM notes AS n GROUP BY n.concurrency_key) AS byk;
    IF v_keys IS NULL THEN
        RETURN;
    END IF;
    UPDATE {schema}.queue_key AS k SET blocked_until = NULL
    FROM unnest(v_keys, v_freed) AS f(k, freed)
    WHERE k.queue = p_queue AND k.concurrency_key = f.k AND f.freed AND k.blocked_until IS NOT NULL;
    INSERT INTO {schema}.queue_key AS k (queue, concurrency_key, next_at)
    SELECT p_queue, q.k, q.next_at FROM unnest(v_keys, v_next) AS q(k, next_at) WHERE q.next_at IS NOT NULL
    ON CONFLICT (queue, concurrency_key) DO UPDATE SET next_at = least(k.next_at, excluded.next_at)
    WHERE k.next_at > excluded.next_at;
END
$$;

-- Up to p_want available jobs without a key of a queue with per-key limits, locked in claim order. No
-- index holds only them: this walks the queue's queued jobs in claim order, keyed ones included.
CREATE FUNCTION {schema}.take_unkeyed(p_queue text, p_types text[], p_want integer, p_exclude uuid[], p_now timestamptz)
RETURNS uuid[]
LANGUAGE sql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
    SELECT coalesce(array_agg(u.id), '{{}}') FROM (
        SELECT j.id FROM {schema}.job AS j
        WHERE j.status = 'queued' AND j.queue = p_queue AND j.concurrency_key IS NULL
          AND j.type = ANY(p_types) AND j.available_at <= p_now AND NOT (j.id = ANY(p_exclude))
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT p_want
        FOR UPDATE SKIP LOCKED
    ) AS u
$$;

-- Keyed claims: the keys due (queue_key.wake_at), the one served longest ago first, each up to what its
-- own limits allow, counting the jobs of the key that are running and those this claim already took
-- (p_exclude). A key left without a slot or without rate budget is not looked at again before one can
-- free; a key without an available job not before its next one is due (or it leaves queue_key). Jobs
-- without a key are not bound by per-key limits: they get a turn in the rotation too.
CREATE FUNCTION {schema}.take_per_key(
    p_setting {schema}.queue_setting, p_types text[], p_want integer, p_exclude uuid[], p_now timestamptz,
    p_lease_seconds double precision
) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    v_queue text := p_setting.queue;
    v_per_key integer := p_setting.concurrency_per_key;
    v_rate integer := p_setting.key_rate_count;
    v_window interval := make_interval(secs => coalesce(p_setting.key_rate_period_seconds, 0));
    v_mine jsonb;
    v_keys text[];
    v_wakes timestamptz[];
    v_visited text[] := '{{}}';
    v_n integer;
    v_key text;
    v_held integer;
    v_lease timestamptz;
    v_started integer;
    v_oldest timestamptz;
    v_allowed integer;
    v_more uuid[];
    v_blocked timestamptz;
    v_next timestamptz;
    v_unkeyed_turn boolean := p_setting.unkeyed_at <= p_now;
    v_ids uuid[] := '{{}}';
BEGIN
    PERFORM {schema}.read_key_notes(v_queue);
    -- The jobs of each key this claim already took (an earlier pass): they hold slots and are starts.
    SELECT coalesce(jsonb_object_agg(m.k, m.n), '{{}}') INTO v_mine
    FROM (SELECT j.concurrency_key AS k, count(*) AS n FROM {schema}.job AS j
          WHERE j.id = ANY(p_exclude) AND j.queue = v_queue AND j.concurrency_key IS NOT NULL
          GROUP BY j.concurrency_key) AS m;
    LOOP
        EXIT WHEN cardinality(v_ids) >= p_want;
        SELECT array_agg(k.concurrency_key ORDER BY k.wake_at, k.concurrency_key),
               array_agg(k.wake_at ORDER BY k.wake_at, k.concurrency_key)
        INTO v_keys, v_wakes
        FROM (SELECT k.concurrency_key, k.wake_at FROM {schema}.queue_key AS k
              WHERE k.queue = v_queue AND k.wake_at <= p_now AND NOT (k.concurrency_key = ANY(v_visited))
              ORDER BY k.wake_at, k.concurrency_key
              LIMIT p_want - cardinality(v_ids)) AS k;
        EXIT WHEN v_keys IS NULL;
        FOR v_n IN 1 .. cardinality(v_keys) LOOP
            EXIT WHEN cardinality(v_ids) >= p_want;
            IF v_unkeyed_turn AND p_setting.unkeyed_at <= v_wakes[v_n] THEN
                v_ids := v_ids || {schema}.take_unkeyed(v_queue, p_types, p_want - cardinality(v_ids),
                                                        p_exclude || v_ids, p_now);
                v_unkeyed_turn := false;
                CONTINUE WHEN cardinality(v_ids) >= p_want;
            END IF;
            v_key := v_keys[v_n];
            v_visited := v_visited || v_key;
            v_allowed := p_want - cardinality(v_ids);
            IF v_per_key IS NOT NULL THEN
                SELECT count(*), min(j.lease_expires_at) INTO v_held, v_lease FROM {schema}.job AS j
                WHERE j.status = 'running' AND j.queue = v_queue AND j.concurrency_key = v_key
                  AND j.lease_expires_at > p_now;
                v_held := v_held + coalesce((v_mine ->> v_key)::integer, 0);
                v_allowed := least(v_allowed, v_per_key - v_held);
            END IF;
            IF v_rate IS NOT NULL THEN
                SELECT count(*), min(s.started_at) INTO v_started, v_oldest FROM {schema}.queue_start AS s
                WHERE s.queue = v_queue AND s.concurrency_key = v_key AND s.started_at > p_now - v_window;
                v_started := v_started + coalesce((v_mine ->> v_key)::integer, 0);
                v_allowed := least(v_allowed, v_rate - v_started);
            END IF;
            v_more := '{{}}';
            IF v_allowed > 0 THEN
                v_more := {schema}.take_from_key(v_queue, v_key, p_types, v_allowed, p_exclude || v_ids);
                v_ids := v_ids || v_more;
            END IF;
            -- When its limits may allow a start again: the earliest lease of its running jobs ends (or
            -- one of them ends first: a note), the oldest start leaves the window.
            v_blocked := NULL;
            IF v_per_key IS NOT NULL AND v_held + cardinality(v_more) >= v_per_key THEN
                v_blocked := coalesce(v_lease, p_now + make_interval(secs => p_lease_seconds));
            END IF;
            IF v_rate IS NOT NULL AND v_started + cardinality(v_more) >= v_rate THEN
                v_blocked := greatest(v_blocked, coalesce(v_oldest, p_now) + v_window);
            END IF;
            IF v_allowed > 0 AND cardinality(v_more) = 0 THEN
                -- Nothing available to this claim: when its next job is due (other types, or locked:
                -- now; it goes to the back of the rotation), or it has none left.
                v_next := {schema}.key_next_at(v_queue, v_key);
                IF v_next IS NULL THEN
                    DELETE FROM {schema}.queue_key AS k WHERE k.queue = v_queue AND k.concurrency_key = v_key;
                ELSE
                    UPDATE {schema}.queue_key AS k
                    SET next_at = v_next, blocked_until = v_blocked, served_at = p_now
                    WHERE k.queue = v_queue AND k.concurrency_key = v_key;
                END IF;
            ELSE
                UPDATE {schema}.queue_key AS k
                SET blocked_until = v_blocked,
                    served_at = CASE WHEN cardinality(v_more) > 0 THEN p_now ELSE k.served_at END
                WHERE k.queue = v_queue AND k.concurrency_key = v_key;
            END IF;
        END LOOP;
    END LOOP;
    IF v_unkeyed_turn AND cardinality(v_ids) < p_want THEN
        v_ids := v_ids || {schema}.take_unkeyed(v_queue, p_types, p_want - cardinality(v_ids), p_exclude || v_ids, p_now);
        v_unkeyed_turn := false;
    END IF;
    IF NOT v_unkeyed_turn AND p_setting.unkeyed_at <= p_now THEN
        -- Found none: looked for again in a second (finding them walks the queue's keyed jobs).
        UPDATE {schema}.queue_setting AS s
        SET unkeyed_at = CASE WHEN EXISTS (SELECT 1 FROM {schema}.job AS j
                                           WHERE j.id = ANY(v_ids) AND j.concurrency_key IS NULL)
                              THEN p_now ELSE p_now + interval '1 second' END
        WHERE s.queue = v_queue;
    END IF;
    RETURN v_ids;
END
$$;

-- A limited queue's share of a claim: serialised on the queue's settings row for the rest of the claim's
-- transaction, then bounded by the valid leases it holds (an expired lease frees its slot; a job
-- scheduled for later never holds one) and by the starts in its sliding rate window, both counting the
-- jobs of the queue this claim already took (p_exclude, an earlier pass), taken per key when per-key
-- limits are set.
DROP FUNCTION {schema}.take_limited(text, text[], integer, uuid[]);
DROP FUNCTION {schema}.take_per_key({schema}.queue_setting, text[], integer, uuid[], timestamptz);
CREATE FUNCTION {schema}.take_limited(
    p_queue text, p_types text[], p_want integer, p_exclude uuid[], p_lease_seconds double precision
) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    v_setting {schema}.queue_setting;
    v_now timestamptz;
    v_want integer := p_want;
    v_mine integer;
    v_count integer;
    v_ids uuid[];
BEGIN
    SELECT * INTO v_setting FROM {schema}.queue_setting AS s WHERE s.queue = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN {schema}.take_from_queue(p_queue, p_types, p_want, p_exclude);
    END IF;
    -- After the lock: claims of this queue are serialised, so their clock readings are in order.
    v_now := clock_timestamp();
    SELECT count(*) INTO v_mine FROM {schema}.job AS j WHERE j.id = ANY(p_exclude) AND j.queue = p_queue;
    IF v_setting.concurrency IS NOT NULL THEN
        SELECT count(*) INTO v_count FROM {schema}.job AS j
        WHERE j.status = 'running' AND j.queue = p_queue AND j.lease_expires_at > v_now;
        v_want := least(v_want, v_setting.concurrency - v_count - v_mine);
    END IF;
    IF v_setting.rate_count IS NOT NULL THEN
        SELECT count(*) INTO v_count FROM {schema}.queue_start AS s
        WHERE s.queue = p_queue AND s.started_at > v_now - make_interval(secs => v_setting.rate_period_seconds);
        v_want := least(v_want, v_setting.rate_count - v_count - v_mine);
    END IF;
    IF v_want <= 0 THEN
        RETURN '{{}}';
    END IF;
    IF v_setting.concurrency_per_key IS NULL AND v_setting.key_rate_count IS NULL THEN
        v_ids := {schema}.take_from_queue(p_queue, p_types, v_want, p_exclude);
    ELSE
        v_ids := {schema}.take_per_key(v_setting, p_types, v_want, p_exclude, v_now, p_lease_seconds);
    END IF;
    -- The starts of this claim are recorded by claim_jobs with their started_at; those that left the
    -- longest window go here.
    IF v_setting.rate_count IS NOT NULL OR v_setting.key_rate_count IS NOT NULL THEN
        DELETE FROM {schema}.queue_start AS s
        WHERE s.queue = p_queue
          AND s.started_at < v_now - make_interval(secs => greatest(
              coalesce(v_setting.rate_period_seconds, 0), coalesce(v_setting.key_rate_period_seconds, 0)));
    END IF;
    RETURN v_ids;
END
$$;

-- The claim of migration 0005, restated whole: a limited queue asked again in the second pass counts
-- what the first pass took of it (take_limited above), and starts are recorded only for queues with a
-- rate limit (nothing else reads them).
CREATE OR REPLACE FUNCTION {schema}.claim_jobs(
    p_worker_id text,
    p_limit integer,
    p_pair_queues text[],
    p_pair_types text[],
    p_lease_seconds double precision,
    p_max_payload_bytes integer,
    p_limited_queues text[]
) RETURNS TABLE (
    id uuid, type text, queue text, name text, group_id uuid, priority integer, configuration_data jsonb,
    execution_data jsonb, attempts integer, max_attempts integer, lease_token uuid,
    cancellation_requested boolean, created_at timestamptz, available_at timestamptz, timeout_seconds double precision,
    oversized_bytes integer
)
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_queues text[];
    v_queue text;
    v_types text[];
    v_share integer;
    v_ids uuid[] := '{{}}';
    v_pass integer;
    v_want integer;
BEGIN
    SELECT array_agg(q.queue ORDER BY q.first) INTO v_queues
    FROM (SELECT p.queue, min(p.n) AS first FROM unnest(p_pair_queues) WITH ORDINALITY AS p(queue, n) GROUP BY p.queue) AS q;
    IF v_queues IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;
    v_share := ceil(p_limit::numeric / cardinality(v_queues));
    FOR v_pass IN 1 .. 2 LOOP
        FOREACH v_queue IN ARRAY v_queues LOOP
            EXIT WHEN cardinality(v_ids) >= p_limit;
            SELECT array_agg(p.type) INTO v_types
            FROM unnest(p_pair_queues, p_pair_types) AS p(queue, type) WHERE p.queue = v_queue;
            v_want := CASE WHEN v_pass = 1 THEN least(v_share, p_limit - cardinality(v_ids))
                           ELSE p_limit - cardinality(v_ids) END;
            IF v_queue = ANY(p_limited_queues) THEN
                v_ids := v_ids || {schema}.take_limited(v_queue, v_types, v_want, v_ids, p_lease_seconds);
            ELSE
                v_ids := v_ids || {schema}.take_from_queue(v_queue, v_types, v_want, v_ids);
            END IF;
        END LOOP;
        EXIT WHEN cardinality(v_ids) >= p_limit OR cardinality(v_queues) = 1;
    END LOOP;
    -- started_at is the clock at the update, not the transaction's start: a claim that waited for a
    -- limited queue's lock must not date its starts before the rate window it was counted in.
    RETURN QUERY
    WITH claimed AS (
        UPDATE {schema}.job AS j
        SET status = 'running',
            attempts = j.attempts + 1,
            lease_token = {schema}.uuid_generate_v7(),
            lease_expires_at = now() + make_interval(secs => p_lease_seconds),
            worker_id = p_worker_id,
            started_at = clock_timestamp()
        WHERE j.id = ANY(v_ids)
        RETURNING j.*
    ), started AS (
        INSERT INTO {schema}.queue_start (queue, concurrency_key, started_at)
        SELECT c.queue, c.concurrency_key, c.started_at FROM claimed AS c
        WHERE c.queue = ANY(p_limited_queues)
          AND EXISTS (SELECT 1 FROM {schema}.queue_setting AS s
                      WHERE s.queue = c.queue AND (s.rate_count IS NOT NULL OR s.key_rate_count IS NOT NULL))
    )
    SELECT c.id, c.type, c.queue, c.name, c.group_id, c.priority,
           CASE WHEN pg_column_size(c.configuration_data) <= p_max_payload_bytes THEN c.configuration_data END,
           c.execution_data, c.attempts, c.max_attempts, c.lease_token,
           c.cancellation_requested_at IS NOT NULL, c.created_at, c.available_at, c.timeout_seconds,
           CASE WHEN pg_column_size(c.configuration_data) > p_max_payload_bytes
                THEN pg_column_size(c.configuration_data) END
    FROM claimed AS c;
END
$$;
