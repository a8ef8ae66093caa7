-- A claim takes past rows other claims hold. With several (type, priority) groups, take_from_queue
-- splits what it wants among the groups by counting their heads without locks; when those heads were
-- held by another claim (or by the leader cancelling expired jobs), the groups' SKIP LOCKED scans came
-- back short and the claim took fewer jobs than were available, none at all when the held rows were
-- all of the first group: a draining worker then stopped with jobs still queued. A group that comes
-- back short now lets the others make up the difference. A claim that meets no held row pays nothing.
CREATE OR REPLACE FUNCTION {schema}.take_from_queue(p_queue text, p_types text[], p_want integer, p_exclude uuid[])
RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    v_types text[] := '{{}}';
    v_priorities integer[] := '{{}}';
    v_type text;
    v_priority integer;
    v_ids uuid[] := '{{}}';
    v_more uuid[];
    v_counts integer[];
    v_group integer;
    v_short boolean := false;
BEGIN
    IF p_want <= 0 THEN
        RETURN v_ids;
    END IF;
    FOREACH v_type IN ARRAY p_types LOOP
        SELECT j.priority INTO v_priority FROM {schema}.job AS j
        WHERE j.status = 'queued' AND j.queue = p_queue AND j.type = v_type
        ORDER BY j.priority DESC LIMIT 1;
        WHILE FOUND LOOP
            v_types := v_types || v_type;
            v_priorities := v_priorities || v_priority;
            SELECT j.priority INTO v_priority FROM {schema}.job AS j
            WHERE j.status = 'queued' AND j.queue = p_queue AND j.type = v_type AND j.priority < v_priority
            ORDER BY j.priority DESC LIMIT 1;
        END LOOP;
    END LOOP;
    IF cardinality(v_types) = 0 THEN
        RETURN v_ids;
    END IF;
    IF cardinality(v_types) > 1 THEN
        -- How many each group contributes to the first p_want jobs in claim order.
        SELECT array_agg(coalesce(c.n, 0) ORDER BY g.g) INTO v_counts
        FROM generate_subscripts(v_types, 1) AS g(g)
        LEFT JOIN (
            SELECT top.g, count(*)::integer AS n
            FROM (
                SELECT heads.g
                FROM generate_subscripts(v_types, 1) AS groups(g)
                CROSS JOIN LATERAL (
                    SELECT groups.g, j.priority, j.available_at, j.id FROM {schema}.job AS j
                    WHERE j.status = 'queued' AND j.queue = p_queue AND j.type = v_types[groups.g]
                      AND j.priority = v_priorities[groups.g] AND j.available_at <= now()
                      AND NOT (j.id = ANY(p_exclude))
                    ORDER BY j.available_at, j.id LIMIT p_want
                ) AS heads
                ORDER BY heads.priority DESC, heads.available_at, heads.id
                LIMIT p_want
            ) AS top
            GROUP BY top.g
        ) AS c ON c.g = g.g;
    ELSE
        v_counts := ARRAY[p_want];
    END IF;
    FOR v_group IN 1 .. cardinality(v_types) LOOP
        CONTINUE WHEN v_counts[v_group] = 0;
        SELECT coalesce(array_agg(locked.id), '{{}}') INTO v_more
        FROM (
            SELECT j.id FROM {schema}.job AS j
            WHERE j.status = 'queued' AND j.queue = p_queue AND j.type = v_types[v_group]
              AND j.priority = v_priorities[v_group] AND j.available_at <= now()
              AND NOT (j.id = ANY(p_exclude))
            ORDER BY j.available_at, j.id
            LIMIT v_counts[v_group]
            FOR UPDATE SKIP LOCKED
        ) AS locked;
        v_short := v_short OR cardinality(v_more) < v_counts[v_group];
        v_ids := v_ids || v_more;
    END LOOP;
    -- A group's share came up short: rows counted were held by other claims, or taken or changed since
    -- they were counted. Groups later in claim order make up for them, highest priority first.
    IF v_short AND cardinality(v_types) > 1 THEN
        FOR v_group IN SELECT g.g FROM generate_subscripts(v_types, 1) AS g(g) ORDER BY v_priorities[g.g] DESC, g.g LOOP
            EXIT WHEN cardinality(v_ids) >= p_want;
            SELECT coalesce(array_agg(locked.id), '{{}}') INTO v_more
            FROM (
                SELECT j.id FROM {schema}.job AS j
                WHERE j.status = 'queued' AND j.queue = p_queue AND j.type = v_types[v_group]
                  AND j.priority = v_priorities[v_group] AND j.available_at <= now()
                  AND NOT (j.id = ANY(p_exclude)) AND NOT (j.id = ANY(v_ids))
                ORDER BY j.available_at, j.id
                LIMIT p_want - cardinality(v_ids)
                FOR UPDATE SKIP LOCKED
            ) AS locked;
            v_ids := v_ids || v_more;
        END LOOP;
    END IF;
    RETURN v_ids;
END
$$;
