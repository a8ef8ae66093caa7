-- jobbus: no transaction
-- Expiry concerns jobs never started (migration 0023): the rescuer's sweep and the claim's bulk
-- cancellation walk only those, so a retrying job or a parked workflow past its expires_at is not in
-- their index to be stepped over at every pass. Built without blocking writes (see 0006).
CREATE INDEX {concurrently} IF NOT EXISTS job_unstarted_expiry_idx
    ON {schema}.job (expires_at) WHERE status = 'queued' AND expires_at IS NOT NULL AND started_at IS NULL;

DROP INDEX {concurrently} IF EXISTS {schema}.job_expiry_idx;
