-- job_finished's notification for wait() is built by slicing the array of finished ids, 200 ids a
-- notification, instead of numbering every id with a window function and grouping them; without
-- follow-ups that array is no longer sorted (wait() reads the ids in any order). In drains of 100,000
-- no-op jobs without workflows, migration 20's function and this one alternated, three each, the
-- function's own time was 1.84-2.08 us of the database's time per job, and is now 1.26-1.43
-- (pg_stat_user_functions with track_functions = 'pl').
CREATE OR REPLACE FUNCTION {schema}.job_finished() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_finished uuid[];
    v_completed uuid[];
    v_due boolean;
    v_parent record;
    v_woken bigint;
    v_channel text;
    v_group record;
    v_spec record;
    v_groups boolean;
    v_children boolean;
    v_at integer;
BEGIN
    -- Whether any group or any child exists: a row of this statement can only be a member or a child
    -- when its job_group or job_child row is visible, as both are written with the job, in its transaction.
    v_groups := EXISTS (SELECT 1 FROM {schema}.job_group);
    v_children := EXISTS (SELECT 1 FROM {schema}.job_child);
    -- Most updates neither finish a job nor reopen one (claims, heartbeats, checkpoints): one pass over
    -- the new rows, and over the old only when a reopened job could change a group's or a parent's count.
    IF NOT EXISTS (SELECT 1 FROM finished_new WHERE status IN ('completed', 'failed', 'cancelled'))
       AND NOT ((v_groups OR v_children)
                AND EXISTS (SELECT 1 FROM finished_old WHERE status IN ('completed', 'failed', 'cancelled'))) THEN
        RETURN NULL;
    END IF;
    IF v_groups THEN
        -- 3 first (a retried member reopens its group); the group rows in group order.
        FOR v_group IN
            SELECT g.group_id, g.spec, d.delta FROM {schema}.job_group AS g
            JOIN (SELECT n.group_id,
                         count(*) FILTER (WHERE n.status IN ('queued', 'running'))
                         - count(*) FILTER (WHERE n.status IN ('completed', 'failed', 'cancelled')) AS delta
                  FROM finished_new AS n JOIN finished_old AS o ON o.id = n.id
                  WHERE n.group_id IS NOT NULL
                    AND (n.status IN ('completed', 'failed', 'cancelled')) <> (o.status IN ('completed', 'failed', 'cancelled'))
                  GROUP BY n.group_id) AS d ON d.group_id = g.group_id
            WHERE g.scheduled_at IS NULL AND d.delta <> 0
            ORDER BY g.group_id
        LOOP
            UPDATE {schema}.job_group AS g
            SET remaining = g.remaining + v_group.delta,
                scheduled_at = CASE WHEN g.remaining + v_group.delta <= 0 THEN now() END
            WHERE g.group_id = v_group.group_id AND g.scheduled_at IS NULL
            RETURNING g.scheduled_at IS NOT NULL INTO v_due;
            IF v_due THEN
                PERFORM {schema}.schedule_spec(v_group.spec, {schema}.channel_name(TG_TABLE_SCHEMA, ''));
            END IF;
        END LOOP;
    END IF;
    IF v_children THEN
        -- 4, likewise per parent; a parked parent whose count reaches 0 is due now.
        FOR v_parent IN
            SELECT c.parent_id, count(*) FILTER (WHERE n.status IN ('queued', 'running'))
                                - count(*) FILTER (WHERE n.status IN ('completed', 'failed', 'cancelled')) AS delta
            FROM finished_new AS n
            JOIN finished_old AS o ON o.id = n.id
            JOIN {schema}.job_child AS c ON c.child_id = n.id
            WHERE (n.status IN ('completed', 'failed', 'cancelled')) <> (o.status IN ('completed', 'failed', 'cancelled'))
            GROUP BY c.parent_id
            ORDER BY c.parent_id
        LOOP
            CONTINUE WHEN v_parent.delta = 0;
            UPDATE {schema}.job_parent AS p SET active = p.active + v_parent.delta
            WHERE p.parent_id = v_parent.parent_id
            RETURNING p.active <= 0 AND p.waiting INTO v_due;
            IF v_due THEN
                UPDATE {schema}.job_parent SET waiting = false WHERE parent_id = v_parent.parent_id;
                WITH woken AS (
                    UPDATE {schema}.job AS j SET available_at = now()
                    WHERE j.id = v_parent.parent_id AND j.status = 'queued' AND j.available_at > now()
                    RETURNING j.queue, j.type
                )
                SELECT count(pg_notify({schema}.channel_name(TG_TABLE_SCHEMA, ''), json_build_array(queue, type)::text))
                INTO v_woken FROM woken;
            END IF;
        END LOOP;
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.job_follow_up) THEN
        -- The jobs this statement finished, and of them those it completed: their follow-ups run once.
        SELECT array_agg(n.id ORDER BY n.id),
               array_agg(n.id ORDER BY n.id) FILTER (WHERE n.status = 'completed')
        INTO v_finished, v_completed
        FROM finished_new AS n
        JOIN finished_old AS o ON o.id = n.id
        WHERE n.status IN ('completed', 'failed', 'cancelled') AND o.status IN ('queued', 'running');
    ELSE
        -- No follow-up to schedule: only wait() reads the ids, in any order, and a job finished before
        -- this statement that it names again is read finished again, so the new rows alone will do.
        SELECT array_agg(n.id) INTO v_finished
        FROM finished_new AS n WHERE n.status IN ('completed', 'failed', 'cancelled');
    END IF;
    IF v_finished IS NULL THEN
        RETURN NULL;
    END IF;

    -- wait()'s wake-up: the ids, 200 a notification (7,399 bytes, under the payload's limit of 8,000).
    v_channel := {schema}.channel_name(TG_TABLE_SCHEMA, '_done');
    FOR v_at IN 1 .. cardinality(v_finished) BY 200 LOOP
        PERFORM pg_notify(v_channel, array_to_string(v_finished[v_at : v_at + 199], ','));
    END LOOP;

    v_channel := {schema}.channel_name(TG_TABLE_SCHEMA, '');
    IF v_completed IS NOT NULL THEN
        FOR v_spec IN
            SELECT f.spec FROM {schema}.job_follow_up AS f WHERE f.job_id = ANY (v_completed) ORDER BY f.job_id
        LOOP
            PERFORM {schema}.schedule_spec(v_spec.spec, v_channel);
        END LOOP;
    END IF;

    RETURN NULL;
END
$$;
