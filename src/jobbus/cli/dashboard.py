"""`jobbus dashboard`: serve the web dashboard (extra `dashboard`) with uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import signal
import socket
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from jobbus.cli.errors import DatabaseUnavailable as CliDatabaseUnavailable
from jobbus.cli.errors import PortInUse, UsageProblem, probe_database, run
from jobbus.cli.loading import open_app

if TYPE_CHECKING:
    from jobbus.app import App

#: How long a stopping dashboard waits for open requests (live event streams never finish by themselves).
SHUTDOWN_SECONDS = 2


@click.command("dashboard")
@click.option("--dsn", metavar="DSN", help="PostgreSQL DSN (default: JOBBUS_DSN).")
@click.option("--app", "app_spec", metavar="MODULE:ATTR", help="Your App, for its settings (optional).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8787, show_default=True)
@click.option("--read-only", is_flag=True, help="Refuse every action (retry, cancel, pause, ...).")
@click.option(
    "--token",
    envvar="JOBBUS_DASHBOARD_TOKEN",
    metavar="TOKEN",
    help="The admin token: every request must carry a token (login form or bearer header); "
    "or set JOBBUS_DASHBOARD_TOKEN.",
)
@click.option(
    "--operator-token",
    envvar="JOBBUS_DASHBOARD_OPERATOR_TOKEN",
    metavar="TOKEN",
    help="A token for the operator role (job, worker and queue actions); or JOBBUS_DASHBOARD_OPERATOR_TOKEN.",
)
@click.option(
    "--viewer-token",
    envvar="JOBBUS_DASHBOARD_VIEWER_TOKEN",
    metavar="TOKEN",
    help="A token for the viewer role (reads only); or JOBBUS_DASHBOARD_VIEWER_TOKEN.",
)
@click.option(
    "--trusted-user-header",
    metavar="NAME",
    help="Take the user's name from this header, sent by a proxy at a --trusted-proxy address.",
)
@click.option(
    "--trusted-proxy",
    "trusted_proxies",
    multiple=True,
    metavar="CIDR",
    help="A network (or address) of the proxy that sets --trusted-user-header; repeatable.",
)
@click.option(
    "--role-map",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help='A TOML file giving the proxy\'s users their roles: [roles] alice = "admin", "*" = "viewer".',
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="A host name (or address) the dashboard answers to besides loopback ones; repeatable. "
    "'.example.com' covers its subdomains.",
)
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING"]))
def dashboard_command(
    dsn: str | None,
    app_spec: str | None,
    host: str,
    port: int,
    read_only: bool,
    token: str | None,
    operator_token: str | None,
    viewer_token: str | None,
    trusted_user_header: str | None,
    trusted_proxies: tuple[str, ...],
    role_map: str | None,
    allowed_hosts: tuple[str, ...],
    log_level: str,
) -> None:
    """Serve the web dashboard: queues, jobs, failures, workers, periodic jobs, groups; live.

    \b
    Examples:
      jobbus dashboard
      JOBBUS_DASHBOARD_TOKEN=s3cret jobbus dashboard --host 0.0.0.0 --port 8080
      jobbus dashboard --read-only --dsn postgresql://app_ro@db/app
      JOBBUS_DASHBOARD_TOKEN=s3cret jobbus dashboard --host 0.0.0.0 --allowed-host jobs.example.com
      jobbus dashboard --trusted-user-header X-Forwarded-User --trusted-proxy 127.0.0.1 --role-map roles.toml

    It binds 127.0.0.1 unless told otherwise; on any other address give it a token (and put TLS in
    front of it). Prefer JOBBUS_DASHBOARD_TOKEN to --token: the command line is visible to other users.
    It answers only to requests for a loopback name (localhost, 127.0.0.1, [::1]) and the
    --allowed-host names; with a token and no --allowed-host, to any name. --token gives the admin
    role, --operator-token and --viewer-token the others; --read-only caps every role at viewer.
    """
    require_dashboard_extra("jobbus dashboard")
    from jobbus.dashboard.roles import TrustedProxy
    from jobbus.dashboard.security import allowed_host

    tokens = {"--token": token, "--operator-token": operator_token, "--viewer-token": viewer_token}
    given = {name: value for name, value in tokens.items() if value is not None}
    for name, value in given.items():
        if not value.strip():
            raise UsageProblem(f"{name} must not be empty")
    if len(set(given.values())) < len(given):
        raise UsageProblem(f"{' and '.join(given)} must differ: each role has its own token")
    proxy: dict[str, Any] = {}
    if trusted_user_header is not None:
        if not trusted_proxies:
            raise UsageProblem("--trusted-user-header needs --trusted-proxy CIDR: the proxy whose header to believe")
        if role_map is None:
            raise UsageProblem("--trusted-user-header needs --role-map FILE: which role each user has")
        try:
            checked = TrustedProxy.of(trusted_user_header, trusted_proxies, role_map)
        except ValueError as exc:
            raise UsageProblem(str(exc)) from None
        proxy = {
            "trusted_user_header": checked.header,
            "trusted_proxies": [str(network) for network in checked.networks],
            "role_map": dict(checked.roles),
        }
    elif trusted_proxies or role_map is not None:
        raise UsageProblem("--trusted-proxy and --role-map need --trusted-user-header NAME")
    try:
        hosts = [allowed_host(name) for name in allowed_hosts]
    except ValueError as exc:
        raise UsageProblem(f"--allowed-host: {exc}") from None
    if not given and not proxy and not _loopback(host):
        raise UsageProblem(
            f"--host {host} is reachable from other machines: give a --token (or JOBBUS_DASHBOARD_TOKEN)"
            " or a --trusted-user-header"
        )
    logging.basicConfig(
        level=getattr(logging, log_level), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    async def body() -> int:
        async with open_app(app_spec, dsn) as app:
            if app.cells:
                await probe_cells(app)
            else:
                await probe_database(app.dsn)
            with StopSignals() as stopping:  # from before it says where it serves to the end: exit 0
                sock = bind_port(host, port)
                logging.getLogger("jobbus.dashboard").info(
                    "dashboard on %s%s%s%s",
                    url_of(sock),
                    " (read-only)" if read_only else "",
                    " (token required)" if given else "",
                    f" (also answers to {', '.join(hosts)})" if hosts else "",
                )
                await serve_dashboard(
                    app,
                    sock,
                    read_only=read_only,
                    token=token,
                    operator_token=operator_token,
                    viewer_token=viewer_token,
                    allowed_hosts=hosts or None,
                    log_level=log_level,
                    stopping=stopping,
                    **proxy,
                )
        return 0

    sys.exit(run(body))


class StopSignals:
    """SIGINT and SIGTERM, from the moment this is entered, stop the dashboard and the command exits 0:
    one that comes before the server serves is kept, and the server stops as soon as it has started.
    (uvicorn raises the stopping signal again once it has shut down, so that the default action,
    KeyboardInterrupt or death by SIGTERM, runs: here that signal is only recorded.)"""

    def __init__(self) -> None:
        self.received = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            self._previous = {sig: signal.signal(sig, self._record) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _record(self, sig: int, frame: FrameType | None) -> None:
        self.received = True


async def serve_dashboard(
    app: App,
    sock: socket.socket,
    *,
    read_only: bool = False,
    token: str | None = None,
    operator_token: str | None = None,
    viewer_token: str | None = None,
    allowed_hosts: list[str] | None = None,
    log_level: str = "INFO",
    stopping: StopSignals | None = None,
    **proxy: Any,
) -> None:
    """Serve the dashboard of `app` on `sock` (from `bind_port`) until SIGINT or SIGTERM, then return,
    so that the command exits 0; `stopping`: the caller's, entered before it said where it serves;
    `proxy`: `create_app`'s trusted proxy settings. The socket is closed at the end."""
    import uvicorn

    from jobbus.dashboard import create_app

    with contextlib.ExitStack() as stack:
        stack.callback(sock.close)
        signals = stopping if stopping is not None else stack.enter_context(StopSignals())
        asgi = create_app(
            app,
            read_only=read_only,
            token=token,
            operator_token=operator_token,
            viewer_token=viewer_token,
            allowed_hosts=allowed_hosts,
            **proxy,
        )
        # Open event streams never end on their own: at shutdown they get SHUTDOWN_SECONDS, then close.
        # Behind a trusted proxy, the peer address must be the connection's own: uvicorn would replace
        # it with the X-Forwarded-For the proxy passes on, and the proxy check would judge the client.
        config = uvicorn.Config(
            asgi,
            log_level=log_level.lower(),
            access_log=False,
            timeout_graceful_shutdown=SHUTDOWN_SECONDS,
            proxy_headers=not proxy,
        )
        dashboard = asgi.state.dashboard

        class Server(uvicorn.Server):
            async def startup(self, sockets: list[socket.socket] | None = None) -> None:
                # uvicorn's own handlers are in place now: a signal that came before means never serve.
                if signals.received:
                    self.should_exit = True
                    return
                await super().startup(sockets)

            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                dashboard.end_streams()  # open tabs reconnect to whatever serves next
                super().handle_exit(sig, frame)

        await Server(config).serve(sockets=[sock])


async def probe_cells(app: App) -> None:
    """Over cells (`JOBBUS_CELLS`): each cell probed side by side; a cell that cannot be reached is named
    in the log and shown as down by the dashboard, which serves the others. Exit 69 when none can be
    reached, 78 for a malformed DSN, as with one database."""
    logger = logging.getLogger("jobbus.dashboard")
    names = list(app.cells)
    found = await asyncio.gather(
        *(probe_database(cell.settings.dsn or "") for cell in app.cells.values()), return_exceptions=True
    )
    for outcome in found:
        if isinstance(outcome, BaseException) and not isinstance(outcome, CliDatabaseUnavailable):
            raise outcome  # a malformed DSN (exit 78) is a configuration error, whichever cell has it
    down = [(name, outcome) for name, outcome in zip(names, found, strict=True) if outcome is not None]
    if len(down) == len(names):
        raise CliDatabaseUnavailable("; ".join(f"cell {name}: {outcome}" for name, outcome in down))
    for name, outcome in down:
        logger.warning("cell %s: %s (its pages say so until it is back)", name, outcome)


def bind_port(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: one the system picks), or `PortInUse` (exit 69) naming the
    port when something else listens there. It accepts connections only once the server serves on it
    (asyncio listens when it starts serving): a client that can connect reaches a running dashboard."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise UsageProblem(f"--host {host}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # still refuses a port something listens on
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"port {port} on {host} is in use: stop what listens there, or choose another with --port"
            ) from None
        raise PortInUse(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    """The dashboard's address on a listening socket, e.g. `http://127.0.0.1:8787/`."""
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def require_dashboard_extra(command: str) -> None:
    """A usage error (exit 64) naming the extra when the dashboard's dependencies are missing."""
    try:
        import uvicorn  # noqa: F401

        import jobbus.dashboard  # noqa: F401
    except ImportError as exc:
        raise UsageProblem(f"{command}: {exc} (pip install 'jobbus[dashboard]')") from None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
