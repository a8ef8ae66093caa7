"""What never leaves the database or a page in clear: secrets in values and in text.

One rule for every reader. The dashboard's default hook (`redact_secrets`) masks values under keys
that look like secrets (`SECRET_NAME`) at any depth. In text (`redact_text`), these are masked:

- `name=value`, `name: value`, `"name": "value"`, `name='value'` (and `\\"name\\": \\"value\\"`, as JSON
  inside a JSON string writes it) where the name looks like a secret, wherever it stands:
  `ValueError: token=abc` masks `abc`. A quoted value is masked whole, spaces and escaped quotes
  included; an unquoted one up to a space, quote, comma, semicolon, `&` or closing bracket
  (`?token=abc&x=1`).
  Names ending in `Error`, `Exception` or `Warning` are exception classes, not secrets:
  `AuthenticationError: bad request` stays as it is;
- the credential after an authorization scheme, `Authorization: Bearer xyz` (also `Basic`, `Token`,
  `Digest`, `Negotiate`, `NTLM`), and after a bare `Bearer` anywhere;
- the password of a DSN: `scheme://user:password@host` (and `password=...`, a secret name).

Names are tried only where a word starts and are at most 256 characters; every repetition before a
value is bounded and nothing a match takes is given back. A value ends its match: once it has a
character the match cannot fail, so its run, however long, is read once (a JWT of 1,500 characters is
masked whole). Masking a text therefore takes time linear in its length, and what comes before a value
(or a DSN's password, at most 1024 characters) never spans more than `SECRET_SPAN` characters.

Everything jobbus stores or prints about an error goes through `redact_error`: cut to its limit first,
then masked, so the cost is bounded by the limit whatever the error's length.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from jobbus.settings import DSN_URI_PASSWORD, DSN_URI_USER

MASK = "••••••"

_SECRET_WORDS = (
    "pass", "pwd", "secret", "token", "api[_-]?key", "access[_-]?key", "auth", "credential", "private",
    "signature", "cookie", "session[_-]?(?:id|key)", "jwt",
)  # fmt: skip
#: Names that look like secrets: what the dashboard masks in JSON and `redact_text` in text. A name
#: matches when one of these words is in it, in any case (`password`, `client_secret`, `X-Api-Key`,
#: `refresh_token`, `Authorization`, `AWS_ACCESS_KEY_ID`, `X-Amz-Signature`, `Set-Cookie`, `sessionid`).
SECRET_NAME = re.compile("|".join(_SECRET_WORDS), re.IGNORECASE)
#: A secret word is looked for only where one of their first letters stands: trying the words, in any
#: case, at every letter of every word made masking a text full of short words twice as slow.
_FIRST_LETTERS = "".join(sorted({word[0] for word in _SECRET_WORDS}))
_SECRET_WORD = f"(?=[{_FIRST_LETTERS}{_FIRST_LETTERS.upper()}])(?i:{'|'.join(_SECRET_WORDS)})"

#: The longest name recognised, in characters.
MAX_SECRET_NAME = 256
#: More than a match can span before its value (a name, its separator, a scheme and a quote: 318
#: characters) and than a DSN's `scheme://user:password@` (1,350), with the few characters lookarounds
#: read beyond: `redact_error` scans this much on each side of what it keeps.
SECRET_SPAN = 4096

#: How far into a kept tail its first whole line is looked for.
_LINE_SEARCH = 1024

_SPACE = r"[ \t]"
#: An unquoted value, up to white space, a quote, a comma, a semicolon, `&` or a closing bracket; a
#: JSON object or list (`"auth": {"token": ...}`) is no value, the names inside it are. Unbounded but
#: possessive and last in its match: see the module's docstring.
_BARE = r"""(?![{\[][\s"'{\[\]}])[^\s'",;&)}\]]++"""
_SECRET = re.compile(
    # scheme://user:password@ (the case of the scheme does not matter).
    rf"(?i:(?P<uri>{DSN_URI_USER}){DSN_URI_PASSWORD})(?P<at>@)"
    # name, separator, value: a word that holds a secret word, tried where a word starts (the
    # lookahead finds the secret word; the name is then taken whole, possessively).
    rf"|(?<![\w-])(?=[\w-]{{0,{MAX_SECRET_NAME}}}?{_SECRET_WORD})(?P<name>[\w-]{{1,{MAX_SECRET_NAME}}}+)"
    r"(?<!Error)(?<!Exception)(?<!Warning)"
    rf"""(?P<sep>(?:\\?["'])?{_SPACE}{{0,16}}+[:=]{_SPACE}{{0,16}}+)"""
    rf"(?P<scheme>(?i:bearer|basic|token|digest|negotiate|ntlm){_SPACE}{{1,16}}+)?"
    # A quoted value up to its closing quote (escaped characters included; an open one to the line's
    # end), or a bare one. Both unbounded, possessive and last: see the module's docstring.
    r"""(?:(?P<open>\\?["'])(?:(?!(?P=open))(?:[^\\\r\n]|\\.))++(?P<close>(?P=open)?)"""
    rf"|{_BARE})"
    # A bearer token anywhere.
    rf"|(?<![\w-])(?P<bearer>(?i:bearer){_SPACE}{{1,16}}+){_BARE}"
)


def _masked(match: re.Match[str]) -> str:
    """What a match becomes: what names the secret, kept; the secret, masked."""
    named = match.group("uri", "name", "sep", "scheme", "open", "bearer")
    return "".join(part for part in named if part) + MASK + (match["close"] or "") + (match["at"] or "")


def redact_text(text: str) -> str:
    """`text` with its secrets masked (the module's docstring lists them), in time linear in its length."""
    return _SECRET.sub(_masked, text)


def redact_error(text: str, limit_bytes: int, *, keep: Literal["head", "tail"] = "head") -> str:
    """`text` as jobbus stores or prints an error: secrets masked, no NUL, valid UTF-8 (unpaired
    surrogates escaped), at most `limit_bytes` bytes of UTF-8 with its head or its tail kept; a cut
    text says so. A kept tail starts at a line's start when one is near.

    Cut first, then masked: only the part kept and `SECRET_SPAN` characters on each side of it are
    scanned, so the cost is bounded by the limit whatever the text's length, and a secret that straddles
    the cut is masked as in the whole text (unless its value alone is longer than `SECRET_SPAN` and
    starts before a kept tail). Masking can shorten what is kept: a cut text keeps at most
    `limit_bytes` characters of the original."""
    size = len(text)
    start, end = (0, min(size, limit_bytes)) if keep == "head" else (max(0, size - limit_bytes), size)
    kept = _masked_between(text, start, end)
    data = kept.replace("\x00", "\\0").encode("utf-8", "backslashreplace")
    if start == 0 and end == size and len(data) <= limit_bytes:
        return data.decode("utf-8")
    if keep == "head":
        note = f"... (cut to {limit_bytes:,} bytes)"
        room = limit_bytes - len(note)
        return (
            data[:room].decode("utf-8", "ignore") + note if room > 0 else data[:limit_bytes].decode("utf-8", "ignore")
        )
    note = f"... (cut to its last {limit_bytes:,} bytes)\n"
    room = limit_bytes - len(note)
    if room <= 0:
        return data[len(data) - limit_bytes :].decode("utf-8", "ignore")
    tail = data[len(data) - room :]
    line = tail.find(b"\n", 0, _LINE_SEARCH) + 1  # a whole first line, unless none starts near the cut
    tail = tail[line:] if 0 < line < len(tail) else tail
    return note + tail.decode("utf-8", "ignore")


def _masked_between(text: str, start: int, end: int) -> str:
    """`text[start:end]` with its secrets masked as `redact_text(text)` masks them; a secret that
    straddles `start` or `end` is masked whole. Reads at most `SECRET_SPAN` characters beyond each end."""
    if start == 0 and end == len(text):
        return redact_text(text)
    parts: list[str] = []
    at = start
    for match in _SECRET.finditer(text, max(0, start - SECRET_SPAN), min(len(text), end + SECRET_SPAN)):
        if match.start() >= end:
            break
        if match.end() <= at:
            continue
        parts.append(text[at : match.start()])
        parts.append(_masked(match))
        at = match.end()
    parts.append(text[at:end])
    return "".join(parts)


def redact_secrets(field: str, value: Any) -> Any:
    """The dashboard's default hook: values under keys that look like secrets (password, token, api_key,
    …) are masked at any depth, and text is masked by `redact_text`. Pass `redact=` to `create_app` for
    rules of your own."""
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
