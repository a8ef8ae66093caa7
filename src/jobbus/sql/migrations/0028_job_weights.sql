-- Weights (SPEC 21): a job of weight N counts N against its queue's concurrency, concurrency_per_key,
-- rate_limit and rate_limit_per_key, and `App.consume` spends rate units outside any job.
--
-- job.weight has a constant default: no rewrite. Its CHECK is added NOT VALID (enforced on every row
-- written from then on) and validated at the end, after this migration's transaction has committed
-- (`jobbus: after commit`): the validation reads the table once under SHARE UPDATE EXCLUSIVE, which
-- blocks neither reads nor writes of jobs, instead of under the ACCESS EXCLUSIVE the new column took.
ALTER TABLE {schema}.job ADD COLUMN IF NOT EXISTS weight integer NOT NULL DEFAULT 1;
ALTER TABLE {schema}.job ADD CONSTRAINT job_weight_check CHECK (weight BETWEEN 1 AND 1000000) NOT VALID;

-- What a start (or a spend) counts in its rate windows: the job's weight, or the units spent.
ALTER TABLE {schema}.queue_start ADD COLUMN IF NOT EXISTS units integer NOT NULL DEFAULT 1;
ALTER TABLE {schema}.queue_start ADD CONSTRAINT queue_start_units_check CHECK (units >= 1) NOT VALID;
ALTER TABLE {schema}.queue_start VALIDATE CONSTRAINT queue_start_units_check;

-- The ids of `App.consume` calls already recorded, so a call repeated after a lost connection spends
-- nothing twice; kept a day (spend_units deletes older ones as it goes).
CREATE TABLE IF NOT EXISTS {schema}.queue_spend (
    id       uuid PRIMARY KEY,
    spent_at timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS queue_spend_spent_at_idx ON {schema}.queue_spend (spent_at);

-- The claim-order prefix of `p_ids` whose weights add up to at most `p_budget` (NULL: all of them),
-- its total weight, and the weight of the first job left out (NULL: none was). A claim takes jobs in
-- claim order and stops at the first that does not fit: a heavy job waits for room, it is never
-- passed over for ever by lighter ones behind it.
CREATE OR REPLACE FUNCTION {schema}.fit_weights(p_ids uuid[], p_budget integer,
                                               OUT ids uuid[], OUT units integer, OUT next_weight integer)
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    -- PL/pgSQL, not SQL: its plan is kept for the session (a SQL function's was made at every call,
    -- which cost a claim of 10 jobs 0.3 ms). Called from the take functions, under their planner settings.
    SELECT coalesce(array_agg(f.id ORDER BY f.total) FILTER (WHERE f.total <= p_budget OR p_budget IS NULL), '{{}}'),
           coalesce(max(f.total) FILTER (WHERE f.total <= p_budget OR p_budget IS NULL), 0)::integer,
           (array_agg(f.weight ORDER BY f.total) FILTER (WHERE f.total > p_budget))[1]
    INTO ids, units, next_weight
    FROM (SELECT j.id, j.weight,
                 sum(j.weight) OVER (ORDER BY j.priority DESC, j.available_at, j.id) AS total
          FROM {schema}.job AS j WHERE j.id = ANY(p_ids)) AS f;
END
$function$;

-- take_limited counts weights: the jobs holding a valid lease by the sum of their weights, the rate
-- window by the units of its starts and spends, the jobs this claim took already by their weights.
-- `p_want` stays a number of jobs (the worker's free slots); the queue's own limits give a budget in
-- units, and the jobs taken are the claim-order prefix that fits it (fit_weights). A queue whose jobs
-- all weigh 1 takes what it took before, plus one look-up of the rows it just locked.
CREATE OR REPLACE FUNCTION {schema}.take_limited(p_queue text, p_types text[], p_want integer, p_exclude uuid[], p_lease_seconds double precision)
 RETURNS uuid[]
 LANGUAGE plpgsql
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    v_setting {schema}.queue_setting;
    v_now timestamptz;
    v_budget integer;
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
    SELECT coalesce(sum(j.weight), 0) INTO v_mine FROM {schema}.job AS j WHERE j.id = ANY(p_exclude) AND j.queue = p_queue;
    IF v_setting.concurrency IS NOT NULL THEN
        SELECT coalesce(sum(j.weight), 0) INTO v_count FROM {schema}.job AS j
        WHERE j.status = 'running' AND j.queue = p_queue AND j.lease_expires_at > v_now;
        v_budget := v_setting.concurrency - v_count - v_mine;
    END IF;
    IF v_setting.rate_count IS NOT NULL THEN
        SELECT coalesce(sum(s.units), 0) INTO v_count FROM {schema}.queue_start AS s
        WHERE s.queue = p_queue AND s.started_at > v_now - make_interval(secs => v_setting.rate_period_seconds);
        v_budget := least(v_budget, v_setting.rate_count - v_count - v_mine);
    END IF;
    IF least(p_want, v_budget) <= 0 THEN
        RETURN '{{}}';
    END IF;
    IF v_setting.concurrency_per_key IS NULL AND v_setting.key_rate_count IS NULL THEN
        v_ids := {schema}.take_from_queue(p_queue, p_types, least(p_want, v_budget), p_exclude);
        IF v_budget IS NOT NULL AND cardinality(v_ids) > 0 THEN
            SELECT f.ids INTO v_ids FROM {schema}.fit_weights(v_ids, v_budget) AS f;
        END IF;
    ELSE
        v_ids := {schema}.take_per_key(v_setting, p_types, p_want, v_budget, p_exclude, v_now, p_lease_seconds);
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
$function$;

-- take_per_key with weights: at most `p_want` jobs weighing at most `p_budget` (NULL: the queue has no
-- limit of its own), each key's jobs within its own room (per-key concurrency and rate, in units).
-- A key whose next job does not fit its room is blocked as a key at its limit is, until its earliest
-- lease ends (or one of its jobs ends: a note) or its oldest start leaves the window.
DROP FUNCTION IF EXISTS {schema}.take_per_key({schema}.queue_setting, text[], integer, uuid[], timestamptz, double precision);
CREATE OR REPLACE FUNCTION {schema}.take_per_key(p_setting {schema}.queue_setting, p_types text[], p_want integer, p_budget integer, p_exclude uuid[], p_now timestamp with time zone, p_lease_seconds double precision)
 RETURNS uuid[]
 LANGUAGE plpgsql
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
AS $function$
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
    v_room integer;
    v_allowed integer;
    v_more uuid[];
    v_more_units integer;
    v_next_weight integer;
    v_blocked timestamptz;
    v_next timestamptz;
    v_unkeyed_turn boolean := p_setting.unkeyed_at <= p_now;
    v_ids uuid[] := '{{}}';
    v_units integer := 0;
    v_full boolean := false;
BEGIN
    PERFORM {schema}.read_key_notes(v_queue);
    -- The weight of each key's jobs this claim already took (an earlier pass): they hold slots and are starts.
    SELECT coalesce(jsonb_object_agg(m.k, m.n), '{{}}') INTO v_mine
    FROM (SELECT j.concurrency_key AS k, sum(j.weight) AS n FROM {schema}.job AS j
          WHERE j.id = ANY(p_exclude) AND j.queue = v_queue AND j.concurrency_key IS NOT NULL
          GROUP BY j.concurrency_key) AS m;
    LOOP
        EXIT WHEN cardinality(v_ids) >= p_want OR v_units >= p_budget OR v_full;
        SELECT array_agg(k.concurrency_key ORDER BY k.wake_at, k.concurrency_key),
               array_agg(k.wake_at ORDER BY k.wake_at, k.concurrency_key)
        INTO v_keys, v_wakes
        FROM (SELECT k.concurrency_key, k.wake_at FROM {schema}.queue_key AS k
              WHERE k.queue = v_queue AND k.wake_at <= p_now AND NOT (k.concurrency_key = ANY(v_visited))
              ORDER BY k.wake_at, k.concurrency_key
              LIMIT least(p_want - cardinality(v_ids), p_budget - v_units)) AS k;
        EXIT WHEN v_keys IS NULL;
        FOR v_n IN 1 .. cardinality(v_keys) LOOP
            EXIT WHEN cardinality(v_ids) >= p_want OR v_units >= p_budget OR v_full;
            IF v_unkeyed_turn AND p_setting.unkeyed_at <= v_wakes[v_n] THEN
                v_more := {schema}.take_unkeyed(v_queue, p_types, least(p_want - cardinality(v_ids), p_budget - v_units),
                                                p_exclude || v_ids, p_now);
                IF p_budget IS NOT NULL AND cardinality(v_more) > 0 THEN
                    SELECT f.ids, f.units, f.next_weight INTO v_more, v_more_units, v_next_weight
                    FROM {schema}.fit_weights(v_more, p_budget - v_units) AS f;
                    v_units := v_units + v_more_units;
                    v_full := v_next_weight IS NOT NULL;  -- the same for a job without a key
                END IF;
                v_ids := v_ids || v_more;
                v_unkeyed_turn := false;
                CONTINUE WHEN cardinality(v_ids) >= p_want OR v_units >= p_budget OR v_full;
            END IF;
            v_key := v_keys[v_n];
            v_visited := v_visited || v_key;
            -- The key's room in units: what the queue's budget leaves, within its own limits.
            v_room := p_budget - v_units;
            IF v_per_key IS NOT NULL THEN
                SELECT coalesce(sum(j.weight), 0), min(j.lease_expires_at) INTO v_held, v_lease FROM {schema}.job AS j
                WHERE j.status = 'running' AND j.queue = v_queue AND j.concurrency_key = v_key
                  AND j.lease_expires_at > p_now;
                v_held := v_held + coalesce((v_mine ->> v_key)::integer, 0);
                v_room := least(v_room, v_per_key - v_held);
            END IF;
            IF v_rate IS NOT NULL THEN
                SELECT coalesce(sum(s.units), 0), min(s.started_at) INTO v_started, v_oldest FROM {schema}.queue_start AS s
                WHERE s.queue = v_queue AND s.concurrency_key = v_key AND s.started_at > p_now - v_window;
                v_started := v_started + coalesce((v_mine ->> v_key)::integer, 0);
                v_room := least(v_room, v_rate - v_started);
            END IF;
            v_allowed := least(p_want - cardinality(v_ids), v_room);
            v_more := '{{}}';
            v_more_units := 0;
            v_next_weight := NULL;
            IF v_allowed > 0 THEN
                v_more := {schema}.take_from_key(v_queue, v_key, p_types, v_allowed, p_exclude || v_ids);
                IF cardinality(v_more) > 0 THEN
                    SELECT f.ids, f.units, f.next_weight INTO v_more, v_more_units, v_next_weight
                    FROM {schema}.fit_weights(v_more, v_room) AS f;
                END IF;
                v_ids := v_ids || v_more;
                v_units := v_units + v_more_units;
            END IF;
            -- When its limits may allow its next job (1 unit, or the weight of the job that did not
            -- fit) again: the earliest lease of its running jobs ends (or one of them ends first: a
            -- note), the oldest start leaves the window.
            v_blocked := NULL;
            IF v_per_key IS NOT NULL AND v_held + v_more_units + coalesce(v_next_weight, 1) > v_per_key THEN
                v_blocked := coalesce(v_lease, p_now + make_interval(secs => p_lease_seconds));
            END IF;
            IF v_rate IS NOT NULL AND v_started + v_more_units + coalesce(v_next_weight, 1) > v_rate THEN
                v_blocked := greatest(v_blocked, coalesce(v_oldest, p_now) + v_window);
            END IF;
            IF v_allowed > 0 AND cardinality(v_more) = 0 AND v_next_weight IS NULL THEN
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
            -- Its next job fits its key but not what the queue's limits leave: the claim stops here, so
            -- the room it needs is not handed to the keys behind it (the key keeps its turn: first next
            -- time), and a heavy job is never passed over for ever.
            v_full := v_next_weight IS NOT NULL AND v_blocked IS NULL AND p_budget IS NOT NULL;
        END LOOP;
    END LOOP;
    IF v_unkeyed_turn AND NOT v_full AND cardinality(v_ids) < p_want AND (p_budget IS NULL OR v_units < p_budget) THEN
        v_more := {schema}.take_unkeyed(v_queue, p_types, least(p_want - cardinality(v_ids), p_budget - v_units),
                                        p_exclude || v_ids, p_now);
        IF p_budget IS NOT NULL AND cardinality(v_more) > 0 THEN
            SELECT f.ids INTO v_more FROM {schema}.fit_weights(v_more, p_budget - v_units) AS f;
        END IF;
        v_ids := v_ids || v_more;
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
$function$;

-- claim_jobs records each start with the weight of its job.
CREATE OR REPLACE FUNCTION {schema}.claim_jobs(p_worker_id text, p_limit integer, p_pair_queues text[], p_pair_types text[], p_lease_seconds double precision, p_max_payload_bytes integer, p_limited_queues text[], p_expiry_budget integer)
 RETURNS TABLE(id uuid, type text, queue text, name text, group_id uuid, priority integer, configuration_data jsonb, execution_data jsonb, attempts integer, max_attempts integer, lease_token uuid, cancellation_requested boolean, created_at timestamp with time zone, available_at timestamp with time zone, timeout_seconds double precision, oversized_bytes integer)
 LANGUAGE plpgsql
 SET enable_bitmapscan TO 'off'
 SET enable_seqscan TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
DECLARE
    v_queues text[];
    v_queue text;
    v_types text[];
    v_share integer;
    v_ids uuid[] := '{{}}';
    v_pass integer;
    v_want integer;
    v_limit integer := p_limit;
    v_claimed integer;
    v_clock timestamptz;
    v_expired integer := 0;
    v_swept integer;
BEGIN
    SELECT array_agg(q.queue ORDER BY q.first) INTO v_queues
    FROM (SELECT p.queue, min(p.n) AS first FROM unnest(p_pair_queues) WITH ORDINALITY AS p(queue, n) GROUP BY p.queue) AS q;
    IF v_queues IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;
    LOOP
        v_ids := '{{}}';
        v_share := ceil(v_limit::numeric / cardinality(v_queues));
        FOR v_pass IN 1 .. 2 LOOP
            FOREACH v_queue IN ARRAY v_queues LOOP
                EXIT WHEN cardinality(v_ids) >= v_limit;
                SELECT array_agg(p.type) INTO v_types
                FROM unnest(p_pair_queues, p_pair_types) AS p(queue, type) WHERE p.queue = v_queue;
                v_want := CASE WHEN v_pass = 1 THEN least(v_share, v_limit - cardinality(v_ids))
                               ELSE v_limit - cardinality(v_ids) END;
                IF v_queue = ANY(p_limited_queues) THEN
                    v_ids := v_ids || {schema}.take_limited(v_queue, v_types, v_want, v_ids, p_lease_seconds);
                ELSE
                    v_ids := v_ids || {schema}.take_from_queue(v_queue, v_types, v_want, v_ids);
                END IF;
            END LOOP;
            EXIT WHEN cardinality(v_ids) >= v_limit OR cardinality(v_queues) = 1;
        END LOOP;
        -- One clock for the expiry test and for started_at; read at the update, not at the transaction's
        -- start: a claim that waited for a limited queue's lock must not date its starts before the rate
        -- window it was counted in.
        v_clock := clock_timestamp();
        RETURN QUERY
        WITH claimed AS (
            UPDATE {schema}.job AS j
            SET status = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN 'cancelled' ELSE 'running' END,
                attempts = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN j.attempts
                                ELSE j.attempts + 1 END,
                lease_token = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN NULL
                                   ELSE {schema}.uuid_generate_v7() END,
                lease_expires_at = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN NULL
                                        ELSE now() + make_interval(secs => p_lease_seconds) END,
                worker_id = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN j.worker_id
                                 ELSE p_worker_id END,
                started_at = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN NULL ELSE v_clock END,
                finished_at = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL THEN v_clock
                                   ELSE j.finished_at END,
                last_error = CASE WHEN j.expires_at <= v_clock AND j.started_at IS NULL
                                  THEN {schema}.expired_error(j.expires_at) ELSE j.last_error END
            WHERE j.id = ANY(v_ids)
            RETURNING j.*
        ), started AS (
            INSERT INTO {schema}.queue_start (queue, concurrency_key, started_at, units)
            SELECT c.queue, c.concurrency_key, c.started_at, c.weight FROM claimed AS c
            WHERE c.status = 'running' AND c.queue = ANY(p_limited_queues)
              AND EXISTS (SELECT 1 FROM {schema}.queue_setting AS s
                          WHERE s.queue = c.queue AND (s.rate_count IS NOT NULL OR s.key_rate_count IS NOT NULL))
        )
        SELECT c.id, c.type, c.queue, c.name, c.group_id, c.priority,
               CASE WHEN s.bytes <= p_max_payload_bytes THEN c.configuration_data END,
               c.execution_data, c.attempts, c.max_attempts, c.lease_token,
               c.cancellation_requested_at IS NOT NULL, c.created_at, c.available_at, c.timeout_seconds,
               CASE WHEN s.bytes > p_max_payload_bytes THEN s.bytes END
        FROM claimed AS c
        CROSS JOIN LATERAL (
            SELECT CASE WHEN pg_column_compression(c.configuration_data) IS NULL
                        THEN pg_column_size(c.configuration_data)
                        ELSE octet_length(c.configuration_data::text) END AS bytes
        ) AS s
        WHERE c.status = 'running';
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
        -- Every row taken was leased: done. Some had expired: take again for the slots they left.
        EXIT WHEN v_claimed = cardinality(v_ids);
        v_limit := v_limit - v_claimed;
        -- A key whose taken job expired counted it as running or started: its limits are read again.
        UPDATE {schema}.queue_key AS k SET blocked_until = NULL
        FROM {schema}.job AS j
        WHERE j.id = ANY(v_ids) AND j.status = 'cancelled' AND j.concurrency_key IS NOT NULL
          AND k.queue = j.queue AND k.concurrency_key = j.concurrency_key AND k.blocked_until IS NOT NULL;
        -- The expired jobs ahead go at once, through the expiry index, rather than a slot at a time.
        v_expired := v_expired + cardinality(v_ids) - v_claimed;
        WITH swept AS (
            UPDATE {schema}.job AS j
            SET status = 'cancelled', finished_at = v_clock, last_error = {schema}.expired_error(j.expires_at)
            WHERE j.id IN (
                SELECT e.id FROM {schema}.job AS e
                WHERE e.status = 'queued' AND e.expires_at <= v_clock AND e.started_at IS NULL
                  AND e.queue = ANY(v_queues) AND e.type = ANY(p_pair_types)
                ORDER BY e.expires_at
                LIMIT greatest(p_expiry_budget - v_expired, 0)
                FOR UPDATE SKIP LOCKED)
            RETURNING 1
        )
        SELECT count(*) INTO v_swept FROM swept;
        v_expired := v_expired + v_swept;
        IF v_expired >= p_expiry_budget THEN
            -- Expired jobs may be left ahead: the caller is told to claim again.
            RETURN QUERY SELECT NULL::uuid, NULL::text, NULL::text, NULL::text, NULL::uuid, NULL::integer, NULL::jsonb,
                                NULL::jsonb, NULL::integer, NULL::integer, NULL::uuid, NULL::boolean, NULL::timestamptz,
                                NULL::timestamptz, NULL::double precision, NULL::integer;
            RETURN;
        END IF;
    END LOOP;
END
$function$;

-- The SQL API takes `weight` (1 to 1,000,000; a heavier job than a limit of its queue is refused).
CREATE OR REPLACE FUNCTION {schema}.schedule_job(p_job jsonb, p_where text, p_channel text)
 RETURNS uuid
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_unknown text;
    v_type text;
    v_queue text;
    v_configuration jsonb := p_job -> 'configuration';
    v_group uuid;
    v_unique text;
    v_delay double precision;
    v_available timestamptz;
    v_id uuid;
    v_round integer;
    v_weight integer;
BEGIN
    SELECT k INTO v_unknown FROM jsonb_object_keys(p_job) AS k
    WHERE k NOT IN ('type', 'configuration', 'queue', 'priority', 'name', 'unique_key', 'group_id', 'max_attempts',
                    'available_at', 'delay_seconds', 'timeout_seconds', 'concurrency_key', 'expires_at',
                    'weight')
    ORDER BY k LIMIT 1;
    IF FOUND THEN
        PERFORM {schema}.refuse_option(p_where, v_unknown,
            'is not an option (queue, priority, name, unique_key, group_id, max_attempts, available_at, '
            'delay_seconds, timeout_seconds, concurrency_key, expires_at, weight)');
    END IF;
    v_type := {schema}.option_text(p_job, 'type', 255, p_where);
    IF v_type IS NULL THEN
        PERFORM {schema}.refuse_option(p_where, 'type', 'is missing');
    END IF;
    IF v_configuration IS NULL OR jsonb_typeof(v_configuration) = 'null' THEN
        v_configuration := '{{}}';
    ELSIF jsonb_typeof(v_configuration) <> 'object' THEN
        PERFORM {schema}.refuse_option(p_where, 'configuration',
                                       'must be a JSON object, got ' || jsonb_typeof(v_configuration));
    ELSIF jsonb_path_exists(v_configuration, 'strict $.**{{200}} ? (@.type() == "object" || @.type() == "array")') THEN
        PERFORM {schema}.refuse_option(p_where, 'configuration', 'is nested too deeply (at most 200 levels)');
    END IF;
    v_queue := coalesce({schema}.option_text(p_job, 'queue', 255, p_where), 'default');
    IF jsonb_typeof(p_job -> 'group_id') NOT IN ('string', 'null') THEN
        PERFORM {schema}.refuse_option(p_where, 'group_id', 'must be a UUID string, got ' || (p_job -> 'group_id')::text);
    END IF;
    BEGIN
        v_group := (p_job ->> 'group_id')::uuid;
    EXCEPTION WHEN invalid_text_representation THEN
        PERFORM {schema}.refuse_option(p_where, 'group_id', 'must be a UUID string, got ' || (p_job -> 'group_id')::text);
    END;
    v_unique := {schema}.option_text(p_job, 'unique_key', 1000, p_where);
    v_available := {schema}.option_time(p_job, 'available_at', p_where);
    v_delay := {schema}.option_seconds(p_job, 'delay_seconds', true, p_where);
    IF v_available IS NOT NULL AND v_delay IS NOT NULL THEN
        PERFORM {schema}.refuse_option(p_where, 'delay_seconds', 'and available_at exclude each other: give one');
    END IF;
    -- Compared in seconds: now() plus a delay far out of range would overflow before the comparison.
    IF v_delay IS NOT NULL AND NOT v_delay BETWEEN extract(epoch FROM '0002-01-01 00:00:00+00'::timestamptz - now())
                                               AND extract(epoch FROM '9999-01-01 00:00:00+00'::timestamptz - now()) THEN
        PERFORM {schema}.refuse_option(p_where, 'delay_seconds',
                                       'is out of range: it must land between 0002-01-01 and 9999-01-01 UTC');
    END IF;
    IF v_group IS NOT NULL THEN
        PERFORM {schema}.refuse_callback_group(v_group, p_where);
    END IF;
    v_weight := coalesce({schema}.option_integer(p_job, 'weight', 1, 1000000, p_where), 1);
    IF v_weight > 1 THEN
        PERFORM {schema}.refuse_heavy_jobs(ARRAY[v_queue], ARRAY[jsonb_typeof(p_job -> 'concurrency_key') = 'string'],
                                           ARRAY[v_weight], p_where);
    END IF;
    FOR v_round IN 1 .. 10 LOOP
        INSERT INTO {schema}.job AS j (id, type, queue, name, group_id, unique_key, priority, configuration_data,
                                      max_attempts, available_at, timeout_seconds, concurrency_key, expires_at,
                                      weight)
        VALUES ({schema}.uuid_generate_v7(), v_type, v_queue, {schema}.option_text(p_job, 'name', 1000, p_where),
                v_group, v_unique, coalesce({schema}.option_integer(p_job, 'priority', -2147483648, 2147483647, p_where), 0),
                v_configuration,
                coalesce({schema}.option_integer(p_job, 'max_attempts', 1, 2147483647, p_where), 3),
                coalesce(v_available, now() + make_interval(secs => coalesce(v_delay, 0))),
                {schema}.option_seconds(p_job, 'timeout_seconds', false, p_where),
                {schema}.option_text(p_job, 'concurrency_key', 1000, p_where),
                {schema}.option_time(p_job, 'expires_at', p_where),
                v_weight)
        ON CONFLICT DO NOTHING
        RETURNING j.id INTO v_id;
        IF v_id IS NOT NULL THEN
            PERFORM pg_notify(p_channel, json_build_array(v_queue, v_type)::text);
            RETURN v_id;
        END IF;
        -- Each statement reads a new snapshot: the holder that made the insert conflict is seen, or it
        -- ended in between and the insert is tried again.
        SELECT j.id INTO v_id FROM {schema}.job AS j
        WHERE j.type = v_type AND j.unique_key = v_unique AND j.status IN ('queued', 'running');
        IF v_id IS NOT NULL THEN
            RETURN v_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION '%', p_where || 'unique_key ' || v_unique || ': the active job holding it changed 10 times in a row'
        USING ERRCODE = 'serialization_failure';
END
$function$;

-- Follow-ups, callbacks and spawned children keep their weight.
CREATE OR REPLACE FUNCTION {schema}.schedule_spec(p_spec jsonb, p_channel text)
 RETURNS uuid
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_id uuid;
BEGIN
    IF pg_trigger_depth() > 0 THEN
        PERFORM set_config('jobbus.finishing', 'on', true);
    ELSIF coalesce((p_spec ->> 'weight')::integer, 1) > 1 THEN
        -- A spawned child is refused like any job; a follow-up or a callback (scheduled from the
        -- trigger that finishes its parent) was checked when its parent was scheduled.
        PERFORM {schema}.refuse_heavy_jobs(ARRAY[p_spec ->> 'queue'], ARRAY[p_spec ->> 'concurrency_key' IS NOT NULL],
                                           ARRAY[(p_spec ->> 'weight')::integer], '');
    END IF;
    INSERT INTO {schema}.job AS j (id, type, queue, name, group_id, unique_key, priority, configuration_data,
                                  max_attempts, available_at, timeout_seconds, concurrency_key, expires_at,
                                  weight)
    VALUES ((p_spec ->> 'id')::uuid, p_spec ->> 'type', p_spec ->> 'queue', p_spec ->> 'name',
            (p_spec ->> 'group_id')::uuid, p_spec ->> 'unique_key', (p_spec ->> 'priority')::integer,
            p_spec -> 'configuration', (p_spec ->> 'max_attempts')::integer,
            coalesce((p_spec ->> 'available_at')::timestamptz,
                     now() + make_interval(secs => coalesce((p_spec ->> 'delay')::float8, 0))),
            (p_spec ->> 'timeout')::float8, p_spec ->> 'concurrency_key',
            coalesce((p_spec ->> 'expires_at')::timestamptz,
                     now() + make_interval(secs => (p_spec ->> 'expires_in')::float8)),
            coalesce((p_spec ->> 'weight')::integer, 1))
    ON CONFLICT DO NOTHING
    RETURNING j.id INTO v_id;
    PERFORM set_config('jobbus.finishing', '', true);
    IF v_id IS NULL THEN
        RETURN NULL;
    END IF;
    IF p_spec ? 'parent_id' THEN
        INSERT INTO {schema}.job_child (child_id, parent_id) VALUES (v_id, (p_spec ->> 'parent_id')::uuid);
        INSERT INTO {schema}.job_parent AS p (parent_id, active) VALUES ((p_spec ->> 'parent_id')::uuid, 1)
        ON CONFLICT (parent_id) DO UPDATE SET active = p.active + 1;
    END IF;
    IF jsonb_typeof(p_spec -> 'then') = 'object' THEN
        INSERT INTO {schema}.job_follow_up (job_id, spec) VALUES (v_id, p_spec -> 'then') ON CONFLICT DO NOTHING;
    END IF;
    PERFORM pg_notify(p_channel, json_build_array(p_spec ->> 'queue', p_spec ->> 'type')::text);
    RETURN v_id;
END
$function$;

-- Schedule time: a job heavier than a limit of its queue could never start, so it is refused (and the
-- statement that would have written it with it). Called only for jobs of weight > 1, in the statement
-- that inserts them; it holds the queue's weight lock shared until the transaction ends, so a
-- concurrent `set_queue` lowering a limit (refuse_limits_below_weights, which takes it exclusively)
-- either sees these jobs or is seen by this check. SQLSTATE 22023 with the column `weight`, as the
-- SQL API refuses a bad option.
CREATE OR REPLACE FUNCTION {schema}.refuse_heavy_jobs(p_queues text[], p_keyed boolean[], p_weights integer[], p_where text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v record;
    v_setting {schema}.queue_setting;
    v_limit integer;
    v_what text;
BEGIN
    FOR v IN
        SELECT w.queue, max(w.weight) AS heaviest, max(w.weight) FILTER (WHERE w.keyed) AS heaviest_keyed
        FROM unnest(p_queues, p_keyed, p_weights) AS w(queue, keyed, weight)
        WHERE w.weight > 1
        GROUP BY w.queue ORDER BY w.queue
    LOOP
        PERFORM pg_advisory_xact_lock_shared({schema}.wait_lock('weight:' || v.queue));
        SELECT * INTO v_setting FROM {schema}.queue_setting AS s WHERE s.queue = v.queue;
        CONTINUE WHEN NOT FOUND;
        v_limit := NULL;
        IF v.heaviest > v_setting.concurrency THEN
            v_limit := v_setting.concurrency; v_what := 'concurrency';
        ELSIF v.heaviest > v_setting.rate_count THEN
            v_limit := v_setting.rate_count; v_what := 'rate_limit';
        ELSIF v.heaviest_keyed > v_setting.concurrency_per_key THEN
            v_limit := v_setting.concurrency_per_key; v_what := 'concurrency_per_key';
        ELSIF v.heaviest_keyed > v_setting.key_rate_count THEN
            v_limit := v_setting.key_rate_count; v_what := 'rate_limit_per_key';
        END IF;
        IF v_limit IS NOT NULL THEN
            RAISE EXCEPTION '%', format('%sweight %s is more than the %s of queue %s (%s): such a job could never start '
                                        '(lower its weight, or raise the limit first)', p_where,
                                        CASE WHEN v_what LIKE '%per_key' THEN v.heaviest_keyed ELSE v.heaviest END,
                                        v_what, v.queue, v_limit)
                USING ERRCODE = 'invalid_parameter_value', COLUMN = 'weight';
        END IF;
    END LOOP;
    RETURN true;
END
$function$;

-- `set_queue`: a limit lowered below the weight of a job that is queued or running in the queue (or of
-- a follow-up waiting for its parent there, or of a group's callback waiting for its group) would leave that job waiting for ever, so it is refused
-- (SQLSTATE JB412), naming the heaviest such weight. A limit raised, kept or removed is not checked.
-- Takes the queue's weight lock exclusively: schedules of weighted jobs in flight commit first and are
-- seen, later ones see the new limit. Reads the queue's queued jobs (its claim index) when a limit is
-- lowered or added; plain schedules never take the lock.
CREATE OR REPLACE FUNCTION {schema}.refuse_limits_below_weights(p_queue text, p_concurrency integer, p_concurrency_per_key integer, p_rate_count integer, p_key_rate_count integer)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_setting {schema}.queue_setting;
    v_all integer;
    v_keyed integer;
    v_heaviest integer;
    v_heaviest_keyed integer;
    v_limit integer;
    v_what text;
BEGIN
    SELECT * INTO v_setting FROM {schema}.queue_setting AS s WHERE s.queue = p_queue;
    -- Only limits that are new or lower than before can be below a job's weight.
    v_all := least(CASE WHEN p_concurrency < v_setting.concurrency OR v_setting.concurrency IS NULL THEN p_concurrency END,
                   CASE WHEN p_rate_count < v_setting.rate_count OR v_setting.rate_count IS NULL THEN p_rate_count END);
    v_keyed := least(CASE WHEN p_concurrency_per_key < v_setting.concurrency_per_key
                               OR v_setting.concurrency_per_key IS NULL THEN p_concurrency_per_key END,
                     CASE WHEN p_key_rate_count < v_setting.key_rate_count
                               OR v_setting.key_rate_count IS NULL THEN p_key_rate_count END);
    IF v_all IS NULL AND v_keyed IS NULL THEN
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock({schema}.wait_lock('weight:' || p_queue));
    SELECT max(j.weight), max(j.weight) FILTER (WHERE j.concurrency_key IS NOT NULL)
    INTO v_heaviest, v_heaviest_keyed
    FROM {schema}.job AS j
    WHERE j.queue = p_queue AND j.status IN ('queued', 'running') AND j.weight > least(v_all, v_keyed);
    SELECT greatest(v_heaviest, max((f.spec ->> 'weight')::integer)),
           greatest(v_heaviest_keyed, max((f.spec ->> 'weight')::integer) FILTER (WHERE f.spec ->> 'concurrency_key' IS NOT NULL))
    INTO v_heaviest, v_heaviest_keyed
    FROM {schema}.job_follow_up AS f
    WHERE f.spec ->> 'queue' = p_queue AND (f.spec ->> 'weight')::integer > least(v_all, v_keyed);
    -- And the callbacks of groups not done yet.
    SELECT greatest(v_heaviest, max((g.spec ->> 'weight')::integer)),
           greatest(v_heaviest_keyed, max((g.spec ->> 'weight')::integer) FILTER (WHERE g.spec ->> 'concurrency_key' IS NOT NULL))
    INTO v_heaviest, v_heaviest_keyed
    FROM {schema}.job_group AS g
    WHERE g.scheduled_at IS NULL AND g.spec ->> 'queue' = p_queue
      AND (g.spec ->> 'weight')::integer > least(v_all, v_keyed);
    IF v_heaviest > p_concurrency AND p_concurrency = v_all THEN
        v_limit := p_concurrency; v_what := 'concurrency';
    ELSIF v_heaviest > p_rate_count AND p_rate_count = v_all THEN
        v_limit := p_rate_count; v_what := 'rate_limit';
    ELSIF v_heaviest_keyed > p_concurrency_per_key AND p_concurrency_per_key = v_keyed THEN
        v_limit := p_concurrency_per_key; v_what := 'concurrency_per_key';
    ELSIF v_heaviest_keyed > p_key_rate_count AND p_key_rate_count = v_keyed THEN
        v_limit := p_key_rate_count; v_what := 'rate_limit_per_key';
    END IF;
    IF v_limit IS NOT NULL THEN
        RAISE EXCEPTION '%', format('queue %s has a job of weight %s: a %s of %s would never let it start '
                                    '(let it finish or cancel it first, or lower its weight)', p_queue,
                                    CASE WHEN v_what LIKE '%per_key' THEN v_heaviest_keyed ELSE v_heaviest END,
                                    v_what, v_limit)
            USING ERRCODE = 'JB412';
    END IF;
    RETURN true;
END
$function$;

-- `App.consume`: spend `p_units` of the queue's rate windows (and of its key's, with a key) at this
-- instant, as starts of that weight would. Serialised with the queue's claims by its settings row, so
-- a claim sees every spend recorded before it. Recorded once per `p_id` (a call repeated after a lost
-- connection finds its id and spends nothing more); returns whether the spend is recorded, false when
-- the queue has no rate limit the spend counts against (nothing is written then).
CREATE OR REPLACE FUNCTION {schema}.spend_units(p_id uuid, p_queue text, p_key text, p_units integer)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'pg_temp'
AS $function$
DECLARE
    v_setting {schema}.queue_setting;
    v_at timestamptz;
BEGIN
    SELECT * INTO v_setting FROM {schema}.queue_setting AS s WHERE s.queue = p_queue FOR UPDATE;
    IF NOT FOUND OR (v_setting.rate_count IS NULL AND (p_key IS NULL OR v_setting.key_rate_count IS NULL)) THEN
        RETURN false;
    END IF;
    v_at := clock_timestamp();
    INSERT INTO {schema}.queue_spend (id, spent_at) VALUES (p_id, v_at) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    INSERT INTO {schema}.queue_start (queue, concurrency_key, started_at, units) VALUES (p_queue, p_key, v_at, p_units);
    DELETE FROM {schema}.queue_spend AS s
    WHERE s.id IN (SELECT o.id FROM {schema}.queue_spend AS o WHERE o.spent_at < v_at - interval '1 day'
                   ORDER BY o.spent_at LIMIT 10);
    RETURN true;
END
$function$;

REVOKE EXECUTE ON FUNCTION
    {schema}.refuse_heavy_jobs(text[], boolean[], integer[], text),
    {schema}.refuse_limits_below_weights(text, integer, integer, integer, integer),
    {schema}.spend_units(uuid, text, text, integer)
    FROM PUBLIC;

-- Roles granted before this migration keep what their rights imply: whoever may insert jobs may
-- schedule weighted ones and spend units, whoever may change queue settings may lower a limit.
DO $$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE acl.grantee::regrole::text END
        FROM pg_class AS c, aclexplode(c.relacl) AS acl
        WHERE c.oid = '{schema}.job'::regclass AND acl.privilege_type = 'INSERT'
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.refuse_heavy_jobs(text[], boolean[], integer[], text), '
                       '{schema}.spend_units(uuid, text, text, integer) TO %s', v_grantee);
    END LOOP;
    FOR v_grantee IN
        SELECT DISTINCT CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE acl.grantee::regrole::text END
        FROM pg_class AS c, aclexplode(c.relacl) AS acl
        WHERE c.oid = '{schema}.queue_setting'::regclass AND acl.privilege_type = 'INSERT'
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.refuse_limits_below_weights(text, integer, integer, integer, integer) TO %s',
                       v_grantee);
    END LOOP;
    FOR v_grantee IN
        SELECT DISTINCT CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE acl.grantee::regrole::text END
        FROM pg_proc AS p, aclexplode(p.proacl) AS acl
        WHERE p.oid = '{schema}.take_limited(text, text[], integer, uuid[], double precision)'::regprocedure
          AND acl.privilege_type = 'EXECUTE'
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.take_per_key({schema}.queue_setting, text[], integer, '
                       'integer, uuid[], timestamptz, double precision), {schema}.fit_weights(uuid[], integer) TO %s',
                       v_grantee);
    END LOOP;
END
$$;

-- jobbus: after commit
-- Each statement on its own, once the above has committed (see the top of this file). If it does not
-- run (the process stopped in between), the CHECK stays NOT VALID: still enforced on every write.
ALTER TABLE {schema}.job VALIDATE CONSTRAINT job_weight_check;
