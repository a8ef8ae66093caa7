"""Who may see the dashboard and what may act: the token, CSRF, read-only mode, redaction.

- With a token, every request carries it: an `Authorization: Bearer <token>` header, or the session
  cookie the login form sets (HttpOnly, SameSite=Strict; it holds an HMAC of the token, not the token).
  Comparisons are constant-time.
- Every action is a POST with a CSRF token (a random cookie echoed in a hidden form field, compared in
  constant time) and, when the browser sends one, an `Origin` of this very host. A bearer header is
  not sent by browsers on their own, so API clients using it need no CSRF token.
- `read_only` refuses every action with 403, whatever the credentials.
- Requests are answered only when their `Host` is one of the dashboard's names (`HostGuard`): a
  loopback name or address, one of `allowed_hosts`, or, with a token (or the host application's own
  authentication, `host_auth`) and no `allowed_hosts`, any.
  A page of another site whose name was made to resolve to 127.0.0.1 (DNS rebinding) sends its own
  name and is refused with 400.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from jobbus.redaction import MASK as MASK
from jobbus.redaction import redact_secrets as redact_secrets

SESSION_COOKIE = "jobbus_session"
CSRF_COOKIE = "jobbus_csrf"
CSRF_FIELD = "csrf"
CSRF_REFUSED = "missing or wrong CSRF token: reload the page and try again"
#: No framing (a page of buttons in someone else's frame is a clickjacking target), no script or style
#: from anywhere but this dashboard, no referrer leaving it.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}

#: A redaction hook: (field, value) -> what the dashboard shows. Fields: configuration, execution_data,
#: result, last_error, steps, traceback.
Redactor = Callable[[str, Any], Any]


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


def set_csrf_cookie(request: Request, response: Response) -> None:
    """Set the CSRF cookie when `Guard.csrf_token` made a new token for this request."""
    new = request.state.__dict__.get("new_csrf")
    if new:
        base = request.scope.get("root_path", "")
        response.set_cookie(CSRF_COOKIE, new, httponly=True, samesite="strict", path=base or "/")


def safe_next(value: Any) -> str | None:
    """A local path to go back to; anything that could leave this site is dropped."""
    if not isinstance(value, str) or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return None
    return value


# -- the names the dashboard answers to -------------------------------------------------------------

_PORT = re.compile(r"[0-9]{1,5}")
_NAME = re.compile(r"[a-z0-9_.-]+|\*")


def host_name(header: str) -> str | None:
    """The host of a `Host` header, lower-case, without its port, IPv6 brackets or trailing dot
    (None when the header is not a host)."""
    header = header.strip().lower()
    if header.startswith("["):
        address, bracket, port = header[1:].partition("]")
        if not bracket or (port and not (port.startswith(":") and _PORT.fullmatch(port[1:]))):
            return None
        try:
            return str(ipaddress.IPv6Address(address))
        except ValueError:
            return None
    name, colon, port = header.partition(":")
    if colon and not _PORT.fullmatch(port):
        return None
    name = name.removesuffix(".")
    return name if name and _NAME.fullmatch(name) and name != "*" else None


def is_loopback(name: str) -> bool:
    """`localhost`, a name under `.localhost` (browsers resolve them to the loopback interface
    themselves), or an address of 127.0.0.0/8 or ::1."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def allowed_host(entry: str) -> str:
    """One entry of `allowed_hosts`, normalised: a name or address without port (``[::1]`` or ``::1``),
    ``.example.com`` for that domain and its subdomains, or ``*`` for any host."""
    if not isinstance(entry, str):
        raise TypeError(f"allowed_hosts entries are host names, got {type(entry).__name__}")
    text = entry.strip().lower()
    if text == "*":
        return text
    if text.startswith(".") and host_name(text[1:]) is not None and ":" not in text:
        return "." + text[1:].removesuffix(".")
    try:
        return str(ipaddress.IPv6Address(text.strip("[]")))
    except ValueError:
        pass
    name = host_name(text)
    if name is None or ":" in text:
        raise ValueError(f"allowed host {entry!r} is not a host name or address (give it without a port)")
    return name


class HostGuard:
    """ASGI middleware: answers a request only when its `Host` is one of the dashboard's names.

    Loopback names are always allowed; the names of `allowed_hosts` too; any other host only when
    the dashboard has a token, or the host application authenticates its requests (`host_auth`), and
    `allowed_hosts` is None. Others get 400 and nothing is read.
    """

    def __init__(
        self, app: ASGIApp, *, allowed_hosts: Iterable[str] | None, token: str | None, host_auth: bool = False
    ) -> None:
        self.app = app
        self.hosts = None if allowed_hosts is None else frozenset(allowed_host(entry) for entry in allowed_hosts)
        guarded = token is not None or host_auth
        self.any_host = (guarded and self.hosts is None) or (self.hosts is not None and "*" in self.hosts)

    def allows(self, header: str | None) -> bool:
        if self.any_host:
            return True
        name = host_name(header) if header else None
        if name is None:
            return False
        if is_loopback(name):
            return True
        hosts = self.hosts or frozenset()
        return name in hosts or any(entry.startswith(".") and f".{name}".endswith(entry) for entry in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = dict(scope.get("headers") or [])
            raw = headers.get(b"host")
            if not self.allows(raw.decode("latin-1") if raw is not None else None):
                response = PlainTextResponse(
                    "this dashboard does not answer to that host name: reach it by a loopback name or one "
                    "given with --allowed-host (create_app(..., allowed_hosts=[...]))",
                    status_code=400,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def actor(guard: Guard, request: Request) -> str:
    """Whom the audit trail names for an action of this request: `token` when the dashboard has one
    (whoever holds it), `anonymous` when it has none (whoever reaches its address)."""
    return "token" if guard.token is not None else "anonymous"
