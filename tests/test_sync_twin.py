"""The blocking twin (`app.sync`) is generated from the async verbs: it is current, and it cannot drift."""

from __future__ import annotations

import inspect
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import jobbus
from jobbus.producer import _async, _sync

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "tools" / "generate_sync.py"
#: App's coroutines that are not producer or admin verbs: the App's lifecycle and its worker.
NOT_VERBS = {"open", "close", "run_worker", "__aenter__", "__aexit__"}


def _check(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GENERATOR), "--check", *map(str, args)], capture_output=True, text=True, cwd=ROOT
    )


def test_the_generated_twin_is_current() -> None:
    done = _check()
    assert done.returncode == 0, done.stderr


def test_a_stale_twin_fails_the_check(tmp_path: Path) -> None:
    stale = tmp_path / "_sync.py"
    stale.write_text(Path(_sync.__file__).read_text().replace("def queue_usage(", "def queue_use("))
    done = _check("--target", stale)
    assert done.returncode == 1
    assert "is stale: run `make sync`" in done.stderr and "queue_use" in done.stderr


def test_a_rule_that_matches_nothing_fails_the_check(tmp_path: Path) -> None:
    source = tmp_path / "_async.py"
    source.write_text(Path(_async.__file__).read_text().replace(".emit(", ".notify("))
    done = _check("--source", source, "--target", Path(_sync.__file__))
    assert done.returncode == 1
    assert "the rule 'emit' matched nothing" in done.stderr


def test_an_async_construct_without_a_rule_fails_the_check(tmp_path: Path) -> None:
    source = tmp_path / "_async.py"
    text = Path(_async.__file__).read_text()
    source.write_text(text.replace("await asyncio.sleep(", "await asyncio.wait_for(asyncio.sleep(0), "))
    done = _check("--source", source)
    assert done.returncode == 1
    assert "keeps 'asyncio': add a rule for it" in done.stderr


def test_the_blocking_twin_has_every_verb_of_app_with_its_signature_and_docstring() -> None:
    verbs = sorted(
        name
        for name, member in inspect.getmembers(jobbus.App, inspect.iscoroutinefunction)
        if not name.startswith("_") and name not in NOT_VERBS
    )
    assert {"queue_usage", "schedule", "wait", "drain", "migrate"} <= set(verbs)
    for name in verbs:
        async_verb, sync_verb = getattr(jobbus.App, name), getattr(jobbus.SyncApp, name)
        assert not inspect.iscoroutinefunction(sync_verb), name
        assert list(inspect.signature(sync_verb).parameters) == list(inspect.signature(async_verb).parameters), name
        assert async_verb.__doc__, f"App.{name} has no docstring"
        assert sync_verb.__doc__, f"SyncApp.{name} has no docstring"
        if name != "drain":  # the blocking drain says how it runs the async one
            assert sync_verb.__doc__ == async_verb.__doc__, name


def test_the_blocking_queue_usage_counts_the_limited_queues(sync_app: jobbus.App) -> None:
    sync_app.sync.set_queue("mail", concurrency=2)
    sync_app.sync.set_queue("sms", rate_limit=jobbus.RateLimit(5, timedelta(minutes=1)))
    sync_app.sync.schedule("t", queue="sms")
    assert sync_app.sync.queue_usage() == {"mail": (0, None), "sms": (0, 0)}
