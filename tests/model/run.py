"""The model check's driver: a topology from a seed, real workers, faults, and the history read back.

`generate(seed)` draws queues with random limits, keys, periodic jobs, chains, groups with callbacks,
workflows (steps, a durable sleep, an event, children) and a fleet of worker processes, each serving a
random subset of the queues with a random concurrency; and a timeline of what the producer schedules
and which faults hit when (SIGKILL and SIGSTOP/SIGCONT of workers, the leader included; terminated
backends; a paused queue; limits changed at run time); and Part III's operations (`part_three`: SQL API
producers, expiring jobs, cancel/delete/run_now racing the workers, errors carrying secrets or huge).
`run(topology, dsn)` plays the timeline against real `jobbus worker` processes kept alive by a
supervisor, then lets the fleet drain in quiet and returns the `History` that `history.check` judges.
Everything is timed by the database clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

import jobbus
from jobbus import control
from jobbus.encryption import keyring_of, sealed_key_id
from tests.model.app import LOG_APPLICATION, LOG_DDL
from tests.model.history import (
    Edit,
    Effect,
    History,
    Inserted,
    JobRow,
    KeyedCall,
    Limits,
    Op,
    Process,
    Report,
    Run,
    Spend,
    Transition,
    Window,
    check,
)

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / ".jobbus" / "model-logs"
#: Short leases so that a frozen or killed worker's jobs come back within the run.
WORKER_ENV = {
    "JOBBUS_LEASE_SECONDS": "6",
    "JOBBUS_HEARTBEAT_INTERVAL_SECONDS": "1",
    "JOBBUS_WORKER_DEAD_AFTER_SECONDS": "6",
}
#: The share of planned jobs of `_job` that go to the batch handlers (tests/model/app.py).
BATCHED = 0.45
DRAIN_TIMEOUT = 180.0
READY_TIMEOUT = 120.0
DRIVER_APPLICATION = "model_driver"
#: Every change of a job row's status, its insert and its delete, recorded in the transaction that makes
#: it (so a change rolled back leaves nothing): what a claim, a cancel, a delete, an expiry did and when,
#: by the database clock (a claim at the row's new `started_at`), also for the attempts whose handler
#: never logged (a worker killed between its claim and the handler's start) and the rows deleted since.
CHANGES_DDL = """
CREATE TABLE public.model_job_change (
    seq        bigserial PRIMARY KEY,
    job_id     uuid NOT NULL,
    old_status text,
    new_status text NOT NULL,
    attempts   integer NOT NULL,
    type       text,
    unique_key text,
    expires_at timestamptz,
    at         timestamptz NOT NULL,
    weight     integer
);
CREATE FUNCTION public.model_job_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.model_job_change (job_id, new_status, attempts, type, unique_key, expires_at, at, weight)
        VALUES (NEW.id, NEW.status, NEW.attempts, NEW.type, NEW.unique_key, NEW.expires_at, clock_timestamp(),
                NEW.weight);
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO public.model_job_change (job_id, old_status, new_status, attempts, at)
        VALUES (NEW.id, OLD.status, NEW.status, NEW.attempts,
                CASE WHEN NEW.status = 'running' AND NEW.started_at IS DISTINCT FROM OLD.started_at
                     THEN NEW.started_at ELSE clock_timestamp() END);
    ELSE
        INSERT INTO public.model_job_change (job_id, old_status, new_status, attempts, at)
        VALUES (OLD.id, OLD.status, 'deleted', OLD.attempts, clock_timestamp());
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER model_job_insert AFTER INSERT ON jobbus.job
    FOR EACH ROW EXECUTE FUNCTION public.model_job_change();
CREATE TRIGGER model_job_update AFTER UPDATE ON jobbus.job
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION public.model_job_change();
CREATE TRIGGER model_job_delete AFTER DELETE ON jobbus.job
    FOR EACH ROW EXECUTE FUNCTION public.model_job_change();
CREATE TABLE public.model_job_edit (
    seq          bigserial PRIMARY KEY,
    job_id       uuid NOT NULL,
    old_status   text NOT NULL,
    new_status   text NOT NULL,
    old_queue    text NOT NULL,
    new_queue    text NOT NULL,
    new_priority integer NOT NULL,
    at           timestamptz NOT NULL
);
CREATE FUNCTION public.model_job_edit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.model_job_edit (job_id, old_status, new_status, old_queue, new_queue, new_priority, at)
    VALUES (NEW.id, OLD.status, NEW.status, OLD.queue, NEW.queue, NEW.priority, clock_timestamp());
    RETURN NULL;
END $$;
CREATE TRIGGER model_job_edit AFTER UPDATE ON jobbus.job
    FOR EACH ROW WHEN (OLD.queue IS DISTINCT FROM NEW.queue OR OLD.priority IS DISTINCT FROM NEW.priority
                       OR OLD.tags IS DISTINCT FROM NEW.tags)
    EXECUTE FUNCTION public.model_job_edit();
"""


@dataclass
class QueueSpec:
    name: str
    concurrency: int | None
    per_key: int | None
    rate: tuple[int, float] | None
    rate_per_key: tuple[int, float] | None
    keys: tuple[str, ...]


@dataclass
class WorkerSpec:
    worker_id: str
    queues: tuple[str, ...]  # empty: every queue
    concurrency: int


@dataclass
class Action:
    at: float  # seconds after the run starts
    kind: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Topology:
    seed: int
    duration: float
    queues: list[QueueSpec]
    workers: list[WorkerSpec]
    periodics: list[tuple[str, float, str, bool]]  # name, every, queue, overlap
    timeline: list[Action]
    single_queue_workers: bool = False

    def describe(self) -> str:
        lines = [f"seed {self.seed}: {self.duration:g} s of faults and load"]
        for q in self.queues:
            lines.append(
                f"  queue {q.name}: concurrency={q.concurrency} per_key={q.per_key} rate={q.rate} "
                f"rate_per_key={q.rate_per_key} keys={list(q.keys)}"
            )
        for w in self.workers:
            lines.append(f"  worker {w.worker_id}: queues={list(w.queues) or 'all'} concurrency={w.concurrency}")
        batch = batch_env(self.seed)
        lines.append(f"  batch handlers: batch_size={batch['MODEL_BATCH_SIZE']} batch_wait={batch['MODEL_BATCH_WAIT']}")
        for name, every, queue, overlap in self.periodics:
            lines.append(f"  periodic {name}: every {every:g} s in {queue}, overlap={overlap}")
        kinds: dict[str, int] = {}
        for a in self.timeline:
            kind = f"{a.kind}:{a.args['variant']}" if "variant" in a.args else a.kind
            kinds[kind] = kinds.get(kind, 0) + 1
        lines.append("  timeline: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())))
        return "\n".join(lines)


#: Per-key limits up to 4: a claim's first pass over its queues takes a share of its size from each, and
#: a key whose share is below its limit is visited again in the second pass, which must count what the
#: first took (limits of 1 or 2 are reached in the first pass and never get there).
PER_KEY_LIMITS = (1, 2, 3, 4)
#: Workers of up to 9 slots: their claims are larger than the number of queues (at most 5 with `qx`),
#: so a claim takes from a queue in both of its passes.
WORKER_CONCURRENCY = 9


def batch_env(seed: int) -> dict[str, str]:
    """The batch handlers' `batch_size` (2 to 5) and `batch_wait` (0 to 0.6 s) of the run of `seed`,
    for its workers' environment: every worker of a run registers the same."""
    return {"MODEL_BATCH_SIZE": str(2 + seed % 4), "MODEL_BATCH_WAIT": f"{0.2 * (seed // 4 % 4):g}"}


def _batch_together(jobs: list[dict[str, Any]]) -> None:
    """Jobs scheduled together that include a batch handler's job all go to that handler (but those
    planned to fail), so its calls get several jobs at once; no draw, so the seeds plan what they did."""
    for batch_type in ("model.batch", "model.batch_sync"):
        if any(job["type"] == batch_type for job in jobs):
            for job in jobs:
                if job["type"] in ("model.work", "model.work_sync"):
                    job["type"] = batch_type
            return


def _maybe(rng: random.Random, p: float, value: Any) -> Any:
    return value if rng.random() < p else None


def generate(seed: int, duration: float = 25.0, *, single_queue_workers: bool = False) -> Topology:
    """The topology of `seed`; `single_queue_workers` gives each worker one queue (a narrower model, to
    tell a fault of the multi-queue claim from the rest)."""
    rng = random.Random(seed)
    queues = []
    for n in range(rng.randint(2, 4)):
        keys = tuple(f"k{i}" for i in range(rng.randint(2, 5))) if n == 0 or rng.random() < 0.6 else ()
        queues.append(
            QueueSpec(
                name=f"q{n}",
                concurrency=rng.choice([1, 2, 3, 4]) if n == 0 or rng.random() < 0.6 else None,
                per_key=_maybe(rng, 0.7, rng.choice(PER_KEY_LIMITS)) if keys else None,
                rate=_maybe(rng, 0.35, (rng.randint(3, 8), float(rng.choice([2, 3, 5])))),
                rate_per_key=_maybe(rng, 0.3, (rng.randint(1, 3), float(rng.choice([2, 3])))) if keys else None,
                keys=keys,
            )
        )
    names = [q.name for q in queues]
    workers = []
    for n in range(rng.randint(2, 4)):
        served = () if rng.random() < 0.25 else tuple(sorted(rng.sample(names, rng.randint(1, len(names)))))
        workers.append(WorkerSpec(f"w{n}", served, rng.randint(2, WORKER_CONCURRENCY)))
    covered = {q for w in workers for q in w.queues} | (set(names) if any(not w.queues for w in workers) else set())
    if single_queue_workers:
        workers = [WorkerSpec(w.worker_id, (names[n % len(names)],), w.concurrency) for n, w in enumerate(workers)]
        workers += [WorkerSpec(f"w{n}", (name,), 3) for n, name in enumerate(names) if n >= len(workers)]
        covered = set(names)
    for missing in sorted(set(names) - covered):
        w = rng.choice(workers)
        w.queues = tuple(sorted({*w.queues, missing})) if w.queues else w.queues
    periodics = [
        (f"tick{n}", float(rng.choice([1, 2, 3])), rng.choice(names), rng.random() < 0.5)
        for n in range(rng.randint(1, 2))
    ]
    timeline: list[Action] = []
    load_until = duration * 0.75
    t = 0.5
    events = 0
    while t < load_until:
        q = rng.choice(queues)
        shape = rng.choices(["jobs", "chain", "group", "flow", "hog"], weights=[5, 2, 2, 2, 1 if q.keys else 0])[0]
        args: dict[str, Any] = {"queue": q.name}
        if shape == "jobs":
            args["jobs"] = [_job(rng, q) for _ in range(rng.randint(1, 6))]
            _batch_together(args["jobs"])
        elif shape == "hog":
            # A big key with a backlog of long jobs that sorts first: the other keys must not wait behind it.
            args["jobs"] = [
                {"type": "model.work", "sleep": rng.uniform(2, 4), "key": q.keys[0]} for _ in range(rng.randint(3, 6))
            ]
            args["jobs"] += [_job(rng, q) for _ in range(rng.randint(2, 5))]
        elif shape == "chain":
            args["parent"] = _job(rng, q, failing=0.2)
            args["then"] = _job(rng, q)
        elif shape == "group":
            args["members"] = [_job(rng, q, failing=0.2) for _ in range(rng.randint(1, 5))]
            args["then"] = _job(rng, q)
            args["late_add"] = rng.random() < 0.3
        else:
            event = f"e{events}" if rng.random() < 0.6 else None
            events += 1
            args["flow"] = {
                "nap": rng.uniform(0.2, 2.0),
                "event": event,
                "children": rng.randint(0, 3),
                "child_sleep": rng.uniform(0, 0.5),
                "step_sleep": rng.choice([0.0, 0.0, rng.uniform(0.2, 1.5)]),
                "key": rng.choice(q.keys) if q.keys else None,
            }
            if event:
                for _ in range(rng.randint(1, 2)):
                    timeline.append(Action(t + rng.uniform(0.5, duration - t), "emit", {"key": event}))
        timeline.append(Action(t, shape, args))
        t += rng.uniform(0.3, 1.5)
    t = 2.0
    while t < duration - 1:
        fault = rng.choices(
            ["kill", "kill_leader", "freeze", "terminate", "pause", "limits"], weights=[3, 2, 3, 2, 1, 2]
        )[0]
        args = {"worker": rng.choice(workers).worker_id, "busiest": rng.random() < 0.7}
        if fault == "freeze":
            args["seconds"] = rng.choice([rng.uniform(0.5, 3), rng.uniform(7, 10)])
        elif fault == "pause":
            args["queue"] = rng.choice(names)
            args["seconds"] = rng.uniform(1, 4)
        elif fault == "limits":
            q = rng.choice(queues)
            args["queue"] = q.name
            args["concurrency"] = rng.choice([1, 2, 3, 5, None])
            args["per_key"] = rng.choice([*PER_KEY_LIMITS, None]) if q.keys else None
        timeline.append(Action(t, fault, args))
        t += rng.uniform(1.5, 4.0)
    # Part III's operations come from a stream of their own: a seed's topology and timeline above are
    # what they were before these joined, and these are added to them, with a queue without limits for
    # the expiring jobs that must start before their expiry (a retry, a durable sleep or a SIGKILL after
    # it): a backlog in a limited queue would let most of them expire unstarted.
    part3 = random.Random(seed * 1_000_003 + 3)
    expiry_queue = QueueSpec("qx", None, None, None, None, ())
    if single_queue_workers:
        workers.append(WorkerSpec("wx", ("qx",), 3))
    elif all(w.queues for w in workers):
        w = part3.choice(workers)
        w.queues = tuple(sorted({*w.queues, "qx"}))
    timeline += part_three(part3, queues, expiry_queue, duration, load_until)
    timeline += weights(random.Random(seed * 1_000_003 + 28), queues, timeline, load_until)
    # Uniqueness windows and debounce (SPEC 21), from a stream of their own as well.
    timeline += windows_and_debounce(random.Random(seed * 1_000_033 + 29), queues, load_until)
    queues.append(expiry_queue)
    timeline.sort(key=lambda a: a.at)
    return Topology(seed, duration, queues, workers, periodics, timeline, single_queue_workers)


def _heaviest(q: QueueSpec, keyed: bool) -> int:
    """The heaviest weight (up to 4) that the queue's first limits let start."""
    limits = [4, q.concurrency, q.rate[0] if q.rate else None]
    if keyed:
        limits += [q.per_key, q.rate_per_key[0] if q.rate_per_key else None]
    return min(limit for limit in limits if limit is not None)


def weights(rng: random.Random, queues: list[QueueSpec], timeline: list[Action], load_until: float) -> list[Action]:
    """Weights (1-4, at most what the queue's first limits allow) for the jobs of the `jobs` and `hog`
    loads, and `consume` calls spending rate units of the queues (and keys) with rate limits; drawn from
    a stream of their own, so the rest of a seed stays what it was."""
    by_name = {q.name: q for q in queues}
    for action in timeline:
        if action.kind in ("jobs", "hog"):
            q = by_name[action.args["queue"]]
            for job in action.args["jobs"]:
                if rng.random() < 0.5:
                    job["weight"] = rng.randint(1, _heaviest(q, job["key"] is not None))
    spends: list[Action] = []
    limited = [q for q in queues if q.rate is not None or q.rate_per_key is not None]
    t = 1.0
    while limited and t < load_until:
        q = rng.choice(limited)
        key = rng.choice(q.keys) if q.keys and (q.rate is None or rng.random() < 0.5) else None
        spends.append(Action(t, "consume", {"queue": q.name, "key": key, "units": rng.randint(1, 3)}))
        t += rng.uniform(0.5, 2.5)
    return spends


#: The shapes of secrets a handler's error carries (tests/model/app.py, `secret_text`).
SECRET_SHAPES = ("token", "api_key", "client_secret", "bearer", "password", "dsn")
_MARKER_LETTERS = "abcdefghijkmnpqrstuvwxyz23456789"
#: The expiry scenarios: `late` (available after its expiry), `paused` (its queue paused until after its
#: expiry), `retry_after` (the first attempt fails, the retry falls after the expiry), `sleep_past` (a
#: durable sleep past the expiry), `kill_after` (its worker SIGKILLed after the expiry).
EXPIRY_VARIANTS = ("late", "paused", "retry_after", "sleep_past", "kill_after")
#: Every Part III operation a seed plays (`Action.kind`, with its variant): each seed plays each.
PART_THREE = (
    "sql",
    "sql_many",
    "keyed:python",
    "keyed:sql",
    *(f"expiry:{v}" for v in EXPIRY_VARIANTS),
    "kill_runner",
    "cancel",
    "delete",
    "run_now",
    "leak",
    "huge",
    "debounce:python",
    "debounce:sql",
    "debounce:mixed",
    "window:python",
    "window:sql",
    "window:mixed",
    "update",
    "update_many",
)
#: The uniqueness window of the model's windowed calls, in seconds: a 15 s run holds a few of them.
MODEL_WINDOW = 4.0


def _marker(rng: random.Random, prefix: str) -> str:
    """A random string that appears nowhere else: a secret the history looks for in the error fields."""
    return prefix + "".join(rng.choices(_MARKER_LETTERS, k=13))


def part_three(
    rng: random.Random, queues: list[QueueSpec], expiry_queue: QueueSpec, duration: float, load_until: float
) -> list[Action]:
    """Part III's operations (SPEC 17, 18) for a seed: producers through the SQL API (`schedule`,
    `schedule_many`, keyed ones beside Python's on the same unique_key), jobs with an expiry in each
    scenario of `EXPIRY_VARIANTS`, `cancel`, `delete` and `run_now` on random jobs at random times
    (running ones included), handlers whose errors carry secrets of every shape of `SECRET_SHAPES`, and
    a handler that raises a huge error. Every seed has each, at times and with values of its own."""
    actions: list[Action] = []
    refs = iter(range(1, 1000))

    def key(q: QueueSpec) -> str | None:
        return rng.choice(q.keys) if q.keys else None

    for many in [False, True] + [rng.random() < 0.5 for _ in range(rng.randint(0, 2))]:
        q = rng.choice(queues)
        jobs = [_sql_job(rng, q) for _ in range(rng.randint(2, 4) if many else 1)]
        actions.append(
            Action(
                rng.uniform(0.5, load_until),
                "sql_many" if many else "sql",
                {"queue": q.name, "jobs": jobs, "closed_group": rng.random() < 0.4},
            )
        )
    # Python and SQL producers on two unique keys: a key still active returns the active job's id.
    for front in ["python", "sql"] + [rng.choice(["python", "sql"]) for _ in range(rng.randint(1, 3))]:
        q = rng.choice(queues)
        actions.append(
            Action(
                rng.uniform(0.5, load_until),
                "keyed",
                {
                    "variant": front,
                    "queue": q.name,
                    "unique_key": rng.choice(["u0", "u1"]),
                    "sleep": rng.uniform(0.5, 2),
                },
            )
        )
    for variant in [*EXPIRY_VARIANTS] + (["late"] if rng.random() < 0.5 else []):
        q = rng.choice(queues) if variant in ("late", "paused") else expiry_queue
        # The scenarios that run on past their expiry start early enough to end within the load's time.
        t = rng.uniform(0.5, load_until if variant in ("late", "paused") else max(1.0, load_until - 5.0))
        x: dict[str, Any] = {"variant": variant, "queue": q.name, "key": key(q), "ref": f"x{next(refs)}"}
        x["front"] = rng.choice(["python", "sql"]) if variant in ("late", "paused") else "python"
        x["sleep"] = rng.uniform(0.05, 0.5)
        if variant == "late":
            x["delay"] = rng.uniform(2.0, 4.0)
            x["expires"] = rng.uniform(0.5, x["delay"] - 0.5)
        elif variant == "paused":
            # The queue is paused 2 s before (its workers apply a pause within a heartbeat) and stays
            # paused 2 s past the expiry.
            x["expires"] = 2.0
            actions.append(Action(t - 2.0 if t > 2.5 else 0.5, "pause", {"queue": q.name, "seconds": 6.0}))
            t = max(t, 2.5)
        elif variant == "retry_after":
            x["expires"] = rng.uniform(2.0, 3.0)
            x["sleep"] = x["expires"] + rng.uniform(0.5, 1.5)
        elif variant == "sleep_past":
            x["expires"] = rng.uniform(2.0, 3.0)
            x["nap"] = x["expires"] + rng.uniform(0.5, 1.5)
            x["children"] = rng.randint(0, 1)
        else:
            x["expires"] = rng.uniform(2.0, 3.0)
            x["sleep"] = x["expires"] + rng.uniform(2.0, 3.0)
            actions.append(Action(t + x["expires"] + rng.uniform(0.5, 1.0), "kill_runner", {"ref": x["ref"]}))
        actions.append(Action(t, "expiry", x))
    for kind, low, high in (("cancel", 2, 4), ("delete", 1, 3), ("run_now", 2, 4)):
        for _ in range(rng.randint(low, high)):
            target = rng.choice(["running", "running", "queued", "any"])
            actions.append(Action(rng.uniform(1.0, duration - 1.0), kind, {"target": target, "pick": rng.random()}))
    shapes = list(SECRET_SHAPES)
    rng.shuffle(shapes)
    jobs_with_secrets = rng.randint(2, 3)
    for n in range(jobs_with_secrets):
        q = rng.choice(queues)
        secrets = [
            [shape, " ".join(_marker(rng, "w") for _ in range(3)) if shape == "password" else _marker(rng, "s")]
            for shape in shapes[n::jobs_with_secrets]
        ]
        actions.append(
            Action(rng.uniform(0.5, load_until), "leak", {"queue": q.name, "key": key(q), "secrets": secrets})
        )
    q = rng.choice(queues)
    variant = rng.choice(["url", "json"])
    actions.append(
        Action(
            rng.uniform(0.5, load_until),
            "huge",
            {
                "queue": q.name,
                "key": key(q),
                "variant": variant,
                "marker": _marker(rng, "s") if variant == "json" else None,
            },
        )
    )
    # `update` (a new priority and tags) of random jobs, running ones included; `update_many` moving a
    # batch of tagged jobs to another queue while the workers claim them, with a priority of its own
    # (`marker`) that tells which rows it changed.
    for _ in range(rng.randint(2, 4)):
        target = rng.choice(["running", "queued", "queued", "any"])
        actions.append(
            Action(
                rng.uniform(1.0, duration - 1.0),
                "update",
                {"target": target, "pick": rng.random(), "priority": rng.choice([-1, 0, 1]), "tags": ["edited"]},
            )
        )
    for n in range(rng.randint(1, 2)):
        source, destination = rng.choice(queues), rng.choice(queues)
        actions.append(
            Action(
                rng.uniform(0.5, load_until),
                "update_many",
                {
                    "queue": source.name,
                    "to": destination.name,
                    "jobs": rng.randint(20, 60),
                    "delay": rng.uniform(0.0, 0.5),
                    "wait": rng.uniform(0.0, 0.6),
                    "marker": 1000 + n,
                },
            )
        )
    return actions


def windows_and_debounce(rng: random.Random, queues: list[QueueSpec], load_until: float) -> list[Action]:
    """Bursts of calls with debounce on two keys (`d0`, `d1`) and with a uniqueness window on two others
    (`w0`, `w1`), each call in a transaction of its own and the calls of a burst at once: from Python
    (`python`), the SQL API (`sql`) or both (`mixed`). Every seed plays each front of each."""
    actions: list[Action] = []
    for kind in ("debounce", "window"):
        variants = ["python", "sql", "mixed"] + [
            rng.choice(["python", "sql", "mixed"]) for _ in range(rng.randint(1, 4))
        ]
        for n, variant in enumerate(variants):
            calls = rng.randint(1, 4)
            fronts = [variant if variant != "mixed" else rng.choice(["python", "sql"]) for _ in range(calls)]
            if variant == "mixed" and len(set(fronts)) < 2:
                fronts = ["python", "sql"]
            args: dict[str, Any] = {
                "variant": variant,
                "queue": rng.choice(queues).name,
                "unique_key": f"{kind[0]}{rng.randint(0, 1)}",
                "fronts": fronts,
                "sleep": rng.uniform(0.1, 1.5),
                "ref": f"{kind[0]}{n}",
            }
            if kind == "debounce":
                args["debounce"] = rng.uniform(0.05, 1.0)
            actions.append(Action(rng.uniform(0.5, load_until), kind, args))
    return actions


def _sql_job(rng: random.Random, q: QueueSpec) -> dict[str, Any]:
    """A job as the SQL API's options take it. SQL jobs do not get a handler's defaults: `max_attempts` is
    given as the handler's (the faults recover jobs a few times), the queue always."""
    kind = "model.fail" if rng.random() < 0.15 else rng.choice(["model.work", "model.work_sync"])
    job: dict[str, Any] = {
        "type": kind,
        "sleep": rng.uniform(0.05, 1.5),
        "key": rng.choice(q.keys) if q.keys else None,
        "max_attempts": 1 if kind == "model.fail" else 50,
        "priority": rng.choice([0, 0, 0, 1, -1]),
    }
    if rng.random() < 0.25:
        job["delay"] = rng.uniform(0.5, 2.0)
    if rng.random() < 0.3:
        job["timeout"] = 60.0
    if rng.random() < 0.2:
        job["name"] = f"sql-{rng.randint(0, 99)}"
    if rng.random() < 0.25:
        job["expires"] = rng.uniform(8.0, 15.0)  # usually starts before: judged by the expiry rule either way
    return job


def _job(rng: random.Random, q: QueueSpec, failing: float = 0.0) -> dict[str, Any]:
    kind = "model.fail" if rng.random() < failing else rng.choice(["model.work", "model.work", "model.work_sync"])
    sleep = rng.uniform(0.05, 1.5)
    # Whether it goes to a batch handler follows from its sleep (its digits), not from a draw of its own:
    # the seeds plan what they planned before the batch handlers came.
    if kind != "model.fail" and int(sleep * 1e6) % 100 < BATCHED * 100:
        kind = "model.batch_sync" if int(sleep * 1e6) % 3 == 0 else "model.batch"
    return {"type": kind, "sleep": sleep, "key": rng.choice(q.keys) if q.keys else None}


# -- the run ----------------------------------------------------------------------------------------


class _Fleet:
    """Worker processes, a supervisor that restarts the dead ones, and the log of what it did."""

    def __init__(
        self, database: dict[str, str], topology: Topology, logs: list[psycopg.Connection[Any]], rng: random.Random
    ) -> None:
        #: The worker processes' database: {"JOBBUS_DSN": dsn}, or {"JOBBUS_CELLS": ...} over several cells.
        self.database = database
        self.topology = topology
        self.logs = logs
        self.rng = rng
        self.specs = {w.worker_id: w for w in topology.workers}
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.ids: dict[str, str] = {}  # spec id -> the id its current process runs under
        self.frozen: set[int] = set()
        self.ours: set[int] = set()  # pids we killed or stopped at the end: their exit is expected
        self.unexpected: list[tuple[str, int, int]] = []
        self.generation = 0
        LOGS.mkdir(parents=True, exist_ok=True)
        for spec in topology.workers:
            self.spawn(spec.worker_id, spec.worker_id)

    def note(self, kind: str, pid: int | None = None, **detail: Any) -> None:
        """Into the log of every cell: each cell's history has the whole fleet's processes."""
        for log in self.logs:
            log.execute(
                "INSERT INTO public.model_log (id, kind, worker, pid, detail) VALUES (%s, %s, %s, %s, %s)",
                (uuid.uuid4(), kind, detail.get("worker"), pid, Jsonb(detail)),
            )

    def spawn(self, spec_id: str, worker_id: str) -> None:
        spec = self.specs[spec_id]
        args = ["--worker-id", worker_id, "--concurrency", str(spec.concurrency), "--shutdown-timeout", "10"]
        for q in spec.queues:
            args += ["--queue", q]
        env = {k: v for k, v in os.environ.items() if k not in ("JOBBUS_DSN", "JOBBUS_CELLS")}
        env.update(self.database, PYTHONUNBUFFERED="1", MODEL_WORKER_ID=worker_id)
        env.update(WORKER_ENV)
        env.update(batch_env(self.topology.seed))
        out = (LOGS / f"seed{self.topology.seed}-{worker_id}.log").open("a")
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobbus", "worker", "--app", "tests.model.app:app", "--poll-interval", "0.2", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
        out.close()
        self.procs[spec_id] = proc
        self.ids[spec_id] = worker_id
        self.note(
            "spawn",
            proc.pid,
            worker=worker_id,
            queues=list(spec.queues),
            concurrency=spec.concurrency,
        )

    def supervise(self, restart: bool = True) -> None:
        for spec_id, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None:
                continue
            self.note("gone", proc.pid, worker=self.ids[spec_id], code=code)
            if proc.pid not in self.ours and code != 0:
                self.unexpected.append((self.ids[spec_id], proc.pid, code))
            del self.procs[spec_id]
            if restart:
                same = self.rng.random() < 0.5
                self.generation += 1
                self.spawn(spec_id, spec_id if same else f"{spec_id}-r{self.generation}")

    def live(self, spec_id: str) -> subprocess.Popen[str] | None:
        proc = self.procs.get(spec_id)
        return proc if proc is not None and proc.poll() is None else None

    async def kill(self, spec_id: str) -> None:
        proc = self.live(spec_id)
        if proc is None or proc.pid in self.frozen:
            return
        self.ours.add(proc.pid)
        proc.send_signal(signal.SIGKILL)
        while proc.poll() is None:  # noqa: ASYNC110 - a process exit is not an awaitable here
            await asyncio.sleep(0.02)
        self.note("kill", proc.pid, worker=self.ids[spec_id])
        self.supervise()

    def freeze(self, spec_id: str) -> int | None:
        proc = self.live(spec_id)
        if proc is None or proc.pid in self.frozen:
            return None
        self.note("stop", proc.pid, worker=self.ids[spec_id])
        proc.send_signal(signal.SIGSTOP)
        self.frozen.add(proc.pid)
        return proc.pid

    def thaw(self, pid: int) -> None:
        if pid not in self.frozen:
            return
        for spec_id, proc in self.procs.items():
            if proc.pid == pid:
                proc.send_signal(signal.SIGCONT)
                self.note("cont", pid, worker=self.ids[spec_id])
        self.frozen.discard(pid)

    def spec_of_worker(self, worker_id: str) -> str | None:
        for spec_id, wid in self.ids.items():
            if wid == worker_id:
                return spec_id
        return None

    async def stop(self) -> None:
        for pid in list(self.frozen):
            self.thaw(pid)
        for proc in self.procs.values():
            self.ours.add(proc.pid)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while any(p.poll() is None for p in self.procs.values()) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.supervise(restart=False)


async def run(topology: Topology, dsn: str) -> History:
    """Play the topology's timeline against real workers on `dsn` (a migrated database of its own)."""
    (history,) = await run_cells(topology, [dsn])
    return history


@dataclass
class _Cell:
    """One database of a run: its log and driver connections, its producer, and what its play expects."""

    dsn: str
    log: psycopg.Connection[Any]
    state: _State
    app: jobbus.App
    expected: dict[str, str] = field(default_factory=dict)
    late: list[tuple[str, str]] = field(default_factory=list)
    quiet_from: float = 0.0


async def run_cells(topology: Topology, dsns: list[str]) -> list[History]:
    """Play the topology's timeline in each of `dsns` (migrated databases of their own) at once, against
    one fleet of real workers: over several databases, cells (SPEC 23), each worker serving every cell
    within its one concurrency and each fault hitting all its cells. One history per cell: every
    guarantee holds within a cell."""
    rng = random.Random(topology.seed * 7919 + 1)
    with contextlib.ExitStack() as stack:
        cells: list[_Cell] = []
        for dsn in dsns:
            log = stack.enter_context(psycopg.connect(dsn, autocommit=True, application_name=LOG_APPLICATION))
            sql = stack.enter_context(psycopg.connect(dsn, autocommit=True, application_name=DRIVER_APPLICATION))
            log.execute(LOG_DDL)
            log.execute(CHANGES_DDL)
            log.execute("CREATE SEQUENCE public.model_keyed_seq")
            state = _State(sql)
            state.dsn = make_conninfo(dsn, application_name=DRIVER_APPLICATION)
            # The producer's own connections are not the fault injector's target: the workers' are.
            app = jobbus.App(dsn=state.dsn, database_wait_seconds=60)
            cells.append(_Cell(dsn, log, state, app))
        for cell in cells:
            await cell.app.open()
        try:
            for cell in cells:
                await _declare(cell.app, cell.log, topology)
            if len(dsns) == 1:
                database = {"JOBBUS_DSN": dsns[0]}
            else:
                database = {"JOBBUS_CELLS": ";".join(f"c{i}={dsn}" for i, dsn in enumerate(dsns))}
            fleet = _Fleet(database, topology, [cell.log for cell in cells], rng)
            try:
                await _ready(fleet, topology, [cell.log for cell in cells])
                await asyncio.gather(
                    *(
                        _play(cell.app, fleet, topology, cell.log, cell.expected, cell.late, cell.state)
                        for cell in cells
                    )
                )
                for cell in cells:
                    cell.quiet_from = _db_now(cell.log)
                await asyncio.gather(*(_quiet(cell.app, fleet, topology, cell.log) for cell in cells))
            finally:
                await fleet.stop()
        finally:
            for cell in cells:
                await cell.app.close()
        return [_history(cell, topology, fleet) for cell in cells]


async def _declare(app: jobbus.App, log: psycopg.Connection[Any], topology: Topology) -> None:
    """The topology's queue limits and periodic jobs, in one database."""
    for q in topology.queues:
        await _set_limits(app, log, q.name, q.concurrency, q.per_key, q.rate, q.rate_per_key)
    for name, every, queue, overlap in topology.periodics:
        await app.add_periodic(
            name,
            type="model.work",
            every=timedelta(seconds=every),
            configuration={"sleep": 0.1},
            queue=queue,
            overlap=overlap,
        )


def _history(cell: _Cell, topology: Topology, fleet: _Fleet) -> History:
    log = cell.log
    periodic_next = {
        name: (_epoch(next_run), _epoch(last))
        for name, next_run, last in log.execute(
            "SELECT name, next_run_at, last_tick FROM public.model_periodic_end"
        ).fetchall()
    }
    history = _read(log, topology, cell.expected, cell.late, fleet.unexpected, cell.quiet_from, periodic_next)
    state = cell.state
    history.ops, history.secrets, history.exercised = state.ops, state.secrets, state.exercised
    history.keyed_calls = state.keyed
    history.moves = state.moves
    history.refused_moves = state.refused_moves
    history.audit = [
        (action, target, details)
        for action, target, details in log.execute(
            "SELECT action, target, details FROM jobbus.audit_log ORDER BY at, id"
        ).fetchall()
    ]
    return history


async def _ready(fleet: _Fleet, topology: Topology, logs: list[psycopg.Connection[Any]]) -> None:
    """Wait for every worker to be registered and a leader elected in every database: the timeline starts then."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        fleet.supervise()
        ready = True
        for log in logs:
            row = log.execute(
                "SELECT (SELECT count(*) FROM jobbus.worker WHERE stopped_at IS NULL),"
                " EXISTS (SELECT 1 FROM jobbus.leader WHERE expires_at > clock_timestamp())"
            ).fetchone()
            ready = ready and row is not None and row[0] >= len(topology.workers) and row[1]
        if ready:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the workers were not all up and led after {READY_TIMEOUT:g} s")


async def _set_limits(
    app: jobbus.App,
    log: psycopg.Connection[Any],
    queue: str,
    concurrency: int | None,
    per_key: int | None,
    rate: tuple[int, float] | None,
    rate_per_key: tuple[int, float] | None,
) -> None:
    # Written before the change: a worker may apply the new limits before the call returns.
    detail = {
        "queue": queue,
        "concurrency": concurrency,
        "per_key": per_key,
        "rate": rate,
        "rate_per_key": rate_per_key,
    }
    log.execute(
        "INSERT INTO public.model_log (id, kind, detail) VALUES (%s, 'limits', %s)", (uuid.uuid4(), Jsonb(detail))
    )
    try:
        await app.set_queue(
            queue,
            concurrency=concurrency,
            concurrency_per_key=per_key,
            rate_limit=None if rate is None else jobbus.RateLimit(rate[0], timedelta(seconds=rate[1])),
            rate_limit_per_key=None
            if rate_per_key is None
            else jobbus.RateLimit(rate_per_key[0], timedelta(seconds=rate_per_key[1])),
        )
    except jobbus.InvalidStateError:
        # Below the weight of a queued job: refused, nothing changed. The limits in force are logged again.
        now = await app.get_queue(queue)
        detail = {
            "queue": queue,
            "concurrency": now.concurrency,
            "per_key": now.concurrency_per_key,
            "rate": None if now.rate_limit is None else (now.rate_limit.count, now.rate_limit.per.total_seconds()),
            "rate_per_key": None
            if now.rate_limit_per_key is None
            else (now.rate_limit_per_key.count, now.rate_limit_per_key.per.total_seconds()),
            "refused": True,
        }
        log.execute(
            "INSERT INTO public.model_log (id, kind, detail) VALUES (%s, 'limits', %s)", (uuid.uuid4(), Jsonb(detail))
        )


@dataclass
class _State:
    """What the driver's Part III operations need and record: the SQL API producer's own connection (a
    plain psycopg one, as any language's driver), jobs by reference, groups that have a callback, the
    calls on jobs with their outcomes, the secrets put into errors, and what was exercised."""

    sql: psycopg.Connection[Any]
    refs: dict[str, str] = field(default_factory=dict)
    groups: list[str] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    secrets: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    exercised: dict[str, int] = field(default_factory=dict)
    #: the producers' conninfo for connections of their own (not the fault injector's target), and the
    #: calls with a uniqueness window or debounce as they committed.
    dsn: str = ""
    keyed: list[KeyedCall] = field(default_factory=list)
    #: (marker priority, count returned, db clock before, after) of each `update_many`.
    moves: list[tuple[int, int, float, float]] = field(default_factory=list)
    refused_moves: set[int] = field(default_factory=set)

    def did(self, what: str) -> None:
        self.exercised[what] = self.exercised.get(what, 0) + 1


def _iso(log: psycopg.Connection[Any], seconds: float) -> str:
    """The database clock `seconds` from now, as the SQL API's `expires_at` and `available_at` take it."""
    return datetime.fromtimestamp(_db_now(log) + seconds, UTC).isoformat()


def _sql_spec(job: dict[str, Any], queue: str, log: psycopg.Connection[Any]) -> dict[str, Any]:
    """One job of the SQL API: `type`, `configuration` and the option keys of docs/sql.md."""
    config: dict[str, Any] = {"sleep": job["sleep"], "sql": True}
    options: dict[str, Any] = {"queue": queue, "max_attempts": job["max_attempts"], "priority": job["priority"]}
    if job.get("key"):
        options["concurrency_key"] = job["key"]
    if "delay" in job:
        options["delay_seconds"] = job["delay"]
        config["delayed"] = True
    if "timeout" in job:
        options["timeout_seconds"] = job["timeout"]
    if "name" in job:
        options["name"] = job["name"]
    if "unique_key" in job:
        options["unique_key"] = job["unique_key"]
    if "expires" in job:
        options["expires_at"] = _iso(log, job["expires"] + job.get("delay", 0.0))
    return {"type": job["type"], "configuration": config, **options}


def _sql_schedule(state: _State, spec: dict[str, Any]) -> str:
    options = {k: v for k, v in spec.items() if k not in ("type", "configuration")}
    row = state.sql.execute(
        "SELECT jobbus.schedule(%s, %s, %s)::text", (spec["type"], Jsonb(spec["configuration"]), Jsonb(options))
    ).fetchone()
    assert row is not None
    return str(row[0])


async def _keyed_burst(app: jobbus.App, state: _State, kind: str, a: dict[str, Any]) -> None:
    """The calls of one burst with debounce or a uniqueness window, at once, each in a transaction of its
    own: Python's on connections of their own, the SQL API's from threads (as other producers would).
    Each reads, after its call and before its commit, its place in the commit order of its key's calls
    (they hold the key's lock until they commit) and the database clock."""
    options: dict[str, Any] = {"queue": a["queue"], "max_attempts": 50, "unique_key": a["unique_key"]}
    if kind == "debounce":
        options["debounce"] = a["debounce"]
    else:
        options["unique_for"] = MODEL_WINDOW
    order = "SELECT nextval('public.model_keyed_seq'), extract(epoch FROM clock_timestamp())::float8"

    async def python(token: str) -> tuple[str, int, float]:
        async with await psycopg.AsyncConnection.connect(state.dsn) as conn:
            job_id = await app.schedule("model.work", {"sleep": a["sleep"], "call": token}, connection=conn, **options)
            seq, at = await (await conn.execute(order)).fetchone()  # type: ignore[misc]
            await conn.commit()
        return str(job_id), int(seq), float(at)

    def sql(token: str) -> tuple[str, int, float]:
        with psycopg.connect(state.dsn) as conn:
            row = conn.execute(
                "SELECT jobbus.schedule('model.work', %s, %s)::text",
                (Jsonb({"sleep": a["sleep"], "call": token}), Jsonb(options)),
            ).fetchone()
            seq, at = conn.execute(order).fetchone()  # type: ignore[misc]
            conn.commit()
        assert row is not None
        return str(row[0]), int(seq), float(at)

    tokens = [f"{a['ref']}.{n}" for n in range(len(a["fronts"]))]
    results = await asyncio.gather(
        *(
            python(token) if front == "python" else asyncio.to_thread(sql, token)
            for token, front in zip(tokens, a["fronts"], strict=True)
        )
    )
    window = MODEL_WINDOW if kind == "window" else 0.0
    for token, (job_id, seq, at) in zip(tokens, results, strict=True):
        state.keyed.append(KeyedCall(kind, "model.work", a["unique_key"], job_id, token, seq, at, window))


async def _on_job(
    app: jobbus.App, log: psycopg.Connection[Any], state: _State, expected: dict[str, str], kind: str, a: dict[str, Any]
) -> None:
    """`cancel`, `delete` or `run_now` of a job the producers were told about, chosen at the moment among
    the running ones, the queued ones or all of them (`target`); the call's outcome is recorded with the
    database clock before and after it."""
    pool = sorted(expected)
    if not pool:
        return
    candidates = pool
    if a["target"] in ("running", "queued"):
        rows = log.execute(
            "SELECT id::text FROM jobbus.job WHERE id = ANY(%s::uuid[]) AND status = %s ORDER BY id",
            (pool, a["target"]),
        ).fetchall()
        candidates = [r[0] for r in rows] or pool
    job_id = candidates[min(int(a["pick"] * len(candidates)), len(candidates) - 1)]
    before = _db_now(log)
    try:
        if kind == "cancel":
            outcome = str((await app.cancel(uuid.UUID(job_id))).value)
        elif kind == "delete":
            await app.delete(uuid.UUID(job_id))
            outcome = "ok"
        elif kind == "update":
            await app.update(uuid.UUID(job_id), priority=a["priority"], tags=a["tags"])
            outcome = "ok"
        else:
            await app.run_now(uuid.UUID(job_id))
            outcome = "ok"
    except jobbus.InvalidStateError as exc:
        outcome = f"error: {exc}"
    state.ops.append(Op(kind, job_id, before, _db_now(log), outcome))
    state.did(kind)
    state.did(f"{kind}:{outcome.split(':')[0]}")


async def _move(
    app: jobbus.App, log: psycopg.Connection[Any], state: _State, expected: dict[str, str], a: dict[str, Any]
) -> None:
    """A batch of tagged jobs scheduled into a queue, then every queued one of them moved to another
    queue while the workers claim them (`update_many`): the count it returns, and the database clock
    around the call, go into the history."""
    tag = f"move{a['marker']}"
    config = {"sleep": 0.05}
    ids = await app.schedule_many(
        "model.work",
        [config] * a["jobs"],
        queue=a["queue"],
        max_attempts=50,
        tags=[tag],
        available_at=timedelta(seconds=a["delay"]),
    )
    for job_id in ids:
        expected[str(job_id)] = "completed"
    await asyncio.sleep(a["wait"])
    before = _db_now(log)
    try:
        changed = await app.update_many(tag=tag, queue=a["queue"], set_queue=a["to"], set_priority=a["marker"])
    except jobbus.InvalidJobError as exc:
        # A job drawn heavier than a limit of the target queue: the move is refused and, the batch being one
        # statement (fewer than 1,000 jobs), nothing of it is written; the checker holds it to that.
        if "weight" not in str(exc) or a["jobs"] > 1000:
            raise
        changed = 0
        state.refused_moves.add(a["marker"])
    state.moves.append((a["marker"], changed, before, _db_now(log)))
    state.did("update_many")


async def _part_three(
    app: jobbus.App,
    fleet: _Fleet,
    log: psycopg.Connection[Any],
    state: _State,
    expected: dict[str, str],
    late: list[tuple[str, str]],
    action: Action,
) -> None:
    a = action.args
    kind = action.kind
    if kind in ("sql", "sql_many"):
        specs = [_sql_spec(job, a["queue"], log) for job in a["jobs"]]
        if kind == "sql":
            ids = [_sql_schedule(state, specs[0])]
        else:
            rows = state.sql.execute("SELECT id::text FROM jobbus.schedule_many(%s) AS id", (Jsonb(specs),)).fetchall()
            ids = [str(r[0]) for r in rows]
        # Acknowledged once the SELECT returned.
        for job_id, job in zip(ids, a["jobs"], strict=True):
            expected[job_id] = "failed" if job["type"] == "model.fail" else "completed"
        state.did(kind)
        if a["closed_group"] and state.groups:
            group = state.groups[len(ids) % len(state.groups)]
            spec = {"type": "model.work", "configuration": {"sleep": 0.2, "group_has_then": True}, "queue": a["queue"]}
            try:
                extra = _sql_schedule(state, {**spec, "group_id": group, "max_attempts": 50})
            except psycopg.Error as exc:
                if exc.sqlstate != "JB409":
                    raise
                late.append((group, "refused"))
            else:
                late.append((group, f"accepted as job {extra} (SQL API)"))
                expected[extra] = "completed"
            state.did("sql:closed_group")
    elif kind == "keyed":
        config = {"sleep": a["sleep"], "unique_key": a["unique_key"]}
        if a["variant"] == "python":
            job_id = str(
                await app.schedule("model.work", config, queue=a["queue"], unique_key=a["unique_key"], max_attempts=50)
            )
        else:
            spec = {"type": "model.work", "configuration": config, "queue": a["queue"], "max_attempts": 50}
            job_id = _sql_schedule(state, {**spec, "unique_key": a["unique_key"]})
        expected[job_id] = "completed"
        state.did(f"keyed:{a['variant']}")
    elif kind in ("debounce", "window"):
        await _keyed_burst(app, state, kind, a)
        state.did(f"{kind}:{a['variant']}")
    elif kind == "expiry":
        await _expiring(app, log, state, expected, a)
        state.did(f"expiry:{a['variant']}")
    elif kind == "kill_runner":
        # The worker running an expiring job, after its expiry: its recovery must run it again.
        target = state.refs.get(a["ref"])
        row = log.execute("SELECT worker_id FROM jobbus.job WHERE id = %s AND status = 'running'", (target,)).fetchone()
        spec_id = fleet.spec_of_worker(row[0]) if row and target else None
        if spec_id is not None:
            await fleet.kill(spec_id)
        state.did("kill_runner" if spec_id is not None else "kill_runner:missed")
    elif kind in ("cancel", "delete", "run_now", "update"):
        await _on_job(app, log, state, expected, kind, a)
    elif kind == "update_many":
        await _move(app, log, state, expected, a)
    elif kind == "leak":
        job_id = str(
            await app.schedule(
                "model.leak", {"secrets": a["secrets"]}, queue=a["queue"], concurrency_key=a["key"], max_attempts=2
            )
        )
        expected[job_id] = "failed"
        state.secrets[job_id] = [
            (shape, word)
            for shape, value in a["secrets"]
            for word in (value.split() if shape == "password" else [value])
        ]
        state.did("leak")
    elif kind == "huge":
        config = {"variant": a["variant"], "marker": a["marker"]}
        job_id = str(
            await app.schedule("model.huge", config, queue=a["queue"], concurrency_key=a["key"], max_attempts=1)
        )
        expected[job_id] = "failed"
        if a["marker"]:
            state.secrets[job_id] = [("dsn", a["marker"])]
        state.did("huge")
        state.did(f"huge:{a['variant']}")


async def _expiring(
    app: jobbus.App, log: psycopg.Connection[Any], state: _State, expected: dict[str, str], x: dict[str, Any]
) -> None:
    """A job with an expiry in one of the scenarios of `EXPIRY_VARIANTS`."""
    variant = x["variant"]
    config: dict[str, Any] = {"sleep": x["sleep"], "expiry": variant}
    kind = "model.work"
    priority = 5  # claimed first among the jobs due: the runs that must start before the expiry mostly do
    if variant == "retry_after":
        kind = "model.fail_once"
    elif variant == "sleep_past":
        kind = "model.flow"
        config.update(nap=x["nap"], event=None, children=x["children"], child_sleep=0.1, steps=["a", "b"])
    delay = x.get("delay")
    if delay is not None:
        config["delayed"] = True
    if x["front"] == "sql":
        spec: dict[str, Any] = {"type": kind, "configuration": config, "queue": x["queue"], "max_attempts": 50}
        spec |= {"priority": priority, "expires_at": _iso(log, x["expires"])}
        if x["key"]:
            spec["concurrency_key"] = x["key"]
        if delay is not None:
            spec["delay_seconds"] = delay
        job_id = _sql_schedule(state, spec)
    else:
        job_id = str(
            await app.schedule(
                kind,
                config,
                queue=x["queue"],
                concurrency_key=x["key"],
                priority=priority,
                max_attempts=50,
                expires=x["expires"],
                available_at=None if delay is None else timedelta(seconds=delay),
            )
        )
    expected[job_id] = "completed"
    state.refs[x["ref"]] = job_id


def _config(job: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"sleep": job["sleep"], **extra}


async def _play(
    app: jobbus.App,
    fleet: _Fleet,
    topology: Topology,
    log: psycopg.Connection[Any],
    expected: dict[str, str],
    late: list[tuple[str, str]],
    state: _State,
) -> None:
    started = time.monotonic()
    queues = {q.name: q for q in topology.queues}
    thaws: list[tuple[float, int]] = []
    resumes: list[tuple[float, str]] = []

    def status_of(job: dict[str, Any]) -> str:
        return "failed" if job["type"] == "model.fail" else "completed"

    for action in topology.timeline:
        while True:
            now = time.monotonic() - started
            for at, pid in [x for x in thaws if x[0] <= now]:
                fleet.thaw(pid)
                thaws.remove((at, pid))
            for at, queue in [x for x in resumes if x[0] <= now]:
                log.execute(
                    "INSERT INTO public.model_log (id, kind, detail) VALUES (%s, 'resume', %s)",
                    (uuid.uuid4(), Jsonb({"queue": queue})),
                )
                await control.resume(app, queue=queue)
                resumes.remove((at, queue))
            fleet.supervise()
            if now >= action.at:
                break
            await asyncio.sleep(min(0.1, action.at - now))
        a = action.args
        kind = action.kind
        if kind in ("jobs", "hog"):
            for job in a["jobs"]:
                try:
                    job_id = await app.schedule(
                        job["type"],
                        _config(job),
                        queue=a["queue"],
                        concurrency_key=job["key"],
                        weight=job.get("weight"),
                    )
                except jobbus.InvalidJobError:
                    # Heavier than a limit lowered at run time: refused, nothing written.
                    state.did("weight:refused")
                    continue
                if job.get("weight", 1) > 1:
                    state.did("weight:scheduled")
                expected[str(job_id)] = status_of(job)
        elif kind == "consume":
            before = _db_now(log)
            recorded = await app.consume(a["queue"], a["units"], key=a["key"])
            after = _db_now(log)
            log.execute(
                "INSERT INTO public.model_log (id, kind, detail) VALUES (%s, 'consume', %s)",
                (uuid.uuid4(), Jsonb({**a, "before": before, "after": after, "recorded": recorded})),
            )
            state.did("consume" if recorded else "consume:unlimited")
        elif kind == "chain":
            token = str(uuid.uuid4())
            parent, then = a["parent"], a["then"]
            job_id = await app.schedule(
                parent["type"],
                _config(parent, chain=token),
                queue=a["queue"],
                concurrency_key=parent["key"],
                then=jobbus.JobRequest(
                    then["type"], _config(then, after=token), queue=a["queue"], concurrency_key=then["key"]
                ),
            )
            expected[str(job_id)] = status_of(parent)
        elif kind == "group":
            group = uuid.uuid4()
            requests = [
                jobbus.JobRequest(
                    m["type"], _config(m, group_has_then=True), queue=a["queue"], concurrency_key=m["key"]
                )
                for m in a["members"]
            ]
            then = a["then"]
            state.groups.append(str(group))
            _, ids = await app.schedule_group(
                requests,
                group_id=group,
                then=jobbus.JobRequest(
                    then["type"], _config(then, callback_of=str(group)), queue=a["queue"], concurrency_key=then["key"]
                ),
            )
            for job_id, m in zip(ids, a["members"], strict=True):
                expected[str(job_id)] = status_of(m)
            if a["late_add"]:
                try:
                    extra = await app.schedule(
                        "model.work", {"sleep": 0.2, "group_has_then": True}, queue=a["queue"], group_id=group
                    )
                except jobbus.InvalidStateError:
                    late.append((str(group), "refused"))
                else:
                    late.append((str(group), f"accepted as job {extra}"))
                    expected[str(extra)] = "completed"
        elif kind == "flow":
            flow = dict(a["flow"])
            key = flow.pop("key")
            job_id = await app.schedule(
                "model.flow", {**flow, "steps": ["a", "b"]}, queue=a["queue"], concurrency_key=key
            )
            expected[str(job_id)] = "completed"
        elif kind == "emit":
            await _emit(app, log, a["key"])
        elif kind in ("kill", "kill_leader"):
            spec_id: str | None = a["worker"]
            if kind == "kill_leader":
                leader = log.execute(
                    "SELECT worker_id FROM jobbus.leader WHERE expires_at > clock_timestamp()"
                ).fetchone()
                spec_id = fleet.spec_of_worker(leader[0]) if leader else None
            if spec_id is not None:
                await fleet.kill(spec_id)
        elif kind == "freeze":
            # Mostly the busiest worker: freezing an idle one shows nothing.
            busiest = log.execute(
                "SELECT worker_id FROM jobbus.job WHERE status = 'running' GROUP BY worker_id ORDER BY count(*) DESC"
            ).fetchone()
            target = fleet.spec_of_worker(busiest[0]) if busiest and a["busiest"] else None
            frozen_pid = fleet.freeze(target or a["worker"])
            if frozen_pid is not None:
                thaws.append((action.at + a["seconds"], frozen_pid))
        elif kind == "terminate":
            log.execute(
                "INSERT INTO public.model_log (id, kind) VALUES (%s, 'terminate')",
                (uuid.uuid4(),),
            )
            log.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                " AND application_name NOT IN (%s, %s)",
                (LOG_APPLICATION, DRIVER_APPLICATION),
            )
        elif kind == "pause":
            if not any(q == a["queue"] for _, q in resumes):
                await control.pause(app, queue=a["queue"])
                log.execute(
                    "INSERT INTO public.model_log (id, kind, detail) VALUES (%s, 'pause', %s)",
                    (uuid.uuid4(), Jsonb({"queue": a["queue"]})),
                )
                resumes.append((action.at + a["seconds"], a["queue"]))
        elif kind == "limits":
            q = queues[a["queue"]]
            await _set_limits(app, log, q.name, a["concurrency"], a["per_key"], q.rate, q.rate_per_key)
        else:
            await _part_three(app, fleet, log, state, expected, late, action)
    for _, pid in thaws:
        fleet.thaw(pid)
    for _, queue in resumes:
        log.execute(
            "INSERT INTO public.model_log (id, kind, detail) VALUES (%s, 'resume', %s)",
            (uuid.uuid4(), Jsonb({"queue": queue})),
        )
        await control.resume(app, queue=queue)


async def _emit(app: jobbus.App, log: psycopg.Connection[Any], key: str) -> None:
    payload = {"emit": str(uuid.uuid4())}
    first = await app.emit_event(key, payload)
    log.execute(
        "INSERT INTO public.model_log (id, kind, detail) VALUES (%s, 'emit', %s)",
        (uuid.uuid4(), Jsonb({"key": key, "payload": payload, "first": first})),
    )


async def _quiet(app: jobbus.App, fleet: _Fleet, topology: Topology, log: psycopg.Connection[Any]) -> None:
    """Faults over: stop the periodic jobs, emit every event once more, and wait for the queues to drain."""
    log.execute(
        "CREATE TABLE public.model_periodic_end AS SELECT p.name, p.next_run_at,"
        " (SELECT max(j.available_at) FROM jobbus.job j WHERE j.name = p.name) AS last_tick FROM jobbus.periodic p"
    )
    for name, *_ in topology.periodics:
        await app.pause_periodic(name)
    keys = {a.args["key"] for a in topology.timeline if a.kind == "emit"}
    for key in sorted(keys):
        await _emit(app, log, key)
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while time.monotonic() < deadline:
        fleet.supervise()
        row = log.execute("SELECT count(*) FROM jobbus.job WHERE status IN ('queued', 'running')").fetchone()
        if row is not None and row[0] == 0:
            return
        await asyncio.sleep(0.5)


def _db_now(log: psycopg.Connection[Any]) -> float:
    row = log.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


def _epoch(value: Any) -> float | None:
    return None if value is None else float(value.timestamp())


def _read(
    log: psycopg.Connection[Any],
    topology: Topology,
    expected: dict[str, str],
    late: list[tuple[str, str]],
    unexpected: list[tuple[str, int, int]],
    quiet_from: float,
    periodic_next: dict[str, tuple[float | None, float | None]],
) -> History:
    h = History(
        expected=expected,
        late_group_adds=late,
        unexpected_exits=unexpected,
        quiet_from=quiet_from,
        periodic_next=periodic_next,
    )
    h.periodic_every = {name: every for name, every, _, _ in topology.periodics}
    size = int(batch_env(topology.seed)["MODEL_BATCH_SIZE"])
    h.batch_sizes = {"model.batch": size, "model.batch_sync": max(2, size - 1)}
    for row in log.execute(
        "SELECT id::text, type, queue, concurrency_key, status, name, extract(epoch FROM available_at)::float8,"
        " extract(epoch FROM created_at)::float8, extract(epoch FROM finished_at)::float8, group_id::text,"
        " configuration_data, attempts, last_error, extract(epoch FROM expires_at)::float8,"
        " extract(epoch FROM started_at)::float8, error_group, history, unique_key, weight FROM jobbus.job"
    ).fetchall():
        values = list(row)
        values[10] = _opened(row[0], row[1], row[10])
        h.jobs.append(JobRow(*values))
    for job_id, old, new, attempts, type_, unique_key, expires_at, at, weight in log.execute(
        "SELECT job_id::text, old_status, new_status, attempts, type, unique_key,"
        " extract(epoch FROM expires_at)::float8, extract(epoch FROM at)::float8, weight"
        " FROM public.model_job_change ORDER BY seq"
    ).fetchall():
        h.transitions.append(Transition(job_id, at, old, new, attempts))
        if old is None:
            h.inserted[job_id] = Inserted(job_id, at, type_, unique_key, expires_at, weight or 1)
    for job_id, old, new, old_queue, new_queue, priority, at in log.execute(
        "SELECT job_id::text, old_status, new_status, old_queue, new_queue, new_priority,"
        " extract(epoch FROM at)::float8 FROM public.model_job_edit ORDER BY seq"
    ).fetchall():
        h.edits.append(Edit(job_id, at, old, new, old_queue, new_queue, priority))
    h.ended = _db_now(log)
    jobs = {j.id: j for j in h.jobs}
    rows = log.execute(
        "SELECT kind, job_id::text, attempt, worker, pid, extract(epoch FROM at)::float8, detail"
        " FROM public.model_log ORDER BY at"
    ).fetchall()
    starts: dict[str, tuple[Any, ...]] = {}
    ends: dict[str, tuple[Any, ...]] = {}
    stops: dict[int, float] = {}
    pauses: dict[str, float] = {}
    spawned: dict[int, tuple[str, tuple[str, ...], int, float]] = {}
    gone: dict[int, float] = {}
    for kind, job_id, attempt, worker, pid, at, detail in rows:
        if kind == "start":
            starts[detail["run"]] = (job_id, attempt, worker, pid, at, detail.get("claimed_at"), detail.get("queue"))
            if "call" in detail:
                h.batch_calls.setdefault(detail["call"], []).append((job_id, detail["type"], attempt))
            if attempt == 1:
                h.first_available.setdefault(job_id, float(detail["available_at"]))
        elif kind == "end":
            ends[detail["run"]] = (at, detail["outcome"])
        elif kind == "effect":
            h.effects.append(Effect(job_id, detail["step"], attempt, pid, at))
        elif kind == "received":
            h.received.append((job_id, detail["key"], detail["payload"]))
        elif kind == "completed":
            h.completions.setdefault(detail["completed"], []).append(at)
        elif kind == "emit":
            h.emitted.setdefault(detail["key"], []).append(detail["payload"])
        elif kind == "limits":
            h.limits.append(
                Limits(
                    at,
                    detail["queue"],
                    detail["concurrency"],
                    detail["per_key"],
                    None if detail["rate"] is None else (int(detail["rate"][0]), float(detail["rate"][1])),
                    None
                    if detail["rate_per_key"] is None
                    else (int(detail["rate_per_key"][0]), float(detail["rate_per_key"][1])),
                )
            )
        elif kind == "consume":
            h.spends.append(
                Spend(
                    detail["queue"],
                    detail["key"],
                    int(detail["units"]),
                    float(detail["before"]),
                    float(detail["after"]),
                    bool(detail["recorded"]),
                )
            )
        elif kind == "spawn":
            spawned[pid] = (worker, tuple(detail["queues"]), int(detail["concurrency"]), math.inf)
        elif kind == "ready" and pid in spawned:
            spawned[pid] = (*spawned[pid][:3], at)
        elif kind == "gone":
            gone.setdefault(pid, at)
        elif kind == "kill":
            gone[pid] = at
            h.faults.append(Window(f"kill {pid}", at, at))
        elif kind == "stop":
            stops[pid] = at
        elif kind == "cont":
            start = stops.pop(pid, at)
            h.frozen.append(Window(str(pid), start, at))
            h.faults.append(Window(f"freeze {pid}", start, at))
        elif kind == "terminate":
            h.faults.append(Window("terminate", at, at))
        elif kind == "pause":
            pauses[detail["queue"]] = at
        elif kind == "resume" and detail["queue"] in pauses:
            h.paused.append(Window(detail["queue"], pauses.pop(detail["queue"]), at))
    for pid, at in stops.items():
        h.frozen.append(Window(str(pid), at, gone.get(pid, at)))
    for pid, (worker, queues, concurrency, at) in spawned.items():
        h.processes.append(Process(pid, worker, queues, concurrency, at, gone.get(pid)))
    for run_id, (job_id, attempt, worker, pid, at, claimed, claimed_queue) in starts.items():
        job = jobs.get(job_id)
        end, outcome = ends.get(run_id, (None, "open"))
        h.runs.append(
            Run(
                run_id,
                job_id,
                job.type if job else "?",
                claimed_queue or (job.queue if job else "?"),
                job.key if job else None,
                attempt,
                worker,
                pid,
                at,
                end,
                outcome,
                at if claimed is None else float(claimed),
            )
        )
    for job_id, name, at in log.execute(
        "SELECT job_id::text, name, extract(epoch FROM created_at)::float8 FROM jobbus.job_step"
        " WHERE name IN ('a', 'b')"
    ).fetchall():
        h.stored_steps[(job_id, name)] = at
    return h


def _opened(job_id: str, job_type: str, configuration: Any) -> Any:
    """A configuration as the handler saw it: opened with JOBBUS_ENCRYPTION_KEYS when the run had keys."""
    if sealed_key_id(configuration) is None:
        return configuration
    keyring = keyring_of([k for k in os.environ.get("JOBBUS_ENCRYPTION_KEYS", "").split(",") if k.strip()])
    if keyring is None:
        raise AssertionError(f"job {job_id} has an encrypted configuration and the run had no keys")
    return keyring.open(configuration, "configuration", job_id, job_type, f"the configuration of job {job_id}")


def check_seed(
    seed: int, dsn: str, duration: float = 25.0, *, single_queue_workers: bool = False
) -> tuple[Topology, Report]:
    """Generate, run and check one seed on `dsn`; the report explains every broken guarantee."""
    topology = generate(seed, duration, single_queue_workers=single_queue_workers)
    history = asyncio.run(run(topology, dsn))
    return topology, check(history)


def check_cells(seed: int, dsns: list[str], duration: float = 25.0) -> tuple[Topology, list[Report]]:
    """Generate one seed and run it in every database of `dsns` at once, as cells served by one fleet of
    workers (`run_cells`); one report per cell."""
    topology = generate(seed, duration)
    return topology, [check(history) for history in asyncio.run(run_cells(topology, dsns))]


def explain(topology: Topology, report: Report) -> str:
    """What a failure prints: the seed that reproduces it, its topology, and each broken guarantee."""
    verdict = "PASS" if report.ok else f"FAIL ({', '.join(sorted(report.guarantees()))})"
    return (
        f"model check seed {topology.seed}: {verdict}\n"
        f"reproduce: python -m tests.model --seed {topology.seed} --duration {topology.duration:g}"
        f"{' --single-queue-workers' if topology.single_queue_workers else ''}\n"
        f"{topology.describe()}\n{report.text()}"
    )
