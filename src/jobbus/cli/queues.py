"""`jobbus queue set|list`: fleet-wide limits of queues (flow control)."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from jobbus.cli import exit_codes
from jobbus.cli.errors import UsageProblem, run
from jobbus.cli.options import check_names, dsn_option, json_option
from jobbus.cli.output import admin_app, console, print_json, shown
from jobbus.cli.suggest import SuggestingGroup
from jobbus.errors import InvalidJobError
from jobbus.limits import KEEP, Keep, QueueSettings, RateLimit


@click.group("queue", cls=SuggestingGroup)
def queue_group() -> None:
    """Limits of queues, fleet-wide: concurrency, per-key concurrency, rate limits.

    \b
    Examples:
      jobbus queue set emails --concurrency 20 --concurrency-per-key 1 --rate 100/1m
      jobbus queue set emails --rate none          # remove one limit, keep the others
      jobbus queue list
    """


def _count(option: str, text: str | None) -> int | Keep | None:
    if text is None:
        return KEEP
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageProblem(f"{option} takes a whole number or none, got {text!r}") from None
    if value < 1:
        raise UsageProblem(f"{option} must be at least 1 (or none to remove the limit), got {value}")
    return value


def _rate(option: str, text: str | None) -> RateLimit | Keep | None:
    if text is None:
        return KEEP
    if text.strip().lower() == "none":
        return None
    try:
        return RateLimit.parse(text)
    except InvalidJobError as exc:
        raise UsageProblem(f"{option}: {exc}") from None


@queue_group.command("set")
@click.argument("queue")
@click.option("--concurrency", metavar="N|none", help="At most N jobs of the queue run at once, fleet-wide.")
@click.option("--concurrency-per-key", metavar="N|none", help="At most N jobs of one concurrency_key at once.")
@click.option("--rate", metavar="N/PERIOD|none", help="At most N jobs started in any rolling PERIOD (1s, 1m, 30s).")
@click.option("--rate-per-key", metavar="N/PERIOD|none", help="The same, per concurrency_key.")
@json_option
@dsn_option
def set_command(
    queue: str,
    concurrency: str | None,
    concurrency_per_key: str | None,
    rate: str | None,
    rate_per_key: str | None,
    as_json: bool,
    dsn: str | None,
) -> None:
    """Set (or with `none` remove) limits of QUEUE; limits not given are kept. Running workers apply a
    change within one poll interval.

    \b
    Examples:
      jobbus queue set emails --concurrency 20
      jobbus queue set tenants --concurrency-per-key 1            # one job per tenant at a time
      jobbus queue set partner-api --rate 100/1m --rate-per-key 10/1m
      jobbus queue set emails --concurrency none --rate none
    """
    check_names("QUEUE", [queue])
    limits = {
        "concurrency": _count("--concurrency", concurrency),
        "concurrency_per_key": _count("--concurrency-per-key", concurrency_per_key),
        "rate_limit": _rate("--rate", rate),
        "rate_limit_per_key": _rate("--rate-per-key", rate_per_key),
    }
    if all(value is KEEP for value in limits.values()):
        raise UsageProblem(
            "queue set needs at least one of --concurrency, --concurrency-per-key, --rate, --rate-per-key"
        )

    async def body() -> int:
        async with admin_app(dsn) as app:
            settings = await app.set_queue(queue, **limits)  # type: ignore[arg-type]
        if as_json:
            print_json(queue_dict(settings))
        else:
            console().print(shown(f"queue {queue}: {describe(settings)}"))
        return exit_codes.OK

    sys.exit(run(body))


@queue_group.command("list")
@json_option
@dsn_option
def list_command(as_json: bool, dsn: str | None) -> None:
    """Every queue that has limits, and how close it is to them now."""

    async def body() -> int:
        async with admin_app(dsn) as app:
            settings = await app.list_queues()
            usage = await app.queue_usage()
        if as_json:
            print_json([queue_dict(s, usage.get(s.queue)) for s in settings])
        elif not settings:
            console().print(Text("no queue has limits (jobbus queue set QUEUE --concurrency N ...)", style="dim"))
        else:
            console().print(limits_table(settings, usage))
        return exit_codes.OK

    sys.exit(run(body))


def describe(settings: QueueSettings) -> str:
    parts = []
    if settings.concurrency is not None:
        parts.append(f"concurrency {settings.concurrency}")
    if settings.concurrency_per_key is not None:
        parts.append(f"{settings.concurrency_per_key} per key")
    if settings.rate_limit is not None:
        parts.append(f"rate {settings.rate_limit}")
    if settings.rate_limit_per_key is not None:
        parts.append(f"rate per key {settings.rate_limit_per_key}")
    return ", ".join(parts) or "no limits"


def queue_dict(settings: QueueSettings, usage: tuple[int, int | None] | None = None) -> dict[str, Any]:
    def rate(limit: RateLimit | None) -> dict[str, Any] | None:
        return None if limit is None else {"count": limit.count, "per_seconds": limit.per.total_seconds()}

    data: dict[str, Any] = {
        "queue": settings.queue,
        "concurrency": settings.concurrency,
        "concurrency_per_key": settings.concurrency_per_key,
        "rate_limit": rate(settings.rate_limit),
        "rate_limit_per_key": rate(settings.rate_limit_per_key),
    }
    if usage is not None:
        data["running"], data["started_in_window"] = usage
    return data


def limits_table(settings: list[QueueSettings], usage: dict[str, tuple[int, int | None]]) -> Table:
    table = Table(title="queue limits", title_justify="left")
    for column in ("queue", "running / concurrency", "per key", "started / rate", "rate per key"):
        table.add_column(column, no_wrap=True)
    for s in settings:
        running, started = usage.get(s.queue, (0, None))
        table.add_row(
            shown(s.queue),
            f"{running} / {s.concurrency}" if s.concurrency is not None else f"{running} / -",
            str(s.concurrency_per_key) if s.concurrency_per_key is not None else "-",
            f"{started or 0} / {s.rate_limit}" if s.rate_limit is not None else "-",
            str(s.rate_limit_per_key) if s.rate_limit_per_key is not None else "-",
        )
    return table
