"""`jobbus queue set|list` through the real executable, and the limits in `jobbus status`."""

from __future__ import annotations

import json

from tests.cli import jobbus, jobbus_json


def test_set_keeps_what_it_is_not_given_and_none_removes(dsn: str) -> None:
    first = jobbus(dsn, "queue", "set", "emails", "--concurrency", "20", "--rate", "100/1m", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["rate_limit"] == {"count": 100, "per_seconds": 60.0}
    second = jobbus(dsn, "queue", "set", "emails", "--concurrency-per-key", "1", "--json")
    assert json.loads(second.stdout) == {
        "queue": "emails",
        "concurrency": 20,
        "concurrency_per_key": 1,
        "rate_limit": {"count": 100, "per_seconds": 60.0},
        "rate_limit_per_key": None,
    }
    assert jobbus(dsn, "queue", "set", "emails", "--rate", "none").returncode == 0
    (listed,) = jobbus_json(dsn, "queue", "list")
    assert (listed["rate_limit"], listed["running"]) == (None, 0)
    status = jobbus_json(dsn, "status")
    assert [q["queue"] for q in status["limits"]] == ["emails"]
    assert "queue limits" in jobbus(dsn, "status").stdout
    for limit in ("--concurrency", "--concurrency-per-key"):
        assert jobbus(dsn, "queue", "set", "emails", limit, "none").returncode == 0
    assert jobbus_json(dsn, "queue", "list") == []  # no limit left: the queue has no settings row


def test_bad_limits_exit_64_with_one_error_line(dsn: str) -> None:
    for args in (
        ("--concurrency", "0"),
        ("--concurrency", "many"),
        ("--rate", "100"),
        ("--rate", "0/1s"),
        ("--rate-per-key", "10/1y"),
        (),
    ):
        result = jobbus(dsn, "queue", "set", "emails", *args)
        assert result.returncode == 64, (args, result.stderr)
        assert result.stderr.count("error:") == 1, result.stderr
    assert jobbus_json(dsn, "queue", "list") == []
