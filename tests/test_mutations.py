"""The breaks of `make mutate` (tools/mutations.py) still apply to the code as it is, name tests that
exist, and one whose text moved stops the run naming it. Running the breaks is `make mutate`'s, not CI's."""

from __future__ import annotations

from pathlib import Path

import pytest
from tools.mutate import BreakError, check_break, main
from tools.mutations import BREAKS, MIGRATIONS, Break

from tests.docs.examples import ROOT
from tests.docs.test_reliability import broken
from tests.docs.test_reliability import references as page_references


@pytest.mark.parametrize("brk", BREAKS, ids=[b.name for b in BREAKS])
def test_each_break_finds_its_text_and_names_tests_that_exist(brk: Break) -> None:
    check_break(brk, ROOT)
    assert brk.tests
    assert [problem for problem in map(broken, brk.tests) if problem] == []


def test_the_breaks_have_unique_names_and_cover_the_promises_of_the_audit() -> None:
    names = [b.name for b in BREAKS]
    assert len(names) == len(set(names))
    assert len(BREAKS) >= 15
    for name in (
        "claim-waits-for-locked-jobs",
        "per-key-limit-forgets-the-first-pass",
        "rescuer-takes-attempts-started-after-the-declaration",
    ):
        assert name in names


def test_the_reliability_page_lists_every_break_with_the_tests_it_runs() -> None:
    text = (ROOT / "docs" / "reliability.md").read_text()
    section = text.split("\n## Breaking each promise on purpose\n", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(" `"): line for line in section.splitlines() if line.startswith("| `")}
    assert set(rows) == {b.name for b in BREAKS}
    for brk in BREAKS:
        assert set(page_references(rows[brk.name])) == set(brk.tests), brk.name


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_break_whose_text_moved_stops_the_run_naming_it(tmp_path: Path) -> None:
    tree = _tree(tmp_path, {"src/a.py": "x = 1\nx = 1\n"})
    with pytest.raises(BreakError, match=r"^gone: its original text occurs 0 times in src/a.py, not 1"):
        check_break(Break("gone", "p", "src/a.py", "y = 2", "y = 3", ("tests/x.py",)), tree)
    with pytest.raises(BreakError, match=r"occurs 2 times in src/a.py, not 1"):
        check_break(Break("twice", "p", "src/a.py", "x = 1", "x = 2", ("tests/x.py",)), tree)
    check_break(Break("both", "p", "src/a.py", "x = 1", "x = 2", ("tests/x.py",), count=2), tree)
    with pytest.raises(BreakError, match=r"^missing: src/b.py does not exist"):
        check_break(Break("missing", "p", "src/b.py", "x", "y", ("tests/x.py",)), tree)


def test_a_later_migration_that_repeats_the_text_stops_the_run(tmp_path: Path) -> None:
    body = "FOR UPDATE SKIP LOCKED"
    tree = _tree(tmp_path, {f"{MIGRATIONS}/0001_a.sql": body, f"{MIGRATIONS}/0002_b.sql": body})
    with pytest.raises(BreakError, match=r"0002_b.sql repeats its text after .*0001_a.sql: break the later"):
        check_break(Break("old", "p", f"{MIGRATIONS}/0001_a.sql", body, "FOR UPDATE", ("tests/x.py",)), tree)
    check_break(Break("new", "p", f"{MIGRATIONS}/0002_b.sql", body, "FOR UPDATE", ("tests/x.py",)), tree)


def test_check_and_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check"]) == 0
    assert capsys.readouterr().out == f"{len(BREAKS)} breaks find their text\n"
    with pytest.raises(SystemExit) as exit_info:
        main(["--only", "no-such-break"])
    assert exit_info.value.code == 2
    assert "no break named no-such-break" in capsys.readouterr().err
