import dataclasses
import logging
import math
import os
from typing import Any

import pytest

from jobbus import App
from jobbus.settings import BOUNDS, NON_SETTING_VARIABLES, Settings


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


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("JOBBUS_LEASE_SECONDS", "inf"),
        ("JOBBUS_LEASE_SECONDS", "1e300"),
        ("JOBBUS_LEASE_SECONDS", "nan"),
        ("JOBBUS_POLL_INTERVAL_SECONDS", "inf"),
        ("JOBBUS_POLL_INTERVAL_SECONDS", "1e-12"),
        ("JOBBUS_DEFAULT_MAX_ATTEMPTS", str(2**40)),
        ("JOBBUS_RETRY_BASE_DELAY_SECONDS", "1e300"),
        ("JOBBUS_RETRY_MAX_DELAY_SECONDS", "1e300"),
        ("JOBBUS_HEARTBEAT_INTERVAL_SECONDS", "1e-12"),
        ("JOBBUS_POOL_MAX_SIZE", str(10**9)),
        ("JOBBUS_MAX_PAYLOAD_BYTES", str(10**12)),
    ],
)
def test_numbers_that_would_overflow_later_are_refused_naming_the_setting(variable: str, value: str) -> None:
    setting = variable.removeprefix("JOBBUS_").lower()
    with pytest.raises(ValueError, match=rf"^{setting} must be "):
        Settings.load({}, environ={variable: value})
    with pytest.raises(ValueError, match=rf"^{setting} must be "):
        Settings.load({setting: float(value)}, environ={})


def test_every_numeric_setting_has_a_finite_range() -> None:
    numeric = {
        f.name
        for f in dataclasses.fields(Settings)
        if str(f.type).split("|")[0].strip() in ("int", "float") and f.name != "transaction_pooling"
    }
    assert numeric == set(BOUNDS)
    for name, bounds in BOUNDS.items():
        assert math.isfinite(bounds.low) and math.isfinite(bounds.high), name
        Settings.load({name: getattr(Settings(), name) or bounds.low}, environ={})  # the default is in range


@pytest.mark.parametrize("name", ["public", "pg_jobs", "pg_catalog", "information_schema"])
def test_reserved_schema_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"schema '{name}' is reserved"):
        Settings.load({"schema": name}, environ={})
    with pytest.raises(ValueError, match="reserved"):
        Settings.load({}, environ={"JOBBUS_SCHEMA": name})


def test_unknown_jobbus_variables_are_warned_once_per_app_naming_the_closest_setting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in list(os.environ):
        if name.startswith("JOBBUS_") and name not in NON_SETTING_VARIABLES:
            monkeypatch.delenv(name)
    monkeypatch.setenv("JOBBUS_LEASE_SECOND", "5")
    monkeypatch.setenv("JOBBUS_TOTALLY_UNRELATED", "1")
    monkeypatch.setenv("JOBBUS_TEST_DSN", "postgresql://elsewhere/db")
    with caplog.at_level(logging.WARNING, logger="jobbus.settings"):
        app = App()
        App()
    warnings = [r for r in caplog.records if r.name == "jobbus.settings"]
    assert len(warnings) == 2  # one per App, both variables in one line
    message = warnings[0].getMessage()
    assert "JOBBUS_LEASE_SECOND (did you mean JOBBUS_LEASE_SECONDS?)" in message
    assert "JOBBUS_TOTALLY_UNRELATED" in message
    assert "JOBBUS_TEST_DSN" not in message.split(";")[0]
    assert app.settings.lease_seconds == 300  # the misspelt variable changed nothing


def test_known_variables_are_not_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="jobbus.settings"):
        Settings.load({}, environ={"JOBBUS_LEASE_SECONDS": "60", "JOBBUS_FULL_FAULTS": "1", "JOBBUS_TEST_DSN": "x"})
    assert caplog.records == []


def test_an_explicit_none_keyword_wins_over_the_environment() -> None:
    env = {
        "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "0.5",
        "JOBBUS_LISTEN_DSN": "postgresql://direct/db",
        "JOBBUS_DSN": "postgresql://env/db",
    }
    s = Settings.load({"heartbeat_interval_seconds": None, "listen_dsn": None}, environ=env)
    assert (s.heartbeat_interval_seconds, s.listen_dsn) == (None, None)
    assert Settings.load({}, environ=env).heartbeat_interval_seconds == 0.5
    # dsn=None means "not given": App(dsn=os.environ.get("DATABASE_URL")) falls back to JOBBUS_DSN.
    assert Settings.load({"dsn": None}, environ=env).dsn == "postgresql://env/db"
    with pytest.raises(ValueError, match="lease_seconds cannot be None"):
        Settings.load({"lease_seconds": None}, environ={"JOBBUS_LEASE_SECONDS": "60"})


def test_none_in_the_environment_for_a_setting_that_takes_it() -> None:
    s = Settings.load({}, environ={"JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "none", "JOBBUS_LISTEN_DSN": ""})
    assert (s.heartbeat_interval_seconds, s.listen_dsn) == (None, None)
    with pytest.raises(ValueError, match="lease_seconds"):
        Settings.load({}, environ={"JOBBUS_LEASE_SECONDS": "none"})


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://jobbus:hunter2-s3cret@db.internal:5432/app",
        "host=db.internal user=jobbus password=hunter2-s3cret dbname=app",
        "host=db.internal password='hunter2-s3cret with spaces' dbname=app",
        "postgresql://jobbus@db.internal/app?password=hunter2-s3cret&sslmode=require",
    ],
)
def test_settings_repr_hides_passwords(dsn: str) -> None:
    s = Settings.load({"dsn": dsn, "listen_dsn": dsn}, environ={})
    for text in (repr(s), str(s), repr(App(dsn=dsn).settings)):
        assert "hunter2" not in text
        assert "db.internal" in text and "***" in text
    assert s.dsn == dsn  # only the display is redacted


def test_cancel_grace_defaults_to_30_s_takes_none_and_is_validated() -> None:
    assert Settings.load({}, environ={}).cancel_grace_seconds == 30
    assert Settings.load({}, environ={"JOBBUS_CANCEL_GRACE_SECONDS": "2.5"}).cancel_grace_seconds == 2.5
    assert Settings.load({}, environ={"JOBBUS_CANCEL_GRACE_SECONDS": "none"}).cancel_grace_seconds is None
    assert App(cancel_grace_seconds=None).settings.cancel_grace_seconds is None
    assert App(cancel_grace_seconds=0).settings.cancel_grace_seconds == 0
    for bad in (-1, "soon", math.inf, True):
        with pytest.raises(ValueError, match=r"^cancel_grace_seconds must be "):
            App(cancel_grace_seconds=bad)
    with pytest.raises(ValueError, match=r"^cancel_grace_seconds must be "):
        Settings.load({}, environ={"JOBBUS_CANCEL_GRACE_SECONDS": "-3"})


def test_retention_event_seconds_from_keyword_and_environment() -> None:
    assert Settings.load({}, environ={}).retention_event_seconds == 604800.0
    assert Settings.load({}, environ={"JOBBUS_RETENTION_EVENT_SECONDS": "3600"}).retention_event_seconds == 3600.0
    assert Settings.load({}, environ={"JOBBUS_RETENTION_EVENT_SECONDS": "none"}).retention_event_seconds is None
    assert App(dsn="postgresql://x/y", retention_event_seconds=None).settings.retention_event_seconds is None
    for bad in (-1, math.inf, "soon", True):
        with pytest.raises((ValueError, TypeError), match="retention_event_seconds"):
            Settings.load({"retention_event_seconds": bad}, environ={})
    with pytest.raises(ValueError, match="retention_event_seconds"):
        Settings.load({}, environ={"JOBBUS_RETENTION_EVENT_SECONDS": "-5"})
