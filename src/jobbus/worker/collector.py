"""The garbage collector's pace while a worker runs in this process.

Python runs a young-generation collection every 700 net allocations of container objects and a full
one after ten of those, each time promoted objects grew by a quarter. A busy worker allocates a few
dozen such objects per job and keeps thousands of attempts in flight (claimed, running, or waiting
for their outcome's write), so at the default pace a drain spent a third of its CPU in the collector
walking live attempts that reference counting frees anyway. While a worker runs, the first threshold
is at least `YOUNG_THRESHOLD`; the host's own setting is restored when the last worker of the
process stops (unless the host changed it meanwhile).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: Allocations between two young-generation collections while a worker runs (Python's default: 700).
#: A drain of 100,000 no-op jobs at concurrency 1000 ran 28 full collections at 700 and none at this.
YOUNG_THRESHOLD = 50_000

_workers = 0
_restore: tuple[int, ...] | None = None
#: Workers of one process may start and stop in threads of their own (one event loop each).
_lock = threading.Lock()


@contextmanager
def worker_pace() -> Iterator[None]:
    """Raise the young generation's threshold for the time a worker runs."""
    global _workers, _restore
    with _lock:
        if _workers == 0:
            before = gc.get_threshold()
            if before[0] < YOUNG_THRESHOLD:
                gc.set_threshold(YOUNG_THRESHOLD, *before[1:])
                _restore = before
        _workers += 1
    try:
        yield
    finally:
        with _lock:
            _workers -= 1
            if _workers == 0 and _restore is not None:
                if gc.get_threshold()[0] == YOUNG_THRESHOLD:  # the host did not set its own meanwhile
                    gc.set_threshold(*_restore)
                _restore = None
