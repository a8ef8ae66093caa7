"""The web dashboard (extra `dashboard`): an ASGI application over an `App`.

    from jobbus.dashboard import create_app
    asgi = create_app(app, read_only=False, token="s3cret")   # serve with any ASGI server
    # or mount it: fastapi_app.mount("/jobs", asgi), or behind the host's own authentication:
    # jobbus.contrib.fastapi.mount_dashboard, jobbus.contrib.django.dashboard.mount_dashboard

`jobbus dashboard` serves it with uvicorn on 127.0.0.1:8787. Pages: overview, jobs, job detail, failures,
workers, queues, periodic jobs, groups; live updates over Server-Sent Events. See docs/dashboard.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("jobbus.dashboard needs starlette and jinja2: pip install 'jobbus[dashboard]'") from exc

from jobbus.dashboard.security import MASK, Redactor, allowed_host, redact_secrets

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from jobbus.app import App


def create_app(
    app: App,
    *,
    read_only: bool = False,
    token: str | None = None,
    allowed_hosts: Iterable[str] | None = None,
    redact: Redactor | None = None,
    host_auth: bool = False,
) -> Starlette:
    """The dashboard of `app` as an ASGI application.

    `read_only` refuses every action; with `token`, every request must carry it (a bearer header, or the
    cookie the login form sets); `redact(field, value)` decides what is shown of each job's
    `configuration`, `execution_data`, `result` and `last_error` (default: `redact_secrets`, which masks
    values under keys that look like secrets). The App's pool is opened on the first request.

    A request is answered only when its `Host` is a loopback name or address (``localhost``,
    ``*.localhost``, 127.0.0.0/8, ``[::1]``) or one of `allowed_hosts` (names or addresses without
    port; ``.example.com`` for a domain and its subdomains; ``*`` for any); with a `token` and
    `allowed_hosts` None, any host. Others get 400.

    `host_auth=True`: the host application authenticates every request before it reaches the
    dashboard (a FastAPI dependency, `jobbus.contrib.fastapi.mount_dashboard`; Django's staff check,
    `jobbus.contrib.django.dashboard.mount_dashboard`), so the dashboard asks for no token of its own
    and, like a dashboard with a token, answers to any host name unless `allowed_hosts` is given.
    """
    from jobbus.dashboard.web import create_starlette

    if token is not None and not token.strip():
        raise ValueError("token must not be empty")
    if token is not None and host_auth:
        raise ValueError("token and host_auth exclude each other: either the dashboard or its host authenticates")
    if isinstance(allowed_hosts, str | bytes):
        raise TypeError("allowed_hosts is a list of host names, not one string")
    hosts = None if allowed_hosts is None else [allowed_host(entry) for entry in allowed_hosts]
    return create_starlette(
        app, read_only=read_only, token=token, redact=redact, allowed_hosts=hosts, host_auth=host_auth
    )


__all__ = ["MASK", "Redactor", "create_app", "redact_secrets"]
