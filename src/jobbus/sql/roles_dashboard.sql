-- The web dashboard with its actions (retry, cancel, delete, run now, pause, resume, drain, stop, restart, limits,
-- periodic pause/resume/run now). A read-only dashboard needs only the observer role.
GRANT USAGE ON SCHEMA {schema} TO {dashboard};
GRANT SELECT ON {schema}.job, {schema}.worker, {schema}.pause, {schema}.command, {schema}.migration,
    {schema}.leader, {schema}.queue_stat, {schema}.queue_setting, {schema}.periodic TO {dashboard};
-- Retry and cancel change these columns and no other (the job's input stays as it is; a retry adds an
-- entry to the history); the bulk edit of queued jobs changes priority, queue and tags besides (and the
-- start of a debounced job parked behind a run of its key, debounce_until).
GRANT UPDATE (status, attempts, available_at, finished_at, cancellation_requested_at, result, error_group, history,
              priority, queue, tags, debounce_until)
    ON {schema}.job TO {dashboard};
-- Delete (one job or in bulk): a queued or finished job goes, its steps and workflow rows with it (the
-- trigger job_deleted, which runs as the schema's owner, removes those).
GRANT DELETE ON {schema}.job TO {dashboard};
-- "Run now" of a periodic job inserts its job and moves the periodic row's bookkeeping.
GRANT INSERT ON {schema}.job TO {dashboard};
GRANT UPDATE ON {schema}.periodic TO {dashboard};
-- Control commands: the durable pause state, the command log (its lock needs DELETE, as the operator's).
GRANT INSERT, DELETE ON {schema}.pause TO {dashboard};
GRANT INSERT, DELETE ON {schema}.command TO {dashboard};
GRANT USAGE ON SEQUENCE {schema}.command_generation_seq TO {dashboard};
-- Queue limits.
GRANT INSERT, UPDATE, DELETE ON {schema}.queue_setting TO {dashboard};
-- A limit lowered below the weight of a queued job is refused by a function that reads the job table as
-- the schema's owner.
GRANT EXECUTE ON FUNCTION {schema}.refuse_limits_below_weights(text, integer, integer, integer, integer) TO {dashboard};
-- A job of weight > 1 moved to another queue by the bulk edit is checked against that queue's limits.
GRANT EXECUTE ON FUNCTION {schema}.refuse_heavy_jobs(text[], boolean[], integer[], text) TO {dashboard};
-- Workflows: a job's steps and children on its page; a retry or cancel that makes a job terminal (or
-- reopens it) moves its group's and its parent's counts and schedules callbacks, in the same transaction.
GRANT SELECT ON {schema}.job_follow_up, {schema}.job_child, {schema}.job_step, {schema}.event,
    {schema}.event_wait TO {dashboard};
GRANT SELECT, INSERT, UPDATE ON {schema}.job_group, {schema}.job_parent TO {dashboard};
GRANT INSERT ON {schema}.job_follow_up TO {dashboard};
-- The audit trail: the dashboard's actions record through record_audit; its Audit page reads the trail.
GRANT EXECUTE ON FUNCTION {schema}.record_audit(uuid, text, text, text, text, jsonb) TO {dashboard};
GRANT SELECT ON {schema}.audit_log TO {dashboard};
REVOKE UPDATE, DELETE, TRUNCATE ON {schema}.audit_log FROM {dashboard};
