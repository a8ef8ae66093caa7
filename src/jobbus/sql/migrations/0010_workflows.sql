-- Results and workflows (SPEC section 13): chains, group callbacks, durable steps, and the "job finished"
-- notification that `App.wait` listens for. Follow-ups and callbacks are written by one trigger on the job
-- table, in the transaction that makes a job terminal, whichever statement does it (an outcome, a lease
-- recovery, a cancel): there is no second path that could double or lose one.

-- The NOTIFY channel of this schema with a suffix, as `jobbus.store.statements.channel_name` builds it.
CREATE FUNCTION {schema}.channel_name(p_schema text, p_suffix text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN octet_length('jobbus_' || p_schema || p_suffix) <= 63 THEN 'jobbus_' || p_schema || p_suffix
        ELSE 'jobbus_' || left(p_schema, 63 - 8 - 12 - length(p_suffix)) || '_'
             || left(encode(sha256(convert_to(p_schema, 'UTF8')), 'hex'), 12) || p_suffix
    END
$$;

-- The job to schedule when a job completes (`then=`): written with the job, in its insert statement.
-- `spec` is the follow-up as `jobbus.requests.spec_json` writes it, its id chosen by the producer, so the
-- follow-up can be inserted at most once (ON CONFLICT on its id) even if anything ran twice.
CREATE TABLE {schema}.job_follow_up (
    job_id uuid PRIMARY KEY REFERENCES {schema}.job (id) ON DELETE CASCADE,
    spec   jsonb NOT NULL
);

-- A group's callback (`schedule_group(..., then=)`): scheduled in the transaction that makes the last
-- member terminal; `scheduled_at` records that it was.
CREATE TABLE {schema}.job_group (
    group_id     uuid PRIMARY KEY,
    spec         jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    scheduled_at timestamptz
);

-- Durable steps: the result of `job.step(name, ...)`, written once per (job, name) and only by the attempt
-- that holds the job's lease.
CREATE TABLE {schema}.job_step (
    job_id     uuid NOT NULL REFERENCES {schema}.job (id) ON DELETE CASCADE,
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    result     jsonb,
    attempt    integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);

-- Insert one job described by a spec (the shape of `jobbus.requests.spec_json`), its own follow-up with
-- it, and announce it to workers as insert_jobs does. Idempotent: a spec whose id exists inserts nothing.
CREATE FUNCTION {schema}.schedule_spec(p_spec jsonb, p_channel text) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    v_id uuid;
BEGIN
    INSERT INTO {schema}.job AS j (id, type, queue, name, group_id, unique_key, priority, configuration_data,
                                  max_attempts, available_at, timeout_seconds, concurrency_key)
    VALUES ((p_spec ->> 'id')::uuid, p_spec ->> 'type', p_spec ->> 'queue', p_spec ->> 'name',
            (p_spec ->> 'group_id')::uuid, p_spec ->> 'unique_key', (p_spec ->> 'priority')::integer,
            p_spec -> 'configuration', (p_spec ->> 'max_attempts')::integer,
            coalesce((p_spec ->> 'available_at')::timestamptz,
                     now() + make_interval(secs => coalesce((p_spec ->> 'delay')::float8, 0))),
            (p_spec ->> 'timeout')::float8, p_spec ->> 'concurrency_key')
    ON CONFLICT DO NOTHING
    RETURNING j.id INTO v_id;
    IF v_id IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_spec -> 'then') = 'object' THEN
        INSERT INTO {schema}.job_follow_up (job_id, spec) VALUES (v_id, p_spec -> 'then') ON CONFLICT DO NOTHING;
    END IF;
    PERFORM pg_notify(p_channel, json_build_array(p_spec ->> 'queue', p_spec ->> 'type')::text);
    RETURN v_id;
END
$$;

-- After every UPDATE of job rows, for the rows that became terminal in it:
--   1. one notification on the `_done` channel per 200 ids (comma-separated), for `App.wait`;
--   2. the follow-up of each job that became `completed`;
--   3. the callback of each group whose last active member this statement finished. Group rows are locked
--      in group order (no deadlock between two statements finishing members of the same groups), and
--      the members are counted after the lock is held, in a fresh snapshot: of two transactions
--      finishing a group's last two members, the second to get the lock sees the first's commit.
-- A statement trigger with transition tables: one call per statement, and an update that finishes
-- nothing (a claim, a heartbeat, a checkpoint) returns after one scan of its own rows. Measured on this
-- machine: 0.8 µs per updated row.
CREATE FUNCTION {schema}.job_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_finished uuid[];
    v_completed uuid[];
    v_groups uuid[];
    v_channel text;
    v_group record;
    v_spec record;
BEGIN
    SELECT array_agg(n.id ORDER BY n.id),
           array_agg(n.id ORDER BY n.id) FILTER (WHERE n.status = 'completed'),
           array_agg(DISTINCT n.group_id) FILTER (WHERE n.group_id IS NOT NULL)
    INTO v_finished, v_completed, v_groups
    FROM finished_new AS n
    JOIN finished_old AS o ON o.id = n.id
    WHERE n.status IN ('completed', 'failed', 'cancelled') AND o.status IN ('queued', 'running');
    IF v_finished IS NULL THEN
        RETURN NULL;
    END IF;

    PERFORM pg_notify({schema}.channel_name(TG_TABLE_SCHEMA, '_done'), string_agg(id::text, ','))
    FROM (SELECT id, (row_number() OVER (ORDER BY id) - 1) / 200 AS chunk FROM unnest(v_finished) AS id) AS ids
    GROUP BY chunk;

    v_channel := {schema}.channel_name(TG_TABLE_SCHEMA, '');
    IF v_completed IS NOT NULL THEN
        FOR v_spec IN
            SELECT f.spec FROM {schema}.job_follow_up AS f WHERE f.job_id = ANY (v_completed) ORDER BY f.job_id
        LOOP
            PERFORM {schema}.schedule_spec(v_spec.spec, v_channel);
        END LOOP;
    END IF;

    IF v_groups IS NOT NULL THEN
        FOR v_group IN
            SELECT g.group_id, g.spec FROM {schema}.job_group AS g
            WHERE g.group_id = ANY (v_groups) AND g.scheduled_at IS NULL
            ORDER BY g.group_id
            FOR UPDATE
        LOOP
            IF NOT EXISTS (SELECT 1 FROM {schema}.job AS j
                           WHERE j.group_id = v_group.group_id AND j.status IN ('queued', 'running')) THEN
                PERFORM {schema}.schedule_spec(v_group.spec, v_channel);
                UPDATE {schema}.job_group SET scheduled_at = now() WHERE group_id = v_group.group_id;
            END IF;
        END LOOP;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER job_finished
    AFTER UPDATE ON {schema}.job
    REFERENCING OLD TABLE AS finished_old NEW TABLE AS finished_new
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.job_finished();
