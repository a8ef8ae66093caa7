"""A failed fault scenario prints what its fleets left: the database's state and the workers' logs."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from tests.faults.harness import STARTED


@pytest.fixture(autouse=True)
def _forget_earlier_fleets() -> None:
    STARTED.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    if report.when == "call" and report.failed:
        for n, fleet in enumerate(STARTED):
            report.sections.append((f"fleet {n}", fleet.explain()))
    return report
