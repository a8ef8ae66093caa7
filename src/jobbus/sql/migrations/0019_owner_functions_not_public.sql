-- The functions that run as the schema's owner (SECURITY DEFINER) kept PostgreSQL's default EXECUTE for
-- PUBLIC, so any role that may use the schema could call them with the owner's rights: a read-only
-- observer could delete finished jobs, events and groups, emit events or store a group's callback. Each
-- is now executable only by the roles granted it (docs/security.md's grants name each one).
REVOKE EXECUTE ON FUNCTION
    {schema}.delete_finished_jobs(text, double precision, integer),
    {schema}.delete_old_events(double precision, integer),
    {schema}.delete_finished_groups(double precision, integer),
    {schema}.sample_queues(double precision, double precision, double precision),
    {schema}.emit_event(text, jsonb, text),
    {schema}.group_scheduled(uuid, uuid[], integer, jsonb),
    {schema}.refuse_callback_group(uuid, text)
    FROM PUBLIC;

-- Roles granted before this migration used some of them through PUBLIC: each keeps what its rights on
-- the job table imply. Roles that update jobs (workers, operators) may be the leader, which samples the
-- queues and deletes what retention frees; roles that insert jobs (producers, workers, operators, the
-- dashboard) emit events and schedule groups.
DO $$
DECLARE
    v_grantee text;
    v_privilege text;
BEGIN
    FOR v_grantee, v_privilege IN
        SELECT DISTINCT CASE WHEN acl.grantee = 0 THEN 'PUBLIC' ELSE acl.grantee::regrole::text END,
               acl.privilege_type
        FROM pg_class AS c, aclexplode(c.relacl) AS acl
        WHERE c.oid = '{schema}.job'::regclass AND acl.privilege_type IN ('INSERT', 'UPDATE')
    LOOP
        IF v_privilege = 'UPDATE' THEN
            EXECUTE format(
                'GRANT EXECUTE ON FUNCTION {schema}.delete_finished_jobs(text, double precision, integer), '
                '{schema}.delete_old_events(double precision, integer), '
                '{schema}.delete_finished_groups(double precision, integer), '
                '{schema}.sample_queues(double precision, double precision, double precision) TO %s',
                v_grantee
            );
        ELSE
            EXECUTE format(
                'GRANT EXECUTE ON FUNCTION {schema}.emit_event(text, jsonb, text), '
                '{schema}.group_scheduled(uuid, uuid[], integer, jsonb), '
                '{schema}.refuse_callback_group(uuid, text) TO %s',
                v_grantee
            );
        END IF;
    END LOOP;
END
$$;
