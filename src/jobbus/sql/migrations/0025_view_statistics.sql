-- What the operator's views count and group (docs/dashboard.md, "Counts"):
--
-- * Failure groups cover every failed job through job_failure_group_idx (migration 26), which holds the
--   fold stored with each failure. Jobs failed before migration 15 (or by a worker of that release) have
--   none: it is written for them now, once, by the function every failure uses.
-- * A count that is not read exactly (past the views' bound) is the planner's estimate: statistics over
--   (status, queue, type) together let it estimate a tab's count under a queue and a type filter from
--   the combinations it sampled, rather than multiplying each column's frequency as if independent.
UPDATE {schema}.job SET error_group = {schema}.fold_error(last_error)
WHERE status = 'failed' AND error_group IS NULL;

CREATE STATISTICS IF NOT EXISTS {schema}.job_status_queue_type (mcv, ndistinct) ON status, queue, type FROM {schema}.job;
-- A queued job's view depends on its last history entry (parked: `waiting`): statistics on that
-- expression let the planner estimate the waiting and retrying views instead of assuming 0.5 %.
CREATE STATISTICS IF NOT EXISTS {schema}.job_last_outcome ON (history -> -1 ->> 'outcome') FROM {schema}.job;

-- The views enumerate the queued (queue, type) pairs with this function: a handful, not the 1,000 rows
-- PostgreSQL assumes of a function, which made it plan (and JIT-compile, 0.5 s) for millions.
ALTER FUNCTION {schema}.queued_pairs() ROWS 10;

-- A manual retry is an entry of the job's history (docs/dashboard.md): a role granted only the columns a
-- retry changes (the dashboard role of docs/security.md, granted before this migration) may change the
-- history too, so its retries keep working without new grants; roles with UPDATE on the table have it.
DO $$
DECLARE
    v_grantee regrole;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT acl.grantee::regrole
        FROM pg_attribute AS a, aclexplode(a.attacl) AS acl
        WHERE a.attrelid = '{schema}.job'::regclass AND a.attname = 'error_group' AND acl.privilege_type = 'UPDATE'
          AND acl.grantee <> 0
    LOOP
        EXECUTE format('GRANT UPDATE (history) ON {schema}.job TO %s', v_grantee);
    END LOOP;
END
$$;
