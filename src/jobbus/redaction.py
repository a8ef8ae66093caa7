"""What never leaves the database or a page in clear: secrets in values and in text.

One rule for every reader: the dashboard's default hook (`redact_secrets`), the tracebacks the worker
stores (`redact_text`), the command line's errors. Values under keys that look like secrets
(password, token, api_key, …) are masked at any depth; in text, the passwords of DSNs
(`postgresql://user:pw@host`, `password=pw`) and the values of secret-looking `key=value` or
`key: value` pairs are masked.
"""

from __future__ import annotations

import re
from typing import Any

from jobbus.settings import redact as redact_dsn_passwords

MASK = "••••••"

#: Names that look like secrets: what the dashboard masks in JSON and the worker in tracebacks.
SECRET_NAME = re.compile(r"pass|secret|token|api[_-]?key|auth|credential|private", re.IGNORECASE)

#: `name=value`, `name: value`, `"name": "value"`, `name='value'` where the name looks like a secret.
#: A name is a whole word with an ASCII letter or `_` in it, tried only where a word starts, and nothing
#: taken is given back: linear in the text's length (trying every letter of a long word took minutes
#: on a 100 KiB traceback).
_SECRET_PAIR = re.compile(
    r"""(?<![\w-])(?P<name>(?:(?![A-Za-z_])[\w-])*+[A-Za-z_][\w-]*+)"""
    r"""(?P<sep>['"]?\s*+[:=]\s*+)(?P<quote>['"]?)(?P<value>[^\s'",;&)}\]]+)""",
)


def redact_text(text: str) -> str:
    """`text` with DSN passwords and the values of secret-looking `key=value` pairs masked."""
    text = redact_dsn_passwords(text)

    def mask(match: re.Match[str]) -> str:
        if not SECRET_NAME.search(match["name"]) or match["value"] in ("***", MASK):
            return match[0]
        return f"{match['name']}{match['sep']}{match['quote']}{MASK}"

    return _SECRET_PAIR.sub(mask, text)


def redact_secrets(field: str, value: Any) -> Any:
    """The dashboard's default hook: values under keys that look like secrets (password, token, api_key,
    …) are masked at any depth, and text has its DSN passwords and secret `key=value` pairs masked. Pass
    `redact=` to `create_app` for rules of your own."""
    if isinstance(value, dict):
        return {
            k: MASK if isinstance(k, str) and SECRET_NAME.search(k) else redact_secrets(field, v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_secrets(field, v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
