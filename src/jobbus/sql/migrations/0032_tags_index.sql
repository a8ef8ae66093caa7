-- jobbus: no transaction
-- Jobs by tag (`jobbus jobs list --tag`, the dashboard's tag filter, `update_many(tag=...)`), built
-- without blocking writes (see 0006). Only jobs that have tags are in it: a job without pays nothing.
CREATE INDEX {concurrently} IF NOT EXISTS job_tags_idx ON {schema}.job USING gin (tags) WHERE tags IS NOT NULL;
