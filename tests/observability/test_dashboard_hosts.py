"""The dashboard answers only to its own names (DNS rebinding): loopback ones, `allowed_hosts`, or any
with a token and no `allowed_hosts`. Over HTTP through the real ASGI application."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jobbus
from jobbus.dashboard import create_app
from jobbus.dashboard.security import HostGuard, host_name, is_loopback
from tests.observability.test_dashboard import client, csrf_of

LOOPBACK = [
    "127.0.0.1:8787",
    "localhost:8787",
    "LOCALHOST",
    "localhost.",
    "[::1]:8787",
    "[::1]",
    "127.3.2.1",
    "app.localhost",
]
FOREIGN = [
    "evil.example:8787",
    "evil.example",
    "10.0.0.5:8787",
    "[2001:db8::1]:8787",
    "0.0.0.0:8787",
    "localhost.evil.example",
]
MALFORMED = ["", "evil example", "[::1", "[::1]x", "a:b", "127.0.0.1:8787:1", "*", "@evil.example"]


@pytest.fixture
async def jobs(dsn: str) -> AsyncIterator[tuple[jobbus.App, list[Any]]]:
    app = jobbus.App(dsn=dsn)
    async with app:
        ids = await app.schedule_many("mail.send", [{"n": n} for n in range(2)])
    yield app, ids


async def test_without_a_token_only_loopback_names_are_answered(jobs: tuple[jobbus.App, list[Any]]) -> None:
    app, [job_id, _] = jobs
    asgi = create_app(app)
    async with client(asgi) as http:
        for host in LOOPBACK:
            response = await http.get("/jobs", headers={"host": host})
            assert response.status_code == 200, host
        for host in [*FOREIGN, *MALFORMED]:
            for path in ["/", "/jobs", f"/jobs/{job_id}", "/events", "/health", "/static/live.js", "/login"]:
                response = await http.get(path, headers={"host": host})
                assert response.status_code == 400, (host, path)
                assert "csrf" not in response.text and "jobbus_csrf" not in response.headers.get("set-cookie", "")
        # The rebinding page's POST: same-origin for the browser, with the CSRF cookie it read before.
        token = csrf_of((await http.get(f"/jobs/{job_id}")).text)
        refused = await http.post(
            f"/jobs/{job_id}/cancel",
            data={"csrf": token, "next": "/"},
            headers={"host": "evil.example:8787", "origin": "http://evil.example:8787"},
        )
        assert refused.status_code == 400
        async with app:
            assert (await app.find(job_id)).status is jobbus.JobStatus.QUEUED  # type: ignore[union-attr]
        done = await http.post(f"/jobs/{job_id}/cancel", data={"csrf": token, "next": "/"})
        assert done.status_code == 303
        async with app:
            assert (await app.find(job_id)).status is jobbus.JobStatus.CANCELLED  # type: ignore[union-attr]
    await asgi.state.dashboard.close()


async def test_allowed_hosts_add_names_and_apply_with_a_token_too(jobs: tuple[jobbus.App, list[Any]]) -> None:
    app, _ = jobs
    allowed = create_app(app, allowed_hosts=["Jobs.Example.com", ".internal.example", "10.0.0.5", "[2001:db8::1]"])
    async with client(allowed) as http:
        for host in ["jobs.example.com", "JOBS.example.com:443", "internal.example", "a.b.internal.example:8080",
                     "10.0.0.5:8787", "[2001:db8::1]:8787", "localhost:8787"]:  # fmt: skip
            assert (await http.get("/jobs", headers={"host": host})).status_code == 200, host
        for host in ["evil.example", "example.com", "badinternal.example", "jobs.example.com.evil.example"]:
            assert (await http.get("/jobs", headers={"host": host})).status_code == 400, host
    await allowed.state.dashboard.close()

    bearer = {"authorization": "Bearer s3cret-token"}
    with_token = create_app(app, token="s3cret-token")  # a token and no allowed_hosts: any name
    async with client(with_token) as http:
        assert (await http.get("/jobs", headers={"host": "jobs.example.com", **bearer})).status_code == 200
        assert (await http.get("/jobs", headers={"host": "jobs.example.com"})).status_code == 401
    await with_token.state.dashboard.close()

    both = create_app(app, token="s3cret-token", allowed_hosts=["jobs.example.com"])
    async with client(both) as http:
        assert (await http.get("/jobs", headers={"host": "jobs.example.com", **bearer})).status_code == 200
        assert (await http.get("/jobs", headers={"host": "127.0.0.1:8787", **bearer})).status_code == 200
        assert (await http.get("/jobs", headers={"host": "evil.example", **bearer})).status_code == 400
    await both.state.dashboard.close()

    anything = create_app(app, allowed_hosts=["*"])
    async with client(anything) as http:
        assert (await http.get("/jobs", headers={"host": "evil.example"})).status_code == 200
    await anything.state.dashboard.close()


def test_allowed_hosts_entries_are_checked_when_the_dashboard_is_made() -> None:
    app = jobbus.App(dsn="postgresql://nowhere/none")
    for entry in ["jobs.example.com:443", "[::1]:8787", "", "a b", "http://jobs.example.com", "a/b"]:
        with pytest.raises(ValueError, match="allowed host"):
            create_app(app, allowed_hosts=[entry])
    with pytest.raises(TypeError, match="list of host names"):
        create_app(app, allowed_hosts="jobs.example.com")


_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_names = st.lists(_label, min_size=1, max_size=4).map(".".join)
_hosts = st.one_of(_names, _names.map(lambda name: f"{name}.localhost"), _names.map(lambda name: f"localhost.{name}"))


async def _nothing(scope: Any, receive: Any, send: Any) -> None:
    return None


@given(name=_hosts, port=st.none() | st.integers(0, 65535), upper=st.booleans())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_name_but_a_loopback_one_is_refused_without_a_token(name: str, port: int | None, upper: bool) -> None:
    guard = HostGuard(_nothing, allowed_hosts=None, guarded=False)
    header = (name.upper() if upper else name) + (f":{port}" if port is not None else "")
    assert host_name(header) == name
    loopback = name == "localhost" or name.endswith(".localhost")
    with contextlib.suppress(ValueError):
        loopback = loopback or ipaddress.ip_address(name).is_loopback
    assert guard.allows(header) is loopback
    assert HostGuard(_nothing, allowed_hosts=[name], guarded=False).allows(header)
    assert HostGuard(_nothing, allowed_hosts=None, guarded=True).allows(header)


@given(address=st.ip_addresses(), port=st.none() | st.integers(0, 65535))
def test_addresses_are_loopback_only_in_127_0_0_0_8_and_1(address: Any, port: int | None) -> None:
    text = f"[{address}]" if address.version == 6 else str(address)
    header = text + (f":{port}" if port is not None else "")
    name = host_name(header)
    assert name == str(address)
    mapped = getattr(address, "ipv4_mapped", None)
    assert is_loopback(name) is (address.is_loopback or (mapped is not None and mapped.is_loopback))
