"""docs/reliability.md names, for every guarantee, the tests that prove it: each named test must exist.

A reference is `tests/path/test_file.py::name` (or `::Class::name`), or a bare `tests/...py` file. The
files are parsed, never imported, so a renamed or deleted test fails here even if nothing imports it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.docs.examples import ROOT

DOC = ROOT / "docs" / "reliability.md"
REFERENCE = re.compile(r"\btests/[\w/]+\.py(?:::\w+)*")


def references(text: str) -> list[str]:
    return sorted(set(REFERENCE.findall(text)))


def _defines(body: list[ast.stmt], names: list[str]) -> bool:
    """Whether `body` defines the function or class `names[0]` (and, inside a class, the rest)."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == names[0]:
            return len(names) == 1 or (isinstance(node, ast.ClassDef) and _defines(node.body, names[1:]))
    return False


def broken(reference: str, root: Path = ROOT) -> str | None:
    """Why `reference` does not name a test of the tree at `root`, or None if it does."""
    path, *names = reference.split("::")
    file = root / path
    if not file.is_file():
        return f"{reference}: no file {path}"
    if names and not _defines(ast.parse(file.read_text(), filename=str(file)).body, names):
        return f"{reference}: {path} defines no {'::'.join(names)}"
    return None


def test_every_test_the_reliability_page_names_exists() -> None:
    found = references(DOC.read_text())
    assert len(found) > 50, f"only {len(found)} test references found: has the table's format changed?"
    assert [problem for problem in map(broken, found) if problem] == []


def test_the_table_covers_the_sections_of_spec_it_lists() -> None:
    text = DOC.read_text()
    for section in ("1", "12", "13", "16", "17"):
        assert re.search(rf"^\| {section} \|", text, re.MULTILINE), f"no row of SPEC section {section}"


def test_a_renamed_or_missing_test_is_reported(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test_kept():\n    pass\n\nasync def test_async():\n    pass\n\n"
        "class TestGroup:\n    def test_inner(self):\n        pass\n"
    )
    text = (
        "| 1 | a promise | `tests/test_x.py::test_kept`<br>`tests/test_x.py::test_async` |\n"
        "| 1 | nested | `tests/test_x.py::TestGroup::test_inner`, `tests/test_x.py` |\n"
        "| 1 | renamed | `tests/test_x.py::test_renamed`, `tests/test_x.py::TestGroup::test_gone` |\n"
        "| 1 | missing | `tests/test_gone.py::test_kept` |\n"
    )
    problems = sorted(p for p in (broken(r, tmp_path) for r in references(text)) if p)
    assert problems == [
        "tests/test_gone.py::test_kept: no file tests/test_gone.py",
        "tests/test_x.py::TestGroup::test_gone: tests/test_x.py defines no TestGroup::test_gone",
        "tests/test_x.py::test_renamed: tests/test_x.py defines no test_renamed",
    ]
