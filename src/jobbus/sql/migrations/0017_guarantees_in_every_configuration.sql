-- Guarantees in every configuration (SPEC 1 and 16), the holes an acceptance review found.

-- 1. `configuration_data` never changes: the trigger of migration 0001 compared the values as jsonb, and
--    jsonb holds 1 and 1.0 equal, so an UPDATE could turn an integer of the configuration into a float
--    (or 1e2 into 100) unrefused. Now any UPDATE that changes the stored text is refused; one that
--    writes back exactly what is stored (an ORM saving every column) changes nothing and passes.
CREATE OR REPLACE FUNCTION {schema}.reject_configuration_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.configuration_data::text IS DISTINCT FROM OLD.configuration_data::text THEN
        RAISE EXCEPTION 'configuration_data of job % is immutable', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
