-- The audit trail (SPEC 22): one row per operator action, written in the transaction of the action.
--
-- Append-only for every role but the schema's owner: no role is granted UPDATE, DELETE or TRUNCATE on
-- it, and rows are written only through record_audit, which runs as the owner and stamps `at` with the
-- transaction's time (a caller cannot date a row). Retention deletes through delete_old_audit, which
-- refuses to delete anything younger than a day, so a worker's role cannot erase the recent trail.
CREATE TABLE IF NOT EXISTS {schema}.audit_log (
    -- Made by the client once per action: an action repeated after a lost connection writes no second row.
    id      uuid PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text NOT NULL CHECK (length(actor) BETWEEN 1 AND 255),
    source  text NOT NULL CHECK (length(source) BETWEEN 1 AND 64),
    action  text NOT NULL CHECK (length(action) BETWEEN 1 AND 64),
    target  text NOT NULL CHECK (length(target) <= 1024),
    details jsonb NOT NULL DEFAULT '{{}}' CHECK (jsonb_typeof(details) = 'object')
);
-- `jobbus audit` and the dashboard's Audit page read newest first, a page after another (keyset on
-- (at, id)); retention deletes from the oldest end.
CREATE INDEX IF NOT EXISTS audit_log_at_idx ON {schema}.audit_log (at, id);
-- Nothing for PUBLIC, even from default privileges; revoked only when there is something to revoke (a
-- REVOKE locks the table on some server versions, and the recorded locks of a migration are the same on all).
DO $revoke$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class AS c, aclexplode(c.relacl) AS acl
               WHERE c.oid = '{schema}.audit_log'::regclass AND acl.grantee = 0) THEN
        REVOKE ALL ON {schema}.audit_log FROM PUBLIC;
    END IF;
END
$revoke$;

CREATE OR REPLACE FUNCTION {schema}.record_audit(p_id uuid, p_actor text, p_source text, p_action text,
                                                 p_target text, p_details jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL, so that creating it reads nothing of the table (an SQL function's body is analysed at
    -- creation, which locks differently from one server version to the next).
    INSERT INTO {schema}.audit_log (id, actor, source, action, target, details)
    VALUES (p_id, p_actor, p_source, p_action, p_target, coalesce(p_details, '{{}}'))
    ON CONFLICT (id) DO NOTHING;
END
$$;

CREATE OR REPLACE FUNCTION {schema}.delete_old_audit(p_older_than_seconds double precision, p_limit integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_deleted integer;
BEGIN
    IF p_older_than_seconds IS NULL OR p_older_than_seconds < 86400 THEN
        RAISE EXCEPTION 'audit entries are kept at least a day (86400 seconds), got %', p_older_than_seconds
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    WITH deleted AS (
        DELETE FROM {schema}.audit_log
        WHERE id = ANY (ARRAY(
            SELECT id FROM {schema}.audit_log
            WHERE at < now() - make_interval(secs => p_older_than_seconds)
            ORDER BY at, id
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ))
        RETURNING 1
    )
    SELECT count(*)::integer INTO v_deleted FROM deleted;
    RETURN v_deleted;
END
$$;
REVOKE EXECUTE ON FUNCTION {schema}.record_audit(uuid, text, text, text, text, jsonb),
    {schema}.delete_old_audit(double precision, integer) FROM PUBLIC;

-- Roles granted before this migration (docs/security.md's grants): those that change or delete jobs
-- (workers, operators, the dashboard, whose UPDATE is on columns) act, so they record; the ones among them that may lead (they may delete
-- finished jobs) delete old entries; those that read the control plane (observers included) read the trail.
DO $grant$
DECLARE
    v_grantee text;
    v_privilege text;
BEGIN
    FOR v_grantee, v_privilege IN
        SELECT DISTINCT acl.grantee::regrole::text, 'UPDATE'
        FROM pg_class AS c, aclexplode(c.relacl) AS acl
        WHERE c.oid = '{schema}.job'::regclass AND acl.privilege_type IN ('UPDATE', 'DELETE') AND acl.grantee <> 0
        UNION
        SELECT DISTINCT p.grantee::regrole::text, 'LEAD'
        FROM pg_proc AS f, aclexplode(f.proacl) AS p
        WHERE f.oid = '{schema}.delete_finished_jobs(text, double precision, integer)'::regprocedure
          AND p.privilege_type = 'EXECUTE' AND p.grantee <> 0
        UNION
        SELECT DISTINCT acl.grantee::regrole::text, 'SELECT'
        FROM pg_class AS c, aclexplode(c.relacl) AS acl
        WHERE c.oid = '{schema}.command'::regclass AND acl.privilege_type = 'SELECT' AND acl.grantee <> 0
    LOOP
        IF v_privilege = 'UPDATE' THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.record_audit(uuid, text, text, text, text, jsonb) TO %s',
                           v_grantee);
        ELSIF v_privilege = 'LEAD' THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION {schema}.delete_old_audit(double precision, integer) TO %s',
                           v_grantee);
        ELSE
            EXECUTE format('GRANT SELECT ON {schema}.audit_log TO %s', v_grantee);
        END IF;
    END LOOP;
END
$grant$;
