-- What `jobbus doctor` checks the fleet by, as each worker reports it in its registry row: how many
-- connections it may open at most (`pool_size`, against the server's max_connections), and its own
-- clock when it last refreshed the row (`clock_at`, against the database's `last_seen_at`: the skew).
-- Nullable columns without a default: the table is not rewritten, and workers of earlier releases,
-- which do not write them, go on as before.
ALTER TABLE {schema}.worker ADD COLUMN IF NOT EXISTS pool_size integer, ADD COLUMN IF NOT EXISTS clock_at timestamptz;
