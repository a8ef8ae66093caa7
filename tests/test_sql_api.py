"""The SQL API (`jobbus.schedule`, `jobbus.schedule_many`): one table of cases run against both the
Python producer and the SQL functions (a case one accepts and the other refuses fails), the same
stored rows for what both accept, deduplication, transactions, the wake-up of an idle worker, and the
Node example of docs/sql.md."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

import jobbus
from tests.processes import finish, prepare, start_worker, wait_until
from tests.roles import granted_roles

ROOT = Path(__file__).resolve().parent.parent


def _nested(levels: int) -> dict[str, Any]:
    """A configuration whose containers nest `levels` deep, itself included."""
    value: Any = 0
    for _ in range(levels - 1):
        value = [value]
    return {"tree": value}


#: Each case: a job as the SQL API takes it (the keys of schedule_many's objects) and the field a
#: refusal must name, or None when both front ends accept it.
CASES: list[tuple[dict[str, Any], str | None]] = [
    ({"type": "t"}, None),
    ({"type": "t", "configuration": {"a": [1, {"b": None}]}, "queue": "mail", "priority": -3}, None),
    ({"type": "t", "name": "Nightly", "unique_key": "k1", "max_attempts": 7, "concurrency_key": "c"}, None),
    ({"type": "t", "group_id": "0190c0de-0000-7000-8000-000000000001"}, None),
    ({"type": "t", "available_at": "2031-01-02T03:04:05+02:00", "expires_at": "2031-01-03T00:00:00Z"}, None),
    ({"type": "t", "delay_seconds": 30, "timeout_seconds": 2.5}, None),
    ({"type": "t", "delay_seconds": -30}, None),
    ({"type": "t", "priority": 2147483647, "max_attempts": 2147483647}, None),
    ({"type": "t", "configuration": None, "queue": None, "name": None}, None),
    ({"type": "t", "unique_key": "ü" * 500}, None),
    ({"type": ""}, "type"),
    ({"type": "   "}, "type"),
    ({"type": 5}, "type"),
    ({"type": "\x1c\xa0\u3000\u2028\x85"}, "type"),
    ({"type": "t", "queue": "\u200b"}, None),
    ({"type": "x" * 256}, "type"),
    ({"type": "é" * 128}, "type"),
    ({"configuration": {}}, "type"),
    ({"type": "t", "configuration": [1, 2]}, "configuration"),
    ({"type": "t", "configuration": "text"}, "configuration"),
    ({"type": "t", "configuration": _nested(200)}, None),
    ({"type": "t", "configuration": _nested(201)}, "configuration"),
    ({"type": "t", "configuration": {"deep": [_nested(200)]}}, "configuration"),
    ({"type": "t", "queue": ""}, "queue"),
    ({"type": "t", "queue": "q" * 256}, "queue"),
    ({"type": "t", "queue": 3}, "queue"),
    ({"type": "t", "name": ""}, "name"),
    ({"type": "t", "name": "n" * 1001}, "name"),
    ({"type": "t", "unique_key": " "}, "unique_key"),
    ({"type": "t", "unique_key": "k" * 1001}, "unique_key"),
    ({"type": "t", "concurrency_key": ""}, "concurrency_key"),
    ({"type": "t", "concurrency_key": 7}, "concurrency_key"),
    ({"type": "t", "priority": 1.5}, "priority"),
    ({"type": "t", "priority": 3.0}, "priority"),
    ({"type": "t", "priority": True}, "priority"),
    ({"type": "t", "priority": "1"}, "priority"),
    ({"type": "t", "priority": 2147483648}, "priority"),
    ({"type": "t", "priority": -2147483649}, "priority"),
    ({"type": "t", "max_attempts": 0}, "max_attempts"),
    ({"type": "t", "max_attempts": 2147483648}, "max_attempts"),
    ({"type": "t", "max_attempts": "3"}, "max_attempts"),
    ({"type": "t", "group_id": "not-a-uuid"}, "group_id"),
    ({"type": "t", "group_id": 12}, "group_id"),
    ({"type": "t", "available_at": "2031-01-02T03:04:05"}, "available_at"),
    ({"type": "t", "available_at": "2031-01-02"}, "available_at"),
    ({"type": "t", "available_at": "tomorrow"}, "available_at"),
    ({"type": "t", "available_at": 1700000000}, "available_at"),
    ({"type": "t", "available_at": "0001-06-01T00:00:00+00:00"}, "available_at"),
    ({"type": "t", "available_at": "9999-06-01T00:00:00+00:00"}, "available_at"),
    ({"type": "t", "delay_seconds": "5"}, "delay_seconds"),
    ({"type": "t", "delay_seconds": 4e11}, "delay_seconds"),
    ({"type": "t", "delay_seconds": -4e11}, "delay_seconds"),
    ({"type": "t", "timeout_seconds": 0}, "timeout_seconds"),
    ({"type": "t", "timeout_seconds": -1}, "timeout_seconds"),
    ({"type": "t", "timeout_seconds": 31536001}, "timeout_seconds"),
    ({"type": "t", "timeout_seconds": "10"}, "timeout_seconds"),
    ({"type": "t", "expires_at": "2031-01-02T03:04:05"}, "expires_at"),
    ({"type": "t", "expires_at": "9999-06-01T00:00:00Z"}, "expires_at"),
    ({"type": "t", "colour": "blue"}, "colour"),
    ({"type": "t", "then": {"type": "u"}}, "then"),
    ({"type": "t", "weight": 3, "concurrency_key": "c"}, None),
    ({"type": "t", "weight": 1000000, "queue": "tight-per-key"}, None),
    ({"type": "t", "weight": 2, "queue": "tight"}, None),
    ({"type": "t", "weight": 3, "queue": "tight"}, "weight"),
    ({"type": "t", "weight": 4, "queue": "tight-per-key", "concurrency_key": "c"}, "weight"),
    ({"type": "t", "weight": 0}, "weight"),
    ({"type": "t", "weight": -1}, "weight"),
    ({"type": "t", "weight": 1000001}, "weight"),
    ({"type": "t", "weight": 1.5}, "weight"),
    ({"type": "t", "weight": True}, "weight"),
    ({"type": "t", "weight": "2"}, "weight"),
    ({"type": "t", "unique_key": "k", "unique_for": 60}, None),
    ({"type": "t", "unique_key": "k", "unique_for": 0.5, "priority": 2, "delay_seconds": 30}, None),
    ({"type": "t", "unique_key": "k", "debounce": 2.5, "name": "n"}, None),
    ({"type": "t", "unique_key": "k", "unique_for": 0}, "unique_for"),
    ({"type": "t", "unique_key": "k", "unique_for": -5}, "unique_for"),
    ({"type": "t", "unique_key": "k", "unique_for": 31536001}, "unique_for"),
    ({"type": "t", "unique_key": "k", "unique_for": "60"}, "unique_for"),
    ({"type": "t", "unique_key": "k", "unique_for": True}, "unique_for"),
    ({"type": "t", "unique_for": 60}, "unique_for"),
    ({"type": "t", "unique_key": "k", "debounce": 0}, "debounce"),
    ({"type": "t", "unique_key": "k", "debounce": 1e12}, "debounce"),
    ({"type": "t", "debounce": 5}, "debounce"),
    ({"type": "t", "unique_key": "k", "debounce": 5, "unique_for": 5}, "debounce"),
    ({"type": "t", "unique_key": "k", "debounce": 5, "delay_seconds": 5}, "debounce"),
    ({"type": "t", "unique_key": "k", "debounce": 5, "available_at": "2031-01-02T03:04:05+02:00"}, "debounce"),
    ({"type": "t", "tags": ["a", "b"]}, None),
    ({"type": "t", "tags": ["b", "a", "b", "a"]}, None),
    ({"type": "t", "tags": []}, None),
    ({"type": "t", "tags": None}, None),
    ({"type": "t", "tags": ["x" * 64, "é" * 64, "tenant:42"]}, None),
    ({"type": "t", "tags": [f"t{n}" for n in range(16)] + ["t0"]}, None),
    ({"type": "t", "tags": [f"t{n}" for n in range(17)]}, "tags"),
    ({"type": "t", "tags": ["x" * 65]}, "tags"),
    ({"type": "t", "tags": ["ok", ""]}, "tags"),
    ({"type": "t", "tags": [" \u3000"]}, "tags"),
    ({"type": "t", "tags": ["ok", 5]}, "tags"),
    ({"type": "t", "tags": [None]}, "tags"),
    ({"type": "t", "tags": [["nested"]]}, "tags"),
    ({"type": "t", "tags": "a"}, "tags"),
    ({"type": "t", "tags": {"a": 1}}, "tags"),
    ({"type": "t", "tags": 3}, "tags"),
]

#: The Python name of each SQL option.
PYTHON_NAMES = {"delay_seconds": "available_at", "timeout_seconds": "timeout", "expires_at": "expires"}


def _when(value: Any) -> Any:
    """An ISO string as Python's datetime, as a caller would parse it; anything else as it is."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return value
    return value


def python_request(job: dict[str, Any]) -> dict[str, Any]:
    """The schedule_many item a Python producer sends for this SQL API job."""
    item: dict[str, Any] = {}
    for key, value in job.items():
        if key == "group_id" and isinstance(value, str):
            try:
                item[key] = uuid.UUID(value)
            except ValueError:
                item[key] = value
        elif key in ("available_at", "expires_at"):
            item[PYTHON_NAMES.get(key, key)] = _when(value)
        elif key == "delay_seconds":
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            item["available_at"] = timedelta(seconds=value) if numeric else value
        else:
            item[PYTHON_NAMES.get(key, key)] = value
    return item


ROW = (
    "type, queue, name, group_id, unique_key, priority, configuration_data, max_attempts, timeout_seconds,"
    " concurrency_key, expires_at, CASE WHEN available_at > created_at + interval '1 day' THEN available_at END,"
    " round(extract(epoch FROM available_at - created_at)), weight, tags"
)


def _rows(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(f"SELECT {ROW} FROM jobbus.job ORDER BY id").fetchall()


def _count(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM jobbus.job").fetchone()
    assert row is not None
    return int(row[0])


def test_python_and_sql_accept_and_refuse_the_same_jobs_and_store_the_same_rows(dsn: str, sync_app: jobbus.App) -> None:
    disagreements: list[tuple[Any, ...]] = []
    sync_app.sync.set_queue("tight", concurrency=2)  # a job heavier than a limit of its queue is refused
    sync_app.sync.set_queue("tight-per-key", concurrency_per_key=3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for job, field in CASES:
            conn.execute("DELETE FROM jobbus.job")
            python_error = sql_error = None
            try:
                sync_app.sync.schedule_many([python_request(job)])
            except jobbus.InvalidJobError as exc:
                python_error = str(exc)
                assert _count(conn) == 0, job
            python_rows = _rows(conn)
            conn.execute("DELETE FROM jobbus.job")
            try:
                conn.execute("SELECT jobbus.schedule_many(%s)", [Jsonb([job])])
            except psycopg.errors.InvalidParameterValue as exc:
                sql_error = str(exc)
                assert exc.diag.column_name == field, (job, exc.diag.column_name)
                assert _count(conn) == 0, job
            sql_rows = _rows(conn)
            if field is None:
                if python_error or sql_error:
                    disagreements.append((job, python_error, sql_error))
                elif python_rows != sql_rows:
                    disagreements.append((job, python_rows, sql_rows))
            elif python_error is None or sql_error is None:
                disagreements.append((job, python_error, sql_error))
            else:
                assert PYTHON_NAMES.get(field, field) in python_error, (job, python_error)
                assert field in sql_error, (job, sql_error)
    assert disagreements == []


def test_schedule_takes_type_configuration_and_options(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            'SELECT jobbus.schedule(\'mail.send\', \'{"to": "a@example.com"}\', \'{"queue": "mail", "priority": 2}\')'
        ).fetchone()
        assert row is not None and isinstance(row[0], uuid.UUID) and row[0].version == 7
        stored = conn.execute("SELECT type, queue, priority, configuration_data FROM jobbus.job").fetchone()
        assert stored == ("mail.send", "mail", 2, {"to": "a@example.com"})
        (plain,) = conn.execute("SELECT jobbus.schedule('bare')").fetchone() or (None,)
        assert plain is not None
        # expires_at is a time; Python's `expires` also takes seconds, which the SQL API has no key for.
        for options, field in (
            ('{"delay_seconds": 1e300}', "delay_seconds"),  # no timedelta holds it: SQL alone
            ('{"expires_at": 60}', "expires_at"),
            ('{"type": "x"}', "type"),
            ('{"configuration": {}}', "configuration"),
            ("[]", "options"),
        ):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
                conn.execute("SELECT jobbus.schedule('t', '{}', %s)", [options])
            assert refused.value.diag.column_name == field
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="queue must not be empty"):
            conn.execute("SELECT jobbus.schedule('t', '{}', '{\"queue\": \"\"}')")
        assert _count(conn) == 2


def test_null_configuration_and_options_mean_none_given(dsn: str) -> None:
    """A driver passes NULL (Go's nil map, JavaScript's null) for an argument it has nothing for."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for arguments in ("'t', NULL, NULL", "'t', 'null', 'null'", "'t', '{}', NULL"):
            row = conn.execute(f"SELECT jobbus.schedule({arguments})").fetchone()
            assert row is not None and isinstance(row[0], uuid.UUID), arguments
        rows = conn.execute("SELECT DISTINCT type, queue, priority, max_attempts, configuration_data FROM jobbus.job")
        assert rows.fetchall() == [("t", "default", 0, 3, {})]


def test_schedule_many_returns_ids_in_input_order_and_dedupes(dsn: str, sync_app: jobbus.App) -> None:
    held = sync_app.sync.schedule("t", unique_key="held")
    jobs = [
        {"type": "t", "unique_key": "z"},
        {"type": "t"},
        {"type": "t", "unique_key": "held"},
        {"type": "a"},
        {"type": "t", "unique_key": "z"},
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute("SELECT * FROM jobbus.schedule_many(%s)", [Jsonb(jobs)]).fetchall()]
        assert len(ids) == 5 and ids[2] == held and ids[0] == ids[4] and len(set(ids)) == 4
        types: dict[uuid.UUID, str] = dict(conn.execute("SELECT id, type FROM jobbus.job").fetchall())
        assert [types[i] for i in ids] == ["t", "t", "t", "a", "t"]
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"jobs\[1\]\.priority"):
            conn.execute("SELECT jobbus.schedule_many(%s)", [Jsonb([{"type": "ok"}, {"type": "t", "priority": "x"}])])
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"jobs\[0\] must be a JSON object"):
            conn.execute("SELECT jobbus.schedule_many('[3]')")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="jobs must be a JSON array"):
            conn.execute("SELECT jobbus.schedule_many('{}')")
        assert _count(conn) == 5 - 1  # the held job, z, the plain t and a
        assert conn.execute("SELECT count(*) FROM jobbus.schedule_many('[]')").fetchone() == (0,)


def test_a_trigger_enqueues_in_the_inserting_transaction_and_a_rollback_leaves_nothing(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.signup (id serial PRIMARY KEY, email text NOT NULL)")
        conn.execute(
            """
            CREATE FUNCTION public.welcome() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM jobbus.schedule('mail.welcome', jsonb_build_object('email', NEW.email),
                                        jsonb_build_object('unique_key', 'welcome:' || NEW.id));
                RETURN NEW;
            END $$;
            CREATE TRIGGER signup_welcome AFTER INSERT ON public.signup
                FOR EACH ROW EXECUTE FUNCTION public.welcome();
            """
        )
        with conn.transaction():
            conn.execute("INSERT INTO public.signup (email) VALUES ('ada@example.com')")
            inside = conn.execute("SELECT configuration_data FROM jobbus.job").fetchall()
            assert inside == [({"email": "ada@example.com"},)]
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("INSERT INTO public.signup (email) VALUES ('bob@example.com')")
            raise RuntimeError("the request failed")
        assert conn.execute("SELECT configuration_data ->> 'email' FROM jobbus.job").fetchall() == [
            ("ada@example.com",)
        ]


def test_a_job_naming_a_group_that_has_a_callback_is_refused_also_from_a_trigger(
    dsn: str, sync_app: jobbus.App
) -> None:
    group, _ = sync_app.sync.schedule_group([jobbus.JobRequest("t")], then=jobbus.JobRequest("merge"))
    job = {"type": "t", "group_id": str(group)}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.upload (group_id uuid NOT NULL)")
        conn.execute(
            """
            CREATE FUNCTION public.process_upload() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM jobbus.schedule('t', '{}', jsonb_build_object('group_id', NEW.group_id));
                RETURN NEW;
            END $$;
            CREATE TRIGGER upload_process AFTER INSERT ON public.upload
                FOR EACH ROW EXECUTE FUNCTION public.process_upload();
            """
        )
        for statement, params in (
            ("SELECT jobbus.schedule('t', '{}', %s)", [Jsonb({"group_id": str(group)})]),
            ("SELECT jobbus.schedule_many(%s)", [Jsonb([job])]),
            ("INSERT INTO public.upload VALUES (%s)", [group]),
        ):
            with pytest.raises(psycopg.Error, match="has a callback") as refused:
                conn.execute(statement, params)
            assert refused.value.sqlstate == "JB409", statement
        assert conn.execute("SELECT count(*) FROM jobbus.job WHERE group_id = %s", [group]).fetchone() == (1,)
        assert conn.execute("SELECT remaining FROM jobbus.job_group WHERE group_id = %s", [group]).fetchone() == (1,)


def _race(dsn: str, app: jobbus.App, key: str) -> list[uuid.UUID]:
    """Two SQL and two Python producers schedule `key` at once; the ids each got back."""
    barrier = threading.Barrier(4)
    ids: list[uuid.UUID] = []
    errors: list[BaseException] = []

    def sql_producer() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                barrier.wait()
                row = conn.execute("SELECT jobbus.schedule('t', '{}', %s)", [Jsonb({"unique_key": key})]).fetchone()
                assert row is not None
                ids.append(row[0])
        except BaseException as exc:
            errors.append(exc)

    def python_producer() -> None:
        try:
            barrier.wait()
            ids.append(app.sync.schedule("t", unique_key=key))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (sql_producer, sql_producer, python_producer, python_producer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    return ids


def test_concurrent_sql_and_python_producers_on_one_unique_key_create_one_job(dsn: str, sync_app: jobbus.App) -> None:
    for round_ in range(20):
        ids = _race(dsn, sync_app, f"race-{round_}")
        assert len(ids) == 4 and len(set(ids)) == 1, ids
    with psycopg.connect(dsn) as conn:
        assert _count(conn) == 20


def test_an_idle_worker_is_woken_by_a_sql_scheduled_job(dsn: str) -> None:
    prepare(dsn)
    proc = start_worker(dsn, "--poll-interval", "30")
    try:
        # Idle: registered and past its first (empty) claim.
        wait_until(lambda: _registered(dsn), timeout=60, what="the worker to register")
        time.sleep(2)
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT jobbus.schedule('record')").fetchone()
            assert row is not None
            job_id = row[0]
            sent = time.monotonic()
        wait_until(lambda: _status(dsn, job_id) == "completed", timeout=20, what="the job to run")
        # Far within the 30 s poll interval: only the notification can have woken it.
        assert time.monotonic() - sent < 20
    finally:
        proc.terminate()
        finish(proc)


def _registered(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM jobbus.worker WHERE state = 'running'").fetchone()
    return bool(row and row[0])


def _status(dsn: str, job_id: uuid.UUID) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else str(row[0])


def _url(dsn: str) -> str:
    """The connection string as a URL, the form node-postgres reads."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    user, host, port = info.get("user", "postgres"), info.get("host", "127.0.0.1"), info.get("port", 5432)
    return f"postgresql://{user}@{host}:{port}/{info['dbname']}"


def _node_example() -> str:
    text = (ROOT / "docs" / "sql.md").read_text(encoding="utf-8")
    start = text.index("```js\n") + len("```js\n")
    return text[start : text.index("```", start)]


@pytest.mark.server  # needs a TCP server (the embedded one listens on a socket only)
def test_the_node_example_of_docs_sql_md_runs(dsn: str, tmp_path: Path) -> None:
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip("node and npm are not installed")
    installed = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--silent", "pg@8"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    if installed.returncode != 0:
        pytest.skip(f"npm could not install pg: {installed.stderr.strip()[:200]}")
    (tmp_path / "enqueue.js").write_text(_node_example(), encoding="utf-8")
    result = subprocess.run(
        [node, "enqueue.js"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "DATABASE_URL": _url(dsn)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.strip().splitlines()
    job_id = uuid.UUID(first)
    assert second.startswith("refused: priority: priority must be an integer")
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT type, queue, unique_key, configuration_data FROM jobbus.job").fetchone()
        assert conn.execute("SELECT id FROM jobbus.job").fetchall() == [(job_id,)]
    assert row == ("mail.send", "mail", "welcome:ada", {"to": "ada@example.com"})


def test_the_producer_role_may_call_the_sql_api(dsn: str) -> None:
    kinds = ("worker", "operator", "observer", "producer")
    with granted_roles(dsn, kinds) as roles, psycopg.connect(roles["producer"], autocommit=True) as conn:
        first = conn.execute("SELECT jobbus.schedule('t', '{}', '{\"unique_key\": \"k\"}')").fetchone()
        again = conn.execute('SELECT * FROM jobbus.schedule_many(\'[{"type": "t", "unique_key": "k"}]\')').fetchone()
        assert first is not None and first == again
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE jobbus.job SET priority = 1")


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
    st.text(alphabet=st.sampled_from(" \t\x1c\x85\xa0\u2000\u200b\u3000x"), max_size=3),
    st.sampled_from(
        ["2031-01-02T03:04:05+02:00", "2031-01-02T03:04:05", "2031-01-02", "0190c0de-0000-7000-8000-000000000001"]
    ),
    st.lists(st.one_of(st.sampled_from(["a", "b", " ", "x" * 64, "y" * 65]), st.integers(0, 3)), max_size=18),
    st.lists(st.sampled_from([f"t{n}" for n in range(20)]), max_size=20),
)
_KEYS = st.sampled_from(
    [
        "queue",
        "priority",
        "name",
        "unique_key",
        "group_id",
        "max_attempts",
        "available_at",
        "delay_seconds",
        "timeout_seconds",
        "concurrency_key",
        "expires_at",
        "weight",
        "unique_for",
        "debounce",
        "tags",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(options=st.dictionaries(_KEYS, _VALUES, max_size=3), job_type=st.sampled_from(["t", "", " ", 5]))
def test_python_and_sql_agree_on_generated_jobs(
    dsn: str, sync_app: jobbus.App, options: dict[str, Any], job_type: Any
) -> None:
    job = {"type": job_type, **options}
    if isinstance(job.get("expires_at"), int | float) and not isinstance(job.get("expires_at"), bool):
        job["expires_at"] = str(job["expires_at"])  # a number is seconds to Python and no time to SQL
    if "available_at" in job and "delay_seconds" in job:
        del job["delay_seconds"]  # one Python option
    try:
        python_request_ok = True
        sync_app.sync.schedule_many([python_request(job)])
    except jobbus.InvalidJobError:
        python_request_ok = False
    except (OverflowError, ValueError):  # timedelta() of the test's own translation
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            sql_ok = True
            conn.execute("SELECT jobbus.schedule_many(%s)", [Jsonb([job])])
        except psycopg.errors.InvalidParameterValue:
            sql_ok = False
    assert python_request_ok == sql_ok, job


def test_a_compressible_configuration_is_measured_as_the_worker_would_load_it(dsn: str, sync_app: jobbus.App) -> None:
    """60 MB of repetitive JSON is stored as well under a megabyte: the claim compares max_payload_bytes
    with its JSON text, so the worker is never handed it (it was, by its stored size)."""
    from tests.storehelpers import claim

    blob = {"rows": ["the same line of an export"] * 2_000_000}
    small = {"rows": ["x" * 100] * 5}
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT jobbus.schedule('t', %s, '{\"priority\": 1}')", (Jsonb(blob),))
        conn.execute("SELECT jobbus.schedule('t', %s)", (Jsonb(small),))
        (stored,) = conn.execute(
            "SELECT pg_column_size(configuration_data) FROM jobbus.job WHERE priority = 1"
        ).fetchone() or (0,)
        assert stored < 2**20  # what the guard used to compare
        big, fine = claim(sync_app, conn, 2)
    assert big.configuration_data is None
    assert big.oversized_bytes is not None and big.oversized_bytes > 50_000_000
    assert fine.oversized_bytes is None and fine.configuration_data == small
