"""Encryption at rest (SPEC 22): every payload a producer or a worker writes is sealed before it leaves the
process, handlers see clear text, a job whose key is not listed fails its attempt naming the key and loses
nothing, jobs stored in clear still run, and the clear text is in no column of any jobbus table."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jobbus
from jobbus.encryption import MARKER, generate_key, key_id, keyring_of, parse_key, sealed_key_id
from tests.conftest import FAST
from tests.processes import eventually

NEW_KEY = generate_key()
OLD_KEY = generate_key()


def secret() -> str:
    return f"clear-{uuid.uuid4().hex}"


def tables_holding(dsn: str, text: str) -> list[str]:
    """The jobbus tables with a row whose text holds `text`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'jobbus' ORDER BY tablename"
            ).fetchall()
        ]
        return [
            table
            for table in tables
            if conn.execute(
                f"SELECT count(*) FROM jobbus.{table} AS t WHERE strpos(t::text, %s) > 0",
                (text,),
            ).fetchone()[0]  # type: ignore[index]
        ]


def stored(dsn: str, job_id: uuid.UUID, column: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT {column} FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
        assert row is not None
        return row[0]


def encrypted_app(dsn: str, *keys: str) -> jobbus.App:
    return jobbus.App(dsn=dsn, encryption_keys=list(keys or (NEW_KEY,)), **FAST)


async def test_every_payload_written_is_sealed_and_handlers_see_the_clear_text(dsn: str) -> None:
    word = secret()
    app = encrypted_app(dsn)
    seen: dict[str, Any] = {}

    @app.job("enc.parent")
    async def parent(job: jobbus.JobExecution) -> Any:
        seen.setdefault("parent", []).append(dict(job.configuration))
        await job.checkpoint({"checkpoint": word})
        await job.step("step", lambda: {"step": word})
        await job.spawn("enc.leaf", {"from_parent": word})
        children = await job.wait_for_children()
        seen["children"] = [(c.configuration_data, c.result) for c in children]
        return {"result": word}

    @app.job("enc.leaf")
    async def leaf(job: jobbus.JobExecution) -> Any:
        seen.setdefault("leaf", []).append(dict(job.configuration))
        return {"leaf": word}

    async with app:
        parent_id = await app.schedule("enc.parent", {"word": word})
        bulk = await app.schedule_many("enc.leaf", [{"bulk": word, "n": n} for n in range(250)])  # COPY
        small = await app.schedule_many("enc.leaf", [{"small": word}, {"small": word}])  # arrays
        chained = await app.schedule("enc.leaf", {"first": word}, then=jobbus.JobRequest("enc.leaf", {"then": word}))
        group_id, _ = await app.schedule_group(
            [jobbus.JobRequest("enc.leaf", {"member": word})], then=jobbus.JobRequest("enc.leaf", {"callback": word})
        )
        debounced = [
            await app.schedule("enc.leaf", {"debounce": word, "call": call}, unique_key="k", debounce=0.01)
            for call in range(2)
        ]
        keyed = await app.schedule("enc.leaf", {"keyed": word}, unique_key="u", unique_for=60)
        assert tables_holding(dsn, word) == []  # nothing in clear before any job ran
        assert sealed_key_id(stored(dsn, parent_id, "configuration_data")) == key_id(parse_key(NEW_KEY, 0))
        for _ in range(20):
            counts = await app.drain(concurrency=4)
            if not counts:
                break
        assert tables_holding(dsn, word) == []  # nor after every job ran, its results and steps written
        parent_job = await app.find(parent_id)
        assert parent_job is not None and parent_job.status == "completed", parent_job
        assert parent_job.configuration_data == {"word": word}
        assert parent_job.execution_data == {"checkpoint": word}
        assert parent_job.result == {"result": word}
        assert parent_job.steps["step"] == {"step": word}
        for job_id in [*bulk, *small, chained, keyed, *debounced]:
            job = await app.find(job_id)
            assert job is not None and job.status == "completed" and job.result == {"leaf": word}, job
        progress = await app.group_progress(group_id)
        assert progress.completion_percentage == 100
    configurations = [entry for entry in seen["leaf"]]
    assert {"then": word} in configurations and {"callback": word} in configurations
    assert {"from_parent": word} in configurations and {"member": word} in configurations
    assert {"debounce": word, "call": 1} in configurations  # debounce: the last call's configuration
    assert seen["children"] == [({"from_parent": word}, {"leaf": word})]
    assert seen["parent"][0] == {"word": word}


async def test_a_job_whose_key_is_not_listed_fails_its_attempt_naming_the_key_and_loses_nothing(dsn: str) -> None:
    word = secret()
    writer = encrypted_app(dsn, OLD_KEY)
    async with writer:
        job_id = await writer.schedule("enc.leaf", {"word": word}, max_attempts=2)
    before = stored(dsn, job_id, "configuration_data")
    reader = encrypted_app(dsn, NEW_KEY)
    ran: list[Any] = []

    @reader.job("enc.leaf")
    async def leaf(job: jobbus.JobExecution) -> None:
        ran.append(job.configuration)

    async with reader:
        await reader.drain(max_jobs=1)
        job = await reader.find(job_id)
    old_id = key_id(parse_key(OLD_KEY, 0))
    assert job is not None and job.status == "queued" and job.attempts == 1
    assert old_id in (job.last_error or "") and "not among" in (job.last_error or "")
    assert ran == []  # the handler never ran
    assert stored(dsn, job_id, "configuration_data") == before  # untouched
    assert sealed_key_id(job.configuration_data) == old_id  # shown sealed: this App lacks the key
    # Given the key (after the newest), a later attempt runs it.
    both = encrypted_app(dsn, NEW_KEY, OLD_KEY)

    @both.job("enc.leaf")
    async def leaf_again(job: jobbus.JobExecution) -> Any:
        return dict(job.configuration)

    async with both:
        await both.drain()
        done = await both.find(job_id)
    assert done is not None and done.status == "completed" and done.result == {"word": word}
    assert sealed_key_id(stored(dsn, job_id, "result")) == key_id(parse_key(NEW_KEY, 0))


async def test_a_worker_without_keys_fails_sealed_jobs_and_runs_clear_ones(dsn: str) -> None:
    word = secret()
    plain = jobbus.App(dsn=dsn, **FAST)
    async with encrypted_app(dsn) as writer:
        sealed_id = await writer.schedule("enc.leaf", {"word": word}, max_attempts=1)
    async with plain:
        clear_id = await plain.schedule("enc.leaf", {"word": word})

        @plain.job("enc.leaf")
        async def leaf(job: jobbus.JobExecution) -> Any:
            return dict(job.configuration)

        await plain.drain()
        sealed_job = await plain.find(sealed_id)
        clear_job = await plain.find(clear_id)
    assert sealed_job is not None and sealed_job.status == "failed"
    assert key_id(parse_key(NEW_KEY, 0)) in (sealed_job.last_error or "")
    assert clear_job is not None and clear_job.status == "completed" and clear_job.result == {"word": word}
    # Clear jobs still run on a worker with keys, and their result is then sealed.
    async with plain:
        clear_again = await plain.schedule("enc.leaf", {"again": word})
    app = encrypted_app(dsn)

    @app.job("enc.leaf")
    async def leaf2(job: jobbus.JobExecution) -> Any:
        return dict(job.configuration)

    async with app:
        await app.drain()
        job = await app.find(clear_again)
    assert job is not None and job.status == "completed" and job.result == {"again": word}
    assert sealed_key_id(stored(dsn, clear_again, "result")) is not None
    assert stored(dsn, clear_again, "configuration_data") == {"again": word}  # written by a producer without keys


async def test_a_sealed_payload_copied_to_another_row_does_not_open(dsn: str) -> None:
    app = encrypted_app(dsn)

    @app.job("enc.leaf")
    async def leaf(job: jobbus.JobExecution) -> Any:
        return dict(job.configuration)

    async with app:
        first = await app.schedule("enc.leaf", {"who": "first"}, max_attempts=1)
        second = await app.schedule("enc.leaf", {"who": "second"}, max_attempts=1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE jobbus.job DISABLE TRIGGER USER")
            conn.execute(
                "UPDATE jobbus.job SET configuration_data = (SELECT configuration_data FROM jobbus.job WHERE id = %s)"
                " WHERE id = %s",
                (first, second),
            )
            conn.execute("ALTER TABLE jobbus.job ENABLE TRIGGER USER")
        await app.drain()
        copied = await app.find(second)
        original = await app.find(first)
    assert original is not None and original.result == {"who": "first"}
    assert copied is not None and copied.status == "failed"
    assert "does not open" in (copied.last_error or "")


def test_bad_keys_are_refused_with_the_problem_and_never_the_key() -> None:
    short = "c2hvcnQ="
    with pytest.raises(ValueError, match=r"decodes to 5 bytes") as info:
        jobbus.App(dsn="postgresql://x/y", encryption_keys=[short])
    assert short not in str(info.value)
    bad = "not base64 at all!!" * 3
    with pytest.raises(ValueError, match="encryption_keys\\[1\\]") as info:
        jobbus.App(dsn="postgresql://x/y", encryption_keys=[NEW_KEY, bad])
    assert bad not in str(info.value)
    with pytest.raises(ValueError, match="repeats an earlier key"):
        jobbus.App(dsn="postgresql://x/y", encryption_keys=[NEW_KEY, NEW_KEY])
    app = jobbus.App(dsn="postgresql://x/y", encryption_keys=f" {NEW_KEY} ,{OLD_KEY}")
    assert NEW_KEY not in repr(app.settings) and "<2 keys>" in repr(app.settings)
    assert keyring_of(app.settings.encryption_keys) is not None


def test_the_environment_lists_keys_newest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBBUS_ENCRYPTION_KEYS", f"{NEW_KEY},{OLD_KEY}")
    app = jobbus.App(dsn="postgresql://x/y")
    keyring = keyring_of(app.settings.encryption_keys)
    assert keyring is not None and keyring.newest_id == key_id(parse_key(NEW_KEY, 0))
    assert keyring.ids[1] == key_id(parse_key(OLD_KEY, 0))


async def test_max_payload_bytes_bounds_the_payload_as_stored(dsn: str) -> None:
    app = jobbus.App(dsn=dsn, encryption_keys=[NEW_KEY], max_payload_bytes=2000, **FAST)
    async with app:
        await app.schedule("enc.leaf", {"x": "a" * 1300})  # 1310 bytes in clear, ~1850 sealed
        with pytest.raises(jobbus.InvalidJobError, match="once encrypted"):
            await app.schedule("enc.leaf", {"x": "a" * 1500})
        with pytest.raises(jobbus.InvalidJobError, match="once encrypted"):
            await app.schedule_many("enc.leaf", [{"x": "a" * 1500}])
        assert len(await app.list_jobs()) == 1


def test_the_envelope_is_one_marked_key() -> None:
    keyring = keyring_of([NEW_KEY])
    assert keyring is not None
    job_id = uuid.uuid4()
    text = keyring.seal_text('{"a":1}', "configuration", job_id)
    import json

    value = json.loads(text)
    assert list(value) == [MARKER]
    assert keyring.open(value, "configuration", job_id, "t", "x") == {"a": 1}
    assert keyring.seal_text("{}", "configuration", job_id) == "{}"  # nothing to hide
    assert keyring.seal_text('{"a":1}', "configuration", job_id) != text  # a fresh nonce each time
    with pytest.raises(jobbus.JobbusError, match="does not open"):
        keyring.open(value, "result", job_id, "t", "x")  # another field
    for malformed in ("", "1", "1.x", f"1.{keyring.newest_id}.i.!!"):
        with pytest.raises(jobbus.JobbusError):
            keyring.open({MARKER: malformed}, "configuration", job_id, "t", "x")


async def test_the_cli_and_the_dashboard_show_payloads_only_with_the_key(dsn: str) -> None:
    import httpx

    from jobbus.dashboard import create_app
    from tests.cli import jobbus as run_cli

    word = secret()
    app = encrypted_app(dsn)

    @app.job("enc.leaf")
    async def leaf(job: jobbus.JobExecution) -> Any:
        await job.step("s", lambda: {"step": word})
        return {"result": word}

    async with app:
        job_id = await app.schedule("enc.leaf", {"word": word})
        await app.drain()
    kid = key_id(parse_key(NEW_KEY, 0))
    hidden = f"<encrypted with key {kid}, not held here>"

    shown = run_cli(dsn, "jobs", "show", str(job_id), JOBBUS_ENCRYPTION_KEYS=NEW_KEY)
    assert shown.returncode == 0, shown.stderr
    assert word in shown.stdout and hidden not in shown.stdout
    for args in (("jobs", "show", str(job_id)), ("jobs", "show", str(job_id), "--json"), ("jobs", "list", "--json")):
        without = run_cli(dsn, *args)
        assert without.returncode == 0, without.stderr
        assert word not in without.stdout and hidden in without.stdout, args
        assert "$jobbus.encrypted" not in without.stdout  # no ciphertext either
    listed = run_cli(dsn, "jobs", "list", "--json", JOBBUS_ENCRYPTION_KEYS=NEW_KEY)
    assert word in listed.stdout

    for keys, visible in (([NEW_KEY], True), ([], False)):
        asgi = create_app(jobbus.App(dsn=dsn, encryption_keys=keys))
        try:
            transport = httpx.ASGITransport(app=asgi)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
                page = (await http.get(f"/jobs/{job_id}")).text
                listing = (await http.get("/jobs?status=completed")).text
        finally:
            await asgi.state.dashboard.close()
        assert (word in page) is visible and (word in listing) is visible
        assert ("not held here" in page) is not visible and ("not held here" in listing) is not visible
        assert "$jobbus.encrypted" not in page


async def test_no_log_line_holds_a_payload(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    word = secret()
    caplog.set_level(logging.DEBUG)
    writer = encrypted_app(dsn, OLD_KEY)
    async with writer:
        failing = await writer.schedule("enc.leaf", {"word": word}, max_attempts=1)
    app = encrypted_app(dsn)

    @app.job("enc.leaf")
    async def leaf(job: jobbus.JobExecution) -> Any:
        return {"result": word}

    async with app:
        ok = await app.schedule("enc.leaf", {"word": word})
        await app.drain()
        assert (await app.find(ok)).status == "completed"  # type: ignore[union-attr]
        assert (await app.find(failing)).status == "failed"  # type: ignore[union-attr]
    assert caplog.records and not [r for r in caplog.records if word in r.getMessage()]
    assert NEW_KEY not in caplog.text and OLD_KEY not in caplog.text


async def test_a_spawn_is_the_same_child_in_every_run_of_the_handler(dsn: str) -> None:
    app = encrypted_app(dsn)
    spawned: list[uuid.UUID] = []

    @app.job("enc.spawner")
    async def spawner(job: jobbus.JobExecution) -> None:
        spawned.append(await job.spawn("enc.child", {"same": 1}))
        await job.sleep("again", 0.2)  # parks: the handler runs again from the top

    @app.job("enc.child")
    async def child(job: jobbus.JobExecution) -> None:
        return None

    async with app:
        parent = await app.schedule("enc.spawner")

        async def finished() -> bool:
            await app.drain()
            job = await app.find(parent)
            return job is not None and job.status == "completed"

        await eventually(finished, what="the spawner to finish")
    assert len(spawned) == 2 and spawned[0] == spawned[1]


@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=20,
    ),
    flip=st.integers(min_value=0),
)
@settings(max_examples=200, deadline=None)
def test_any_payload_opens_as_written_and_any_altered_bit_is_refused(value: Any, flip: int) -> None:
    import base64
    import json

    from jobbus.jsontext import dumps

    keyring = keyring_of([NEW_KEY, OLD_KEY])
    assert keyring is not None
    job_id = uuid.uuid4()
    text = dumps(value)
    sealed_text = keyring.seal_text(text, "result", job_id)
    if text in ("{}", "null"):
        assert sealed_text == text
        return
    sealed = json.loads(sealed_text)
    assert keyring.open(sealed, "result", job_id, "t", "x") == json.loads(text)
    body = sealed[MARKER]
    prefix = body.rsplit(".", 1)[0] + "."
    raw = bytearray(base64.urlsafe_b64decode(body[len(prefix) :]))
    raw[flip % len(raw)] ^= 1 << (flip % 8)  # one bit of the nonce, the ciphertext or the tag
    altered = base64.urlsafe_b64encode(bytes(raw)).decode()
    with pytest.raises(jobbus.JobbusError):
        keyring.open({MARKER: prefix + altered}, "result", job_id, "t", "x")
    with pytest.raises(jobbus.JobbusError):
        keyring.open(sealed, "result", uuid.uuid4(), "t", "x")  # another job


def test_reconfigure_takes_keys_as_app_does() -> None:
    app = jobbus.App(dsn="postgresql://x/y")
    app.reconfigure(encryption_keys=[NEW_KEY])
    assert app.settings.encryption_keys == (NEW_KEY,)
    app.reconfigure(encryption_keys=f"{NEW_KEY},{OLD_KEY}")
    assert list(app.settings.encryption_keys) == [NEW_KEY, OLD_KEY]
    with pytest.raises(ValueError, match="decodes to"):
        app.reconfigure(encryption_keys=["c2hvcnQ="])
