-- Failure groups written when a job fails. The dashboard's failures page groups the failed jobs among the
-- 20,000 most recently finished by their error, with what varies from job to job folded into
-- placeholders. Folded as the page read them (five regexp_replace calls per failed row), 20,000 failed
-- rows of 150 characters took 0.7 to 1.3 s per request; each statement that makes a job `failed` now
-- stores the fold in `error_group` (a CASE on the status it writes: completions and retries never
-- evaluate it), and the page only groups. Rows failed before this migration, or by a worker of the
-- previous release during a rolling deploy, keep NULL there: the page folds those as it reads them, so
-- they group with the new rows of the same error.
--
-- A nullable column without a default changes the catalog only: the table is not rewritten, and the
-- lock it takes is held for no longer than that.
ALTER TABLE {schema}.job ADD COLUMN error_group text;

-- The one definition of the folding rules, in this order: UUIDs (<id>), e-mail addresses (<email>),
-- quoted values ('...' or "...", not opened inside a word: <str>), hexadecimal ids of 16 digits or more
-- (<id>), numbers at the start of a word (<n>; "S3Error", "utf8" and "job_12" stay). So "user 7 not
-- found" and "user 8 not found" are one group, and so are "no such key 'a'" and "no such key 'b'"; no
-- error at all folds to the empty text. The lookbehind and word-start forms of the last two rules ran
-- three times faster than the same rules written with a captured character before them. A plain SQL
-- expression, IMMUTABLE: the planner inlines it where it is called.
CREATE FUNCTION {schema}.fold_error(p_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
               coalesce(p_error, ''),
               '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'),
               '[[:alnum:]._+-]+@[[:alnum:]-]+(\.[[:alnum:]-]+)+', '<email>', 'g'),
               '(?<![[:alnum:]_])(''[^'']*''|"[^"]*")(?![[:alnum:]_])', '<str>', 'g'),
               '\m[0-9a-f]{16,}\M', '<id>', 'gi'),
               '\m[0-9]+', '<n>', 'g')
$$;

-- A manual retry clears error_group. A role granted only the columns a retry changes (the dashboard role
-- of docs/security.md, granted before this migration) may change this one too, so its retries keep
-- working without new grants; roles with UPDATE on the whole table have it already.
DO $$
DECLARE
    v_grantee regrole;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT acl.grantee::regrole
        FROM pg_attribute AS a, aclexplode(a.attacl) AS acl
        WHERE a.attrelid = '{schema}.job'::regclass AND a.attname = 'status' AND acl.privilege_type = 'UPDATE'
          AND acl.grantee <> 0
    LOOP
        EXECUTE format('GRANT UPDATE (error_group) ON {schema}.job TO %s', v_grantee);
    END LOOP;
END
$$;
