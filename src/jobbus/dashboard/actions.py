"""The dashboard's actions: each a function of the dashboard, the request and its form that acts and
returns the line the next page shows (`web.action` refuses it to a role below the one its route needs
or without its CSRF token, and turns a refusal into that line)."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from jobbus import control, views
from jobbus.audit import gathering
from jobbus.dashboard.formatting import parse_uuid
from jobbus.dashboard.state import Dashboard
from jobbus.errors import InvalidStateError
from jobbus.limits import KEEP, Keep, RateLimit
from jobbus.models import JobStatus
from jobbus.producer import plan
from jobbus.requests import validate_tags
from jobbus.store.views import Count

if TYPE_CHECKING:
    from jobbus.app import App

T = TypeVar("T")
#: A bulk action acts on at most this many jobs per click (a failure group says how many are left).
BULK_LIMIT = 1000
WORKER_ACTIONS = ("pause", "resume", "drain", "stop", "restart")


async def retry_job(dash: Dashboard, request: Request, form: dict[str, Any]) -> str:
    job_id = _require_uuid(request.path_params["job_id"])
    await dash.app.retry(job_id)
    return f"job {job_id} queued again"


async def cancel_job(dash: Dashboard, request: Request, form: dict[str, Any]) -> str:
    job_id = _require_uuid(request.path_params["job_id"])
    status = await dash.app.cancel(job_id)
    return f"job {job_id}: {'cancellation requested' if status is JobStatus.RUNNING else status.value}"


async def delete_job(dash: Dashboard, request: Request, form: dict[str, Any]) -> str:
    job_id = _require_uuid(request.path_params["job_id"])
    await dash.app.delete(job_id)
    return f"job {job_id} deleted"


async def run_job_now(dash: Dashboard, request: Request, form: dict[str, Any]) -> str:
    job_id = _require_uuid(request.path_params["job_id"])
    await dash.app.run_now(job_id)
    return f"job {job_id} is available now"


async def bulk_jobs(dash: Dashboard, request: Request, form: dict[str, Any]) -> str:
    ids = [_require_uuid(i) for i in (form.get("ids") or [])][:BULK_LIMIT]
    verb = form.get("action")
    if verb not in BULK_ACTIONS:
        raise ValueError("bulk action must be retry, cancel or delete")
    if not ids:
        return "no job selected"
    with gathering() as acted_on:
        done = await BULK_ACTIONS[verb](dash.app, ids)
    # One audit entry for the click, once its actions are done (each in its own transaction): it names
    # the jobs acted on, so it never names one that was not.
    details = {"count": len(acted_on), "selected": len(ids), "jobs": [t.removeprefix("job:") for t in acted_on]}
    await dash.act(dash.app.audit_store.record(verb, "jobs", details))
    return f"{verb}: {done} of {len(ids)} selected job(s)"


async def update_jobs(dash: Dashboard, request: Request, form: dict[str, Any]) -> str | Response:
    """Change queued jobs: the selected ones (`scope=selected`, in one statement as a batch of
    `App.update_many`) or every queued job of the page's queue, type and tag filters (`scope=filter`,
    `App.update_many`). Without `confirm`, a page that names the changes and how many jobs they touch,
    and asks again; with it, the change."""
    changes = _changes(form)
    scope = form.get("scope")
    ids = [_require_uuid(i) for i in (form.get("ids") or [])][:BULK_LIMIT]
    if scope == "selected":
        if not ids:
            return "no job selected"
        found = await dash.run(dash.app.store.find_jobs(ids))
        queued = sum(job.status is JobStatus.QUEUED for job in found)
        count, what = Count(queued), f"of the {len(ids)} selected jobs (those still queued)"
    elif scope == "filter":
        if form.get("filter_other"):
            raise ValueError("a change of every job of a filter takes a queue, a type and tags only: clear the others")
        queue, job_type = form.get("filter_queue") or None, form.get("filter_type") or None
        tags = _tags("tag", form.get("filter_tag"))
        if queue is None and job_type is None and not tags:
            raise ValueError("choose a queue, a type or a tag first: this would change every queued job")
        filters = views.Filters((queue,) if queue else (), (job_type,) if job_type else (), tags=tags)
        count = await views.count(dash.app, "queued", filters)
        what = (
            "queued jobs"
            + "".join(f" {label} {value}" for label, value in (("of queue", queue), ("of type", job_type)) if value)
            + (f" with tags {', '.join(tags)}" if tags else "")
        )
    else:
        raise ValueError("scope must be selected or filter")
    if not form.get("confirm"):
        return dash.render(
            request,
            "update_confirm.html",
            title="Change jobs",
            count=count,
            what=what,
            changes=_described(changes),
            form={k: v for k, v in form.items() if k not in ("csrf", "ids")},
            ids=ids,
        )
    if scope == "selected":
        # One statement, as a batch of update_many: a job claimed or finished meanwhile is left as it is.
        checked = plan.update_changes(
            "update_many",
            changes["priority"],
            changes["queue"],
            changes["available_at"],
            changes["add_tags"],
            "add_tags",
        )
        statement = dash.app.store.update_jobs(
            after=uuid.UUID(int=0),
            limit=BULK_LIMIT,
            queue=None,
            type=None,
            tags=None,
            set_priority=checked["priority"],
            set_queue=checked["queue"],
            available_at=checked["available_at"],
            delay_seconds=checked["delay_seconds"],
            add_tags=checked["tags"],
            ids=ids,
        )
        described = plan.described_changes(
            changes["priority"], changes["queue"], changes["available_at"], changes["add_tags"], "add_tags"
        )
        audited = dash.app.audit_store.audited(
            statement,
            "update_many",
            "jobs",
            lambda result: {
                "count": result[2],
                "selected": len(ids),
                "filter": {"ids": "selected"},
                "changes": described,
            },
        )
        _last, _chosen, done = await dash.act(audited)
        return f"changed {done} of {len(ids)} selected job(s)"
    done = await dash.app.update_many(
        queue=queue,
        type=job_type,
        tag=list(tags) or None,
        set_priority=changes["priority"],
        set_queue=changes["queue"],
        set_available_at=changes["available_at"],
        add_tags=changes["add_tags"],
    )
    return f"changed {done:,} queued job(s)"


def _changes(form: dict[str, Any]) -> dict[str, Any]:
    """The bulk edit's fields; an empty one changes nothing, and at least one must change something."""
    priority = _optional_int(form.get("set_priority"))
    queue = (form.get("set_queue") or "").strip() or None
    when = (form.get("set_available_at") or "").strip()
    add_tags = _tags("add_tags", form.get("add_tags")) or None
    if priority is None and queue is None and not when and add_tags is None:
        raise ValueError("give at least one change: priority, queue, available at or tags to add")
    return {"priority": priority, "queue": queue, "available_at": _when(when) if when else None, "add_tags": add_tags}


def _described(changes: dict[str, Any]) -> list[str]:
    said = []
    if changes["priority"] is not None:
        said.append(f"priority {changes['priority']}")
    if changes["queue"] is not None:
        said.append(f"move to queue {changes['queue']}")
    if changes["available_at"] is not None:
        at = changes["available_at"]
        said.append(f"available {'in ' + str(at) if isinstance(at, timedelta) else 'at ' + at.isoformat()}")
    if changes["add_tags"] is not None:
        said.append(f"add tags {', '.join(changes['add_tags'])}")
    return said


def _when(text: str) -> datetime | timedelta:
    """`now`, a delay from now (`15m`, `1h30m`) or an aware ISO 8601 time."""
    if text.lower() == "now":
        return timedelta(0)
    match = _DELAY.fullmatch(text.lower().replace(" ", ""))
    if match:
        return timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in _DELAY_PART.findall(text.lower())))
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"available at {text!r} is not now, a delay like 15m or an ISO 8601 time") from None
    if value.tzinfo is None:
        raise ValueError(f"available at {text!r} has no timezone: add an offset or Z")
    return value


_DELAY = re.compile(r"(\d{1,9}[smhdw])+")
_DELAY_PART = re.compile(r"(\d{1,9})([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _tags(what: str, text: Any) -> tuple[str, ...]:
    if not isinstance(text, str) or not text.strip():
        return ()
    return validate_tags(what, [t.strip() for t in text.split(",") if t.strip()]) or ()


async def retry_failures(dash: Dashboard, request: Request, form: dict[str, Any]) -> str:
    """ "Retry all" of a failure group: every failed job of it, however many, and says how many."""
    pattern = form.get("pattern")
    groups = await dash.run(dash.store.failures())
    group = next((g for g, _ in groups if g.key == pattern), None)
    if group is None:
        return "that failure group is gone (retried or pruned meanwhile)"
    retried, kept = await views.retry_failure_group(dash.app, group.pattern)
    said = f"retried {retried:,} job(s) failing with {dash.redact('last_error', group.example)}"
    return said + (f"; {kept:,} left failed: another active job holds their unique key" if kept else "")


async def worker_action(dash: Dashboard, request: Request, form: dict[str, Any]) -> str:
    verb = form.get("action")
    if verb not in WORKER_ACTIONS:
        raise ValueError(f"unknown action {verb!r}")
    worker_id = form.get("worker_id") or None
    target = control.Target.of(worker_id=worker_id, all=worker_id is None)
    issued = await control.issue(dash.app, verb, target)
    return f"{verb} sent to {target} (command {issued.generation}, {len(issued.worker_ids)} worker(s) addressed)"


async def queue_action(dash: Dashboard, request: Request, form: dict[str, Any]) -> str:
    queue = request.path_params["queue"]
    verb = request.path_params["verb"]
    if verb in ("pause", "resume"):
        issued = await control.issue(dash.app, verb, control.Target.of(queue=queue))
        return f"queue {queue}: {verb} (command {issued.generation})"
    raise HTTPException(404)


async def queue_limits(dash: Dashboard, request: Request, form: dict[str, Any]) -> str:
    queue = request.path_params["queue"]
    limits = await dash.app.set_queue(
        queue,
        concurrency=_limit(form, "concurrency", _optional_int),
        concurrency_per_key=_limit(form, "concurrency_per_key", _optional_int),
        rate_limit=_limit(form, "rate_limit", _optional_rate),
        rate_limit_per_key=_limit(form, "rate_limit_per_key", _optional_rate),
    )
    shown = ", ".join(
        f"{name} {value}"
        for name, value in (
            ("concurrency", limits.concurrency),
            ("per key", limits.concurrency_per_key),
            ("rate", limits.rate_limit),
            ("rate per key", limits.rate_limit_per_key),
        )
        if value is not None
    )
    return f"queue {queue}: {shown or 'no limits'}"


async def periodic_action(dash: Dashboard, request: Request, form: dict[str, Any]) -> str:
    name = request.path_params["name"]
    verb = request.path_params["verb"]
    if verb == "pause":
        await dash.app.pause_periodic(name)
        return f"periodic job {name} paused"
    if verb == "resume":
        await dash.app.resume_periodic(name)
        return f"periodic job {name} resumed"
    if verb == "run":
        job_id = await dash.app.run_periodic(name)
        return f"periodic job {name}: job {job_id} enqueued"
    raise HTTPException(404)


# -- acting on many jobs ----------------------------------------------------------------------------


async def _retry_many(app: App, ids: list[uuid.UUID]) -> int:
    done = 0
    for job_id in ids:
        with contextlib.suppress(InvalidStateError):
            await app.retry(job_id)
            done += 1
    return done


async def _cancel_many(app: App, ids: list[uuid.UUID]) -> int:
    done = 0
    for job_id in ids:
        with contextlib.suppress(InvalidStateError):
            status = await app.cancel(job_id)
            done += status in (JobStatus.CANCELLED, JobStatus.RUNNING)
    return done


async def _delete_many(app: App, ids: list[uuid.UUID]) -> int:
    done = 0
    for job_id in ids:
        with contextlib.suppress(InvalidStateError):
            await app.delete(job_id)
            done += 1
    return done


#: The bulk actions of the jobs page; each counts the selected jobs it acted on (a job in a state the
#: action does not apply to is skipped, as a single action would refuse it).
BULK_ACTIONS: dict[str, Callable[[App, list[uuid.UUID]], Awaitable[int]]] = {
    "retry": _retry_many,
    "cancel": _cancel_many,
    "delete": _delete_many,
}


# -- reading the forms ------------------------------------------------------------------------------


def _require_uuid(value: Any) -> uuid.UUID:
    parsed = parse_uuid(value)
    if parsed is None:
        raise ValueError(f"{value!r} is not a job id")
    return parsed


def _limit(form: dict[str, Any], name: str, parse: Callable[[Any], T | None]) -> T | Keep | None:
    """A limit of the limits form: a field not sent keeps the stored limit, an empty one (or `none`)
    removes it."""
    if name not in form:
        return KEEP
    value = form[name]
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    return parse(value)


def _optional_int(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a whole number") from None


def _optional_rate(value: Any) -> RateLimit | None:
    if value in (None, "") or (isinstance(value, str) and not value.strip()):
        return None
    return RateLimit.parse(str(value))
