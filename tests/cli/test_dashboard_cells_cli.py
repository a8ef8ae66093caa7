"""`jobbus dashboard` over cells: it probes every cell and serves those it reaches."""

from __future__ import annotations

import logging

import pytest

from jobbus.cli.dashboard import probe_cells
from jobbus.cli.errors import DatabaseUnavailable
from tests.observability.cells import cells_app, unreachable_dsn


async def test_a_cell_that_is_down_at_start_is_named_and_the_others_are_served(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="jobbus.dashboard"):
        await probe_cells(cells_app({"a": dsn, "down": unreachable_dsn()}))
    said = [r.getMessage() for r in caplog.records if r.name == "jobbus.dashboard"]
    assert len(said) == 1 and said[0].startswith("cell down: cannot reach the database"), said


async def test_no_cell_reachable_at_start_is_exit_69() -> None:
    with pytest.raises(DatabaseUnavailable, match=r"cell x: cannot reach the database.*; cell y: cannot reach"):
        await probe_cells(cells_app({"x": unreachable_dsn(), "y": unreachable_dsn()}))
