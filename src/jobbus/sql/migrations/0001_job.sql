-- The job table, its invariants and the indexes behind every hot query.
-- {schema} is replaced by the validated, quoted schema identifier.

CREATE FUNCTION {schema}.uuid_generate_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    -- 48-bit Unix milliseconds, then version 7 and the RFC 4122 variant over random bits.
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                    PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$;

CREATE TABLE {schema}.job (
    id                        uuid PRIMARY KEY,
    type                      text NOT NULL CHECK (length(type) BETWEEN 1 AND 255),
    queue                     text NOT NULL DEFAULT 'default' CHECK (length(queue) BETWEEN 1 AND 255),
    name                      text,
    group_id                  uuid,
    unique_key                text,
    priority                  integer NOT NULL DEFAULT 0,
    status                    text NOT NULL DEFAULT 'queued'
                              CHECK (status IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
    configuration_data        jsonb NOT NULL DEFAULT '{{}}' CHECK (jsonb_typeof(configuration_data) = 'object'),
    execution_data            jsonb NOT NULL DEFAULT '{{}}',
    progress_current          double precision,
    progress_total            double precision,
    result                    jsonb,
    attempts                  integer NOT NULL DEFAULT 0,
    max_attempts              integer NOT NULL CHECK (max_attempts >= 1),
    available_at              timestamptz NOT NULL DEFAULT now(),
    lease_token               uuid,
    lease_expires_at          timestamptz,
    worker_id                 text,
    cancellation_requested_at timestamptz,
    last_error                text,
    created_at                timestamptz NOT NULL DEFAULT now(),
    started_at                timestamptz,
    finished_at               timestamptz
) WITH (fillfactor = 85);

-- Claim order is (priority DESC, available_at, id) among queued rows; the partial index holds only
-- queued rows, so millions of finished rows never enter the claim's scan.
CREATE INDEX job_claim_idx ON {schema}.job (priority DESC, available_at, id) WHERE status = 'queued';
-- Recovery of expired leases scans only running rows.
CREATE INDEX job_lease_idx ON {schema}.job (lease_expires_at) WHERE status = 'running';
-- Deduplication: one active job per (type, unique_key).
CREATE UNIQUE INDEX job_unique_active_idx ON {schema}.job (type, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('queued', 'running');
CREATE INDEX job_group_idx ON {schema}.job (group_id) WHERE group_id IS NOT NULL;
-- Pruning and "finished in the last hour" reads.
CREATE INDEX job_finished_idx ON {schema}.job (finished_at) WHERE finished_at IS NOT NULL;

CREATE FUNCTION {schema}.reject_configuration_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.configuration_data IS DISTINCT FROM OLD.configuration_data THEN
        RAISE EXCEPTION 'configuration_data of job % is immutable', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER job_configuration_immutable
    BEFORE UPDATE OF configuration_data ON {schema}.job
    FOR EACH ROW EXECUTE FUNCTION {schema}.reject_configuration_change();
