"""The examples of README.md and docs/*.md as tests, collected by Sybil (see the root conftest.py).

- ```python blocks run in order, one namespace per document, as a reader would run them: `__name__`
  is `"__main__"`, `JOBBUS_DSN` (and `dsn` in the namespace) point at a fresh migrated database of
  the test server, top-level `await` runs on one event loop per document. A block whose first line
  is a comment naming a file (`# shop/messaging.py`) is written to that path in a directory on
  `sys.path` and imported, so later blocks can import it as the reader's project would.
- ```bash and ```sh blocks are not run, but every `jobbus ...` command in them is parsed by the real
  CLI's parser (click, without running anything): an unknown command, a renamed option or a stray
  argument fails the document. So are the `jobbus` commands of ```ini, ```yaml and ```dockerfile
  blocks (`ExecStart=`, `command=`, exec-form arrays).
- `<!-- skip: next "why" -->` before a block skips it, with the reason shown by pytest;
  `<!-- invisible-code-block: python ... -->` runs setup or checks that a reader need not see.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import inspect
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import pytest
from sybil import Example, Sybil
from sybil.evaluators.python import pad
from sybil.parsers.markdown import CodeBlockParser, SkipParser

import jobbus
from jobbus.cli import cli
from tests.dbserver import ensure_template, fresh_database, server_dsn

ROOT = Path(__file__).resolve().parent.parent.parent
#: The documents whose examples are tests, relative to the repository root.
DOCUMENTS = ("README.md", "docs/*.md")

_STATE = "__docs_state__"
_MODULE_FILE = re.compile(r"#\s*(?P<path>[\w./-]+\.py)(?:\s|$)")
_SHELL_OPERATORS = frozenset("|&;()<>")
_COMMAND_PREFIXES = frozenset({"xargs", "exec", "sudo", "time", "watch", "nohup"})


class _DocumentState:
    """What one document's examples share, and everything to undo after its last example."""

    def __init__(self) -> None:
        self.exit = contextlib.ExitStack()
        self.loop = asyncio.new_event_loop()
        self.exit.callback(self.loop.close)
        self.directory = Path(self.exit.enter_context(tempfile.TemporaryDirectory(prefix="jobbus-docs-")))
        self.modules: list[str] = []

    def close(self, namespace: dict[str, Any]) -> None:
        values = list(namespace.values())
        for name in self.modules:
            module = sys.modules.pop(name, None)
            if module is not None:
                values.extend(vars(module).values())
        for app in {id(v): v for v in values if isinstance(v, jobbus.App)}.values():
            app.sync.close()
            while app._pool is not None:  # opened by a top-level `await app.open()` / `async with`
                self.loop.run_until_complete(app.close())
        self.exit.close()


def setup_document(namespace: dict[str, Any]) -> None:
    state = _DocumentState()
    try:
        dsn = state.exit.enter_context(fresh_database(server_dsn(), ensure_template(server_dsn())))
        patch = state.exit.enter_context(pytest.MonkeyPatch.context())
        for name in [name for name in os.environ if name.startswith("JOBBUS_")]:
            patch.delenv(name)
        patch.setenv("JOBBUS_DSN", dsn)
        patch.syspath_prepend(str(state.directory))
    except BaseException:
        state.exit.close()
        raise
    namespace.update({_STATE: state, "__name__": "__main__", "dsn": dsn})


def teardown_document(namespace: dict[str, Any]) -> None:
    state = namespace.pop(_STATE, None)
    if isinstance(state, _DocumentState):
        state.close(namespace)


def run_python(example: Example) -> None:
    """Run a block like a script in the document's namespace, or save and import it as a module."""
    __tracebackhide__ = True
    namespace = example.namespace
    state: _DocumentState = namespace[_STATE]
    source = str(example.parsed)
    line = example.line + example.parsed.line_offset
    module_file = _MODULE_FILE.match(source.split("\n", 1)[0])
    if module_file is not None:
        _import_module_file(state, module_file["path"], pad(source, line))
        return
    code = compile(pad(source, line), example.path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    result = eval(code, namespace)
    if code.co_flags & inspect.CO_COROUTINE:
        state.loop.run_until_complete(result)
    namespace.pop("__builtins__", None)


def _import_module_file(state: _DocumentState, relative: str, source: str) -> None:
    path = state.directory / relative
    for package in reversed(path.relative_to(state.directory).parents[:-1]):
        (state.directory / package).mkdir(exist_ok=True)
        (state.directory / package / "__init__.py").touch()
    path.write_text(source)
    name = ".".join(Path(relative).with_suffix("").parts)
    importlib.invalidate_caches()
    state.modules.extend(_parents_and_self(name))
    importlib.import_module(name)


def _parents_and_self(name: str) -> Iterator[str]:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        yield ".".join(parts[:end])


def check_commands(example: Example) -> str | None:
    """Every `jobbus ...` command line of a shell block must parse against the real CLI."""
    return _problems(example, jobbus_commands(str(example.parsed)))


def check_config_commands(example: Example) -> str | None:
    """Every `jobbus` command of a supervisor configuration must parse against the real CLI."""
    return _problems(example, config_commands(str(example.parsed)))


def _problems(example: Example, commands: Iterable[tuple[int, list[str]]]) -> str | None:
    problems = [
        f"line {example.line + offset}: `{' '.join(argv)}`: {problem}"
        for offset, argv in commands
        if (problem := parse_problem(argv[1:])) is not None
    ]
    return "\n".join(problems) or None


def config_commands(text: str) -> Iterator[tuple[int, list[str]]]:
    """`jobbus` commands of `ExecStart=` / `command=` lines (systemd, Supervisor) and of exec-form
    arrays such as `CMD ["jobbus", "worker", ...]` (Docker, Compose, Kubernetes)."""
    lines = text.splitlines()
    shell: list[str] = []
    for index, line in enumerate(lines):
        key = re.match(r"(ExecStart|command)=", line)
        continued = index > 0 and lines[index - 1].endswith("\\") and bool(shell[-1])
        shell.append(line[key.end() :] if key else line if continued else "")
    yield from jobbus_commands("\n".join(shell))
    for index, line in enumerate(lines):
        for array in re.findall(r"\[\s*\"[^\]]*\]", line):
            argv = json.loads(array)
            if Path(argv[0]).name == "jobbus":
                yield index, argv


def jobbus_commands(script: str) -> Iterator[tuple[int, list[str]]]:
    """(line offset, argv) of each `jobbus` command in a shell script, pipes and `$(...)` included."""
    start, pending = 0, ""
    for offset, line in enumerate(script.splitlines()):
        if not pending:
            start = offset
        pending += line + "\n"
        if line.endswith("\\"):
            continue
        try:
            commands = list(_commands_in(pending.replace("\\\n", " ")))
        except ValueError:  # a quotation still open: the command goes on on the next line
            continue
        yield from ((start, argv) for argv in commands)
        pending = ""
    if pending:
        raise ValueError(f"unterminated shell command: {pending!r}")


def _commands_in(text: str) -> Iterator[list[str]]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    simple: list[str] = []  # the current simple command, up to the next operator
    command: list[str] | None = None
    for token in [*tokens, ";"]:
        if "$(" in token:
            yield from _commands_in(token.split("$(", 1)[1])
        if set(token) <= _SHELL_OPERATORS:
            if command is not None:
                yield command
            simple, command = [], None
            continue
        if command is not None:
            command.append(token)
        elif Path(token).name == "jobbus" and all(
            "=" in word or word in _COMMAND_PREFIXES or (simple[0] in _COMMAND_PREFIXES and word.startswith("-"))
            for word in simple
        ):
            command = ["jobbus"]
        simple.append(token)


def parse_problem(args: Sequence[str]) -> str | None:
    """Parse `jobbus ARGS` as the CLI would, without running it; what is wrong, or None.

    Only click's parser runs (option names, option arity, positional arguments, subcommands): no
    callback, no type conversion, so placeholders such as `$POD_NAME` pass and `--help` prints nothing.
    """
    command: click.Command = cli
    ctx = click.Context(cli, info_name="jobbus")
    rest = list(args)
    while True:
        try:
            _, leftover, _ = command.make_parser(ctx).parse_args(args=rest)
        except click.UsageError as exc:
            return exc.format_message()
        if not isinstance(command, click.Group):
            return f"unexpected argument(s): {' '.join(leftover)}" if leftover else None
        if not leftover:
            return None
        name, rest = leftover[0], leftover[1:]
        sub = command.get_command(ctx, name)
        if sub is None:
            return f"no such command {name!r} in `{ctx.command_path}`"
        command, ctx = sub, click.Context(sub, info_name=name, parent=ctx)


def docs_sybil() -> Sybil:
    return Sybil(
        parsers=[
            SkipParser(),
            CodeBlockParser("python", run_python),
            CodeBlockParser("bash", check_commands),
            CodeBlockParser("sh", check_commands),
            *(CodeBlockParser(language, check_config_commands) for language in ("ini", "yaml", "dockerfile")),
        ],
        path=str(ROOT),
        patterns=DOCUMENTS,
        setup=setup_document,
        teardown=teardown_document,
        name="docs",
    )


pytest_collect_file = docs_sybil().pytest()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `-n N`: each document's examples on one worker, in order; every other test as `--dist load`.

    (An `xdist_group` mark with `--dist loadgroup` would say the same, but pytest-xdist 3.8 cannot
    apply it to the node ids of pytest 9.2.)
    """
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class DocumentScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path.endswith(".md") else nodeid

    return DocumentScheduling(config, log)
