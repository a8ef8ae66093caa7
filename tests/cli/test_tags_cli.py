"""`jobbus jobs list --tag` and `jobbus jobs update`: the tag filter (every tag named) over 20,000 jobs
in both orders a list takes, the tags shown, bulk and single updates with their exit codes and output."""

from __future__ import annotations

from typing import Any

import psycopg

import jobbus as jobbus_package
from tests.cli import jobbus, jobbus_json, query_value


def _fill(dsn: str) -> None:
    app = jobbus_package.App(dsn=dsn)
    with app.sync:
        app.sync.schedule_many("t", [{}] * 15_000, tags=["tenant:1"])
        app.sync.schedule_many("t", [{}] * 4_000, tags=["tenant:1", "vip"])
        app.sync.schedule_many("u", [{}] * 1_500, tags=["vip"], queue="other")
        app.sync.schedule_many("t", [{}] * 200)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE jobbus.job")


def _all(dsn: str, *args: str) -> list[dict[str, Any]]:
    """Every job a listing reaches, page after page."""
    jobs: list[dict[str, Any]] = []
    after: list[str] = []
    while True:
        page = jobbus_json(dsn, "jobs", "list", *args, "--limit", "10000", *after)
        jobs += page
        if len(page) < 10_000:
            return jobs
        after = ["--after", str(page[-1]["id"])]


def test_jobs_list_by_tag_reaches_every_job_with_every_tag(dsn: str) -> None:
    _fill(dsn)
    both = _all(dsn, "--tag", "tenant:1", "--tag", "vip")
    assert len(both) == 4_000 and all(set(j["tags"]) == {"tenant:1", "vip"} for j in both)
    assert len({j["id"] for j in _all(dsn, "--tag", "tenant:1")}) == 19_000
    assert len(_all(dsn, "--tag", "vip", "--oldest")) == 5_500
    queued = jobbus_json(dsn, "jobs", "list", "--status", "queued", "--tag", "vip", "--limit", "10000")
    assert len(queued) == 5_500
    assert jobbus_json(dsn, "jobs", "list", "--tag", "nobody") == []
    table = jobbus(dsn, "jobs", "list", "--tag", "vip", "--type", "u", "--limit", "3")
    assert table.returncode == 0 and "vip" in table.stdout, table.stderr
    bad = jobbus(dsn, "jobs", "list", "--tag", "x" * 65)
    assert bad.returncode == 64 and "--tag holds a tag of 65 characters" in bad.stderr


def test_jobs_show_prints_the_tags_schedule_gave(dsn: str) -> None:
    scheduled = jobbus(dsn, "schedule", "t", "--tag", "tenant:9", "--tag", "urgent", "--tag", "tenant:9")
    assert scheduled.returncode == 0, scheduled.stderr
    job_id = scheduled.stdout.strip()
    refused = jobbus(dsn, "schedule", "t", "--tag", " ")
    assert refused.returncode == 64 and "tags must not hold an empty tag (item 0)" in refused.stderr
    shown = jobbus(dsn, "jobs", "show", str(job_id))
    assert shown.returncode == 0 and "tenant:9, urgent" in shown.stdout
    assert jobbus_json(dsn, "jobs", "show", str(job_id))["tags"] == ["tenant:9", "urgent"]


def test_jobs_update_by_filter_prints_the_count_and_changes_only_queued_jobs(dsn: str) -> None:
    app = jobbus_package.App(dsn=dsn)
    with app.sync:
        app.sync.schedule_many("t", [{}] * 2_500, queue="a", tags=["move"])
        app.sync.schedule_many("t", [{}] * 5, queue="a")
        running = app.sync.schedule("t", {}, queue="a", tags=["move"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobbus.job SET status = 'running', attempts = 1 WHERE id = %s", (running,))
    moved = jobbus(dsn, "jobs", "update", "--queue", "a", "--tag", "move", "--set-queue", "b", "--set-priority", "4")
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.strip() == "2500 jobs updated"
    assert query_value(dsn, "SELECT count(*) FROM jobbus.job WHERE queue = 'b' AND priority = 4") == 2_500
    assert query_value(dsn, "SELECT queue FROM jobbus.job WHERE id = %s", running) == "a"
    later = jobbus_json(dsn, "jobs", "update", "--queue", "b", "--set-available-at", "2h")
    assert later == {"updated": 2_500}
    assert query_value(dsn, "SELECT count(*) FROM jobbus.job WHERE available_at > now() + interval '1 hour'") == 2_500
    at = jobbus(dsn, "jobs", "update", "--type", "t", "--set-available-at", "2031-01-02T03:04:05Z")
    assert at.returncode == 0 and at.stdout.strip() == "2505 jobs updated", at.stderr
    now = jobbus(dsn, "jobs", "update", "--queue", "b", "--set-available-at", "now")
    assert now.returncode == 0 and now.stdout.strip() == "2500 jobs updated"
    none = jobbus(dsn, "jobs", "update", "--queue", "nowhere", "--set-priority", "1")
    assert none.returncode == 0 and none.stdout.strip() == "0 jobs updated"


def test_jobs_update_of_one_job_and_its_exit_codes(dsn: str) -> None:
    app = jobbus_package.App(dsn=dsn)
    with app.sync:
        job_id = str(app.sync.schedule("t", {}))
    done = jobbus(dsn, "jobs", "update", job_id, "--set-priority", "9", "--set-queue", "q")
    assert done.returncode == 0 and done.stdout.strip() == f"job {job_id} updated", done.stderr
    assert query_value(dsn, "SELECT priority || queue FROM jobbus.job WHERE id = %s", job_id) == "9q"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE jobbus.job SET status = 'completed', finished_at = now() WHERE id = %s", (job_id,))
    finished = jobbus(dsn, "jobs", "update", job_id, "--set-priority", "1")
    assert finished.returncode == 1 and "only queued jobs can be updated" in finished.stderr
    missing = jobbus(dsn, "jobs", "update", "0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10", "--set-priority", "1")
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    for args, problem in [
        ((job_id,), "give at least one change"),
        (("--set-priority", "1"), "give a job ID or at least one of"),
        ((job_id, "--queue", "q", "--set-priority", "1"), "not both"),
        (("--queue", "q", "--set-available-at", "soon"), "--set-available-at 'soon' is not an ISO 8601"),
        (("--queue", "q", "--set-available-at", "2031-01-02T03:04:05"), "has no timezone"),
        (("--queue", "", "--set-priority", "1"), "--queue must not be empty"),
        (("--queue", "q", "--set-queue", "", "--set-priority", "1"), "--set-queue must not be empty"),
        (("--tag", "", "--set-priority", "1"), "--tag must not hold an empty tag"),
        (("not-a-uuid", "--set-priority", "1"), "is not a job id"),
        (("--queue", "q", "--set-priority", "2147483648"), "--set-priority"),
    ]:
        refused = jobbus(dsn, "jobs", "update", *args)
        assert refused.returncode == 64 and problem in refused.stderr, (args, refused.stderr)
    assert query_value(dsn, "SELECT priority FROM jobbus.job WHERE id = %s", job_id) == 9


def test_schedule_takes_a_weight_a_window_and_a_debounce(dsn: str) -> None:
    weighted = jobbus(dsn, "schedule", "t", "--weight", "3")
    assert weighted.returncode == 0, weighted.stderr
    assert query_value(dsn, "SELECT weight FROM jobbus.job WHERE id = %s", weighted.stdout.strip()) == 3
    first = jobbus(dsn, "schedule", "w", "--unique-key", "daily", "--unique-for", "1d")
    again = jobbus(dsn, "schedule", "w", "--unique-key", "daily", "--unique-for", "1d")
    assert first.returncode == again.returncode == 0 and first.stdout == again.stdout
    debounced = [
        jobbus(dsn, "schedule", "d", "--unique-key", "u", "--debounce", "30s", "--config", f'{{"n": {n}}}')
        for n in (1, 2)
    ]
    assert debounced[0].stdout == debounced[1].stdout
    assert query_value(dsn, "SELECT configuration_data->>'n' FROM jobbus.job WHERE type = 'd'") == "2"
    for args, problem in (
        (("--weight", "0"), "--weight"),
        (("--unique-for", "1d"), "unique_for needs a unique_key"),
        (("--unique-key", "k", "--debounce", "soon"), "--debounce 'soon' is not a duration"),
    ):
        refused = jobbus(dsn, "schedule", "x", *args)
        assert refused.returncode in (2, 64) and problem in refused.stderr, (args, refused.stderr)
    assert query_value(dsn, "SELECT count(*) FROM jobbus.job WHERE type = 'x'") == 0
