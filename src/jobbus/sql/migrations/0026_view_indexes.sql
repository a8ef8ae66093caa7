-- jobbus: no transaction
-- The indexes of the operator's views, built without blocking writes (see 0006): every list reaches
-- every matching job along an index in its own order, whatever the table's size (docs/dashboard.md).
-- Each holds only rows of its view, so a job pays for an entry when it enters the view: a finished job
-- one entry, a retrying or parked job one, a failed job one more.

-- Finished jobs by (status, queue, type), each pair in finish order: the completed, failed and
-- cancelled tabs, with or without a queue and a type, and their counts.
CREATE INDEX {concurrently} IF NOT EXISTS job_finished_view_idx
    ON {schema}.job (status, queue, type, finished_at, id) WHERE finished_at IS NOT NULL;

-- Queued jobs after a failed attempt (not parked in a durable wait), by when they run next.
CREATE INDEX {concurrently} IF NOT EXISTS job_retrying_view_idx
    ON {schema}.job (available_at, id)
    WHERE status = 'queued' AND attempts > 0 AND (history -> -1 ->> 'outcome') IS DISTINCT FROM 'waiting';

-- Queued jobs parked in a durable sleep or wait, by when they wake (a wait for an event or children
-- without a timeout wakes at never(), the end of the index).
CREATE INDEX {concurrently} IF NOT EXISTS job_waiting_view_idx
    ON {schema}.job (available_at, id) WHERE status = 'queued' AND (history -> -1 ->> 'outcome') = 'waiting';

-- Failed jobs by failure group, each group in finish order: the failures page over every failed job.
CREATE INDEX {concurrently} IF NOT EXISTS job_failure_group_idx
    ON {schema}.job (error_group, finished_at, id) WHERE status = 'failed';
