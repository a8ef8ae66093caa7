-- Least-privilege grants for one jobbus schema, to existing roles. Run as the role that owns the schema
-- (the one that ran `jobbus migrate`).

GRANT USAGE ON SCHEMA {schema} TO {worker}, {operator}, {observer};

-- Producers and workers: schedule jobs, claim them, renew leases, write outcomes, keep the registry row
-- fresh and read the control plane. No DELETE, no DDL.
GRANT SELECT, INSERT, UPDATE ON {schema}.job TO {worker}, {operator};
GRANT SELECT, INSERT, UPDATE ON {schema}.worker TO {worker}, {operator};
GRANT SELECT ON {schema}.pause, {schema}.command, {schema}.migration TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.uuid_generate_v7() TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.claim_jobs(text, integer, text[], text[], double precision, integer, text[]),
    {schema}.take_from_queue(text, text[], integer, uuid[]), {schema}.queued_pairs()
    TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.claim_jobs(text, integer, text[], text[], double precision, integer, text[], integer) TO {worker}, {operator};
-- The leader (any worker may be elected): the leadership lease, queue samples (through a function that
-- keeps its tallies as the schema owner), and retention through a function that deletes expired finished
-- jobs and nothing else.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.leader TO {worker}, {operator};
GRANT SELECT, INSERT, DELETE ON {schema}.queue_stat TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.delete_finished_jobs(text, double precision, integer) TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.sample_queues(double precision, double precision, double precision) TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.delete_old_events(double precision, integer),
    {schema}.delete_finished_groups(double precision, integer)
    TO {worker}, {operator};
-- Flow control: claims of limited queues lock their settings row, record starts and take turns of jobs
-- without a key.
GRANT SELECT, UPDATE ON {schema}.queue_setting TO {worker};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.queue_setting TO {operator};
GRANT SELECT, INSERT, DELETE ON {schema}.queue_start TO {worker}, {operator};
-- Keyed claims keep the keys of their queue and read the notes producers and outcomes leave (which the
-- triggers write as the schema owner).
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.queue_key TO {worker}, {operator};
GRANT SELECT, DELETE ON {schema}.queue_key_note TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.take_limited(text, text[], integer, uuid[], double precision),
    {schema}.take_per_key({schema}.queue_setting, text[], integer, integer, uuid[], timestamptz, double precision),
    {schema}.take_from_key(text, text, text[], integer, uuid[]),
    {schema}.take_unkeyed(text, text[], integer, uuid[], timestamptz),
    {schema}.read_key_notes(text), {schema}.key_next_at(text, text)
    TO {worker}, {operator};
-- Weights: claims fit weighted jobs to their budget; schedules of weighted jobs check them against the
-- queue's limits, `consume` spends rate units and lowering a limit checks the weights of queued jobs
-- (functions that run as the schema owner).
GRANT EXECUTE ON FUNCTION {schema}.fit_weights(uuid[], integer) TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.refuse_heavy_jobs(text[], boolean[], integer[], text) TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.spend_units(uuid, text, text, integer) TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.refuse_limits_below_weights(text, integer, integer, integer, integer) TO {operator};
-- Periodic jobs: workers store the ones their code declares and the leader enqueues their ticks.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.periodic TO {worker}, {operator};
-- Workflows: whatever finishes a job (an outcome, a recovery, a cancel) schedules its follow-up and its
-- group's callback; handlers store steps, park on events and children. Events are emitted through the
-- function emit_event, which runs as the schema owner.
GRANT SELECT, INSERT ON {schema}.job_follow_up, {schema}.job_child TO {worker}, {operator};
GRANT SELECT, INSERT, UPDATE ON {schema}.job_group, {schema}.job_step, {schema}.job_parent TO {worker}, {operator};
GRANT SELECT ON {schema}.event TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.emit_event(text, jsonb, text),
    {schema}.group_scheduled(uuid, uuid[], integer, jsonb), {schema}.refuse_callback_group(uuid, text)
    TO {worker}, {operator};
GRANT SELECT, INSERT, DELETE ON {schema}.event_wait TO {worker}, {operator};
-- Jobs with a uniqueness window or debounce (handlers spawn them, follow-ups name them): schedule_keyed.
GRANT EXECUTE ON FUNCTION {schema}.schedule_keyed(jsonb, text) TO {worker}, {operator};

-- Operators (the CLI): in addition, control commands, pruning, and forgetting old registry rows.
GRANT DELETE ON {schema}.job, {schema}.worker TO {operator};
GRANT INSERT, DELETE ON {schema}.pause TO {operator};
GRANT INSERT, DELETE ON {schema}.command TO {operator};
GRANT USAGE ON SEQUENCE {schema}.command_generation_seq TO {operator};

-- Observers (dashboards, `jobbus status` for on-call): read only.
GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {observer};

-- The audit trail: every role that acts records through record_audit (it runs as the schema's owner),
-- the leader deletes old entries through delete_old_audit, and none may change or delete a row itself.
GRANT EXECUTE ON FUNCTION {schema}.record_audit(uuid, text, text, text, text, jsonb) TO {worker}, {operator};
GRANT EXECUTE ON FUNCTION {schema}.delete_old_audit(double precision, integer) TO {worker}, {operator};
GRANT SELECT ON {schema}.audit_log TO {worker}, {operator}, {observer};
REVOKE UPDATE, DELETE, TRUNCATE ON {schema}.audit_log FROM PUBLIC, {worker}, {operator}, {observer};
