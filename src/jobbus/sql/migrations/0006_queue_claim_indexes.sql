-- jobbus: no transaction
-- Indexes built without blocking writes (CONCURRENTLY, outside a transaction); `jobbus schema` prints
-- them without CONCURRENTLY, for a fresh schema in one transaction. {concurrently} marks where it goes.

-- The claim walks queued jobs of one queue, one type and one priority in (available_at, id) order:
-- jobs of other queues or types, jobs scheduled for later and finished jobs are never read. Its
-- (queue, type) prefix also serves the loose index scan of queued_pairs().
CREATE INDEX {concurrently} IF NOT EXISTS job_queue_claim_idx
    ON {schema}.job (queue, type, priority DESC, available_at, id) WHERE status = 'queued';

-- The jobs a (dead) worker holds. Indexes only what never changes while a job runs, so lease renewals,
-- checkpoints and progress are HOT updates (no index is touched; measured in docs/capacity.md).
CREATE INDEX {concurrently} IF NOT EXISTS job_running_idx ON {schema}.job (worker_id) WHERE status = 'running';

-- Replaced: the claim index of one walk over every queued job, and the index on lease_expires_at that
-- made every lease renewal a non-HOT update.
DROP INDEX {concurrently} IF EXISTS {schema}.job_claim_idx;
DROP INDEX {concurrently} IF EXISTS {schema}.job_lease_idx;
