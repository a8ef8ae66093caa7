-- Producers (web apps that only enqueue): insert jobs and read them back. Dedupe never updates the
-- existing job, so a producer needs neither UPDATE nor DELETE.
GRANT USAGE ON SCHEMA {schema} TO {producer};
GRANT SELECT, INSERT ON {schema}.job TO {producer};
