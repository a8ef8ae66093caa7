"""`jobbus keys rotate` (SPEC 22): every stored payload re-encrypted with the newest key, online, with
workers writing the same rows; a rotation killed halfway (SIGKILL) loses nothing and resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest

import jobbus
from jobbus.encryption import MARKER, generate_key, key_id, parse_key
from tests.conftest import FAST
from tests.processes import ROOT, query, wait_until, workers

OLD_KEY = generate_key()
NEW_KEY = generate_key()
NEW_ID = key_id(parse_key(NEW_KEY, 0))


def rotate(dsn: str, *args: str, keys: str = f"{NEW_KEY},{OLD_KEY}") -> subprocess.Popen[str]:
    env = {**os.environ, "JOBBUS_DSN": dsn, "JOBBUS_ENCRYPTION_KEYS": keys, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "jobbus", "keys", "rotate", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def not_newest(dsn: str) -> dict[str, int]:
    """Payloads stored neither empty nor under the newest key, per place."""
    done = f"1.{NEW_ID}.%"

    def count(sql: str) -> int:
        return int(query(dsn, sql, (done,) * sql.count("%s"))[0][0])

    def pending(column: str) -> str:
        sealed = f"coalesce({column} ->> '{MARKER}' LIKE %s, false)"
        return f"NOT ({column} IS NULL OR {column} = '{{}}'::jsonb OR {column} = 'null'::jsonb OR {sealed})"

    return {
        "configuration": count(f"SELECT count(*) FROM jobbus.job WHERE {pending('configuration_data')}"),
        "execution": count(
            f"SELECT count(*) FROM jobbus.job WHERE {pending('execution_data')} AND execution_data - '_trace' <> '{{}}'"
        ),
        "result": count(f"SELECT count(*) FROM jobbus.job WHERE {pending('result')}"),
        "steps": count(f"SELECT count(*) FROM jobbus.job_step WHERE {pending('result')} AND name = 'copy'"),
        "follow_ups": count(
            "SELECT count(*) FROM jobbus.job_follow_up"
            f" WHERE NOT coalesce(spec -> 'configuration' ->> '{MARKER}' LIKE %s, false)"
        ),
        "groups": count(
            f"SELECT count(*) FROM jobbus.job_group WHERE scheduled_at IS NULL"
            f" AND NOT coalesce(spec -> 'configuration' ->> '{MARKER}' LIKE %s, false)"
        ),
    }


def test_rotation_killed_halfway_resumes_and_leaves_every_payload_under_the_newest_key(dsn: str) -> None:
    old = jobbus.App(dsn=dsn, encryption_keys=[OLD_KEY], **FAST)
    plain = jobbus.App(dsn=dsn, **FAST)
    expected: dict[uuid.UUID, dict[str, Any]] = {}

    @old.job("enc.echo")
    async def echo(job: jobbus.JobExecution) -> Any:
        configuration = dict(job.configuration)
        await job.checkpoint({"seen": configuration})
        stepped = await job.step("copy", lambda: configuration)
        return {"echo": stepped, "checkpoint": job.execution_data}

    with old.sync:
        configurations = [{"n": n, "secret": uuid.uuid4().hex} for n in range(3000)]
        ids = old.sync.schedule_many("enc.echo", configurations)
        expected.update(zip(ids, configurations, strict=True))
        # Some finished already (results, checkpoints and steps under the old key) ...
        old.sync.drain(max_jobs=300, concurrency=10)
        # ... follow-ups and a group callback not scheduled yet ...
        for n in range(20):
            head = old.sync.schedule(
                "enc.later", {"first": n}, then=jobbus.JobRequest("enc.echo", {"then": n, "secret": "s"})
            )
            expected[head] = {"first": n}
        group_id, members = old.sync.schedule_group(
            [jobbus.JobRequest("enc.later", {"member": 1})], then=jobbus.JobRequest("enc.echo", {"callback": 1})
        )
        expected[members[0]] = {"member": 1}
    with plain.sync:
        clear = plain.sync.schedule_many("enc.echo", [{"clear": n} for n in range(50)])
        expected.update((job_id, {"clear": n}) for n, job_id in enumerate(clear))
    before = not_newest(dsn)
    assert before["configuration"] == len(expected) and before["result"] == 300 and before["follow_ups"] == 20

    keys = {"JOBBUS_ENCRYPTION_KEYS": f"{NEW_KEY},{OLD_KEY}"}
    with workers(dsn, 2, "--concurrency", "4", env=keys, app="tests.encryption_apps:app") as fleet:
        first = rotate(dsn, "--batch-size", "20")
        wait_until(
            lambda: not_newest(dsn)["configuration"] < before["configuration"] - 400,
            what="the rotation to re-encrypt some jobs",
        )
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert first.returncode == -signal.SIGKILL
        halfway = not_newest(dsn)
        assert halfway["configuration"] > 0, halfway  # killed before the end
        second = rotate(dsn, "--batch-size", "200", "--json")
        out, err = second.communicate(timeout=300)
        assert second.returncode == 0, (out, err)
        report = json.loads(out)
        assert report["complete"] and report["key_id"] == NEW_ID and report["missing_keys"] == {}
        assert "jobs:" not in out and "re-encrypted" not in out  # --json: progress is not on stdout
        # The audit trail: the killed run wrote no entry, the resumed one its own, with what it rewrote.
        assert query(dsn, "SELECT action, target, source, details FROM jobbus.audit_log") == [
            ("rotate_keys", f"key:{NEW_ID}", "cli", {"count": sum(report["rewritten"].values())})
        ]
        assert query(dsn, "SELECT count(*) FROM jobbus.job WHERE status = 'completed'")[0][0] > 300  # they ran
        for proc in fleet:  # stopped gently: their jobs end before they exit
            proc.send_signal(signal.SIGTERM)
        for proc in fleet:
            proc.wait(timeout=60)
    assert not_newest(dsn) == dict.fromkeys(before, 0)

    # Only the newest key is needed now: every job runs and reads back as it was scheduled.
    new_only = jobbus.App(dsn=dsn, encryption_keys=[NEW_KEY], **FAST)

    @new_only.job("enc.echo")
    async def echo_again(job: jobbus.JobExecution) -> Any:
        configuration = dict(job.configuration)
        await job.checkpoint({"seen": configuration})
        stepped = await job.step("copy", lambda: configuration)
        return {"echo": stepped, "checkpoint": job.execution_data}

    @new_only.job("enc.later")
    async def later(job: jobbus.JobExecution) -> Any:
        return dict(job.configuration)

    with new_only.sync:
        new_only.sync.drain(concurrency=20)
        new_only.sync.drain(concurrency=20)  # follow-ups and the group callback scheduled by the first
        jobs = new_only.sync.list_jobs(limit=10_000)
    by_id = {job.id: job for job in jobs}
    assert all(job.status == "completed" for job in jobs), [
        (j.status, j.last_error) for j in jobs if j.status != "completed"
    ][:3]
    for job_id, configuration in expected.items():
        job = by_id[job_id]
        assert job.configuration_data == configuration
        if job.type == "enc.echo":
            assert job.result == {"echo": configuration, "checkpoint": {"seen": configuration}}
            assert job.steps["copy"] == configuration
    followed = [job for job in jobs if job.configuration_data.get("secret") == "s"]
    assert len(followed) == 20 and all(job.result["echo"]["then"] >= 0 for job in followed)
    assert any(job.configuration_data == {"callback": 1} for job in jobs)
    del group_id


def test_rotation_without_keys_is_refused_and_a_missing_key_is_reported(dsn: str) -> None:
    env = {**os.environ, "JOBBUS_DSN": dsn, "PYTHONUNBUFFERED": "1"}
    env.pop("JOBBUS_ENCRYPTION_KEYS", None)
    refused = subprocess.run(
        [sys.executable, "-m", "jobbus", "keys", "rotate"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 78 and "JOBBUS_ENCRYPTION_KEYS" in refused.stderr
    with jobbus.App(dsn=dsn, encryption_keys=[OLD_KEY], **FAST).sync as app:
        job_id = app.schedule("enc.echo", {"x": 1})
    with psycopg.connect(dsn) as conn:
        before = conn.execute("SELECT configuration_data::text FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
    proc = rotate(dsn, keys=NEW_KEY)  # the old key is not listed
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    assert key_id(parse_key(OLD_KEY, 0)) in err and "not listed" in err
    with psycopg.connect(dsn) as conn:
        after = conn.execute("SELECT configuration_data::text FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
    assert after == before  # left as it was


def test_the_configuration_stays_immutable_but_for_a_re_encryption(dsn: str) -> None:
    with jobbus.App(dsn=dsn, encryption_keys=[OLD_KEY], **FAST).sync as app:
        job_id = app.schedule("enc.echo", {"x": 1})
    with psycopg.connect(dsn, autocommit=True) as conn:
        sealed = conn.execute("SELECT configuration_data FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
        assert sealed is not None
        for attempt in ("{}", '{"x": 2}', '{"$jobbus.encrypted": "1.a.i.b", "more": 1}'):
            with pytest.raises(psycopg.errors.CheckViolation, match="immutable"), conn.transaction():
                conn.execute("SELECT set_config('jobbus.rekey', 'on', true)")
                conn.execute("UPDATE jobbus.job SET configuration_data = %s WHERE id = %s", (attempt, job_id))
        with pytest.raises(psycopg.errors.CheckViolation, match="immutable"):  # not without the setting
            conn.execute(
                "UPDATE jobbus.job SET configuration_data = %s WHERE id = %s",
                ('{"$jobbus.encrypted": "1.a.i.b"}', job_id),
            )
        after = conn.execute("SELECT configuration_data FROM jobbus.job WHERE id = %s", (job_id,)).fetchone()
        assert after == sealed
