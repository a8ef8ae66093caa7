"""The operator's numbers agree: the overview, the jobs page's tabs, the failures page and `jobbus status`
read the same counts at the same moment, exact or said to be estimates, on a table where a window or a
sample would have lied (the review's: 20,000 scheduled an hour ahead, 2,500 retrying, 2,000 failed)."""

from __future__ import annotations

import re
from typing import Any

import psycopg

from tests.cli import jobbus_json
from tests.observability.test_dashboard import client, dashboard  # noqa: F401 (the fixture)

FILL = [
    # 20,000 scheduled an hour ahead, in queue "reports"
    "INSERT INTO jobbus.job (id, type, queue, max_attempts, available_at)"
    " SELECT jobbus.uuid_generate_v7(), 'report.render', 'reports', 3, now() + interval '1 hour' + n * interval '1 ms'"
    " FROM generate_series(1, 20000) AS n",
    # 2,500 retrying, 2,000 failed with one error, 145 completed, in queue "mail"
    "INSERT INTO jobbus.job (id, type, queue, max_attempts, attempts, available_at, last_error, history)"
    " SELECT jobbus.uuid_generate_v7(), 'mail.send', 'mail', 3, 1, now() + interval '10 min', 'sku-' || n || ' busy',"
    ' \'[{"attempt": 1, "outcome": "retried"}]\' FROM generate_series(1, 2500) AS n',
    "INSERT INTO jobbus.job (id, type, queue, max_attempts, attempts, status, started_at, finished_at, last_error,"
    " error_group) SELECT jobbus.uuid_generate_v7(), 'mail.send', 'mail', 3, 3, 'failed', now(), now(),"
    " 'LookupError: user ' || n || ' not found', 'LookupError: user <n> not found' FROM generate_series(1, 2000) AS n",
    "INSERT INTO jobbus.job (id, type, queue, max_attempts, attempts, status, started_at, finished_at)"
    " SELECT jobbus.uuid_generate_v7(), 'mail.send', 'mail', 3, 1, 'completed', now(), now()"
    " FROM generate_series(1, 145) AS n",
]


def _count(html: str, tab: str) -> str:
    found = re.search(rf'data-tab="{tab}"[^>]*>{tab} <span class="count"[^>]*>([^<]+)</span>', html)
    assert found is not None, tab
    return found.group(1)


async def test_the_overview_the_tabs_the_failures_and_status_agree(dsn: str, dashboard: tuple[Any, Any]) -> None:  # noqa: F811
    _app, asgi = dashboard
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in FILL:
            conn.execute(statement)
        conn.execute("ANALYZE jobbus.job")
    status = jobbus_json(dsn, "status")
    by_queue = {q["queue"]: q for q in status["queues"]}
    async with client(asgi) as http:
        jobs = (await http.get("/jobs?status=failed")).text
        failures = (await http.get("/failures")).text
        overview = (await http.get("/")).text
        mail_tabs = (await http.get("/jobs?status=failed&queue=mail")).text
    # Exact where at most 10,000 are read: the same number everywhere.
    assert _count(jobs, "failed") == "2,000" == _count(mail_tabs, "failed")
    assert _count(jobs, "retrying") == "2,500" and _count(jobs, "completed") == "145"
    assert by_queue["mail"]["failed"] == 2000 and by_queue["mail"]["completed"] == 145
    assert re.search(r'<h1>Failures <span class="count"[^>]*>2,000</span>', failures)
    assert re.search(r'<td class="num"><a [^>]*>2,000</a></td>', failures)  # the one group, whole
    row = re.search(r'<tr data-queue="mail">(.*?)</tr>', overview, re.S)
    assert row and "2,000" in row.group(1)
    # Past the bound: an estimate, said to be one, in the page and in the JSON alike.
    scheduled = _count(jobs, "scheduled")
    assert scheduled.startswith(("≈", ">")), scheduled
    assert by_queue["reports"]["estimated"] and "scheduled" in by_queue["reports"]["estimated_counts"]
    assert status["totals"]["estimated"] and not by_queue["mail"]["estimated"]
    reports = re.search(r'<tr data-queue="reports">(.*?)</tr>', overview, re.S)
    assert reports and re.search(r">(≈|&gt;) [\d,]+<", reports.group(1))
