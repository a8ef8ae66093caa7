"""How fast each dashboard page answers on a big job table: `make bench-dashboard`.

    .venv/bin/python bench/dashboard.py                         # 10M finished + 100k queued jobs
    .venv/bin/python bench/dashboard.py --rows 1000000          # a smaller table
    .venv/bin/python bench/dashboard.py --keep                  # reuse the table of the last run

The data goes into its own database on the server at BENCH_DSN (default: the test server), built
once with INSERT ... SELECT generate_series in batches (completed 95 %, failed 3 %, cancelled 2 %,
finished over the last week, 30 error messages, 1 % of jobs in groups, 5 queues, 20 types), then
20,000 failed jobs, with messages of about 150 characters whose ids, addresses, quoted values and
numbers vary from job to job, and 20 jobs of a rare type older than all the others (the worst filter of
a finished tab). Failed rows carry
their failure group as a worker writes it (the function fold_error). Then VACUUM ANALYZE, an hour of
queue samples, 8 worker rows and a periodic job. Each page is requested
`--requests` times through the ASGI application in this process (queries, rendering, no network)
after two warm-up requests, and the table prints p50, p95 and the worst time per page.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

import jobbus  # noqa: E402
from jobbus import schema as jobbus_schema  # noqa: E402
from jobbus import search  # noqa: E402
from jobbus.dashboard import create_app  # noqa: E402

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DATABASE = "jbb_dashboard"
BATCH = 500_000
TARGET_P95_MS = 150.0

FINISHED_SQL = """
INSERT INTO jobbus.job (id, type, queue, name, group_id, status, configuration_data, execution_data, result,
                        attempts, max_attempts, available_at, created_at, started_at, finished_at, worker_id,
                        last_error, error_group, history)
SELECT jobbus.uuid_generate_v7(),
       'type.' || (n %% 20),
       'queue-' || (n %% 5),
       CASE WHEN n %% 10 = 0 THEN 'report ' || n END,
       CASE WHEN n %% 100 = 0 THEN ('00000000-0000-4000-8000-' || lpad(to_hex(n / 1000), 12, '0'))::uuid END,
       s.status,
       jsonb_build_object('n', n, 'to', 'user' || n || '@example.com'),
       '{}'::jsonb,
       CASE WHEN s.status = 'completed' THEN jsonb_build_object('ok', true) END,
       1, 3, at, at, at, at + interval '1 second', 'worker-' || (n %% 8),
       e.error, jobbus.fold_error(e.error),
       '[]'::jsonb
FROM generate_series(%(start)s::bigint, %(stop)s::bigint) AS n,
     LATERAL (SELECT CASE WHEN n %% 100 < 95 THEN 'completed' WHEN n %% 100 < 98 THEN 'failed'
                          ELSE 'cancelled' END AS status,
                     now() - interval '1 minute'
                     - make_interval(secs => 604800.0 * (%(rows)s - n) / %(rows)s) AS at) AS s,
     LATERAL (SELECT CASE WHEN s.status = 'failed'
                          THEN 'ReportError' || (n %% 30) || ': report ' || n || ' could not be rendered' END
              AS error) AS e
"""

# The failures page's worst case, after the rows above: the whole window of the page (the 20,000 most
# recently finished jobs) failed, each message ~150 characters folding to one of 30 groups, with a UUID,
# an address, a quoted value, a 32-digit hex id and numbers that vary from job to job.
RECENT_FAILURES = 20_000
RECENT_FAILURES_SQL = """
INSERT INTO jobbus.job (id, type, queue, status, configuration_data, execution_data, attempts, max_attempts,
                        available_at, created_at, started_at, finished_at, worker_id, last_error, error_group,
                        history)
SELECT jobbus.uuid_generate_v7(), 'type.' || (n %% 20), 'queue-' || (n %% 5), 'failed', jsonb_build_object('n', n),
       '{}'::jsonb, 3, 3, at, at, at, at, 'worker-' || (n %% 8), e.error, jobbus.fold_error(e.error), '[]'::jsonb
FROM generate_series(1, %(failures)s) AS n,
     LATERAL (SELECT now() - make_interval(secs => (%(failures)s - n) * 0.002) AS at) AS s,
     LATERAL (SELECT 'InvoiceError' || (n %% 30) || ': invoice ''INV-' || n || ''' of user' || (n %% 997)
                     || '@example.com refused by ' || gen_random_uuid() || ' after ' || (n %% 5000)
                     || ' ms (digest ' || md5(n::text) || ')' AS error) AS e
"""

# The worst filter of a finished tab: a type of 20 jobs, the oldest of the table, under millions completed.
RARE_SQL = """
INSERT INTO jobbus.job (id, type, queue, status, configuration_data, execution_data, attempts, max_attempts,
                        available_at, created_at, started_at, finished_at, history)
SELECT jobbus.uuid_generate_v7(), 'type.rare', 'queue-0', 'completed', jsonb_build_object('n', n), '{}'::jsonb, 1, 3,
       at, at, at, at, '[]'::jsonb
FROM generate_series(1, 20) AS n, LATERAL (SELECT now() - interval '8 days' - n * interval '1 s' AS at) AS s
"""

QUEUED_SQL = """
INSERT INTO jobbus.job (id, type, queue, configuration_data, max_attempts, available_at, created_at, priority)
SELECT jobbus.uuid_generate_v7(), 'type.' || (n %% 20), 'queue-' || (n %% 5), jsonb_build_object('n', n), 3,
       now() + make_interval(secs => CASE WHEN n %% 10 = 0 THEN 3600 ELSE -60 END), now(), (n %% 3)
FROM generate_series(1, %(queued)s) AS n
"""

SAMPLES_SQL = """
INSERT INTO jobbus.queue_stat (sampled_at, queue, available, scheduled, running, completed, failed, cancelled,
                               oldest_available_seconds)
SELECT date_trunc('second', now()) - make_interval(secs => 10 * s), 'queue-' || q, 18000 + s, 2000, 8,
       300 + (s %% 50), s %% 7, 0, 60 + s
FROM generate_series(0, 359) AS s, generate_series(0, 4) AS q
"""


def database_dsn(server: str) -> str:
    return psycopg.conninfo.make_conninfo(server, dbname=DATABASE)


def build(server: str, rows: int, queued: int) -> None:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    dsn = database_dsn(server)
    with psycopg.connect(dsn, autocommit=True) as conn:
        jobbus_schema.migrate(conn, "jobbus")
        started = time.monotonic()
        for start in range(1, rows + 1, BATCH):
            stop = min(rows, start + BATCH - 1)
            conn.execute(FINISHED_SQL.encode(), {"start": start, "stop": stop, "rows": rows})
            print(f"  {stop:>11,} finished jobs ({time.monotonic() - started:.0f} s)", flush=True)
        conn.execute(RECENT_FAILURES_SQL.encode(), {"failures": RECENT_FAILURES})
        print(f"  {RECENT_FAILURES:>11,} recent failures ({time.monotonic() - started:.0f} s)", flush=True)
        conn.execute(RARE_SQL.encode(), {})
        conn.execute(QUEUED_SQL.encode(), {"queued": queued})
        conn.execute(SAMPLES_SQL.encode(), {})
        for n in range(8):
            conn.execute(
                "INSERT INTO jobbus.worker (id, host, pid, queues, types, concurrency, state, instance_id, "
                "lease_seconds, dead_after_seconds, heartbeat_seconds) "
                "VALUES (%s, 'bench', %s, NULL, '{}', 20, 'running', gen_random_uuid(), 300, 15, 5)",
                (f"worker-{n}", 1000 + n),
            )
        print("  VACUUM ANALYZE ...", flush=True)
        conn.execute("VACUUM ANALYZE jobbus.job")
    app = jobbus.App(dsn=dsn)
    with app.sync:
        app.sync.add_periodic("nightly", type="type.1", cron="0 3 * * *")
    print(f"  built in {time.monotonic() - started:.0f} s", flush=True)


async def measure(dsn: str, requests: int, only: str | None = None) -> list[tuple[str, list[float]]]:
    app = jobbus.App(dsn=dsn)
    asgi = create_app(app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://127.0.0.1") as http:
        jobs_html = (await http.get("/jobs?status=failed")).text
        job_id = re.search(r'data-job="([0-9a-f-]{36})"', jobs_html)
        group = "00000000-0000-4000-8000-" + format(1234, "012x")
        deep = "/jobs?status=completed"
        for _ in range(20):  # twenty pages down: a keyset page costs what the first one does
            found = re.search(r'href="([^"]+)" rel="next"', (await http.get(deep)).text)
            if not found:
                break
            deep = found.group(1).replace("&amp;", "&")
        pages = {
            "overview": "/",
            "overview, 24 h": "/?range=24h",
            "overview, 7 days": "/?range=7d",
            "jobs (queued tab)": "/jobs",
            "jobs completed": "/jobs?status=completed",
            "jobs completed, rare type": "/jobs?status=completed&type=type.rare",
            "jobs completed, queue+type": "/jobs?status=completed&queue=queue-2&type=type.7",
            "jobs completed, name (new)": "/jobs?status=completed&name=report%209999990",
            "jobs completed, name (old)": "/jobs?status=completed&name=report%2010",
            "jobs failed": "/jobs?status=failed",
            "jobs failed, one type": "/jobs?status=failed&type=type.3",
            "jobs failed, search": "/jobs?status=failed&q=INV-1999",
            "jobs failed, search (common)": "/jobs?status=failed&q=ReportError2",
            "jobs completed, search (rare)": "/jobs?status=completed&q=report%209999990",
            "jobs completed, search (a type)": "/jobs?status=completed&q=type.1",
            "jobs cancelled": "/jobs?status=cancelled",
            "jobs queued": "/jobs?status=queued",
            "jobs queued, one queue": "/jobs?status=queued&queue=queue-3",
            "jobs scheduled": "/jobs?status=scheduled",
            "jobs retrying": "/jobs?status=retrying",
            "jobs waiting": "/jobs?status=waiting",
            "jobs running": "/jobs?status=running",
            "jobs, 20 pages down": deep,
            "job detail": f"/jobs/{job_id.group(1) if job_id else '00000000-0000-0000-0000-000000000000'}",
            "failures": "/failures",
            "workers": "/workers",
            "workers, one selected": "/workers?worker=worker-3",
            "queues": "/queues",
            "periodic": "/periodic",
            "groups": "/groups",
            "group": f"/groups/{group}",
            "jobs of a group": f"/jobs?group={group}",
        }
        # A search's tab counts come after its page (the page's script asks /jobs/counts): timed apart.
        for name, path in list(pages.items()):
            if "search" in name:
                query = "&".join(part for part in path.split("?", 1)[1].split("&") if not part.startswith("status="))
                pages[f"{name}: counts"] = f"/jobs/counts?{query}"
        results = []
        for name, path in pages.items():
            if only is not None and only not in name:
                continue
            for _ in range(2):
                await http.get(path)
            times = []
            for _ in range(requests):
                started = time.perf_counter()
                response = await http.get(path)
                times.append((time.perf_counter() - started) * 1000)
                if response.status_code not in (200, 404):
                    raise SystemExit(f"{path}: HTTP {response.status_code}\n{response.text[:2000]}")
            results.append((name, times))
            print(f"  {name}: p95 {p95(times):.1f} ms", flush=True)
    await asgi.state.dashboard.close()
    return results


async def _create_search_index(dsn: str) -> None:
    async with jobbus.App(dsn=dsn) as app:
        await search.create_search_index(app, lambda line: print(f"  {line}", flush=True))


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000, help="finished jobs (default 10,000,000)")
    parser.add_argument("--queued", type=int, default=100_000, help="queued jobs (default 100,000)")
    parser.add_argument("--requests", type=int, default=20, help="timed requests per page")
    parser.add_argument("--keep", action="store_true", help="reuse the table the last run built")
    parser.add_argument("--search-index", action="store_true", help="build the optional search index first")
    parser.add_argument("--only", help="measure only the pages whose name holds this text")
    parser.add_argument("--dsn", default=os.environ.get("BENCH_DSN", DEFAULT_DSN), help="server (BENCH_DSN)")
    args = parser.parse_args()
    if not args.keep:
        print(f"building {args.rows:,} finished and {args.queued:,} queued jobs in database {DATABASE}")
        build(args.dsn, args.rows, args.queued)
    dsn = database_dsn(args.dsn)
    if args.search_index:
        print("building the search index ...", flush=True)
        asyncio.run(_create_search_index(dsn))
    with psycopg.connect(dsn) as conn:
        estimate = conn.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = 'jobbus.job'::regclass").fetchone()
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('jobbus.job'))").fetchone()
    print(f"\njob table: ~{estimate[0] if estimate else 0:,} rows, {size[0] if size else '?'} with indexes")
    results = asyncio.run(measure(dsn, args.requests, args.only))
    print(f"\n{'page':<44}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}")
    worst = 0.0
    for name, times in results:
        if not name.endswith(": counts"):  # the counts a search's page asks for once it is shown
            worst = max(worst, p95(times))
        print(f"{name:<44}{statistics.median(times):>9.1f}{p95(times):>9.1f}{max(times):>9.1f}")
    verdict = "within" if worst <= TARGET_P95_MS else "over"
    print(
        f"\nworst p95 of a page {worst:.1f} ms: {verdict} the {TARGET_P95_MS:.0f} ms target "
        f"({args.requests} requests per page)"
    )


if __name__ == "__main__":
    main()
