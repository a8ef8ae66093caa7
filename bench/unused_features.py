"""What the features a drain does not use cost it: `make bench-unused`.

    .venv/bin/python bench/unused_features.py                           # 100,000 jobs, 5 rounds
    .venv/bin/python bench/unused_features.py --jobs 20000 --rounds 2   # a short check that it works

One worker process (`bench/jobbus_driver.py`'s drain, concurrency `--concurrency`) drains no-op jobs
with no limits, no periodic jobs, no workflows, no tracer provider and no metrics port, and none of
SPEC 21's options (weight 1, no uniqueness window or debounce, no tags, no batch handler): as shipped,
and with the code path of each of those features removed, one at a time and all at once (see
`FEATURES` for how each is removed: weights by the claim recording its starts without their weight and
the column dropped, debounce by its triggers and CHECK dropped, tags by its trigger dropped, batch
handlers by the worker's per-job batch test taken out of its source). The attempt history, which
every completion writes, is removed in a variant of its own and reported apart: it is a used feature,
not an unused one. Every variant has a database of its own on BENCH_DSN, and the drains are
interleaved: one of each variant per round, `--rounds` rounds.

Per drain, as bench/run.py defines them: the steady rate (first to last handler start) and the start-to-
exit rate; the worker process's CPU per job (getrusage in that process, from its call into the worker
to the return); the CPU per job of the database's backends (their /proc/<pid>/stat while they live,
bench/capacity.py's meter); and the database's time per job inside jobbus's PL/pgSQL functions, the
claim's and the triggers' (the self time of pg_stat_user_functions, each variant's database set to
`track_functions = 'pl'`): a narrower figure than the backends' CPU, which every statement's parsing,
locking, index and WAL work also moves, and the one where the database's share of workflows and limits
lives. The table gives medians (min–max) and, per variant, the shipped worker's
cost as a multiple of the variant's: how much more the shipped drain pays for what that variant lacks
(1.00: nothing; a rate's multiple is the variant's rate over the shipped one).

The SQL a variant runs is made from the shipped SQL by edits that raise `SqlChanged` when the text no
longer reads as they expect (tests/test_bench.py checks them against the shipped migrations and queries),
so a changed statement stops the benchmark instead of being measured unedited; the same holds for the
worker's source that the batches variant edits (`SourceChanged`), and for the triggers, constraints and
column the variants drop (a DROP of one that is gone fails).
"""

from __future__ import annotations
import __future__

import argparse
import contextlib
import functools
import inspect
import math
import re
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/unused_features.py` puts bench/ first, not the repository root
    sys.path.insert(0, str(ROOT))

from bench import capacity, jobbus_driver, run  # noqa: E402
from bench.suite import Setting, Sizes, Suite, System, add_server_arguments, log, server_from  # noqa: E402
from jobbus import schema, tracing  # noqa: E402
from jobbus.store import jobs as job_store  # noqa: E402
from jobbus.store.statements import queries  # noqa: E402
from jobbus.worker import observer, producer  # noqa: E402
from jobbus.worker.services import periodic  # noqa: E402

SCENARIO = "unused"
SCHEMA = jobbus_driver.SCHEMA
#: Seconds between two readings of the database's backends: a backend's work after its last reading is
#: lost when it exits, as the worker's do at the end of each drain.
BACKEND_READ_INTERVAL = 0.05


class SqlChanged(RuntimeError):
    """The shipped SQL no longer reads as an edit expects: update the edit, or a variant would measure
    the shipped statement under another name."""


# -- edits of the shipped SQL ------------------------------------------------------------------------

#: A claim function's definition in a migration, from its CREATE to the line that closes its body (the
#: dollar quote that opened it: `$$` or `$function$`).
CLAIM_FUNCTION = re.compile(
    r"^CREATE (?:OR REPLACE )?FUNCTION \{schema\}\.claim_jobs\(.*?\bAS\s+(\$\w*\$).*?^\1;", re.S | re.M
)
#: Flow control's branch of the claim: a limited queue is taken by take_limited, any other by take_from_queue.
LIMITED_BRANCH = re.compile(
    r"IF\s+v_queue\s*=\s*ANY\(p_limited_queues\)\s+THEN\s+v_ids\s*:=\s*v_ids\s*\|\|\s*\{schema\}\.take_limited\([^;]*\);"
    r"\s+ELSE\s+(v_ids\s*:=\s*v_ids\s*\|\|\s*\{schema\}\.take_from_queue\([^;]*\);)\s+END\s+IF;"
)
#: The CTE that records the starts of rate-limited queues (queue_start).
STARTS_CTE = re.compile(r",\s*started\s+AS\s*(?=\()")
#: Expiry's CASE on each column the claim's UPDATE writes: the value of an expired row, else the lease's.
EXPIRY_CASE = re.compile(
    r"CASE\s+WHEN\s+j\.expires_at\s*<=\s*v_clock(?:\s+AND\s+j\.started_at\s+IS\s+NULL)?\s+THEN\s+.+?\s+ELSE\s+(.+?)\s+END\b",
    re.S,
)
#: What the claim does once it met expired jobs: count them, cancel those ahead in bulk, stop at its budget.
EXPIRY_SWEEP = re.compile(r"\s+v_expired\s*:=\s*v_expired\s*\+\s*cardinality\(.*?\bRETURN;\s+END\s+IF;", re.S)
#: The weight of each start the claim records (migration 0028): `units` in queue_start, from the job's weight.
STARTS_UNITS = re.compile(
    r"(INSERT\s+INTO\s+\{schema\}\.queue_start\s*\(\s*queue,\s*concurrency_key,\s*started_at)\s*,\s*units\s*\)"
    r"(\s+SELECT\s+c\.queue,\s*c\.concurrency_key,\s*c\.started_at)\s*,\s*c\.weight\b"
)
#: `, column = j.column`: what an expiry CASE leaves of a column only an expired row changes.
SELF_ASSIGNMENT = re.compile(r",\s*(\w+)\s*=\s*j\.\1\b(?=\s*(?:,|WHERE\b))")
#: The statements that write an attempt's outcome; those the queries define are edited.
COMPLETION_STATEMENTS = ("record_outcomes", "complete_jobs")
#: The history entry an outcome statement appends: `, history = <expression>` in its SET list.
HISTORY_ITEM = re.compile(r",\s*history\s*=\s*")
#: What ends an expression at the top level: a clause that follows a SET list or a CTE.
NEXT_CLAUSE = re.compile(r"\s+(?:FROM|WHERE|RETURNING|SELECT)\b")


def claim_function_template() -> tuple[str, str]:
    """The latest definition of `{schema}.claim_jobs` (template text), and the migration that holds it."""
    for migration in reversed(schema.migrations()):
        found = [m[0] for m in CLAIM_FUNCTION.finditer(migration.template) if "LANGUAGE plpgsql" in m[0]]
        if found:
            return found[-1], f"migration {migration.version:04d}_{migration.name}"
    raise SqlChanged("no migration defines {schema}.claim_jobs")


def stripped_claim_function(removed: Sequence[str] = ("limits",)) -> str:
    """The shipped claim function without the `removed` features' parts (`CLAIM_EDITS`), rendered for SCHEMA."""
    return edit_claim_function(*claim_function_template(), removed)


def strip_claim_function(text: str, where: str) -> str:
    """A claim function's definition (template text) without flow control (the limited branch, the
    queue_start CTE) and without expiry (its CASEs), as a CREATE OR REPLACE rendered for SCHEMA."""
    return edit_claim_function(text, where, ("limits",))


def edit_claim_function(text: str, where: str, removed: Sequence[str]) -> str:
    """A claim function's definition (template text) with the edits of the `removed` features among
    `CLAIM_EDITS` applied, in that order, as a CREATE OR REPLACE rendered for SCHEMA."""
    text = text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    for name, edit in CLAIM_EDITS.items():
        if name in removed:
            text = edit(text, where)
    return schema.render(text, SCHEMA)


def claim_without_weights(text: str, where: str) -> str:
    """The claim's record of a start without its weight: queue_start's `units` left to its default (1),
    as before migration 0028; the rest of the claim never reads a weight."""
    text = substitute(text, STARTS_UNITS, r"\1)\2", f"{where}: the units of the starts recorded", once=True)
    absent(text, ("weight", "units"), where)
    return text


def claim_without_limits(text: str, where: str) -> str:
    """The claim without flow control (the limited branch, the queue_start CTE) and expiry (its CASEs)."""
    text = substitute(text, LIMITED_BRANCH, r"\1", f"{where}: the limited branch", once=True)
    text = cut(text, STARTS_CTE, f"{where}: the CTE `started` (queue_start)")
    text = substitute(text, EXPIRY_CASE, r"\1", f"{where}: the expiry CASEs", once=False)
    text = substitute(text, EXPIRY_SWEEP, "", f"{where}: the bulk cancellation of expired jobs", once=True)
    text = substitute(text, SELF_ASSIGNMENT, "", f"{where}: the columns only expiry writes", once=False)
    absent(text, ("take_limited", "queue_start", "expires_at"), where)
    return text


#: The features whose code is in the claim function, and the edit that removes each: applied in this
#: order (the weights edit reads the queue_start CTE that the limits edit removes), rendered once.
CLAIM_EDITS: dict[str, Callable[[str, str], str]] = {"weights": claim_without_weights, "limits": claim_without_limits}


def statements_without_history(schema_name: str = SCHEMA) -> dict[str, str]:
    """The shipped outcome statements (`COMPLETION_STATEMENTS`) without the history entry each appends."""
    shipped = queries(schema_name)
    names = [name for name in COMPLETION_STATEMENTS if name in shipped]
    if "record_outcomes" not in names:
        raise SqlChanged("the queries define no record_outcomes: which statement writes outcomes now?")
    return {name: strip_history_entry(shipped[name], name) for name in names}


def strip_history_entry(statement: str, name: str) -> str:
    """An outcome statement without its `history = ...` assignment."""
    text = cut(statement, HISTORY_ITEM, f"query {name}: the history assignment")
    if HISTORY_ITEM.search(text):
        raise SqlChanged(f"query {name}: still assigns history after the edits")
    return text


def substitute(text: str, pattern: re.Pattern[str], replacement: str, what: str, *, once: bool) -> str:
    """`pattern` replaced: exactly one match when `once`, else at least one."""
    edited, count = pattern.subn(replacement, text)
    if count == 0 or (once and count != 1):
        raise SqlChanged(f"{what}: expected {'one match' if once else 'matches'} of {pattern.pattern!r}, found {count}")
    return edited


def cut(text: str, head: re.Pattern[str], what: str) -> str:
    """Removes the one match of `head` and the SQL expression that follows it (to the next top-level comma,
    closing parenthesis or clause)."""
    found = list(head.finditer(text))
    if len(found) != 1:
        raise SqlChanged(f"{what}: expected one match of {head.pattern!r}, found {len(found)}")
    return text[: found[0].start()] + text[expression_end(text, found[0].end(), what) :]


def expression_end(text: str, start: int, what: str) -> int:
    """Where the expression starting at `start` ends, parentheses, quoted text and comments skipped."""
    depth, i = 0, start
    while i < len(text):
        if text.startswith("--", i):
            i = text.find("\n", i)
            if i < 0:
                break
            continue
        char = text[i]
        if char == "'":
            i = text.find("'", i + 1) + 1  # a doubled quote is two quoted strings side by side: same end
            if i == 0:
                break
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                return i
            depth -= 1
        elif depth == 0 and (char == "," or NEXT_CLAUSE.match(text, i)):
            return i
        i += 1
    raise SqlChanged(f"{what}: the expression starting at {text[start : start + 40]!r} does not end")


def absent(text: str, words: Sequence[str], where: str) -> None:
    """Raise when any of `words` is still in the SQL, as a word (`expires_at`, not `lease_expires_at`), outside
    comments."""
    code = re.sub(r"--[^\n]*", "", text)
    left = [word for word in words if re.search(rf"\b{word}\b", code)]
    if left:
        raise SqlChanged(f"{where}: still names {', '.join(left)} after the edits")


# -- removing each feature ---------------------------------------------------------------------------


def replace_everywhere(module: Any, name: str, value: object) -> None:
    """`module.name` replaced, and in every jobbus module that imported it by name; it must exist, so
    that a rename cannot leave a variant running the shipped code."""
    original = getattr(module, name)  # AttributeError when it is gone
    for loaded in list(sys.modules.values()):
        if getattr(loaded, "__name__", "").startswith("jobbus") and vars(loaded).get(name) is original:
            setattr(loaded, name, value)


def replace_attribute(owner: type, name: str, value: object) -> None:
    """`owner.name` replaced; it must exist (AttributeError), as for `replace_everywhere`."""
    getattr(owner, name)
    setattr(owner, name, value)


def no_tracer() -> None:
    return None


def nothing(*args: object) -> None:
    return None


def same_job(job: Any) -> Any:
    return job


def strip_tracing() -> None:
    replace_everywhere(tracing, "current_tracer", no_tracer)
    replace_everywhere(tracing, "attempt_ended", nothing)
    replace_everywhere(job_store, "_take_trace_context", same_job)


class NoObservers(tuple[object, ...]):
    """What a worker holds instead of `Observers` when it has none: an empty tuple, whose truth test is
    no Python call, and reports that do nothing."""

    active = False
    claimed = finished = queues_sampled = leadership_changed = staticmethod(nothing)


def strip_observers() -> None:
    shipped_new = observer.Observers.__new__

    def new(cls: type[observer.Observers], observers: Sequence[Any] = ()) -> object:
        return NoObservers() if not observers else shipped_new(cls)

    replace_attribute(observer.Observers, "__new__", staticmethod(new))


async def no_round(self: periodic.PeriodicEnqueuer) -> None:
    return None


def strip_periodics() -> None:
    replace_attribute(periodic.PeriodicEnqueuer, "run_once", no_round)


def strip_history() -> None:
    queries(SCHEMA).update(statements_without_history())  # the stores read this very dict


def strip_workflows(conn: psycopg.Connection[Any]) -> None:
    conn.execute(sql.SQL("ALTER TABLE {}.job DISABLE TRIGGER job_finished").format(sql.Identifier(SCHEMA)))


def strip_claim(conn: psycopg.Connection[Any], removed: Sequence[str]) -> None:
    """The claim function without the parts of the `removed` features that live in it (`CLAIM_EDITS`),
    all edits in one definition."""
    if any(name in CLAIM_EDITS for name in removed):
        conn.execute(stripped_claim_function(removed).encode())


def execute_all(conn: psycopg.Connection[Any], statements: Sequence[str]) -> None:
    """Each statement rendered for SCHEMA; a trigger, constraint or column that is gone fails it, so a
    rename cannot leave a variant measuring the shipped schema."""
    for statement in statements:
        conn.execute(schema.render(statement, SCHEMA).encode())


#: Weights' column: its CHECK is evaluated at every write of every row, and each row carries it.
WEIGHTS_SCHEMA = ("ALTER TABLE {schema}.job DROP COLUMN weight",)
#: Debounce's end-of-run triggers (their WHEN is evaluated at every change of status and every delete)
#: and its CHECK (evaluated at every write).
DEBOUNCE_SCHEMA = (
    "DROP TRIGGER job_debounce_finished ON {schema}.job",
    "DROP TRIGGER job_debounce_deleted ON {schema}.job",
    "ALTER TABLE {schema}.job DROP CONSTRAINT job_debounce_parked_check",
)
#: Tags' trigger, which fires only on an UPDATE that sets job.queue.
TAGS_SCHEMA = ("DROP TRIGGER job_key_moved ON {schema}.job",)


def strip_weights(conn: psycopg.Connection[Any]) -> None:
    execute_all(conn, WEIGHTS_SCHEMA)


def strip_debounce(conn: psycopg.Connection[Any]) -> None:
    execute_all(conn, DEBOUNCE_SCHEMA)


def strip_tags(conn: psycopg.Connection[Any]) -> None:
    execute_all(conn, TAGS_SCHEMA)


class SourceChanged(SqlChanged):
    """The shipped Python no longer reads as an edit expects."""


#: The lines of `Producer._start` that divert a batch handler's jobs (`batch_size`) to `_start_batches`,
#: each run of lines removed as a whole.
BATCH_DIVERSION = (
    ("        batched: list[ClaimedJob] = []",),
    (
        "            if handler.batch_size is not None:",
        "                batched.append(claimed)",
        "                continue",
    ),
    (
        "        if batched:",
        "            return len(jobs) - len(batched) + self._start_batches(batched, sent, tracer)",
    ),
)


def start_without_batches(source: str | None = None) -> str:
    """The source of `Producer._start` (the shipped one by default) without its batch diversion
    (`BATCH_DIVERSION`), dedented to module level."""
    if source is None:
        source = inspect.getsource(producer.Producer._start)
    for run_of_lines in BATCH_DIVERSION:
        lines = "".join(f"{line}\n" for line in run_of_lines)
        if source.count(lines) != 1:
            raise SourceChanged(f"Producer._start: expected these lines once: {lines!r}")
        source = source.replace(lines, "")
    body = source.split('"""', 2)[2]  # the docstring speaks of batches
    if re.search(r"\bbatch", body):
        raise SourceChanged("Producer._start: still names a batch after the edits")
    return textwrap.dedent(source)


def strip_batches() -> None:
    namespace: dict[str, Any] = {}
    first_line = inspect.getsourcelines(producer.Producer._start)[1]
    source = "\n" * (first_line - 1) + start_without_batches()  # tracebacks name the shipped file's lines
    code = compile(source, producer.__file__, "exec", flags=__future__.annotations.compiler_flag)
    exec(code, vars(producer), namespace)
    replace_attribute(producer.Producer, "_start", namespace["_start"])


@dataclass(frozen=True)
class Feature:
    name: str
    #: How its code path is removed, for the reader of the table.
    how: str
    database: Callable[[psycopg.Connection[Any]], None] | None = None
    process: Callable[[], None] | None = None
    #: After a drain without it, a query that is true when the drain did without it indeed.
    check: str = ""


FEATURES = {
    feature.name: feature
    for feature in (
        Feature(
            "workflows",
            "`ALTER TABLE jobbus.job DISABLE TRIGGER job_finished` (groups, parents, follow-ups, the `_done` "
            "notification for wait())",
            database=strip_workflows,
        ),
        Feature(
            "limits",
            "claim_jobs of the latest migration defining it, re-created without the limited branch "
            "(take_limited), the queue_start CTE and the expiry CASEs",
        ),
        Feature(
            "tracing",
            "in the worker process, tracing.current_tracer returns None, tracing.attempt_ended and the "
            "claim's trace-context extraction do nothing (the calls remain)",
            process=strip_tracing,
        ),
        Feature(
            "observers",
            "in the worker process, Observers() without observers is an empty tuple: the worker's two checks "
            "per job, `if self.observers` (as shipped, each a call of Observers.__bool__), then make no Python "
            "call (the attribute checks themselves remain)",
            process=strip_observers,
        ),
        Feature(
            "periodics",
            "in the worker process, the leader's PeriodicEnqueuer.run_once does nothing (a round per second, "
            "not per job)",
            process=strip_periodics,
        ),
        Feature(
            "weights",
            "claim_jobs of the latest migration defining it, re-created recording its starts without their "
            "weight (queue_start.units left to its default, 1, as before migration 0028), and "
            "`ALTER TABLE jobbus.job DROP COLUMN weight` (the column every row carries and its CHECK, "
            "evaluated at every write); take_limited, take_per_key and fit_weights, which count weights, "
            "run only for a queue with limits, which a plain drain's claim never calls, and are left",
            database=strip_weights,
        ),
        Feature(
            "debounce",
            "`DROP TRIGGER` job_debounce_finished and job_debounce_deleted (their WHEN, `unique_key IS NOT "
            "NULL AND ...`, is tested at every change of a job's status and every delete; their function "
            "never runs for a job without a key) and the CHECK job_debounce_parked_check (tested at every "
            "write); the indexes job_unique_key_idx and job_debounce_parked_idx are left: a job without "
            "unique_key (and without debounce_until) has no entry in them, only their predicates are "
            "tested when a row is written",
            database=strip_debounce,
        ),
        Feature(
            "tags",
            "`DROP TRIGGER job_key_moved` (AFTER UPDATE OF queue: no statement of a drain sets job.queue, "
            "so it never fires on a drain's path; what goes is its column test at each update); the GIN "
            "index job_tags_idx is left: a job without tags (NULL) has no entry in it",
            database=strip_tags,
        ),
        Feature(
            "batches",
            "in the worker process, Producer._start is the shipped method's source without its batch "
            "diversion (the per-job test `if handler.batch_size is not None`, the list it fills and the "
            "call of _start_batches), compiled in the producer's module; the rest of batches' code in the "
            "worker (a slot count per claim, checks at announcements) remains",
            process=strip_batches,
        ),
        Feature(
            "history",
            "in the worker process, the outcome statements the queries define among "
            f"{' and '.join(COMPLETION_STATEMENTS)} without their `history = ...` assignment",
            process=strip_history,
            check=f"SELECT NOT EXISTS (SELECT FROM {SCHEMA}.job WHERE history <> '[]')",
        ),
    )
}
UNUSED = ("workflows", "limits", "tracing", "observers", "periodics", "weights", "debounce", "tags", "batches")


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    removed: tuple[str, ...] = ()


VARIANTS = [
    Variant("shipped", "as shipped"),
    *(Variant(f"no_{name}", f"without {name}", (name,)) for name in UNUSED),
    Variant("stripped", f"without all {len(UNUSED)}", UNUSED),
    Variant("no_history", "without the attempt history (used by every job)", ("history",)),
]


# -- the worker process ------------------------------------------------------------------------------


def drive(argv: Sequence[str]) -> None:
    """`driver --strip a,b <op> ...`: bench/jobbus_driver.py's operation `op`, with the named features'
    code removed from this process first."""
    parser = argparse.ArgumentParser(prog="bench/unused_features.py driver", add_help=False, allow_abbrev=False)
    parser.add_argument("--strip", default="", help="comma-separated FEATURES")
    known, rest = parser.parse_known_args(argv)
    for name in filter(None, known.strip.split(",")):
        strip = FEATURES[name].process
        if strip is not None:
            strip()
    jobbus_driver.main(rest)


# -- the measurement ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    #: A rate (more is better), not a cost per job (less is better).
    rate: bool


METRICS = [
    Metric("steady", "steady", "jobs/s", rate=True),
    Metric("wall", "start to exit", "jobs/s", rate=True),
    Metric("worker cpu", "worker CPU", "µs/job", rate=False),
    Metric("db cpu", "database CPU", "µs/job", rate=False),
    Metric("db functions", "database functions", "µs/job", rate=False),
]

#: The jobbus functions' counters, zeroed before a drain (the fill's calls are not the drain's).
RESET_FUNCTIONS = (
    "SELECT count(pg_stat_reset_single_function_counters(p.oid)) FROM pg_proc AS p "
    "JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE n.nspname = %s"
)
#: Milliseconds spent inside the jobbus functions themselves (self time: not in the functions they call).
FUNCTION_TIME = "SELECT coalesce(sum(self_time), 0) FROM pg_stat_user_functions WHERE schemaname = %s"


def systems(setting: Setting) -> list[System]:
    """One System per variant: bench/run.py's jobbus system through this script's driver."""
    base = run.jobbus_system(quick=True)
    return [
        replace(
            base,
            name=variant.name,
            driver=["-m", "bench.unused_features", "driver", "--strip", ",".join(variant.removed)],
            sweep=[setting],
            best=setting,
        )
        for variant in VARIANTS
    ]


def measure(suite: Suite, jobs: int) -> None:
    variants = {variant.name: variant for variant in VARIANTS}
    with suite.databases(SCENARIO) as dbs:
        for name, db in dbs.items():
            with suite.server.connect(db) as conn:
                conn.execute(sql.SQL("ALTER DATABASE {} SET track_functions = 'pl'").format(sql.Identifier(db)))
                strip_claim(conn, variants[name].removed)
                for feature in variants[name].removed:
                    strip = FEATURES[feature].database
                    if strip is not None:
                        strip(conn)
        for round_ in range(suite.runs):
            for system in suite.systems:
                if system.name in dbs:
                    with suite.guarded(SCENARIO, system):
                        drain(suite, system, dbs[system.name], variants[system.name], jobs, round_)


def drain(suite: Suite, system: System, db: str, variant: Variant, jobs: int, round_: int) -> None:
    readings: list[capacity.CpuReading] = []
    meter = functools.partial(capacity.cpu_meter, suite.server.admin_dsn, db, readings, interval=BACKEND_READ_INTERVAL)

    @contextlib.contextmanager
    def metered() -> Iterator[None]:
        suite.server.execute(db, RESET_FUNCTIONS, (SCHEMA,))
        with meter():
            yield

    figures = suite.drain_once(SCENARIO, system, db, system.best_setting, jobs, around=metered)
    function_ms = float(suite.server.execute(db, FUNCTION_TIME, (SCHEMA,))[0][0])  # after the backends' exit
    for feature in variant.removed:
        check = FEATURES[feature].check
        if check and not suite.server.execute(db, check)[0][0]:
            raise RuntimeError(f"{variant.label}: the drain still used {feature} ({check} is false)")
    values = {
        "steady": figures["steady"],
        "wall": figures["wall"],
        "worker cpu": figures["worker_cpu"] * 1e6,
        "db cpu": readings[0].db * 1e6 / jobs,
        "db functions": function_ms * 1e3 / jobs,
    }
    label = system.best_setting.label
    for metric in METRICS:
        suite.record(SCENARIO, system.name, label, jobs, metric.key, metric.unit, values[metric.key])
    suite.record(SCENARIO, system.name, label, jobs, "busy", "fraction", readings[0].machine_busy)
    log(
        f"round {round_ + 1} {variant.label}: {values['steady']:,.0f} jobs/s steady, {values['wall']:,.0f} start "
        f"to exit, worker {values['worker cpu']:.0f} µs/job, database {values['db cpu']:.0f} µs/job "
        f"({values['db functions']:.1f} in functions), "
        f"machine {readings[0].machine_busy:.0%} busy"
    )


#: Issues 24 and 37: a drain that uses none of the features (`UNUSED`) runs within 5 % of the same drain
#: without their code.
GOAL = 1.05


def shipped_cost(suite: Suite, variant: str, metric: Metric) -> float:
    """What the shipped drain pays per job as a multiple of `variant` (a rate: the variant's over the
    shipped); NaN when either is unmeasured."""
    here, shipped = suite.find(SCENARIO, variant, metric.key), suite.find(SCENARIO, "shipped", metric.key)
    if here is None or shipped is None:
        return math.nan
    return here.median / shipped.median if metric.rate else shipped.median / here.median


def table(suite: Suite) -> tuple[list[str], list[list[str]]]:
    """One row per variant: each metric's median (min–max), and `shipped_cost`."""
    header = ["variant"]
    for metric in METRICS:
        header += [f"{metric.label} ({metric.unit})", "shipped ×"]
    rows = []
    for variant in VARIANTS:
        row = [variant.label]
        for metric in METRICS:
            here = suite.find(SCENARIO, variant.name, metric.key)
            ratio = shipped_cost(suite, variant.name, metric)
            row.append("-" if here is None else f"{here.median:,.0f} ({here.low:,.0f}–{here.high:,.0f})")
            row.append("-" if variant.name == "shipped" or math.isnan(ratio) else f"{ratio:.3f}")
        rows.append(row)
    return header, rows


def report(suite: Suite, jobs: int, setting: Setting) -> str:
    busy = [v for m in suite.results if m.metric == "busy" for v in m.values]
    goal = ", ".join(
        f"{metric.label} ×{ratio:.3f} ({'met' if ratio <= GOAL else 'MISSED'})"
        for metric in METRICS
        if not math.isnan(ratio := shipped_cost(suite, "stripped", metric))
    )
    lines = [
        f"{jobs:,} no-op jobs per drain, one worker process at {setting.label}, {suite.runs} rounds "
        f"(median, min–max); `shipped ×` is what the shipped drain pays per job as a multiple of the variant "
        f"(rates: the variant's over the shipped; 1.000 = the feature costs nothing)",
        "",
        run.render_markdown_table(*table(suite)),
        "",
        f"Issue 24's goal (issue 37: with SPEC 21's features), the shipped drain within {GOAL - 1:.0%} of the one "
        f"without all {len(UNUSED)}: "
        f"{goal or 'not measured'}",
        "",
        "How each was removed:",
        *(f"- {name}: {feature.how}" for name, feature in FEATURES.items()),
    ]
    if busy:
        lines.append(f"Machine busy during the drains (all CPUs, everybody's): {min(busy):.0%}–{max(busy):.0%}.")
    lines += [f"Note: {m.system}: {m.note}" for m in suite.results if m.note]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_arguments(parser)
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per drain (default 100,000)")
    parser.add_argument("--rounds", type=int, default=5, help="drains of each variant (default 5)")
    parser.add_argument("--concurrency", type=int, default=200, help="the worker's concurrency (default 200)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["driver"]:
        drive(argv[1:])
        return 0
    args = parse_args(argv)
    stripped_claim_function(tuple(CLAIM_EDITS))  # a changed statement stops the benchmark before any drain
    statements_without_history()
    start_without_batches()
    setting = Setting(f"c{args.concurrency}", args.concurrency)
    server = server_from(args)
    suite = Suite(server, systems(setting), Sizes(), args.rounds)
    try:
        measure(suite, args.jobs)
    except KeyboardInterrupt:
        log("interrupted: dropping the benchmark databases")
        return 130
    finally:
        server.drop_all()
    print(report(suite, args.jobs, setting))
    return 0


if __name__ == "__main__":
    sys.exit(main())
