"""The operator's views of jobs (`sql/queries/views.sql`): complete lists and honest counts.

Shared by the dashboard's jobs page, its overview and failures, and `jobbus jobs list` / `jobbus
status`, so they show the same jobs and the same numbers. A list walks the index of its view in the
view's order from a keyset cursor: it reaches every matching job, and a page is empty only when
nothing further matches. A count is exact up to `COUNT_CAP` rows read along an index; past it, it is
the planner's estimate of the same rows, and says so (`Count.estimated`).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobbus.models import waiting_for
from jobbus.store.statements import Row, Statement, queries

#: Every view a list or a count can be asked for: the five statuses, the views of queued jobs, and
#: `finished` (completed, failed and cancelled together).
STATUSES = ("queued", "running", "completed", "failed", "cancelled")
QUEUED_VIEWS = ("scheduled", "retrying", "waiting")
VIEWS = (*STATUSES, *QUEUED_VIEWS, "finished")
FINISHED = ("completed", "failed", "cancelled")
#: Rows a count reads along an index before it gives the planner's estimate instead.
COUNT_CAP = 10_000
#: A job's configuration is previewed in lists when it is stored in at most this many bytes.
PREVIEW_BYTES = 2048

#: The columns of a job that a list shows (`JobSummary`, in this order).
SUMMARY = (
    "j.id, j.status, j.queue, j.type, j.name, j.unique_key, j.attempts, j.max_attempts, j.priority, j.created_at,"
    " j.available_at, j.started_at, j.finished_at, left(j.last_error, 300), j.worker_id, j.progress_current,"
    " j.progress_total, j.group_id,"
    f" CASE WHEN pg_column_size(j.configuration_data) <= {PREVIEW_BYTES} THEN j.configuration_data END,"
    " pg_column_size(j.configuration_data),"
    " CASE WHEN j.status = 'queued' THEN j.history -> -1 ->> 'outcome' END,"
    " CASE WHEN j.status = 'queued' THEN j.history -> -1 ->> 'waiting_for' END,"
    " j.tags"
)
#: What a search looks in, as one text: type, name, unique_key, last error and the first 2,000 characters
#: of the configuration's JSON (not the id: its text doubled what testing a row costs, and a whole id
#: opens its job). The optional search index (`jobbus search-index create`) is an index of this
#: expression (without the `j.`), so a search can use it.
SEARCH_DOCUMENT = (
    "(j.type || ' ' || coalesce(j.name, '') || ' ' || coalesce(j.unique_key, '') || ' '"
    " || coalesce(j.last_error, '') || ' ' || left(j.configuration_data::text, 2000))"
)
SEARCH = f"{SEARCH_DOCUMENT} ILIKE %(text)s"
#: The filters every view takes (`Filters`): `{filters}` in views.sql.
FILTERS = (
    "(%(queues)s::text[] IS NULL OR j.queue = ANY(%(queues)s::text[]))"
    " AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))"
    " AND (%(name)s::text IS NULL OR j.name = %(name)s::text) AND (%(text)s::text IS NULL OR " + SEARCH + ")"
)
#: The tag filter alone (`Filters.tags`: jobs that have every one): `{tagged}` in views.sql.
TAGGED = "(%(tags)s::text[] IS NULL OR j.tags @> %(tags)s::text[])"
FILTERS += " AND " + TAGGED


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A job as a list shows it (no payload beyond a small configuration's preview)."""

    id: uuid.UUID
    status: str
    queue: str
    type: str
    name: str | None
    unique_key: str | None
    attempts: int
    max_attempts: int
    priority: int
    created_at: datetime
    available_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    worker_id: str | None
    progress_current: float | None
    progress_total: float | None
    group_id: uuid.UUID | None
    #: The configuration when it is stored in at most `PREVIEW_BYTES`, else None.
    configuration: dict[str, Any] | None
    configuration_bytes: int
    #: A queued job's last history outcome (`waiting` while parked, `retried`, ...), else None.
    last_outcome: str | None
    #: What a parked job waits for, as recorded (`sleep:NAME`, `event KEY`, `children`), else None;
    #: `waits_for` reads it as the handler named it.
    waiting_for: str | None
    #: The job's tags (None: none).
    tags: list[str] | None = None

    @property
    def waits_for(self) -> str | None:
        return waiting_for(self.waiting_for) if self.view == "waiting" else None

    @property
    def view(self) -> str:
        """The status, or for a queued job the view it is in: `waiting`, `retrying`, `scheduled` (from
        the job's own columns, so a list and the job's page name it alike)."""
        if self.status != "queued":
            return self.status
        if self.last_outcome == "waiting":
            return "waiting"
        if self.attempts > 0:
            return "retrying"
        return "queued"

    @property
    def next_run_at(self) -> datetime | None:
        """When a queued job becomes available (a retry its next attempt, a parked job its wake-up; None
        for a wait without a timeout, and for a job that is not queued)."""
        return self.available_at if self.status == "queued" and self.available_at.year < 9000 else None


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a list's next page starts: the sort key of the last job of the page before."""

    id: uuid.UUID
    at: datetime | None = None

    def encode(self) -> str:
        """An opaque, URL-safe token."""
        raw = json.dumps([str(self.id), self.at.isoformat() if self.at else None])
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor | None:
        """The cursor of a token; None for anything that is not one (a stale or edited link)."""
        try:
            job_id, at = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            return cls(uuid.UUID(job_id), datetime.fromisoformat(at) if at else None)
        except (ValueError, TypeError):
            return None


@dataclass(frozen=True, slots=True)
class Page:
    jobs: list[JobSummary]
    #: Where the next page starts; None when nothing further matches.
    next: Cursor | None


@dataclass(frozen=True, slots=True)
class Count:
    """A count as shown: exact, or an estimate (shown with ≈, `"estimated": true` in JSON). An estimate
    below what was read is no estimate of it: then the count says only that there are at least `value`
    (shown as "> N-1", `"at_least": true`)."""

    value: int
    estimated: bool = False
    at_least: bool = False
    #: False when the count was not read: a search without its index stopped before it finished (shown
    #: as "?", `"count": null` in JSON).
    counted: bool = True

    @classmethod
    def estimate(cls, read: int, estimate: int) -> Count:
        """What to show when `read` rows were read before the bound and the planner estimates `estimate`."""
        return cls(read, estimated=True, at_least=True) if estimate < read else cls(estimate, estimated=True)

    @classmethod
    def total(cls, counts: Iterable[Count]) -> Count:
        """The sum of counts: an estimate if any is one, at least its value if any is a lower bound."""
        parts = list(counts)
        return cls(
            sum(c.value for c in parts),
            any(c.estimated for c in parts),
            any(c.at_least for c in parts),
            all(c.counted for c in parts),
        )

    def __str__(self) -> str:
        if not self.counted:
            return "?"
        if self.at_least:
            return f"> {self.value - 1:,}"
        return f"≈ {self.value:,}" if self.estimated else f"{self.value:,}"

    def as_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {"count": self.value if self.counted else None, "estimated": self.estimated}
        if self.at_least:
            value["at_least"] = True
        return value


@dataclass(frozen=True, slots=True)
class Filters:
    """What narrows a list or a count: a job of one of `queues` (any when empty), of one of `types`,
    named `name`, holding `text` (in its type, name, unique_key, last error or configuration), of
    `group_id`."""

    queues: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    name: str | None = None
    text: str | None = None
    group_id: uuid.UUID | None = None
    #: Finished views only: jobs finished after this instant.
    finished_after: datetime | None = None
    #: Jobs that have every one of these tags (any job when empty).
    tags: tuple[str, ...] = ()

    def params(self) -> dict[str, Any]:
        return {
            "finished_after": self.finished_after,
            "queues": list(self.queues) or None,
            "types": list(self.types) or None,
            "name": self.name,
            "text": f"%{escape_like(self.text)}%" if self.text else None,
            "group_id": self.group_id,
            "tags": list(self.tags) or None,
        }


class ViewStore:
    """Builds the statements of the job views for one schema."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        shipped = queries(schema)
        fragments = {
            "{finished_triples}": shipped["fragment_finished_triples"].rstrip().rstrip(";"),
            "{queued_levels}": shipped["fragment_queued_levels"].rstrip().rstrip(";"),
            "{summary}": SUMMARY,
            "{filters}": FILTERS,
            "{search}": SEARCH,
            "{tagged}": TAGGED,
        }
        self._q = {}
        for name, text in shipped.items():
            if name.startswith(
                ("view_", "count_", "estimate_", "pairs_", "queue_counts", "search_index", "finished_span")
            ):
                for marker, fragment in fragments.items():
                    text = text.replace(marker, fragment)
                self._q[name] = text

    def search_indexes(self) -> Statement[frozenset[str]]:
        """The valid indexes of the optional search index (`jobbus search-index create`), by name."""
        return Statement(
            self._q["search_indexes"], {"schema_name": self.schema}, lambda rows, _: frozenset(r[0] for r in rows)
        )

    def finished_span(self) -> Statement[tuple[datetime | None, datetime | None]]:
        """The oldest and the newest finish of any job (None: none finished): two index probes."""
        return Statement(self._q["finished_span"], {}, lambda rows, _: (rows[0][0], rows[0][1]))

    def page(
        self,
        view: str,
        filters: Filters,
        *,
        cursor: Cursor | None = None,
        limit: int = 50,
        search_index: bool = False,
    ) -> Statement[Page]:
        """One page of `view` (see `VIEWS`), in the view's order: finished jobs the most recently
        finished first, queued ones (and each view of them) by when they run next, running ones the
        latest start first, a group's jobs (`filters.group_id`) the newest first."""
        if view not in VIEWS:
            raise ValueError(f"unknown view {view!r}: one of {', '.join(VIEWS)}")
        params: dict[str, Any] = {
            **filters.params(),
            "id": cursor.id if cursor else None,
            "at": cursor.at if cursor else None,
            "limit": limit + 1,
            "statuses": None,
            "scheduled": view == "scheduled",
        }
        if filters.group_id is not None:
            name = "view_group"
            params["statuses"] = list(FINISHED) if view == "finished" else [view if view in STATUSES else "queued"]
        elif view in (*FINISHED, "finished"):
            name = "view_finished"
            if filters.name is not None:
                name = "view_finished_named"
            elif search_index and filters.text:
                name = "view_finished_search"
            params["statuses"] = list(FINISHED) if view == "finished" else [view]
        elif view in ("queued", "scheduled"):
            name = "view_queued"
        else:
            name = f"view_{view}"
        query = self._q[name]
        if filters.tags and name in ("view_finished", "view_queued", "view_retrying", "view_waiting"):
            # A tag's jobs are found along job_tags_idx when the planner finds the tag rare, along the
            # view's order when it is common (the walks above would meet a rare tag's jobs late).
            name = "view_finished_tagged" if name == "view_finished" else "view_queued_tagged"
            query = self._q[name].replace("{predicate}", _PREDICATES[view] + " AND " + FILTERS)
        if cursor is not None and cursor.at is None and name != "view_group":
            params["id"] = params["at"] = None  # not a cursor of this list: start from its beginning

        def decode(rows: list[Row], _: int) -> Page:
            jobs = [JobSummary(*row) for row in rows]
            if len(jobs) <= limit:
                return Page(jobs, None)
            jobs = jobs[:limit]
            return Page(jobs, _cursor_of(name, jobs[-1]))

        return Statement(query, params, decode, prepare=False)

    def count(
        self, view: str, filters: Filters, *, cap: int = COUNT_CAP, search_index: bool = False
    ) -> Statement[tuple[int, bool]]:
        """How many jobs of `view` match, read along the view's index: (the count, whether it went past
        `cap`, when it is `cap` + 1 and only `estimate` can say more)."""
        params = self._params(view, filters)
        params["cap"] = cap
        name = "count_group" if filters.group_id is not None else f"count_{_FAMILY[view]}"
        if name == "count_finished" and filters.name is not None:
            name = "count_finished_named"
        elif name == "count_finished" and search_index and filters.text:
            name = "count_finished_search"
        query = self._q[name]
        if filters.text and filters.group_id is None and _FAMILY[view] != "finished":
            query = self._q["count_searched"].replace("{predicate}", _PREDICATES[view] + " AND " + FILTERS)
        elif filters.tags and filters.group_id is None and not (search_index and filters.text):
            # Counted as a search is, the planner choosing the read: job_tags_idx for a rare tag.
            query = self._q["count_searched"].replace("{predicate}", _PREDICATES[view] + " AND " + FILTERS)
        return Statement(query, params, lambda rows, _: (int(rows[0][0]), int(rows[0][0]) > cap), prepare=False)

    def estimate(self, view: str, filters: Filters) -> Statement[int]:
        """The planner's estimate of how many jobs of `view` match (EXPLAIN of its predicate)."""
        predicate = _PREDICATES["group" if filters.group_id is not None else view] + " AND " + FILTERS
        query = self._q["estimate_rows"].replace("{predicate}", predicate)

        return Statement(query, self._params(view, filters), decode_estimate, prepare=False)

    def queue_counts(self, part: str, *, cap: int = COUNT_CAP) -> Statement[list[tuple[str, str, int, bool]]]:
        """Per queue, the `part` ("queued" or "finished") of `QUEUE_COUNTS` read now (queue_counts_<part>):
        (queue, what, n, past `cap`)."""

        def decode(rows: list[Row], _: int) -> list[tuple[str, str, int, bool]]:
            return [(r[0], r[1], int(r[2]), bool(r[3])) for r in rows if r[2] is not None]

        params = {"cap": cap, "statuses": list(FINISHED), "queues": None, "types": None}
        return Statement(self._q[f"queue_counts_{part}"], params, decode, prepare=False)

    def queue_estimate(self, what: str, queue: str) -> Statement[int]:
        """The planner's estimate of one of `QUEUE_COUNTS` of one queue."""
        query = self._q["estimate_rows"].replace("{predicate}", _QUEUE_PREDICATES[what])
        return Statement(query, {"queue": queue, "status": what.split("_", 1)[0]}, decode_estimate, prepare=False)

    def pairs(self, view: str) -> Statement[list[tuple[str, str]]]:
        """Every (queue, type) pair of `view`'s jobs (for the queued views: of every queued job), sorted."""
        family = {"finished": "finished", "running": "running"}.get(_FAMILY[view], "queued")
        params = self._params(view, Filters())
        return Statement(self._q[f"pairs_{family}"], params, lambda rows, _: [(r[0], r[1]) for r in rows])

    @staticmethod
    def _params(view: str, filters: Filters) -> dict[str, Any]:
        if view not in VIEWS:
            raise ValueError(f"unknown view {view!r}: one of {', '.join(VIEWS)}")
        statuses: list[str] | None = None
        if view == "finished":
            statuses = list(FINISHED)
        elif view in FINISHED or (filters.group_id is not None and view in STATUSES):
            statuses = [view]
        elif filters.group_id is not None:
            statuses = ["queued"]
        return {**filters.params(), "statuses": statuses, "scheduled": view == "scheduled"}


#: The statement family that counts each view.
_FAMILY = {
    "queued": "queued",
    "scheduled": "queued",
    "retrying": "retrying",
    "waiting": "waiting",
    "running": "running",
    "completed": "finished",
    "failed": "finished",
    "cancelled": "finished",
    "finished": "finished",
}
#: Each view's rows: the conditions of its list without the cursor, for the planner's estimate and a search's count.
_PREDICATES = {
    "queued": "j.status = 'queued'",
    "scheduled": (
        "j.status = 'queued' AND j.available_at > now() AND j.attempts = 0"
        " AND (j.history -> -1 ->> 'outcome') IS DISTINCT FROM 'waiting'"
    ),
    "retrying": "j.status = 'queued' AND j.attempts > 0 AND (j.history -> -1 ->> 'outcome') IS DISTINCT FROM 'waiting'",
    "waiting": "j.status = 'queued' AND (j.history -> -1 ->> 'outcome') = 'waiting'",
    "running": "j.status = 'running'",
    **dict.fromkeys(
        (*FINISHED, "finished"),
        "j.status = ANY(%(statuses)s::text[]) AND j.finished_at IS NOT NULL"
        " AND (%(finished_after)s::timestamptz IS NULL OR j.finished_at > %(finished_after)s::timestamptz)",
    ),
    "group": (
        "j.group_id = %(group_id)s::uuid AND (%(statuses)s::text[] IS NULL OR j.status = ANY(%(statuses)s::text[]))"
    ),
}


#: What the queue table counts per queue (`ViewStore.queue_counts`), and the rows each stands for.
_QUEUE_PREDICATES = {
    "queued": "j.status = 'queued' AND j.queue = %(queue)s",
    "available": "j.status = 'queued' AND j.queue = %(queue)s AND j.available_at <= now()",
    "scheduled": "j.status = 'queued' AND j.queue = %(queue)s AND j.available_at > now() AND j.attempts = 0",
    **dict.fromkeys(FINISHED, "j.status = %(status)s AND j.queue = %(queue)s AND j.finished_at IS NOT NULL"),
    "completed_minute": (
        "j.status = %(status)s AND j.queue = %(queue)s AND j.finished_at > now() - interval '1 minute'"
    ),
    "failed_hour": "j.status = %(status)s AND j.queue = %(queue)s AND j.finished_at > now() - interval '1 hour'",
}
QUEUE_COUNTS = ("queued", "available", "scheduled", "running", *FINISHED, "completed_minute", "failed_hour")


def decode_estimate(rows: list[Row], _: int) -> int:
    """The rows an `EXPLAIN (FORMAT JSON)` says its statement returns."""
    plan = rows[0][0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def _cursor_of(name: str, job: JobSummary) -> Cursor:
    if name.startswith("view_finished"):
        return Cursor(job.id, job.finished_at)
    if name == "view_running":
        return Cursor(job.id, job.started_at)
    if name == "view_group":
        return Cursor(job.id)
    return Cursor(job.id, job.available_at)


def escape_like(text: str) -> str:
    """`text` for a LIKE pattern, its wildcards taken literally."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def views_of(statuses: Sequence[str]) -> list[str]:
    """Unknown views refused, naming the known ones."""
    unknown = [s for s in statuses if s not in VIEWS]
    if unknown:
        raise ValueError(f"unknown view {unknown[0]!r}: one of {', '.join(VIEWS)}")
    return list(statuses)
