-- jobbus: no transaction
-- Indexes of flow control, built without blocking writes (see 0006 for {concurrently}).

-- Keyed claims walk one key of one queue, per type and priority, from its oldest available job. Only
-- jobs with a concurrency key are in it: jobs without one cost inserts nothing more.
CREATE INDEX {concurrently} IF NOT EXISTS job_key_claim_idx
    ON {schema}.job (queue, concurrency_key, type, priority DESC, available_at, id)
    WHERE status = 'queued' AND concurrency_key IS NOT NULL;

-- What runs per queue and per key, for the limits: running rows only, and nothing a lease renewal
-- changes, so renewals stay HOT.
CREATE INDEX {concurrently} IF NOT EXISTS job_running_queue_idx
    ON {schema}.job (queue, concurrency_key) WHERE status = 'running';
