-- Worker instances, their own timing, commands routed by target, and a server-side payload bound.

-- Each worker process registers a fresh instance id. A second process under the same worker id is
-- refused while the first is live; acknowledgements and registry refreshes are fenced by the instance,
-- so a restart under the same id never counts as the old process having applied a command.
ALTER TABLE {schema}.worker
    ADD COLUMN instance_id uuid,
    -- The worker's own settings: `status`/`workers` and the leader judge it by these, not by theirs.
    ADD COLUMN lease_seconds double precision NOT NULL DEFAULT 300,
    ADD COLUMN dead_after_seconds double precision NOT NULL DEFAULT 15,
    ADD COLUMN heartbeat_seconds double precision NOT NULL DEFAULT 5,
    -- Set when a silent worker was declared dead and its jobs recovered; cleared when it speaks again.
    ADD COLUMN declared_dead_at timestamptz;

-- Job columns of the production queue: a timeout per job (the handler's when NULL), the key that
-- per-key concurrency and rate limits count by, and the history of the job's attempts (what each ended
-- in: retried, snoozed, released, timed out, recovered, ...), kept bounded. ADD COLUMN with a constant
-- default changes the catalog only (no table rewrite).
ALTER TABLE {schema}.job
    ADD COLUMN timeout_seconds double precision,
    ADD COLUMN concurrency_key text,
    ADD COLUMN history jsonb NOT NULL DEFAULT '[]';

-- The workers (and their instances) a command was addressed to when it was issued: what `--wait`
-- waits for. Routing does not use this snapshot: a worker applies every command issued after it
-- started whose target matches it when it next reads control, also after an outage.
ALTER TABLE {schema}.command
    ADD COLUMN instance_ids uuid[] NOT NULL DEFAULT '{{}}';
