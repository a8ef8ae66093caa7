-- Worker registry and the durable control plane.

CREATE TABLE {schema}.worker (
    id                 text PRIMARY KEY,
    host               text NOT NULL,
    pid                integer NOT NULL,
    queues             text[],
    types              text[] NOT NULL DEFAULT '{{}}',
    concurrency        integer NOT NULL,
    state              text NOT NULL DEFAULT 'running'
                       CHECK (state IN ('running', 'paused', 'draining', 'stopping', 'stopped')),
    in_flight          integer NOT NULL DEFAULT 0,
    completed          bigint NOT NULL DEFAULT 0,
    failed             bigint NOT NULL DEFAULT 0,
    acked_generation   bigint NOT NULL DEFAULT 0,
    started_at         timestamptz NOT NULL DEFAULT now(),
    last_seen_at       timestamptz NOT NULL DEFAULT now(),
    stopped_at         timestamptz
);

-- Desired pause state per target: ('all', ''), ('queue', name) or ('worker', id). Durable: a worker
-- started later under a paused target starts paused.
CREATE TABLE {schema}.pause (
    target_kind  text NOT NULL CHECK (target_kind IN ('all', 'queue', 'worker')),
    target       text NOT NULL DEFAULT '',
    paused_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (target_kind, target)
);

-- One-shot commands (drain, stop, restart) and pause/resume changes, numbered by a generation that
-- workers acknowledge in worker.acked_generation.
CREATE TABLE {schema}.command (
    generation   bigserial PRIMARY KEY,
    action       text NOT NULL CHECK (action IN ('pause', 'resume', 'drain', 'stop', 'restart')),
    target_kind  text NOT NULL CHECK (target_kind IN ('all', 'queue', 'worker')),
    target       text NOT NULL DEFAULT '',
    worker_ids   text[] NOT NULL DEFAULT '{{}}',
    issued_at    timestamptz NOT NULL DEFAULT now()
);
