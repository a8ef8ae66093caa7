"""Showing text that comes from users (job types, queues, worker ids, configurations, errors) on a terminal.

Such text, drawn with `output.shown`, is never read as rich markup (a queue named ``[/]`` or a
configuration holding ``[INST]`` is shown as written), and control characters are shown as escapes
(``\\x1b``) instead of being sent to the terminal, where they could recolour, rewrite or hide what an
operator reads.
"""

from __future__ import annotations

#: C0 controls except tab and newline, DEL, C1 controls, and the bidirectional overrides and isolates
#: that can make text read differently from what it holds.
_UNSAFE = [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = str.maketrans({code: f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" for code in _UNSAFE})


def visible(text: str) -> str:
    """`text` with every control character written as an escape; tabs and newlines are kept."""
    return text if text.isprintable() else text.translate(_ESCAPES)
