-- Named queries of key rotation (`jobbus keys rotate`, jobbus/rotation.py). Each block starts with
-- `-- name: <query_name>`; {schema} is the quoted schema identifier. Pages are read in key order without
-- locks, as text, and written back with compare-and-set on that text: a value a worker wrote meanwhile is kept (the next pass
-- reads it again), so rotation never overwrites a newer checkpoint or result. %(done)s is the LIKE
-- pattern of a payload sealed with the newest key ('1.<key id>.%%'); a value is done when it is that,
-- empty ({{}}, null, SQL NULL) or, for a checkpoint, only the producer's trace context.

-- name: rekey_jobs_left
-- Jobs with a configuration, checkpoint or result to re-encrypt: the progress's total.
SELECT count(*)
FROM {schema}.job AS j
WHERE NOT (j.configuration_data = '{{}}'::jsonb OR coalesce(j.configuration_data ->> '$jobbus.encrypted' LIKE %(done)s, false))
   OR NOT (j.execution_data - '_trace' = '{{}}'::jsonb OR coalesce(j.execution_data ->> '$jobbus.encrypted' LIKE %(done)s, false))
   OR NOT (j.result IS NULL OR j.result = 'null'::jsonb OR coalesce(j.result ->> '$jobbus.encrypted' LIKE %(done)s, false));

-- name: rekey_jobs_page
-- The next jobs after %(after)s with a payload to re-encrypt.
SELECT j.id, j.type, j.configuration_data::text, j.execution_data::text, j.result::text
FROM {schema}.job AS j
WHERE j.id > %(after)s
  AND (NOT (j.configuration_data = '{{}}'::jsonb OR coalesce(j.configuration_data ->> '$jobbus.encrypted' LIKE %(done)s, false))
       OR NOT (j.execution_data - '_trace' = '{{}}'::jsonb OR coalesce(j.execution_data ->> '$jobbus.encrypted' LIKE %(done)s, false))
       OR NOT (j.result IS NULL OR j.result = 'null'::jsonb OR coalesce(j.result ->> '$jobbus.encrypted' LIKE %(done)s, false)))
ORDER BY j.id
LIMIT %(limit)s;

-- name: rekey_jobs
-- Compare-and-set of a page: each column takes its new value only while it still holds the value read.
-- The configuration's immutability trigger lets a sealed value replace it while `jobbus.rekey` is on
-- (set for this statement's transaction by the join, before any row is written). Returns per job
-- whether each column took its new value.
UPDATE {schema}.job AS j
SET configuration_data = CASE WHEN j.configuration_data = v.old_c THEN v.new_c ELSE j.configuration_data END,
    execution_data = CASE WHEN j.execution_data = v.old_e THEN v.new_e ELSE j.execution_data END,
    result = CASE WHEN j.result IS NOT DISTINCT FROM v.old_r THEN v.new_r ELSE j.result END
FROM unnest(%(ids)s::uuid[], %(old_c)s::jsonb[], %(new_c)s::jsonb[], %(old_e)s::jsonb[], %(new_e)s::jsonb[],
            %(old_r)s::jsonb[], %(new_r)s::jsonb[]) AS v(id, old_c, new_c, old_e, new_e, old_r, new_r),
     (SELECT set_config('jobbus.rekey', 'on', true)) AS rekey
WHERE j.id = v.id
RETURNING j.id, j.configuration_data = v.new_c AND j.execution_data = v.new_e
                AND j.result IS NOT DISTINCT FROM v.new_r;

-- name: rekey_steps_page
-- The next results of `job.step` after (%(after_job)s, %(after_name)s) to re-encrypt. The steps of durable
-- waits (sleep:, event:, spawn:) are written and read by the database's functions: they stay in clear.
SELECT s.job_id, s.name, j.type, s.result::text
FROM {schema}.job_step AS s JOIN {schema}.job AS j ON j.id = s.job_id
WHERE (s.job_id, s.name) > (%(after_job)s, %(after_name)s)
  AND left(s.name, 6) NOT IN ('sleep:', 'event:', 'spawn:')
  AND NOT (s.result IS NULL OR s.result = 'null'::jsonb OR coalesce(s.result ->> '$jobbus.encrypted' LIKE %(done)s, false))
ORDER BY s.job_id, s.name
LIMIT %(limit)s;

-- name: rekey_steps
UPDATE {schema}.job_step AS s
SET result = v.new
FROM unnest(%(ids)s::uuid[], %(names)s::text[], %(old)s::jsonb[], %(new)s::jsonb[]) AS v(job_id, name, old, new)
WHERE s.job_id = v.job_id AND s.name = v.name AND s.result = v.old
RETURNING s.job_id;

-- name: rekey_follow_ups_page
-- Follow-ups not scheduled yet (`then=`): their specs hold the configurations of jobs to come.
SELECT f.job_id, f.spec::text FROM {schema}.job_follow_up AS f
WHERE f.job_id > %(after)s ORDER BY f.job_id LIMIT %(limit)s;

-- name: rekey_follow_ups
UPDATE {schema}.job_follow_up AS f SET spec = v.new
FROM unnest(%(ids)s::uuid[], %(old)s::jsonb[], %(new)s::jsonb[]) AS v(id, old, new)
WHERE f.job_id = v.id AND f.spec = v.old
RETURNING f.job_id;

-- name: rekey_groups_page
-- Group callbacks not scheduled yet.
SELECT g.group_id, g.spec::text FROM {schema}.job_group AS g
WHERE g.group_id > %(after)s AND g.scheduled_at IS NULL ORDER BY g.group_id LIMIT %(limit)s;

-- name: rekey_groups
UPDATE {schema}.job_group AS g SET spec = v.new
FROM unnest(%(ids)s::uuid[], %(old)s::jsonb[], %(new)s::jsonb[]) AS v(id, old, new)
WHERE g.group_id = v.id AND g.spec = v.old
RETURNING g.group_id;

-- name: rekey_snapshots_page
-- The children a parent's `wait_for_children` answered, kept for its later runs.
SELECT p.parent_id, p.snapshots::text FROM {schema}.job_parent AS p
WHERE p.parent_id > %(after)s AND p.snapshots IS NOT NULL ORDER BY p.parent_id LIMIT %(limit)s;

-- name: rekey_snapshots
UPDATE {schema}.job_parent AS p SET snapshots = v.new
FROM unnest(%(ids)s::uuid[], %(old)s::jsonb[], %(new)s::jsonb[]) AS v(id, old, new)
WHERE p.parent_id = v.id AND p.snapshots = v.old
RETURNING p.parent_id;
