-- Named queries of `jobbus doctor`: what the server, its standbys, its sessions and the worker registry
-- say about the health of a jobbus database. Read-only, each one round trip; none locks anything.

-- name: doctor_server
-- The server's version, its connection budget (what ordinary roles may open) and autovacuum, globally
-- and on the job table (a storage parameter `autovacuum_enabled = false` turns it off there alone).
-- `track_counts` off turns autovacuum off too, whatever it says.
SELECT current_setting('server_version_num')::int,
       current_setting('server_version'),
       current_setting('max_connections')::int,
       current_setting('superuser_reserved_connections')::int,
       current_setting('autovacuum')::bool AND current_setting('track_counts')::bool,
       (SELECT coalesce(bool_and(option_value::bool), true)
          FROM pg_options_to_table((SELECT reloptions FROM pg_class WHERE oid = to_regclass(%(job_table)s)))
         WHERE option_name = 'autovacuum_enabled'),
       to_regclass(%(job_table)s) IS NOT NULL;

-- name: doctor_schema_version
SELECT coalesce(max(version), 0) FROM {schema}.migration;

-- name: doctor_standbys
-- The standbys streaming from this server and whether each is synchronous (`sync` or `quorum`).
-- Without pg_monitor (or superuser) a role sees the rows but not their state: `sync_state` is NULL.
SELECT coalesce(nullif(application_name, ''), host(client_addr), pid::text), sync_state
FROM pg_stat_replication
ORDER BY 1;

-- name: doctor_workers
-- The live workers (not stopped, refreshed within the shorter of their lease and dead-after time),
-- with the connections each may open and its clock's lead over the database's at its last refresh.
-- Workers of releases before version 27 of the schema leave both NULL.
SELECT id, host, pool_size, extract(epoch FROM clock_at - last_seen_at)::float8
FROM {schema}.worker
WHERE state <> 'stopped'
  AND last_seen_at >= now() - make_interval(secs => least(lease_seconds, dead_after_seconds))
ORDER BY id;

-- name: doctor_idle_transactions
-- Sessions of this database idle inside a transaction for longer than %(seconds)s: each holds its
-- snapshot (vacuum cannot remove the job rows that finished since) and its locks.
SELECT pid, usename, coalesce(nullif(application_name, ''), host(client_addr), 'local'),
       extract(epoch FROM now() - state_change)::float8
FROM pg_stat_activity
WHERE state IN ('idle in transaction', 'idle in transaction (aborted)')
  AND datname = current_database()
  AND now() - state_change > make_interval(secs => %(seconds)s)
ORDER BY state_change;
