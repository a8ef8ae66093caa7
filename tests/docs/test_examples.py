"""The docs harness itself: which shell lines it reads as `jobbus` commands, and what it refuses."""

from __future__ import annotations

import pytest

from tests.docs.examples import config_commands, jobbus_commands, parse_problem


def test_commands_are_found_behind_pipes_substitutions_prefixes_and_continuations() -> None:
    script = "\n".join(
        [
            "jobbus worker --app a:app \\",
            "    --queue q   # a comment",
            'psql "$JOBBUS_DSN" -c "CREATE TABLE t (id int,',
            '                       v text)"',
            "jobbus jobs list --json | jq -r '.[].id' | xargs -n1 jobbus jobs retry",
            "while [ \"$(jobbus workers --live --json | jq 'length')\" != 0 ]; do sleep 2; done",
            "JOBBUS_SCHEMA=jobs .venv/bin/jobbus schema > jobbus.sql",
            "pip install jobbus",
        ]
    )
    assert list(jobbus_commands(script)) == [
        (0, ["jobbus", "worker", "--app", "a:app", "--queue", "q"]),
        (4, ["jobbus", "jobs", "list", "--json"]),
        (4, ["jobbus", "jobs", "retry"]),
        (5, ["jobbus", "workers", "--live", "--json"]),
        (6, ["jobbus", "schema"]),
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "--app", "myproject.jobs:app", "--queue", "emails", "--concurrency", "50"],
        ["jobs", "retry", "0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10", "--at", "2026-05-01T09:00:00Z"],
        ["pause", "--queue", "payments", "--wait"],
        ["status", "--help"],
        ["worker", "--worker-id", "$(POD_NAME)"],  # values are not checked: placeholders pass
    ],
)
def test_commands_of_the_real_cli_parse(args: list[str]) -> None:
    assert parse_problem(args) is None


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["worker", "--app", "a:app", "--concurency", "5"], "--concurency"),
        (["jobs", "retry", "0190f3c4-8f2e-7a71-9c1e-2b1f0e6d4a10", "[--at", "x]"], "unexpected argument"),
        (["jobs", "retire", "x"], "no such command 'retire'"),
        (["sttaus"], "no such command 'sttaus'"),
    ],
)
def test_renamed_options_commands_and_stray_arguments_are_reported(args: list[str], problem: str) -> None:
    found = parse_problem(args)
    assert found is not None and problem in found


def test_commands_are_found_in_supervisor_configurations() -> None:
    text = "\n".join(
        [
            "[Service]",
            "ExecStart=/srv/app/.venv/bin/jobbus worker --app a:app \\",
            "    --worker-id %H-%i --concurrency 20",
            "Restart=on-failure",
            'CMD ["jobbus", "worker", "--app", "a:app"]',
            '    command: ["sh", "-c", "echo"]',
        ]
    )
    assert list(config_commands(text)) == [
        (1, ["jobbus", "worker", "--app", "a:app", "--worker-id", "%H-%i", "--concurrency", "20"]),
        (4, ["jobbus", "worker", "--app", "a:app"]),
    ]
