-- Retention deletes by primary key. The function of 0005 joined the deleted rows to its batch
-- (`DELETE ... USING doomed`); planned without its parameters, a batch of `LIMIT p_limit` was
-- estimated at tens of thousands of rows and the join became a sequential scan of the whole job
-- table per batch: 509 rows/s at 10M finished rows, far behind 1,000 jobs/s. The batch as an array
-- keeps the delete on the primary key whatever the estimate (54,216 rows/s measured on the same
-- table; docs/capacity.md).
CREATE OR REPLACE FUNCTION {schema}.delete_finished_jobs(
    p_status text, p_older_than_seconds double precision, p_limit integer
)
RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH deleted AS (
        DELETE FROM {schema}.job
        WHERE id = ANY (ARRAY(
            SELECT id FROM {schema}.job
            WHERE status = p_status
              AND p_status IN ('completed', 'failed', 'cancelled')
              AND finished_at < now() - make_interval(secs => p_older_than_seconds)
            ORDER BY finished_at
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ))
        RETURNING 1
    )
    SELECT count(*)::integer FROM deleted
$$;
