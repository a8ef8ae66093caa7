"""An --app module with a bug of its own: it imports a dependency that is not installed."""

from __future__ import annotations

import importlib

importlib.import_module("jobbus_dependency_that_is_not_installed")
