-- Producers (web apps that only enqueue): insert jobs and read them back. Dedupe never updates the
-- existing job, so a producer needs neither UPDATE nor DELETE.
GRANT USAGE ON SCHEMA {schema} TO {producer};
GRANT SELECT, INSERT ON {schema}.job TO {producer};
-- With a job, its follow-up (`then=`) and its group's callback; reads show its parent and steps. A
-- follow-up naming a group is refused when the group has a callback: that check reads job_group.
GRANT INSERT ON {schema}.job_follow_up TO {producer};
GRANT SELECT, INSERT ON {schema}.job_group TO {producer};
GRANT SELECT ON {schema}.job_step, {schema}.job_child TO {producer};
-- Events (`emit_event`) and groups (`schedule_group`, and the check that a follow-up's group has no
-- callback) go through functions that run as the schema's owner.
GRANT EXECUTE ON FUNCTION {schema}.emit_event(text, jsonb, text),
    {schema}.group_scheduled(uuid, uuid[], integer, jsonb), {schema}.refuse_callback_group(uuid, text)
    TO {producer};
-- The SQL API (docs/sql.md): the same rights, through two functions.
GRANT EXECUTE ON FUNCTION {schema}.schedule(text, jsonb, jsonb), {schema}.schedule_many(jsonb) TO {producer};
-- Weighted jobs are checked against their queue's limits, and `consume` spends rate units, through
-- functions that run as the schema's owner.
GRANT EXECUTE ON FUNCTION {schema}.refuse_heavy_jobs(text[], boolean[], integer[], text) TO {producer};
GRANT EXECUTE ON FUNCTION {schema}.spend_units(uuid, text, text, integer) TO {producer};
-- Uniqueness windows and debounce (`unique_for=`, `debounce=`) go through schedule_keyed, which runs as
-- the schema's owner: a debounced call gives a queued job a later call's configuration.
GRANT EXECUTE ON FUNCTION {schema}.schedule_keyed(jsonb, text) TO {producer};
-- The audit trail is append-only (producers take no operator action, so they record nothing).
REVOKE UPDATE, DELETE, TRUNCATE ON {schema}.audit_log FROM {producer};
