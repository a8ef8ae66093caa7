"""`jobbus periodic ...` through the real executable; `jobbus status` shows the next runs."""

from __future__ import annotations

import json

from tests.cli import jobbus, jobbus_json


def test_add_list_pause_resume_run_remove(dsn: str) -> None:
    added = jobbus(
        dsn, "periodic", "add", "nightly", "--type", "report.render", "--cron", "0 3 * * *",
        "--timezone", "Europe/Paris", "--config", '{"kind": "nightly"}', "--json",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["configuration"] == {"kind": "nightly"}
    assert jobbus(dsn, "periodic", "add", "ping", "--type", "ops.ping", "--every", "30s").returncode == 0
    listed = {p["name"]: p for p in jobbus_json(dsn, "periodic", "list")}
    assert listed["ping"]["every_seconds"] == 30 and listed["nightly"]["cron"] == "0 3 * * *"
    assert jobbus(dsn, "periodic", "pause", "nightly").stdout.strip() == "periodic nightly paused"
    assert not {p["name"]: p for p in jobbus_json(dsn, "periodic", "list")}["nightly"]["enabled"]
    assert jobbus(dsn, "periodic", "resume", "nightly").returncode == 0
    ran = jobbus(dsn, "periodic", "run", "ping")
    assert ran.returncode == 0
    shown = jobbus_json(dsn, "jobs", "show", ran.stdout.strip())
    assert (shown["type"], shown["name"]) == ("ops.ping", "ping")
    status = jobbus_json(dsn, "status")
    assert {p["name"] for p in status["periodic"]} == {"nightly", "ping"}
    assert "nightly" in jobbus(dsn, "status").stdout
    assert jobbus(dsn, "periodic", "remove", "ping").returncode == 0
    assert [p["name"] for p in jobbus_json(dsn, "periodic", "list")] == ["nightly"]


def test_bad_input_exits_64_and_unknown_names_exit_1(dsn: str) -> None:
    for args in (
        ("add", "x", "--type", "t"),
        ("add", "x", "--type", "t", "--cron", "* * * * *", "--every", "5s"),
        ("add", "x", "--type", "t", "--cron", "0 3 * *"),
        ("add", "x", "--type", "t", "--every", "0s"),
        ("add", "x", "--type", "t", "--cron", "0 3 * * *", "--timezone", "Mars/Olympus"),
        ("add", "x", "--type", "t", "--every", "5s", "--config", "[1]"),
    ):
        result = jobbus(dsn, "periodic", *args)
        assert result.returncode == 64, (args, result.stderr)
        assert result.stderr.count("error:") == 1, result.stderr
    for verb in ("remove", "pause", "resume", "run"):
        result = jobbus(dsn, "periodic", verb, "nope")
        assert result.returncode == 1 and "no periodic job is named 'nope'" in result.stderr
    assert jobbus_json(dsn, "periodic", "list") == []
