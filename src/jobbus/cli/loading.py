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
            raise AppLoadError(f"--app {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
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
        app = await _resolve(spec, target, stack)
        if dsn:
            app.settings = dataclasses.replace(app.settings, dsn=dsn)
        yield app


async def _resolve(spec: str, target: Any, stack: contextlib.AsyncExitStack) -> App:
    if isinstance(target, App):
        return target
    if not callable(target):
        raise AppLoadError(f"--app {spec!r} is a {type(target).__name__}, not an App or a factory of one")
    produced = target()
    if inspect.isawaitable(produced) and not hasattr(produced, "__aenter__"):
        produced = await produced
    if isinstance(produced, App):
        return produced
    if hasattr(produced, "__aenter__") and hasattr(produced, "__aexit__"):
        entered = await stack.enter_async_context(produced)
        if isinstance(entered, App):
            return entered
        raise AppLoadError(f"--app {spec!r}: the context manager yielded {type(entered).__name__}, not an App")
    raise AppLoadError(f"--app {spec!r}: calling it returned {type(produced).__name__}, not an App")


def settings_from_env(dsn: str | None) -> Settings:
    """Settings of a command without an App: `dsn` (the --dsn flag) if given, then JOBBUS_* variables."""
    return Settings.load({"dsn": dsn})
