"""Fail when the public surface changed since the last release without CHANGELOG.md naming the change.

The last release is the newest `## [X.Y.Z] - DATE - commit HASH` heading of CHANGELOG.md (tags are not
read: a clone may have none). Its source is read with `git archive` and compared with the tree's:

- the Python API, with griffe: the names added to or removed from the `__all__` of each public module
  (docs/stability.md lists them), public modules added or removed, what griffe's API check reports
  as breaking (a parameter removed, moved, made required or given another default, an object removed or
  changed in kind, a base class removed, ...), and what it leaves out as compatible: a new parameter of
  a public function or method, a new public method of a public class;
- the command line: commands and their flags, types, choices and multiplicity, as tools/cli_surface.py
  lists them (also checked here to be the committed docs/cli-surface.txt).

Each change must be named by one bullet of the sections above that release's heading ([Unreleased],
and a release being cut whose commit is not recorded yet): a bullet names a change when it holds each of
the change's names as a whole word (`schedule` and `cell` for a parameter `cell` of `App.schedule`;
`jobs`, `list` and `--tag` for a flag of `jobbus jobs list`). Every release heading that names a commit
is checked too: the commit must exist and its pyproject.toml must carry the heading's version.

    python tools/api_check.py              # `make api-check`
    python tools/api_check.py --tree DIR   # check a copy of the tree (DIR's src/, CHANGELOG.md, docs/)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parent.parent
SURFACE = Path("docs/cli-surface.txt")
#: The modules whose `__all__` is public (docs/stability.md); other modules may change in any release.
PUBLIC_MODULES = (
    "jobbus",
    "jobbus.bus",
    "jobbus.dashboard",
    "jobbus.testing",
    "jobbus.contrib.asgi",
    "jobbus.contrib.fastapi",
    "jobbus.contrib.django",
    "jobbus.contrib.django.dashboard",
)
RELEASE = re.compile(
    r"^## \[(?P<version>\d+\.\d+\.\d+)\] - (?P<date>\d{4}-\d{2}-\d{2})(?: - commit (?P<commit>[0-9a-f]{7,40}))?\s*$"
)
UNRELEASED = "## [Unreleased]"
PARAMETER_BREAKAGES = {
    griffe.BreakageKind.PARAMETER_MOVED,
    griffe.BreakageKind.PARAMETER_REMOVED,
    griffe.BreakageKind.PARAMETER_CHANGED_KIND,
    griffe.BreakageKind.PARAMETER_CHANGED_DEFAULT,
    griffe.BreakageKind.PARAMETER_CHANGED_REQUIRED,
    griffe.BreakageKind.PARAMETER_ADDED_REQUIRED,
}


class CheckError(Exception):
    """The check could not run (a malformed CHANGELOG.md, a missing commit): what to fix."""


@dataclass(frozen=True)
class Release:
    """A release heading of CHANGELOG.md; `commit` is None while the release is cut, until it is recorded."""

    version: str
    date: str
    commit: str | None
    line: int


@dataclass(frozen=True)
class Change:
    """One change of the public surface, and the names a CHANGELOG bullet must hold to name it."""

    what: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class Changelog:
    """The releases, newest first; the newest with a recorded commit is what the tree is compared with."""

    releases: tuple[Release, ...]
    baseline: Release
    #: The bullets above the baseline's heading, each joined into one line.
    pending: tuple[str, ...]


def parse_changelog(text: str) -> Changelog:
    """The release headings, newest first, and the bullets written since the last recorded release."""
    lines = text.splitlines()
    if UNRELEASED not in lines:
        raise CheckError(f"CHANGELOG.md has no `{UNRELEASED}` heading")
    releases = []
    for number, line in enumerate(lines, start=1):
        if line.startswith("## ") and line != UNRELEASED:
            match = RELEASE.match(line)
            if match is None:
                raise CheckError(
                    f"CHANGELOG.md:{number}: {line!r} is not `## [X.Y.Z] - YYYY-MM-DD - commit HASH` "
                    "(or, while a release is cut, the same without ` - commit HASH`)"
                )
            releases.append(Release(match["version"], match["date"], match["commit"], number))
    for release in releases[1:]:
        if release.commit is None:
            raise CheckError(
                f"CHANGELOG.md:{release.line}: release {release.version} names no commit; only the newest "
                "release, while it is cut, may wait for its commit to be recorded"
            )
    recorded = [release for release in releases if release.commit is not None]
    if not recorded:
        raise CheckError("CHANGELOG.md names no release with its commit (`## [X.Y.Z] - DATE - commit HASH`)")
    bullets: list[str] = []
    for line in lines[lines.index(UNRELEASED) + 1 : recorded[0].line - 1]:
        if line.startswith("- "):
            bullets.append(line[2:])
        elif bullets and line.startswith("  ") and line.strip():
            bullets[-1] += " " + line.strip()
    return Changelog(tuple(releases), recorded[0], tuple(bullets))


def names_in(bullet: str, names: Iterable[str]) -> bool:
    """Whether the bullet holds every name as a whole word (`App.schedule` holds `schedule`)."""
    return all(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", bullet) for name in names)


def unnamed(changes: Iterable[Change], bullets: Sequence[str]) -> list[Change]:
    return [change for change in changes if not any(names_in(bullet, change.names) for bullet in bullets)]


def git(repo: Path, *args: str) -> bytes:
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=False)
    if result.returncode != 0:
        raise CheckError(f"git {' '.join(args)}: {result.stderr.decode().strip()}")
    return result.stdout


def check_release_commits(repo: Path, releases: Iterable[Release], tree_version: str) -> None:
    """Each recorded commit exists and carries its release's version; an unrecorded one is the tree's."""
    for release in releases:
        if release.commit is None:
            if release.version != tree_version:
                raise CheckError(
                    f"CHANGELOG.md:{release.line}: release {release.version} names no commit yet, but "
                    f"pyproject.toml says version {tree_version}"
                )
            continue
        try:
            pyproject = git(repo, "show", f"{release.commit}:pyproject.toml")
        except CheckError as exc:
            raise CheckError(
                f"CHANGELOG.md:{release.line}: the commit {release.commit} of release {release.version} cannot be "
                f"read ({exc}); a shallow clone needs `git fetch --unshallow`"
            ) from None
        version = tomllib.loads(pyproject.decode())["project"]["version"]
        if version != release.version:
            raise CheckError(
                f"CHANGELOG.md:{release.line}: the commit {release.commit} of release {release.version} has "
                f"version {version} in its pyproject.toml"
            )


def extract_src(repo: Path, commit: str, into: Path) -> Path:
    """The release's src/ in `into`, read from git without touching the work tree."""
    with tempfile.TemporaryFile() as archive:
        archive.write(git(repo, "archive", "--format=tar", commit, "src"))
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(into, filter="data")
    return into / "src"


def released_cli_surface(repo: Path, commit: str, src: Path) -> str:
    """The release's committed docs/cli-surface.txt, or for a release before it, the surface its source lists."""
    exists = ["git", "-C", str(repo), "cat-file", "-e", f"{commit}:{SURFACE}"]
    if subprocess.run(exists, capture_output=True, check=False).returncode != 0:
        return cli_surface_of(src)
    return git(repo, "show", f"{commit}:{SURFACE}").decode()


def load_api(src: Path) -> griffe.ModulesCollection:
    """The package read statically from `src` (nothing imported), its submodules hidden from the check."""
    loader = griffe.GriffeLoader(search_paths=[src], allow_inspection=False)
    loader.load("jobbus")
    loader.resolve_aliases(implicit=False, external=False)
    for path in PUBLIC_MODULES:
        module = public_module(loader.modules_collection, path)
        if module is not None:
            for member in module.members.values():
                if not member.is_alias and member.is_module:
                    # griffe counts every module as public; here only PUBLIC_MODULES' __all__ is.
                    member.public = False
    return loader.modules_collection


def public_module(modules: griffe.ModulesCollection, path: str) -> griffe.Object | None:
    try:
        found = modules.get_member(path)
    except KeyError:
        return None
    return found if isinstance(found, griffe.Object) else None


def exported(module: griffe.Object) -> set[str]:
    """The names of the module's `__all__` (griffe keeps a name added from another module's as an expression)."""
    return {name if isinstance(name, str) else name.name for name in module.exports or ()}


def breakage_names(breakage: griffe.Breakage) -> tuple[str, ...]:
    """`TaskOptions` and `values` for a default changed in `TaskOptions.__init__(values=...)`."""
    obj = breakage.obj
    names = []
    if obj.parent is not None and obj.parent.is_class:
        names.append(obj.parent.name)
    if obj.name != "__init__":
        names.append(obj.name)
    if breakage.kind in PARAMETER_BREAKAGES:
        parameter = breakage.new_value if breakage.new_value is not None else breakage.old_value
        names.append(parameter.name)
    return tuple(names)


def python_changes(old: griffe.ModulesCollection, new: griffe.ModulesCollection) -> Iterator[Change]:
    for path in PUBLIC_MODULES:
        old_module, new_module = public_module(old, path), public_module(new, path)
        if old_module is None and new_module is None:
            continue
        if old_module is None or new_module is None:
            verb = "added" if old_module is None else "removed"
            yield Change(f"the public module {path} was {verb}", (path,))
            continue
        old_names, new_names = exported(old_module), exported(new_module)
        for name in sorted(new_names - old_names):
            yield Change(f"{path}.__all__ gained {name}", (name,))
        for name in sorted(old_names - new_names):
            yield Change(f"{path}.__all__ lost {name}", (name,))
        for breakage in griffe.find_breaking_changes(old_module, new_module):
            if breakage.kind is griffe.BreakageKind.OBJECT_REMOVED and breakage.obj.name in old_names - new_names:
                continue  # reported above as a name gone from __all__
            explained = breakage.explain(griffe.ExplanationStyle.MARKDOWN).strip().removeprefix("- ")
            yield Change(f"{breakage.obj.path}: {explained}", breakage_names(breakage))
        yield from additions(old_module, new_module, old_names & new_names)


def public_callables(module: griffe.Object, names: Iterable[str]) -> dict[tuple[str, ...], griffe.Function]:
    """The module's public functions among `names`, and the public methods of its public classes, by
    (name,) and (class, method)."""
    found: dict[tuple[str, ...], griffe.Function] = {}
    for name in names:
        target = resolved(module.members.get(name))
        if isinstance(target, griffe.Function):
            found[(name,)] = target
        elif isinstance(target, griffe.Class):
            for method_name, member in target.all_members.items():
                method = resolved(member) if member.is_public else None
                if isinstance(method, griffe.Function):
                    found[(name, method_name)] = method
    return found


def resolved(member: griffe.Object | griffe.Alias | None) -> griffe.Object | None:
    """What an alias (a re-exported name) points at; None when it leaves the package."""
    if isinstance(member, griffe.Alias):
        try:
            return member.final_target
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None
    return member


def additions(old_module: griffe.Object, new_module: griffe.Object, names: set[str]) -> Iterator[Change]:
    """What griffe's check leaves out as compatible: a new method of a public class, a new parameter."""
    old, new = public_callables(old_module, names), public_callables(new_module, names)
    for key, function in sorted(new.items()):
        words = tuple(word for word in key if word != "__init__")
        if key not in old:
            yield Change(f"{'.'.join(key)} is new", words)
            continue
        known = {parameter.name for parameter in old[key].parameters}
        for parameter in function.parameters:
            if parameter.name not in known:
                yield Change(f"{'.'.join(key)} takes a new parameter {parameter.name}", (*words, parameter.name))


def parse_surface(text: str) -> dict[str, dict[str, str]]:
    """Command path -> {a parameter's first token (`--tag`, `<ID>`): its whole line}."""
    commands: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith(" "):
            if current is None:
                raise CheckError(f"a parameter before any command in the CLI surface: {line!r}")
            description = line.strip()
            current[description.split(" ", 1)[0]] = description
        else:
            current = commands.setdefault(line.strip(), {})
    return commands


def flag_names(token: str) -> tuple[str, ...]:
    """What a bullet must name of a parameter: its long flag (`--json` of `--json/--no-json`)."""
    if token.startswith("<"):
        return ()
    flags = token.split("/")
    long = [flag for flag in flags if flag.startswith("--")]
    return tuple(long or flags)[:1]


def cli_changes(old_text: str, new_text: str) -> Iterator[Change]:
    old, new = parse_surface(old_text), parse_surface(new_text)
    for command in sorted(old.keys() | new.keys()):
        words = tuple(command.split()[1:])
        if command not in new:
            yield Change(f"the command `{command}` was removed", words)
            continue
        if command not in old:
            yield Change(f"the command `{command}` was added", words)
            continue
        before, after = old[command], new[command]
        for token in sorted(before.keys() | after.keys()):
            if before.get(token) == after.get(token):
                continue
            if token not in after:
                what = f"lost `{before[token]}`"
            elif token not in before:
                what = f"gained `{after[token]}`"
            else:
                what = f"changed `{before[token]}` to `{after[token]}`"
            yield Change(f"`{command}` {what}", words + flag_names(token))


def cli_surface_of(src: Path) -> str:
    """The CLI surface of the jobbus in `src`, listed by a Python that imports it from there."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools/cli_surface.py"), "--print"], capture_output=True, env=env, check=False
    )
    if result.returncode != 0:
        raise CheckError(f"listing the CLI of {src} failed:\n{result.stderr.decode()}")
    return result.stdout.decode()


def run(tree: Path, repo: Path) -> list[str]:
    """The problems found: empty when the surface's changes since the last release are all named."""
    changelog = parse_changelog((tree / "CHANGELOG.md").read_text())
    tree_version = tomllib.loads((tree / "pyproject.toml").read_text())["project"]["version"]
    check_release_commits(repo, changelog.releases, tree_version)
    baseline = changelog.baseline
    assert baseline.commit is not None
    problems = []
    new_surface = cli_surface_of(tree / "src")
    committed = tree / SURFACE
    if not committed.exists() or committed.read_text() != new_surface:
        problems.append(f"{SURFACE} is not the CLI's surface: run `make cli-surface` and commit it")
    with tempfile.TemporaryDirectory(prefix="jobbus-api-check-") as scratch:
        old_src = extract_src(repo, baseline.commit, Path(scratch))
        old_surface = released_cli_surface(repo, baseline.commit, old_src)
        changes = [
            *python_changes(load_api(old_src), load_api(tree / "src")),
            *cli_changes(old_surface, new_surface),
        ]
    missing = unnamed(changes, changelog.pending)
    if missing:
        problems.append(
            f"{len(missing)} change(s) of the public surface since {baseline.version} (commit {baseline.commit}) "
            f"that no bullet of CHANGELOG.md's {UNRELEASED} names; write one that holds the names in brackets:"
        )
        problems.extend(f"  - {change.what}  [{', '.join(change.names)}]" for change in missing)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the tree to check (default: this checkout)")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the git repository holding the releases")
    args = parser.parse_args(argv)
    try:
        problems = run(args.tree, args.repo)
    except CheckError as exc:
        print(f"api-check: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"api-check: {problem}" if not problem.startswith("  ") else problem, file=sys.stderr)
    if not problems:
        print("api-check: every change of the public surface since the last release is in CHANGELOG.md")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
