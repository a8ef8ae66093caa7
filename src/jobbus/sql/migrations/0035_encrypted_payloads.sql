-- Encryption at rest (SPEC 22): `jobbus keys rotate` re-encrypts a job's configuration with the newest key.
-- The configuration stays immutable; a re-encryption is the one other change it may take, when the
-- session names the job in `jobbus.rekey` and the new value is a sealed payload (one key,
-- "$jobbus.encrypted"). Without the key nobody can write a sealed value that opens for that job (the
-- cipher binds each payload to its job), so this cannot be used to change what a job does.
CREATE OR REPLACE FUNCTION {schema}.reject_configuration_change()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NEW.configuration_data::text IS DISTINCT FROM OLD.configuration_data::text
       -- debounce (schedule_keyed) gives a queued job that never started the configuration of a later call
       AND NOT (OLD.status = 'queued' AND OLD.started_at IS NULL
                AND current_setting('jobbus.debounce', true) IS NOT DISTINCT FROM OLD.id::text)
       -- key rotation re-encrypts it (jobbus keys rotate)
       AND NOT (current_setting('jobbus.rekey', true) IS NOT DISTINCT FROM 'on'
                AND NEW.configuration_data ? '$jobbus.encrypted'
                AND (SELECT count(*) FROM jsonb_object_keys(NEW.configuration_data)) = 1) THEN
        RAISE EXCEPTION 'configuration_data of job % is immutable', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$function$;
