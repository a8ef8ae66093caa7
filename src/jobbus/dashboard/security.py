"""Who may see the dashboard and what may act: the tokens, the trusted proxy, CSRF, read-only mode,
redaction.

- With tokens (one per role), every request carries one: an `Authorization: Bearer <token>` header,
  or the session cookie the login form sets (HttpOnly, SameSite=Strict; it holds an HMAC of the
  token, not the token). Comparisons are constant-time.
- Behind a trusted proxy, the user's name comes from the proxy's header, believed only when the
  request's peer is one of the proxy's networks; from anywhere else the header is ignored.
- Every action is a POST with a CSRF token (a random cookie echoed in a hidden form field, compared in
  constant time) and, when the browser sends one, an `Origin` of this very host. A bearer header is
  not sent by browsers on their own, so API clients using it need no CSRF token.
- `read_only` caps every role at viewer: every action is refused with 403, whatever the credentials.
- Requests are answered only when their `Host` is one of the dashboard's names (`HostGuard`): a
  loopback name or address, one of `allowed_hosts`, or, with a token, a trusted proxy or the host
  application's own authentication (`host_auth`), and no `allowed_hosts`, any.
  A page of another site whose name was made to resolve to 127.0.0.1 (DNS rebinding) sends its own
  name and is refused with 400.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from jobbus.dashboard.roles import ACTOR_KEY, HOST_ACTOR_KEY, Actor, Role, TrustedProxy
from jobbus.redaction import MASK as MASK
from jobbus.redaction import redact_secrets as redact_secrets

SESSION_COOKIE = "jobbus_session"
#: Where a dashboard over cells keeps its own root path in each request's scope: a cell's pages are
#: mounted below it (`/cells/NAME`), and its cookies, login and static files stay at the root.
ROOT_KEY = "jobbus.dashboard.root"
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
    """Who a request is (`actor`) and whether its form may act (`csrf_ok`).

    `tokens` maps each token to the role it gives; `proxy` names users behind a trusted proxy;
    `host_auth`: the host application authenticated the request and put its `Actor` in the scope.
    With none of them, the dashboard is open and everyone is an ``anonymous`` admin (it answers on
    loopback names only). `read_only` caps every role at viewer.
    """

    def __init__(
        self,
        tokens: Mapping[str, Role],
        *,
        read_only: bool,
        proxy: TrustedProxy | None = None,
        host_auth: bool = False,
    ) -> None:
        self.read_only = read_only
        self.proxy = proxy
        self.host_auth = host_auth
        self._tokens = [(token.encode(), role) for token, role in tokens.items()]
        self._sessions = [(_session_of(token, role), role) for token, role in tokens.items()]

    @property
    def token_required(self) -> bool:
        """Whether the login form can let anyone in (some token is set)."""
        return bool(self._tokens)

    @property
    def open(self) -> bool:
        """Nobody is asked who they are."""
        return not self._tokens and self.proxy is None and not self.host_auth

    # -- authentication ------------------------------------------------------------------------------

    def token_role(self, submitted: str) -> Role | None:
        """The role of the token `submitted`, compared in constant time with every token."""
        found = None
        for token, role in self._tokens:
            if hmac.compare_digest(submitted.encode(), token):
                found = role
        return found

    def session_value(self, role: Role) -> str:
        return next(value for value, given in self._sessions if given is role)

    def bearer(self, request: HTTPConnection) -> Role | None:
        """The role of the token in the request's Authorization header, if it carries one."""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return self.token_role(value.strip()) if scheme.lower() == "bearer" and self._tokens else None

    def actor(self, request: HTTPConnection) -> Actor | str | None:
        """Who made `request` (kept in its scope for `actor_of`), a refusal saying why (403), or None
        when it must authenticate first (401 or the login form)."""
        found = self._identify(request)
        if isinstance(found, Actor):
            if self.read_only:
                found = found.capped(Role.VIEWER)
            request.scope[ACTOR_KEY] = found
        return found

    def _identify(self, request: HTTPConnection) -> Actor | str | None:
        if self.host_auth:
            claimed = request.scope.get(HOST_ACTOR_KEY)
            return claimed if isinstance(claimed, Actor) else Actor("host-user", Role.ADMIN)
        if self.proxy is not None and self.proxy.trusts(request.scope):
            names = request.headers.getlist(self.proxy.header)
            if len(names) > 1:
                return f"the proxy sent {len(names)} {self.proxy.header} headers: it must send exactly one"
            if names and names[0].strip():
                user = names[0].strip()
                role = self.proxy.role_of(user)
                if role is None:
                    return f"user {user!r} has no role in this dashboard's role map"
                return Actor(user, role)
        role = self.bearer(request)
        if role is None:
            cookie = request.cookies.get(SESSION_COOKIE, "").encode()
            for value, given in self._sessions:
                if hmac.compare_digest(cookie, value.encode()):
                    role = given
        if role is not None:
            return Actor(f"{role.value}-token", role)
        return Actor("anonymous", Role.ADMIN) if self.open else None

    # -- CSRF ---------------------------------------------------------------------------------------

    @staticmethod
    def csrf_token(request: Request) -> str:
        """The CSRF token of this browser (a new one when it has none; the response sets the cookie)."""
        token = request.cookies.get(CSRF_COOKIE)
        if not token or not re.fullmatch(r"[0-9a-f]{64}", token):
            token = request.state.__dict__.setdefault("new_csrf", secrets.token_hex(32))
        return token

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        if self.bearer(request) is not None:
            return True
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
            return False  # another site (or an opaque "null" origin) posting into this one
        cookie = request.cookies.get(CSRF_COOKIE, "")
        return bool(cookie) and bool(submitted) and hmac.compare_digest(cookie.encode(), (submitted or "").encode())


def _session_of(token: str, role: Role) -> str:
    """The session cookie of a login with `token`: an HMAC of it (the cookie never holds the token)."""
    return hmac.new(token.encode(), f"jobbus dashboard session {role.value}".encode(), hashlib.sha256).hexdigest()


def root_of(request: HTTPConnection) -> str:
    """The dashboard's root path (its mount point): where its cookies, login and static files are. It is
    the request's `root_path`, but on a cell's page of a dashboard over cells (`ROOT_KEY`)."""
    root: str = request.scope.get(ROOT_KEY, request.scope.get("root_path", ""))
    return root


def set_csrf_cookie(request: Request, response: Response) -> None:
    """Set the CSRF cookie when `Guard.csrf_token` made a new token for this request."""
    new = request.state.__dict__.get("new_csrf")
    if new:
        root = root_of(request)
        response.set_cookie(CSRF_COOKIE, new, httponly=True, samesite="strict", path=root or "/")


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


class RootPath:
    """ASGI middleware of a dashboard over cells: keeps the dashboard's root path in the scope
    (`ROOT_KEY`) before a cell's mount adds `/cells/NAME` to the request's `root_path`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope[ROOT_KEY] = scope.get("root_path", "")
        await self.app(scope, receive, send)


class HostGuard:
    """ASGI middleware: answers a request only when its `Host` is one of the dashboard's names.

    Loopback names are always allowed; the names of `allowed_hosts` too; any other host only when
    the dashboard is `guarded` (it has a token or a trusted proxy, or the host application
    authenticates its requests) and `allowed_hosts` is None. Others get 400 and nothing is read.
    """

    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str] | None, guarded: bool) -> None:
        self.app = app
        self.hosts = None if allowed_hosts is None else frozenset(allowed_host(entry) for entry in allowed_hosts)
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
