"""`jobbus dashboard`: serve the web dashboard (extra `dashboard`) with uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import sys
from types import FrameType

import click

from jobbus.cli.errors import UsageProblem, probe_database, run
from jobbus.cli.loading import open_app

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
    help="Every request must carry it (login form or bearer header); or set JOBBUS_DASHBOARD_TOKEN.",
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

    It binds 127.0.0.1 unless told otherwise; on any other address give it a token (and put TLS in
    front of it). Prefer JOBBUS_DASHBOARD_TOKEN to --token: the command line is visible to other users.
    It answers only to requests for a loopback name (localhost, 127.0.0.1, [::1]) and the
    --allowed-host names; with a token and no --allowed-host, to any name.
    """
    try:
        import uvicorn

        from jobbus.dashboard import create_app
        from jobbus.dashboard.security import allowed_host
    except ImportError as exc:
        raise UsageProblem(f"jobbus dashboard: {exc} (pip install 'jobbus[dashboard]')") from None
    if token is not None and not token.strip():
        raise UsageProblem("--token must not be empty")
    try:
        hosts = [allowed_host(name) for name in allowed_hosts]
    except ValueError as exc:
        raise UsageProblem(f"--allowed-host: {exc}") from None
    if token is None and not _loopback(host):
        raise UsageProblem(
            f"--host {host} is reachable from other machines: give a --token (or JOBBUS_DASHBOARD_TOKEN)"
        )
    logging.basicConfig(
        level=getattr(logging, log_level), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    async def body() -> int:
        async with open_app(app_spec, dsn) as app:
            await probe_database(app.dsn)
            asgi = create_app(app, read_only=read_only, token=token, allowed_hosts=hosts or None)
            # Open event streams never end on their own: at shutdown they get SHUTDOWN_SECONDS, then close.
            config = uvicorn.Config(
                asgi,
                host=host,
                port=port,
                log_level=log_level.lower(),
                access_log=False,
                timeout_graceful_shutdown=SHUTDOWN_SECONDS,
            )
            live = asgi.state.dashboard.live

            class Server(uvicorn.Server):
                def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                    live.end_streams()  # open tabs reconnect to whatever serves next
                    super().handle_exit(sig, frame)

            server = Server(config)
            logging.getLogger("jobbus.dashboard").info(
                "dashboard on http://%s:%d/%s%s%s",
                host,
                port,
                " (read-only)" if read_only else "",
                " (token required)" if token else "",
                f" (also answers to {', '.join(hosts)})" if hosts else "",
            )
            await server.serve()
        return 0

    sys.exit(run(body))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
