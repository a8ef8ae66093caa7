"""Who may see the dashboard and what may act: the token, CSRF, read-only mode, redaction.

- With a token, every request carries it: an `Authorization: Bearer <token>` header, or the session
  cookie the login form sets (HttpOnly, SameSite=Strict; it holds an HMAC of the token, not the token).
  Comparisons are constant-time.
- Every action is a POST with a CSRF token (a random cookie echoed in a hidden form field, compared in
  constant time) and, when the browser sends one, an `Origin` of this very host. A bearer header is
  not sent by browsers on their own, so API clients using it need no CSRF token.
- `read_only` refuses every action with 403, whatever the credentials.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request

SESSION_COOKIE = "jobbus_session"
CSRF_COOKIE = "jobbus_csrf"
CSRF_FIELD = "csrf"

#: A redaction hook: (field, value) -> what the dashboard shows. Fields: configuration, execution_data,
#: result, last_error.
Redactor = Callable[[str, Any], Any]

_SECRET_KEY = re.compile(r"pass|secret|token|api[_-]?key|auth|credential|private", re.IGNORECASE)
MASK = "••••••"


def redact_secrets(field: str, value: Any) -> Any:
    """The default hook: values under keys that look like secrets (password, token, api_key, …) are masked,
    at any depth. Pass `redact=` to `create_app` for rules of your own."""
    if isinstance(value, dict):
        return {
            k: MASK if isinstance(k, str) and _SECRET_KEY.search(k) else redact_secrets(field, v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_secrets(field, v) for v in value]
    return value


class Guard:
    def __init__(self, token: str | None, *, read_only: bool) -> None:
        self.token = token
        self.read_only = read_only
        self._session = (
            hmac.new(token.encode(), b"jobbus dashboard session", hashlib.sha256).hexdigest() if token else None
        )

    # -- authentication ------------------------------------------------------------------------------

    @property
    def session_value(self) -> str:
        assert self._session is not None
        return self._session

    def bearer(self, request: Request) -> bool:
        """The request carries the token in an Authorization header."""
        if self.token is None:
            return False
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self.token.encode())

    def authenticated(self, request: Request) -> bool:
        if self.token is None:
            return True
        if self.bearer(request):
            return True
        cookie = request.cookies.get(SESSION_COOKIE, "")
        assert self._session is not None
        return hmac.compare_digest(cookie.encode(), self._session.encode())

    def login(self, submitted: str) -> bool:
        return self.token is not None and hmac.compare_digest(submitted.encode(), self.token.encode())

    # -- CSRF ---------------------------------------------------------------------------------------

    @staticmethod
    def csrf_token(request: Request) -> str:
        """The CSRF token of this browser (a new one when it has none; the response sets the cookie)."""
        token = request.cookies.get(CSRF_COOKIE)
        if not token or not re.fullmatch(r"[0-9a-f]{64}", token):
            token = request.state.__dict__.setdefault("new_csrf", secrets.token_hex(32))
        return token

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        if self.bearer(request):
            return True
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
            return False  # another site (or an opaque "null" origin) posting into this one
        cookie = request.cookies.get(CSRF_COOKIE, "")
        return bool(cookie) and bool(submitted) and hmac.compare_digest(cookie.encode(), (submitted or "").encode())
