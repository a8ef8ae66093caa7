"""The operator's commands over cells (SPEC 23): every cell or those named with --cell, a cell that is down
named while the others are served, and --json entries that carry their cell."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from tests.cli import ROOT, UNREACHABLE_DSN, cli_env, jobbus, query_value, running_workers
from tests.dbserver import fresh_database

NAMES = ("a", "b", "c")


@pytest.fixture
def cells(admin_dsn: str, template_db: str) -> Iterator[dict[str, str]]:
    """Three cells, each a fresh migrated database of the test server."""
    with ExitStack() as stack:
        yield {name: stack.enter_context(fresh_database(admin_dsn, template_db)) for name in NAMES}


def _run(cells: dict[str, str], *args: str) -> tuple[int, str, str]:
    """`jobbus ARGS` with JOBBUS_CELLS naming `cells` (and no JOBBUS_DSN)."""
    result = jobbus(None, *args, JOBBUS_CELLS=";".join(f"{name}={dsn}" for name, dsn in cells.items()))
    return result.returncode, result.stdout, result.stderr


def _insert(dsn: str, rows: list[tuple[uuid.UUID, str, datetime]]) -> None:
    """Queued jobs (id, queue, available_at) written as the SQL API's callers would, in one statement."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO jobbus.job (id, type, queue, max_attempts, available_at) VALUES (%s, 'noop', %s, 3, %s)",
            rows,
        )


def _uuid7(at: datetime) -> uuid.UUID:
    """A UUIDv7 of a given time: ids of several cells interleave in creation order as real ones do."""
    millis = int(at.timestamp() * 1000)
    value = (millis << 80) | (0x7 << 76) | (random.getrandbits(12) << 64) | (0b10 << 62) | random.getrandbits(62)
    return uuid.UUID(int=value)


def test_status_reads_each_cell_and_tags_its_queues_and_a_down_cell_is_named_with_exit_69(
    cells: dict[str, str],
) -> None:
    now = datetime.now(UTC)
    for index, (name, dsn) in enumerate(cells.items()):
        _insert(dsn, [(_uuid7(now), f"q-{name}", now) for _ in range(index + 1)])

    code, out, err = _run(cells, "status", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert [cell["cell"] for cell in report["cells"]] == list(NAMES) and report["unreachable"] == []
    for index, cell in enumerate(report["cells"]):
        assert [(q["cell"], q["queue"], q["available"]) for q in cell["queues"]] == [
            (cell["cell"], f"q-{cell['cell']}", index + 1)
        ]

    code, out, err = _run(cells, "status", "--json", "--cell", "b")
    assert code == 0, err
    assert [cell["cell"] for cell in json.loads(out)["cells"]] == ["b"]

    down = {**cells, "b": UNREACHABLE_DSN}
    code, out, err = _run(down, "status", "--json")
    assert code == 69
    assert "cell b: cannot reach the database" in err
    report = json.loads(out)
    assert [cell["cell"] for cell in report["cells"]] == ["a", "c"]
    assert [entry["cell"] for entry in report["unreachable"]] == ["b"]

    code, out, err = _run(down, "status")  # the human view: the others shown, the down one named
    assert code == 69 and "cell a" in out and "cell c" in out and "cell b:" in err


def test_cell_names_are_checked_before_anything_is_done(cells: dict[str, str], dsn: str) -> None:
    code, _, err = _run(cells, "pause", "--all", "--cell", "nope")
    assert code == 64 and "'nope': no such cell (the cells are a, b, c)" in err
    for cell_dsn in cells.values():
        assert query_value(cell_dsn, "SELECT count(*) FROM jobbus.pause") == 0

    result = jobbus(dsn, "status", "--cell", "a")  # one database (JOBBUS_DSN): there are no cells
    assert result.returncode == 64 and "no cells are configured" in result.stderr


def test_jobs_list_pages_through_every_cell_in_one_order_each_job_once(cells: dict[str, str]) -> None:
    """Creation order and the queued view's order (when each job runs next), paged 37 at a time over three
    cells whose jobs interleave: every job exactly once, in the list's order, each with its own cell."""
    rng = random.Random(7)
    start = datetime.now(UTC) - timedelta(hours=1)
    placed: dict[str, str] = {}
    for name, dsn in cells.items():
        rows = []
        for _ in range(rng.randint(60, 140)):
            job_id = _uuid7(start + timedelta(seconds=rng.uniform(0, 3000)))
            rows.append((job_id, "default", start + timedelta(seconds=rng.uniform(0, 7200))))
            placed[str(job_id)] = name
        _insert(dsn, rows)

    for listing in (["--oldest"], [], ["--status", "queued"]):
        seen: list[dict[str, str]] = []
        after: list[str] = []
        for _ in range(50):
            code, out, err = _run(cells, "jobs", "list", "--json", "--limit", "37", *listing, *after)
            assert code == 0, err
            page = json.loads(out)
            if not page:
                break
            seen += page
            after = ["--after", page[-1]["id"]]  # the last job seen: found in its cell for its place
        assert sorted(job["id"] for job in seen) == sorted(placed), listing
        assert all(job["cell"] == placed[job["id"]] for job in seen)
        if listing == ["--status", "queued"]:
            keys = [(datetime.fromisoformat(job["available_at"]), job["id"]) for job in seen]
            assert keys == sorted(keys)
        else:
            ids = [uuid.UUID(job["id"]) for job in seen]
            assert ids == sorted(ids, reverse=not listing)

    # The cursor a page prints reads the same next page as the id of its last job.
    code, out, err = _run(cells, "jobs", "list", "--limit", "37", "--status", "queued")
    assert code == 0, err
    printed = [line for line in out.splitlines() if line.startswith("more: --after ")]
    assert len(printed) == 1, out
    cursor = printed[0].removeprefix("more: --after ").strip()
    first = json.loads(_run(cells, "jobs", "list", "--json", "--limit", "37", "--status", "queued")[1])
    by_cursor = _run(cells, "jobs", "list", "--json", "--limit", "37", "--status", "queued", "--after", cursor)
    by_id = _run(cells, "jobs", "list", "--json", "--limit", "37", "--status", "queued", "--after", first[-1]["id"])
    assert by_cursor[0] == 0 and json.loads(by_cursor[1]) == json.loads(by_id[1]) != []


def test_control_commands_act_in_every_cell_or_the_named_ones(cells: dict[str, str]) -> None:
    code, out, err = _run(cells, "pause", "--queue", "reports", "--cell", "a", "--cell", "c", "--json")
    assert code == 0, err
    assert [entry["cell"] for entry in json.loads(out)] == ["a", "c"]
    paused = {
        name: query_value(dsn, "SELECT count(*) FROM jobbus.pause WHERE target_kind = 'queue' AND target = 'reports'")
        for name, dsn in cells.items()
    }
    assert paused == {"a": 1, "b": 0, "c": 1}

    code, out, err = _run(cells, "resume", "--queue", "reports")
    assert code == 0, err
    assert "cell a:" in out and "cell b:" in out and "cell c:" in out
    for dsn in cells.values():
        assert query_value(dsn, "SELECT count(*) FROM jobbus.pause") == 0


def test_workers_lists_each_cells_workers_with_their_cell(cells: dict[str, str]) -> None:
    with running_workers(cells["a"], ("w-in-a", [])), running_workers(cells["c"], ("w-in-c", [])):
        code, out, err = _run(cells, "workers", "--json", "--live")
        assert code == 0, err
        assert sorted((w["cell"], w["id"]) for w in json.loads(out)) == [("a", "w-in-a"), ("c", "w-in-c")]
        code, out, err = _run(cells, "workers", "--json", "--cell", "c")
        assert code == 0, err
        assert [(w["cell"], w["id"]) for w in json.loads(out)] == [("c", "w-in-c")]


def test_migrate_migrates_every_cell_and_names_one_that_is_down(admin_dsn: str) -> None:
    with ExitStack() as stack:
        empty = {name: stack.enter_context(fresh_database(admin_dsn, None)) for name in ("a", "b")}
        code, out, err = _run({**empty, "down": UNREACHABLE_DSN}, "migrate")
        assert code == 69 and "cell down: cannot reach the database" in err
        assert "cell a:" in out and "cell b:" in out
        for dsn in empty.values():
            assert query_value(dsn, "SELECT count(*) FROM jobbus.migration") > 0

        code, out, err = _run(empty, "migrate", "--cell", "b")
        assert code == 0, err
        assert "cell b:" in out and "cell a:" not in out and "nothing to do" in out


def test_queue_move_waits_until_no_job_of_the_queue_is_left_in_the_old_cell_and_loses_none(
    cells: dict[str, str],
) -> None:
    two = {"a": cells["a"], "b": cells["b"]}
    now = datetime.now(UTC)
    _insert(two["a"], [(_uuid7(now), "reports", now) for _ in range(40)])
    refused = _run(two, "queue", "move", "reports", "--to", "b")  # queue_cells still places it in a
    assert refused[0] == 64 and "placed in cell a" in refused[2]

    env = cli_env(None, JOBBUS_CELLS=f"a={two['a']};b={two['b']}", JOBBUS_QUEUE_CELLS="reports=b")
    move = subprocess.Popen(
        [sys.executable, "-m", "jobbus", "queue", "move", "reports", "--to", "b", "--interval", "0.2"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert move.stdout is not None
    first = move.stdout.readline()  # the first look: the 40 jobs left in a
    try:
        assert move.poll() is None, first  # it waits
        with running_workers(two["a"], ("w-old-cell", ["--queue", "reports"])):
            rest, err = move.communicate(timeout=60)
    finally:
        if move.poll() is None:
            move.kill()
    assert move.returncode == 0, err
    assert "cell a: 40 available, 0 scheduled for later, 0 running" in first
    assert "no job left outside cell b" in rest.splitlines()[-1]
    assert query_value(two["a"], "SELECT count(*) FROM jobbus.job WHERE status = 'completed'") == 40
    assert query_value(two["a"], "SELECT count(*) FROM jobbus.job") == 40


def test_one_job_commands_find_the_job_in_its_cell_and_one_database_commands_ask_for_one(
    cells: dict[str, str],
) -> None:
    listed = ";".join(f"{n}={d}" for n, d in cells.items())

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return jobbus(None, *args, JOBBUS_CELLS=listed, JOBBUS_QUEUE_CELLS="reports=c")

    scheduled = run("schedule", "noop", "--queue", "reports")
    assert scheduled.returncode == 0, scheduled.stderr
    job_id = scheduled.stdout.strip().split()[-1]
    assert [query_value(dsn, "SELECT count(*) FROM jobbus.job") for dsn in cells.values()] == [0, 0, 1]

    shown = run("jobs", "show", job_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["queue"] == "reports"
    cancelled = run("jobs", "cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert query_value(cells["c"], "SELECT status FROM jobbus.job WHERE id = %s", job_id) == "cancelled"

    limits = run("queue", "set", "reports", "--concurrency", "3")
    assert limits.returncode == 64 and "give the database of one cell with --dsn" in limits.stderr
    assert [query_value(dsn, "SELECT count(*) FROM jobbus.queue_setting") for dsn in cells.values()] == [0, 0, 0]
