"""The Python API reference (docs/reference/*.md) renders the public surface: all of it, and nothing else.

A `::: dotted.path` line of a reference page is rendered by mkdocstrings. The public surface is
`jobbus.__all__` and the `__all__` of the modules in `PUBLIC_MODULES`; everything else (the store, the
registry, the worker's services) may change in any release and must not be listed. A class rendered
with an explicit `members:` list leaves out the public-looking members that are not for users: those
are named in `NOT_RENDERED`, so a new method is either listed or left out on purpose.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from types import ModuleType
from typing import Any

import griffe
import pytest
from tools.api_check import PUBLIC_MODULES

from tests.docs.examples import ROOT

REFERENCE = ROOT / "docs" / "reference"
#: Members with public names that a page's `members:` list leaves out, by class, with the reason.
NOT_RENDERED = {
    # The App's machinery, read by the worker, the bus and the integrations.
    "jobbus.App": {
        "registry",
        "store",
        "periodic_store",
        "queue_store",
        "audit_store",
        "handlers",
        "periodics",
        "events",
        "job_scope",  # App(job_scope=...) is documented with the constructor
        "job_defaults",
        "max_attempts_of",
        "build_job_spec",
        "insert_specs",
    },
    "jobbus.SyncApp": {"insert_specs"},
    # What the durable steps and waits are built of; SyncJobExecution calls them.
    # open_payloads: the worker decrypts the claimed payloads with it before the handler runs.
    "jobbus.JobExecution": {"check_open", "stored_step", "store_step", "open_payloads"},
    # The worker's services and wiring.
    "jobbus.Worker": {
        "observers",
        "app",
        "registry",
        "settings",
        "store",
        "instance_id",
        "poll_interval",
        "types",
        "abandoned",
        "pools",
        "workers",
        "maintenance",
        "policy",
        "completer",
        "claimer",
        "control",
        "registrar",
        "monitor",
        "watchdog",
        "producer",
        "leadership",
    },
}

_DIRECTIVE = re.compile(r"^::: (?P<path>\S+)\s*$")


@dataclass
class Directive:
    page: str
    line: int
    path: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"docs/reference/{self.page}:{self.line}: ::: {self.path}"


def _options(lines: list[str]) -> dict[str, Any]:
    """The `options:` block under a directive, in the subset of YAML the pages use."""
    options: dict[str, Any] = {}
    key = None
    for text in lines:
        stripped = text.strip()
        if stripped == "options:":
            continue
        if stripped.startswith("- "):
            assert key is not None and isinstance(options[key], list), f"a list item outside a list: {text!r}"
            options[key].append(stripped[2:].strip().strip("\"'"))
            continue
        name, _, value = stripped.partition(":")
        key, value = name.strip(), value.strip()
        options[key] = [] if value == "" else {"true": True, "false": False}.get(value, value)
    return options


def directives() -> Iterator[Directive]:
    for page in sorted(REFERENCE.glob("*.md")):
        lines = page.read_text().splitlines()
        for index, line in enumerate(lines):
            match = _DIRECTIVE.match(line)
            if match is None:
                continue
            block = []
            for following in lines[index + 1 :]:
                if following.strip() and not following.startswith("    "):
                    break
                if following.strip():
                    block.append(following)
            yield Directive(page.name, index + 1, match["path"], _options(block))


@cache
def _public_names(module_name: str) -> tuple[str, ...]:
    module = importlib.import_module(module_name)
    return tuple(module.__all__)


def _rendered(directive: Directive) -> list[tuple[str, str]]:
    """(module, name) of each public object a directive renders; fails on anything else."""
    if directive.path in PUBLIC_MODULES:
        members = directive.options.get("members")
        assert isinstance(members, list), f"{directive.where}: a module's page names its members (`members:`)"
        outside = sorted(set(members) - set(_public_names(directive.path)))
        assert not outside, f"{directive.where}: not in {directive.path}.__all__: {outside}"
        return [(directive.path, name) for name in members]
    module_name, _, name = directive.path.rpartition(".")
    assert module_name in PUBLIC_MODULES, (
        f"{directive.where}: {module_name} is not a public module; render names of jobbus.__all__ "
        f"or of {', '.join(PUBLIC_MODULES[1:])}"
    )
    assert name in _public_names(module_name), f"{directive.where}: {name} is not in {module_name}.__all__"
    return [(module_name, name)]


def _identity(module_name: str, name: str) -> object:
    """What makes two public names one object: re-exports (`jobbus.MessageBus` is `jobbus.bus.MessageBus`)."""
    value = getattr(importlib.import_module(module_name), name)
    if inspect.isclass(value) or inspect.isfunction(value) or isinstance(value, ModuleType):
        return id(value)
    return f"{module_name}.{name}"  # a constant: only its own name documents it


def test_reference_pages_render_only_public_names() -> None:
    found = list(directives())
    assert len(found) > 40, "docs/reference/ lost its directives"
    for directive in found:
        _rendered(directive)


def test_every_public_name_is_on_one_reference_page() -> None:
    rendered: dict[object, list[str]] = {}
    for directive in directives():
        for module_name, name in _rendered(directive):
            rendered.setdefault(_identity(module_name, name), []).append(f"{directive.where} ({name})")
    twice = {key: where for key, where in rendered.items() if len(where) > 1}
    assert not twice, f"rendered more than once (their anchors would collide): {list(twice.values())}"
    missing = [
        f"{module_name}.{name}"
        for module_name in PUBLIC_MODULES
        for name in _public_names(module_name)
        if _identity(module_name, name) not in rendered
    ]
    assert not missing, f"public but on no page of docs/reference/: {missing}"


@cache
def _griffe_package() -> griffe.Module:
    package = griffe.load("jobbus", search_paths=[str(ROOT / "src")], resolve_aliases=True)
    assert isinstance(package, griffe.Module)
    return package


@pytest.mark.parametrize(
    "directive",
    [d for d in directives() if isinstance(d.options.get("members"), list) and d.path not in PUBLIC_MODULES],
    ids=lambda d: d.path,
)
def test_a_class_with_a_member_list_leaves_out_only_what_it_means_to(directive: Directive) -> None:
    """The members mkdocstrings sees (griffe: instance attributes and inherited members included)."""
    obj = _griffe_package()[directive.path.removeprefix("jobbus.")]
    public = {name for name in obj.all_members if not name.startswith("_")}
    listed = set(directive.options["members"])
    assert listed <= public, f"{directive.where}: no such member: {sorted(listed - public)}"
    left_out = public - listed
    meant = NOT_RENDERED.get(directive.path, set())
    assert left_out <= meant, (
        f"{directive.where}: {sorted(left_out - meant)} neither listed under `members:` nor in NOT_RENDERED"
    )
    assert not meant & listed, f"{directive.where}: in NOT_RENDERED and listed: {sorted(meant & listed)}"


def test_the_site_hides_private_members_and_submodules() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    assert 'filters: ["!^_"]' in config
    assert "show_submodules: false" in config
