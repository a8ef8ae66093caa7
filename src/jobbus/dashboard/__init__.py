"""The web dashboard (extra `dashboard`): an ASGI application over an `App`.

    from jobbus.dashboard import create_app
    asgi = create_app(app, token="s3cret", operator_token="0p3r", viewer_token="v1ew")   # any ASGI server
    # or mount it: fastapi_app.mount("/jobs", asgi), or behind the host's own authentication:
    # jobbus.contrib.fastapi.mount_dashboard, jobbus.contrib.django.dashboard.mount_dashboard

`jobbus dashboard` serves it with uvicorn on 127.0.0.1:8787. Pages: overview, jobs, job detail, failures,
workers, queues, periodic jobs, groups; live updates over Server-Sent Events. Three roles (viewer,
operator, admin) decide who may act on what. See docs/dashboard.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("jobbus.dashboard needs starlette and jinja2: pip install 'jobbus[dashboard]'") from exc

from jobbus.dashboard.roles import Actor, Role, TrustedProxy, actor_of, load_role_map
from jobbus.dashboard.security import MASK, Redactor, allowed_host, redact_secrets

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from jobbus.app import App


def create_app(
    app: App,
    *,
    read_only: bool = False,
    token: str | None = None,
    operator_token: str | None = None,
    viewer_token: str | None = None,
    allowed_hosts: Iterable[str] | None = None,
    redact: Redactor | None = None,
    host_auth: bool = False,
    trusted_user_header: str | None = None,
    trusted_proxies: Iterable[str] | None = None,
    role_map: Mapping[str, Role | str] | str | os.PathLike[str] | None = None,
) -> Starlette:
    """The dashboard of `app` as an ASGI application.

    Roles (`Role`): `token` gives `admin`, `operator_token` `operator`, `viewer_token` `viewer`; with
    any of them, every request must carry one (a bearer header, or the cookie the login form sets).
    `read_only` caps every role at viewer: every action is refused. `redact(field, value)` decides
    what is shown of each job's `configuration`, `execution_data`, `result` and `last_error`
    (default: `redact_secrets`, which masks values under keys that look like secrets). The App's
    pool is opened on the first request.

    An App over cells (`App.cells`, SPEC 23) gets one dashboard for all of them: the overview of every
    cell at the root, each cell's pages and actions below `/cells/NAME/`, one login for every cell.

    Behind a proxy that authenticates users: `trusted_user_header` names the header carrying the
    user's name, believed only from a peer address within `trusted_proxies` (networks, CIDR), and
    `role_map` (a mapping, or the path of a TOML file with a ``[roles]`` table, `load_role_map`)
    gives each user a role; ``"*"`` gives one to everyone else, and a user it does not name is
    refused. A request without the header, or from any other address, needs a token.

    A request is answered only when its `Host` is a loopback name or address (``localhost``,
    ``*.localhost``, 127.0.0.0/8, ``[::1]``) or one of `allowed_hosts` (names or addresses without
    port; ``.example.com`` for a domain and its subdomains; ``*`` for any); with a token or a trusted
    proxy and `allowed_hosts` None, any host. Others get 400.

    `host_auth=True`: the host application authenticates every request before it reaches the
    dashboard and gives its role (a FastAPI dependency and role callable,
    `jobbus.contrib.fastapi.mount_dashboard`; Django's users and permissions,
    `jobbus.contrib.django.dashboard.mount_dashboard`), so the dashboard asks for no token of its own
    and, like a dashboard with a token, answers to any host name unless `allowed_hosts` is given.
    """
    from jobbus.dashboard.security import Guard
    from jobbus.dashboard.web import create_starlette

    tokens: dict[str, Role] = {}
    for name, value, role in (
        ("token", token, Role.ADMIN),
        ("operator_token", operator_token, Role.OPERATOR),
        ("viewer_token", viewer_token, Role.VIEWER),
    ):
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must not be empty")
        if value in tokens:
            raise ValueError(f"{name} is the same as the {tokens[value].value} token: give each role its own")
        tokens[value] = role
    proxy = None
    if trusted_user_header is not None:
        if role_map is None:
            raise ValueError("trusted_user_header needs a role_map: which role each user has")
        proxy = TrustedProxy.of(trusted_user_header, trusted_proxies or (), role_map)
    elif trusted_proxies is not None or role_map is not None:
        raise ValueError("trusted_proxies and role_map go with trusted_user_header (the header naming the user)")
    if (tokens or proxy is not None) and host_auth:
        raise ValueError(
            "tokens (or a trusted proxy) and host_auth exclude each other: either the dashboard or its host "
            "authenticates"
        )
    if isinstance(allowed_hosts, str | bytes):
        raise TypeError("allowed_hosts is a list of host names, not one string")
    hosts = None if allowed_hosts is None else [allowed_host(entry) for entry in allowed_hosts]
    guard = Guard(tokens, read_only=read_only, proxy=proxy, host_auth=host_auth)
    if app.cells:  # every cell's pages below /cells/NAME, the overview of every cell at the root
        from jobbus.dashboard.cells import create_cells_starlette

        return create_cells_starlette(app, guard=guard, redact=redact, allowed_hosts=hosts)
    return create_starlette(app, guard=guard, redact=redact, allowed_hosts=hosts)


__all__ = ["MASK", "Actor", "Redactor", "Role", "actor_of", "create_app", "load_role_map", "redact_secrets"]
