"""What a handler logged during one attempt: its lines, the newest kept within `MAX_LOG_BYTES`.

Stored with the attempt's outcome in its `Job.history` entry under `logs` (SPEC 22). A line is added
from whichever thread logged it (a sync handler's, the event loop's), so adding and closing share one
lock; only attempts that log take it. Memory is bounded whatever a handler logs: each line is cut to
`MAX_LINE_BYTES` before it arrives here, and the oldest lines are dropped (counted) past the bound.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from typing import Any

#: The logger of `job.logger`: its records are kept with the attempt whatever their logger's
#: propagation; every other `jobbus.*` logger is the library's own and never kept.
JOB_LOGGER = "jobbus.job"
#: An attempt keeps at most this many bytes of lines (UTF-8 of the messages, plus `LINE_OVERHEAD`
#: each), the newest.
MAX_LOG_BYTES = 64 * 1024
#: A line's message (an exception's traceback included) keeps at most this many bytes, its head.
MAX_LINE_BYTES = 8 * 1024
#: What a line costs beside its message: its `at`, `level` and the JSON around them.
LINE_OVERHEAD = 64

_LOCK = threading.Lock()


class AttemptLog:
    """The lines of one attempt, oldest first, until `close()` hands them over; a line added after
    (a task the handler leaked, a thread it started) is ignored."""

    __slots__ = ("_bytes", "_closed", "_lines", "dropped")

    def __init__(self) -> None:
        self._lines: deque[tuple[dict[str, str], int]] = deque()
        self._bytes = 0
        self._closed = False
        #: Lines dropped to keep the newest within `MAX_LOG_BYTES`.
        self.dropped = 0

    def add(self, at: str, level: str, message: str) -> None:
        """Keep one line (its message already bounded and redacted); drop the oldest past the bound."""
        size = len(message.encode("utf-8", "replace")) + LINE_OVERHEAD
        line = {"at": at, "level": level, "message": message}
        with _LOCK:
            if self._closed:
                return
            self._lines.append((line, size))
            self._bytes += size
            while self._bytes > MAX_LOG_BYTES and len(self._lines) > 1:
                _, gone = self._lines.popleft()
                self._bytes -= gone
                self.dropped += 1

    def close(self) -> tuple[list[dict[str, str]], int]:
        """The lines kept and how many were dropped; nothing is added after."""
        with _LOCK:
            self._closed = True
            lines = [line for line, _ in self._lines]
            self._lines.clear()
            return lines, self.dropped

    def stored(self, *, close: bool) -> str | None:
        """The lines as the store takes them (`{"lines": [...], "dropped": N}`, JSON), None when there
        are none; `close` closes the log (the attempt is decided), else the lines stay (a durable wait
        that may not park)."""
        if close:
            lines, dropped = self.close()
        else:
            with _LOCK:
                lines, dropped = [line for line, _ in self._lines], self.dropped
        if not lines:
            return None
        return json.dumps({"lines": lines, "dropped": dropped}, ensure_ascii=False)


def history_logs(entry: Any) -> list[dict[str, Any]]:
    """The lines of a `Job.history` entry (none when it has no `logs`), for those who print them."""
    logs = entry.get("logs") if isinstance(entry, dict) else None
    return [line for line in logs if isinstance(line, dict)] if isinstance(logs, list) else []
