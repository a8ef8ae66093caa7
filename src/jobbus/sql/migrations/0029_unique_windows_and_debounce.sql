-- jobbus: no transaction
-- Uniqueness windows and debounce (`unique_for=`, `debounce=`): two nullable columns without a default
-- (no rewrite; producers and workers of earlier releases, which do not write them, go on as before),
-- and the indexes built without blocking writes (see 0006). Their functions follow in 0030.
--
-- unique_until: set on a job scheduled with a window, the end of that window (created_at + unique_for);
-- retention and prune keep the job until then, so a window is never shortened by a delete.
-- debounce_until: set while a debounced job waits behind a run of its key (parked at never(), so no
-- claim takes it): when that run ends, it becomes available at this time (or at once if that passed).
-- The CHECK keeps a parked job parked: no statement can make it available (so no claim can start it)
-- without clearing debounce_until, which the release does: two runs of one key are never in flight.
-- A parked job may still end without running (cancelled, expired, deleted).
-- One statement, repeatable: a run stopped after it drops and adds the constraint again.
ALTER TABLE {schema}.job
    DROP CONSTRAINT IF EXISTS job_debounce_parked_check,
    ADD COLUMN IF NOT EXISTS unique_until timestamptz,
    ADD COLUMN IF NOT EXISTS debounce_until timestamptz,
    ADD CONSTRAINT job_debounce_parked_check
        CHECK (debounce_until IS NULL OR available_at >= '9000-01-01 00:00:00+00') NOT VALID;

ALTER TABLE {schema}.job VALIDATE CONSTRAINT job_debounce_parked_check;

-- The (type, unique_key) of every keyed job in scheduling order: a window's lookup ("scheduled less than
-- unique_for ago") and debounce's look at a key's rows. Jobs without a key have no entry.
CREATE INDEX {concurrently} IF NOT EXISTS job_unique_key_idx
    ON {schema}.job (type, unique_key, created_at) WHERE unique_key IS NOT NULL;

-- Parked debounced jobs: what the end of a keyed run looks for (almost always nothing).
CREATE INDEX {concurrently} IF NOT EXISTS job_debounce_parked_idx
    ON {schema}.job (type, unique_key) WHERE debounce_until IS NOT NULL AND status = 'queued';

-- Deduplication as before (SPEC 2: at most one active job per (type, unique_key)), except a debounced
-- job parked behind a run of its key: the one queued beside one running that SPEC 21 allows. Built
-- beside the old index, which is then dropped and its name given to the new one. Every ON CONFLICT of
-- the producers names no conflict target, so they meet whichever unique index exists.
CREATE UNIQUE INDEX {concurrently} IF NOT EXISTS job_unique_active_debounce_idx
    ON {schema}.job (type, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('queued', 'running') AND debounce_until IS NULL;

DROP INDEX {concurrently} IF EXISTS {schema}.job_unique_active_idx;

ALTER INDEX IF EXISTS {schema}.job_unique_active_debounce_idx RENAME TO job_unique_active_idx;
