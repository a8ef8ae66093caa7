-- Periodic jobs: declared in code (kept in step with the code by the workers) or added at run time.
-- The leader enqueues each due tick; the row's next_run_at is the unit of exactly-once: a tick is
-- enqueued only by the statement that moves next_run_at past it.
CREATE TABLE {schema}.periodic (
    name           text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 255),
    type           text NOT NULL CHECK (length(type) BETWEEN 1 AND 255),
    cron           text,
    every_seconds  double precision CHECK (every_seconds >= 1),
    timezone       text NOT NULL DEFAULT 'UTC',
    configuration  jsonb NOT NULL DEFAULT '{{}}' CHECK (jsonb_typeof(configuration) = 'object'),
    queue          text NOT NULL DEFAULT 'default',
    priority       integer NOT NULL DEFAULT 0,
    overlap        boolean NOT NULL DEFAULT false,
    enabled        boolean NOT NULL DEFAULT true,
    source         text NOT NULL CHECK (source IN ('code', 'runtime')),
    next_run_at    timestamptz NOT NULL,
    last_run_at    timestamptz,
    last_job_id    uuid,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);
CREATE INDEX periodic_due_idx ON {schema}.periodic (next_run_at) WHERE enabled;
