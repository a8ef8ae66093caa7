"""What a typed task adds to the bus's encoding: `Task.configuration` (defer) and `Task.arguments` (worker).

    .venv/bin/python bench/tasks.py      # the table of docs/benchmarks.md, "Typed task arguments"

No database: pure CPU, one thread, the messages of bench/codec.py, each as the one parameter of a task.
*defer* binds the arguments to the signature and encodes each by its annotation (`jobbus.encoding.encode`,
with its equality proof); the bus's *dispatch* is that encode alone. *worker* decodes a stored
configuration back into arguments; the bus's *worker decode* is `JsonCodec.decode`. ops/s, best of 5.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jobbus  # noqa: E402
from bench.codec import MESSAGES, ops_per_second  # noqa: E402
from jobbus import encoding  # noqa: E402
from jobbus.bus import JsonCodec  # noqa: E402
from jobbus.tasks import Task  # noqa: E402


def task_for(app: jobbus.App, cls: type[Any]) -> Task[..., None]:
    def handle(message: Any) -> None:
        pass

    handle.__annotations__ = {"message": cls, "return": None}
    return app.task(f"bench.{cls.__name__}")(handle)


def main() -> int:
    app = jobbus.App(dsn="postgresql://unused.invalid/bench")  # never connects
    codec = JsonCodec()
    print(f"Python {sys.version.split()[0]}, ops/s (best of 5)\n")
    print("| message | bus dispatch | task defer | bus worker decode | task worker |\n|---|---:|---:|---:|---:|")
    for label, cls, message in MESSAGES:
        task = task_for(app, cls)
        configuration = json.loads(json.dumps(task.configuration(message)))
        assert task.arguments(configuration) == ([], {"message": message})
        payload = configuration["message"]
        figures = (
            ops_per_second(functools.partial(encoding.encode, message, cls, what="message")),
            ops_per_second(functools.partial(task.configuration, message)),
            ops_per_second(functools.partial(codec.decode, cls, payload)),
            ops_per_second(functools.partial(task.arguments, configuration)),
        )
        print(f"| {label} | " + " | ".join(f"{figure:,.0f}" for figure in figures) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
