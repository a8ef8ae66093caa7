"""`make api-check`: a change of the public surface since the last release fails until CHANGELOG.md names it.

The check runs as CI runs it (tools/api_check.py in a subprocess) against this checkout and against copies
of the tree with a change made to them; the releases are read from this repository's history.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tools.api_check import CheckError, cli_changes, names_in, parse_changelog, unnamed

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "tools" / "api_check.py"
SURFACE = ROOT / "docs" / "cli-surface.txt"


def api_check(tree: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), "--tree", str(tree), "--repo", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what the check reads of the tree: the source, CHANGELOG.md, pyproject.toml, the CLI surface."""
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "docs").mkdir()
    for name in ("CHANGELOG.md", "pyproject.toml", "docs/cli-surface.txt"):
        shutil.copyfile(ROOT / name, copy / name)
    return copy


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path} no longer holds {old!r}: pick another change to fake"
    path.write_text(text.replace(old, new, 1))


def add_entry(tree: Path, bullet: str) -> None:
    """A bullet under `[Unreleased]`, which a release commit leaves empty."""
    changelog = tree / "CHANGELOG.md"
    added = "## [Unreleased]\n\n### Added\n\n"
    if added in changelog.read_text():
        edit(changelog, added, f"{added}- {bullet}\n")
    else:
        edit(changelog, "## [Unreleased]\n", f"{added}- {bullet}\n")


def test_the_tree_names_every_change_since_the_last_release() -> None:
    done = api_check()
    assert done.returncode == 0, done.stderr
    assert "every change of the public surface since the last release is in CHANGELOG.md" in done.stdout


def test_a_breaking_signature_change_fails_until_an_entry_names_it(tree: Path) -> None:
    edit(
        tree / "src/jobbus/errors.py",
        "def __init__(self, delay: float | timedelta) -> None:",
        "def __init__(self, delay: float | timedelta, reason: str) -> None:",
    )
    done = api_check(tree)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Snooze.__init__" in done.stderr and "[Snooze, reason]" in done.stderr
    add_entry(tree, "`Snooze` takes a `reason`.")
    done = api_check(tree)
    assert done.returncode == 0, done.stderr


def test_a_new_optional_parameter_fails_until_an_entry_names_it(tree: Path) -> None:
    """griffe's check passes what is compatible; a new parameter is still a change to name."""
    edit(
        tree / "src/jobbus/errors.py",
        "def __init__(self, delay: float | timedelta) -> None:",
        'def __init__(self, delay: float | timedelta, *, reason: str = "") -> None:',
    )
    done = api_check(tree)
    assert done.returncode == 1
    assert "Snooze.__init__ takes a new parameter reason  [Snooze, reason]" in done.stderr
    add_entry(tree, "`Snooze(delay, reason=...)` says why in the job's history.")
    done = api_check(tree)
    assert done.returncode == 0, done.stderr


def test_a_name_added_to_all_fails_until_an_entry_names_it(tree: Path) -> None:
    init = tree / "src/jobbus/__init__.py"
    edit(init, "__all__ = [\n", '__all__ = [\n    "describe_everything",\n')
    init.write_text(init.read_text() + '\n\ndef describe_everything() -> str:\n    return ""\n')
    done = api_check(tree)
    assert done.returncode == 1
    assert "jobbus.__all__ gained describe_everything  [describe_everything]" in done.stderr
    add_entry(tree, "Two entries name it in passing: `describe` and `everything` are not the name.")
    assert api_check(tree).returncode == 1
    add_entry(tree, "`jobbus.describe_everything()`.")
    done = api_check(tree)
    assert done.returncode == 0, done.stderr


def test_a_new_flag_fails_until_the_surface_is_regenerated_and_an_entry_names_it(tree: Path) -> None:
    edit(
        tree / "src/jobbus/cli/prune.py",
        '@click.command("prune")\n',
        '@click.command("prune")\n@click.option("--keep-failed", is_flag=True)\n',
    )
    done = api_check(tree)
    assert done.returncode == 1
    assert "docs/cli-surface.txt is not the CLI's surface: run `make cli-surface`" in done.stderr
    assert "`jobbus prune` gained `--keep-failed flag`  [prune, --keep-failed]" in done.stderr
    surface = subprocess.run(
        [sys.executable, str(ROOT / "tools/cli_surface.py"), "--print"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tree / "src")},
        check=True,
    ).stdout
    assert "jobbus prune\n    --keep-failed flag\n" in surface
    (tree / "docs/cli-surface.txt").write_text(surface)
    add_entry(tree, "`jobbus prune --keep-failed` keeps the failed jobs.")
    done = api_check(tree)
    assert done.returncode == 0, done.stderr


def test_a_release_heading_must_name_a_commit_of_its_version(tree: Path) -> None:
    changelog = tree / "CHANGELOG.md"
    zero_one, zero_two = (release.commit for release in parse_changelog(changelog.read_text()).releases[-1:-3:-1])
    assert zero_one is not None and zero_two is not None
    edit(changelog, f"## [0.2.0] - 2026-12-01 - commit {zero_two}", f"## [0.2.0] - 2026-12-01 - commit {zero_one}")
    done = api_check(tree)
    assert done.returncode == 2
    assert f"the commit {zero_one}" in done.stderr and "of release 0.2.0 has version 0.1.0" in done.stderr


def test_a_release_being_cut_compares_with_the_previous_one(tree: Path) -> None:
    """The release commit moves [Unreleased] under its own heading, whose commit is recorded afterwards."""
    changelog = tree / "CHANGELOG.md"
    newest = parse_changelog(changelog.read_text()).releases[0]
    if newest.commit is None:  # this checkout is a release commit: its own commit records it in the copy
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=True)
        edit(
            changelog,
            f"## [{newest.version}] - {newest.date}\n",
            f"## [{newest.version}] - {newest.date} - commit {head.stdout.strip()}\n",
        )
    major, minor, _ = newest.version.split(".")
    following = f"{major}.{int(minor) + 1}.0"
    edit(changelog, "## [Unreleased]\n", f"## [Unreleased]\n\n## [{following}] - 2099-01-01\n")
    done = api_check(tree)
    assert done.returncode == 2
    assert f"release {following} names no commit yet, but pyproject.toml says version {newest.version}" in done.stderr
    edit(tree / "pyproject.toml", f'version = "{newest.version}"', f'version = "{following}"')
    done = api_check(tree)
    assert done.returncode == 0, done.stderr


def test_only_the_newest_release_may_wait_for_its_commit() -> None:
    text = "## [Unreleased]\n\n## [0.2.0] - 2026-12-01 - commit 149910a\n\n## [0.1.0] - 2026-11-30\n"
    with pytest.raises(CheckError, match=r"release 0\.1\.0 names no commit"):
        parse_changelog(text)
    with pytest.raises(CheckError, match=r"'## \[0\.3\.0\]' is not `## \[X\.Y\.Z\] - YYYY-MM-DD - commit HASH`"):
        parse_changelog("## [Unreleased]\n\n## [0.3.0]\n")


def test_a_bullet_names_a_change_by_whole_words() -> None:
    assert names_in("`App.schedule(..., cell=NAME)` places a job", ("schedule", "cell"))
    assert not names_in("a scheduled job's cells", ("schedule", "cell"))
    assert names_in("`jobbus schedule --in DURATION`", ("schedule", "--in"))
    assert not names_in("`jobbus schedule --interval`", ("schedule", "--in"))
    changes = list(cli_changes("jobbus jobs list\n    --tag TEXT\n", "jobbus jobs list\n    --tag TEXT repeatable\n"))
    assert [change.names for change in changes] == [("jobs", "list", "--tag")]
    bullets = ("`jobbus jobs list --tag` is repeatable", "`--tag` of `jobbus schedule`")
    assert unnamed(changes, bullets[1:]) == changes
    assert unnamed(changes, bullets) == []


def test_the_committed_cli_surface_is_current_and_a_stale_one_fails(tmp_path: Path) -> None:
    generator = [sys.executable, str(ROOT / "tools/cli_surface.py"), "--check"]
    done = subprocess.run(generator, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    stale = tmp_path / "cli-surface.txt"
    stale.write_text(SURFACE.read_text().replace("    --older-than TEXT required\n", ""))
    assert SURFACE.read_text() != stale.read_text()
    done = subprocess.run([*generator, "--target", str(stale)], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "+    --older-than TEXT required" in done.stderr and "is stale: run `make cli-surface`" in done.stderr
