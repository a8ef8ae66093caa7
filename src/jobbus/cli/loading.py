"""Resolving `--app module:attr` into an open `App` for the whole command.

`attr` may be an `App`, a callable returning one (sync or async), or an async context manager factory
that yields one; the factory owns pools and clients for the whole run and is exited after it, also
on errors and signals.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from jobbus.app import App
from jobbus.cli.suggest import one_of
from jobbus.settings import Settings


class AppLoadError(Exception):
    """`--app` does not name something that gives an App; the CLI exits 78."""


def import_target(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr or module_name.startswith("."):
        raise AppLoadError(f"--app {spec!r}: expected module:attribute, e.g. myproject.jobs:app")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`, the current directory is importable
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not _names_the_target(exc, module_name):
            raise  # a missing import inside the user's module: its traceback shows where
        raise AppLoadError(
            f"--app {spec!r}: no module named {exc.name!r} (run from the project directory, or check PYTHONPATH)"
        ) from None
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise AppLoadError(
                f"--app {spec!r}: module {module_name!r} has no attribute {attr!r}{_apps_beside(spec)}"
            ) from None
    return target


def _names_the_target(exc: ModuleNotFoundError, module_name: str) -> bool:
    """Whether the module that is missing is `module_name` itself or one of its parent packages."""
    return exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + "."))


@contextlib.asynccontextmanager
async def open_app(spec: str | None, dsn: str | None) -> AsyncIterator[App]:
    """Yield the App named by `spec` (or an App from the environment when None).

    The database: `dsn` (the command's --dsn flag) when given, else the App's own `dsn` keyword, else
    `JOBBUS_DSN`; the App resolves the last two itself.
    """
    if spec is None:
        yield App(dsn=dsn)
        return
    target = import_target(spec)
    async with contextlib.AsyncExitStack() as stack:
        try:
            app = await _resolve(spec, target, stack)
        except AppLoadError as exc:
            raise AppLoadError(f"{exc}{_apps_beside(spec)}") from None
        if dsn:
            app.settings = dataclasses.replace(app.settings, dsn=dsn)
        yield app


#: What `--app` may name, said whenever it names something else.
_APP_KINDS = "not a jobbus.App (nor a callable returning one, nor an async context manager factory yielding one)"


async def _resolve(spec: str, target: Any, stack: contextlib.AsyncExitStack) -> App:
    if isinstance(target, App):
        return target
    if not callable(target):
        raise AppLoadError(f"--app {spec!r} is {_a(target)}, {_APP_KINDS}")
    kind = _kind(target)
    needed = _required_parameters(target)
    if needed:
        raise AppLoadError(f"--app {spec!r} is {kind} that takes {needed}, {_APP_KINDS}")
    try:
        produced = target()
    except TypeError as exc:
        if exc.__traceback__ is None or exc.__traceback__.tb_next is not None:
            raise  # raised inside the factory: a bug there, whose traceback shows where
        raise AppLoadError(f"--app {spec!r} is {kind} that cannot be called without arguments, {_APP_KINDS}") from None
    if inspect.isawaitable(produced) and not hasattr(produced, "__aenter__"):
        produced = await produced
    if isinstance(produced, App):
        return produced
    if hasattr(produced, "__aenter__") and hasattr(produced, "__aexit__"):
        entered = await stack.enter_async_context(produced)
        if isinstance(entered, App):
            return entered
        raise AppLoadError(f"--app {spec!r} is {kind} that yields {_a(entered)}, {_APP_KINDS}")
    if inspect.isclass(target):
        raise AppLoadError(f"--app {spec!r} is a class, {_APP_KINDS}")
    raise AppLoadError(f"--app {spec!r} is {kind} that returns {_a(produced)}, {_APP_KINDS}")


def _apps_beside(spec: str) -> str:
    """`; did you mean `--app jobs:app`?` when the module of `spec` holds Apps, else nothing."""
    module_name = spec.partition(":")[0]
    module = sys.modules.get(module_name)
    names = sorted(name for name, value in vars(module).items() if isinstance(value, App)) if module else []
    return f"; did you mean {one_of([f'--app {module_name}:{name}' for name in names[:3]])}?" if names else ""


def _required_parameters(target: Any) -> str:
    """The arguments `target` cannot be called without (e.g. a job handler's `job`), as `an argument
    (job)`; empty when it can be called with none, or when its signature cannot be read."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # some builtins have none: calling them tells
        return ""
    required = [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if not required:
        return ""
    return f"{'an argument' if len(required) == 1 else 'arguments'} ({', '.join(required)})"


def _kind(target: Any) -> str:
    """What a callable is, in words: `a function`, `an async function`, `a class`, `a callable partial`..."""
    if inspect.isclass(target):
        return "a class"
    if inspect.iscoroutinefunction(target):
        return "an async function"
    if inspect.isfunction(target) or inspect.ismethod(target) or inspect.isbuiltin(target):
        return "a function"
    return f"a callable {type(target).__name__}"


def _a(value: Any) -> str:
    """`a module`, `an int`, `None`: the type of a value with its article."""
    if value is None:
        return "None"
    if inspect.ismodule(value):
        return "a module"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def settings_from_env(dsn: str | None) -> Settings:
    """Settings of a command without an App: `dsn` (the --dsn flag) if given, then JOBBUS_* variables."""
    return Settings.load({"dsn": dsn})
