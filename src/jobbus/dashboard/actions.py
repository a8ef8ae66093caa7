"""The dashboard's actions: each a function of the dashboard, the request and its form that acts and
returns the line the next page shows (`web.action` refuses it when read-only or without its CSRF token,
and turns a refusal into that line)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import Request

from jobbus import control, views
from jobbus.dashboard.formatting import parse_uuid
from jobbus.dashboard.state import Dashboard
from jobbus.errors import InvalidStateError
from jobbus.limits import KEEP, Keep, RateLimit
from jobbus.models import JobStatus

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
    done = await BULK_ACTIONS[verb](dash.app, ids)
    return f"{verb}: {done} of {len(ids)} selected job(s)"


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
    if verb == "limits":
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
    raise HTTPException(404)


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
