"""What a failed attempt costs the worker's event loop: the stored error and traceback of one exception.

    .venv/bin/python -m bench.error_path

For each message, a `ValueError` raised from a nested call and caused by a `ConnectionError`, both
carrying the message: the worker's whole failure path for it, `error_text` (the stored `last_error`)
and `traceback_text` (the stored traceback: formatted, cut, masked), as the outcome policy runs them
on the event loop. Messages of 300 KiB and 10 MiB: plain text, and what once froze the worker for
minutes (`a://b:` over and over, then compact JSON full of URLs, with secrets at both ends). Prints
the median and the largest wall time of 20 runs, and the masking of the same messages whole
(`redact_text`, what nothing but a cut bounds), in milliseconds. No database.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

from jobbus.redaction import redact_text
from jobbus.worker.outcomes import error_text, traceback_text

SIZES = {"300 KiB": 300 * 1024, "10 MiB": 10 * 1024 * 1024}
RUNS = 20


def plain(size: int) -> str:
    return "x" * size


def hostile(size: int) -> str:
    url = '{"id":1,"url":"https://api.example.com:443/v1/items/1?page=2","next":"http://h:8080/2"},'
    half = size // 2
    return f"api_key=start {'a://b:' * (half // 6)}{url * (half // len(url))} token=end"


def raised(message: str) -> BaseException:
    def call() -> None:
        raise ConnectionError(message)

    try:
        try:
            call()
        except ConnectionError as exc:
            raise ValueError(message) from exc
    except ValueError as exc:
        return exc
    raise AssertionError("unreachable")


def failure_path(exc: BaseException) -> tuple[str, str]:
    return error_text(exc), traceback_text(exc)


def timed(work: Callable[[], object], runs: int = RUNS) -> tuple[float, float]:
    """The median and the largest wall time of `runs` runs, in milliseconds."""
    spent = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        spent.append((time.perf_counter() - started) * 1000)
    return statistics.median(spent), max(spent)


def main() -> None:
    print(f"{'message':<22} {'failure path (ms)':>22} {'redact_text whole (ms)':>24}")
    for kind, make in (("plain", plain), ("hostile", hostile)):
        for label, size in SIZES.items():
            message = make(size)
            exc = raised(message)
            median, largest = timed(partial(failure_path, exc))
            whole, _ = timed(partial(redact_text, message), runs=3)
            path = f"{median:.1f} (max {largest:.1f})"
            print(f"{kind + ' ' + label:<22} {path:>22} {whole:>24.1f}")


if __name__ == "__main__":
    main()
