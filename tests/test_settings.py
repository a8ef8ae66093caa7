from typing import Any

import pytest

from jobbus import App
from jobbus.settings import Settings


def test_defaults_match_the_spec() -> None:
    s = Settings.load({}, environ={})
    assert (s.schema, s.default_max_attempts, s.lease_seconds) == ("jobbus", 3, 300)
    assert (s.retry_base_delay_seconds, s.retry_max_delay_seconds, s.retry_jitter) == (30, 1800, 0.20)
    assert s.poll_interval_seconds == 1.0
    assert s.heartbeat_seconds <= s.lease_seconds / 3


def test_environment_fills_in_and_keywords_win() -> None:
    env = {"JOBBUS_LEASE_SECONDS": "60", "JOBBUS_SCHEMA": "jobs", "JOBBUS_DSN": "postgresql://env/db"}
    s = Settings.load({"lease_seconds": 90}, environ=env)
    assert s.lease_seconds == 90
    assert s.schema == "jobs"
    assert s.dsn == "postgresql://env/db"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"lease_seconds": -1}, "lease_seconds"),
        ({"retry_jitter": 1.0}, "retry_jitter"),
        ({"retry_jitter": -0.1}, "retry_jitter"),
        ({"default_max_attempts": 0}, "default_max_attempts"),
        ({"poll_interval_seconds": 0}, "poll_interval_seconds"),
        ({"schema": "Robert'); DROP TABLE x;--"}, "schema"),
        ({"lease_seconds": "soon"}, "lease_seconds"),
        ({"retry_max_delay_seconds": 1, "retry_base_delay_seconds": 5}, "retry_max_delay_seconds"),
        ({"no_such_setting": 1}, "no_such_setting"),
    ],
)
def test_invalid_settings_raise_value_error_naming_the_setting(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        App(**overrides)


def test_invalid_environment_value_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBBUS_RETRY_JITTER", "2")
    with pytest.raises(ValueError, match="retry_jitter"):
        App()
