"""The dashboard's roles: every route declares the one it needs and the server enforces it for every
route, whatever the form carries; tokens per role; users named by a trusted proxy only."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from starlette.requests import Request
from starlette.routing import Mount, Route

import jobbus
from jobbus.dashboard import Actor, Role, actor_of, create_app, load_role_map
from jobbus.dashboard.roles import HOST_ACTOR_KEY, PUBLIC, required_role
from jobbus.dashboard.security import Guard
from tests.observability.test_dashboard import BASE, PAGES, csrf_of, seed

TOKENS = {"admin": "adm1n-t0ken", "operator": "0per-t0ken", "viewer": "v1ew-t0ken"}
#: The value each path parameter of a route takes in these tests (a job the seed left failed).
PARAMS = {"queue": "reports", "verb": "pause", "name": "nightly"}


@pytest.fixture
async def dashboard(dsn: str) -> AsyncIterator[tuple[dict[str, Any], Any]]:
    data = seed(dsn)
    asgi = create_app(
        jobbus.App(dsn=dsn), token=TOKENS["admin"], operator_token=TOKENS["operator"], viewer_token=TOKENS["viewer"]
    )
    yield data, asgi
    await asgi.state.dashboard.close()


def client(asgi: Any, *, peer: str = "127.0.0.1", **kwargs: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=asgi, client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url=BASE, **kwargs)


async def logged_in(http: httpx.AsyncClient, token: str) -> str:
    """Log `http` in with `token` (the session cookie) and return its CSRF token."""
    csrf = csrf_of((await http.get("/login")).text)
    response = await http.post("/login", data={"csrf": csrf, "token": token, "next": "/"})
    assert response.status_code == 303, response.text
    return csrf


def concrete(path: str, job_id: uuid.UUID) -> str:
    """A route's path with its parameters filled in."""
    return re.sub(r"{(\w+)(?::\w+)?}", lambda m: str(job_id) if m[1] == "job_id" else PARAMS[m[1]], path)


def posting_routes(asgi: Any) -> list[tuple[str, Role | str]]:
    return [
        (route.path, required_role(route.endpoint))
        for route in asgi.routes
        if isinstance(route, Route) and "POST" in (route.methods or ())
    ]


def state(dsn: str, job_id: uuid.UUID) -> tuple[Any, ...]:
    """What an action would change: the job, the queue's pause and limits, the periodic job, commands."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT status FROM jobbus.job WHERE id = %s),"
            " (SELECT count(*) FROM jobbus.job),"
            " (SELECT count(*) FROM jobbus.queue_setting),"
            " (SELECT enabled FROM jobbus.periodic WHERE name = 'nightly'),"
            " (SELECT count(*) FROM jobbus.command)",
            (job_id,),
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_every_route_declares_the_role_it_needs(dsn: str) -> None:
    asgi = create_app(jobbus.App(dsn=dsn))
    routes = [route for route in asgi.routes if isinstance(route, Route | Mount)]
    assert len(routes) == len(asgi.routes)
    declared = {
        route.path: required_role(route.endpoint if isinstance(route, Route) else route.app) for route in routes
    }
    # Anyone may log in and out, check health and fetch the stylesheet; nothing else is public.
    assert {path for path, role in declared.items() if role == PUBLIC} == {"/login", "/logout", "/health", "/static"}
    for route in routes:
        if isinstance(route, Route) and route.methods and route.methods - {"GET", "HEAD"}:
            assert declared[route.path] in (Role.OPERATOR, Role.ADMIN, PUBLIC), route.path
        elif isinstance(route, Route) and declared[route.path] != PUBLIC:
            assert declared[route.path] is Role.VIEWER, route.path  # every page is for reading
    admin = {path for path, role in declared.items() if role is Role.ADMIN}
    assert admin == {"/queues/{queue:path}/limits", "/periodic/{name:path}/{verb}"}


def test_a_route_without_a_role_is_found() -> None:
    with pytest.raises(LookupError, match="declares no role"):
        required_role(lambda request: None)


async def test_a_viewer_posts_nothing_even_with_its_session_and_csrf_token(
    dsn: str, dashboard: tuple[dict[str, Any], Any]
) -> None:
    data, asgi = dashboard
    job_id = data["failed"][0]
    before = state(dsn, job_id)
    routes = [(path, role) for path, role in posting_routes(asgi) if role != PUBLIC]
    assert len(routes) >= 10
    async with client(asgi) as browser, client(asgi, headers={"authorization": f"Bearer {TOKENS['viewer']}"}) as api:
        csrf = await logged_in(browser, TOKENS["viewer"])
        for path, _ in routes:
            url = concrete(path, job_id)
            form = {"csrf": csrf, "next": "/", "action": "retry", "ids": [str(job_id)], "scope": "selected"}
            form |= {"set_priority": "5", "concurrency": "1", "confirm": "1", "pattern": "x"}
            refused = await browser.post(url, data=form)
            assert refused.status_code == 403, (url, refused.status_code)
            assert "needs the operator role" in refused.text or "needs the admin role" in refused.text
            assert (await api.post(url, data=form)).status_code == 403, url
        for path in PAGES:  # and reads every page
            assert (await browser.get(path)).status_code == 200, path
    assert state(dsn, job_id) == before


async def test_an_operator_acts_on_jobs_workers_and_queues_but_reaches_no_admin_route(
    dsn: str, dashboard: tuple[dict[str, Any], Any]
) -> None:
    data, asgi = dashboard
    job_id = data["failed"][0]
    async with client(asgi) as browser:
        csrf = await logged_in(browser, TOKENS["operator"])
        before = state(dsn, job_id)
        for path, role in posting_routes(asgi):
            if role is Role.ADMIN:
                form = {"csrf": csrf, "next": "/", "concurrency": "1"}
                refused = await browser.post(concrete(path, job_id), data=form)
                assert refused.status_code == 403 and "needs the admin role" in refused.text, path
        assert state(dsn, job_id) == before
        retried = await browser.post(f"/jobs/{job_id}/retry", data={"csrf": csrf, "next": "/"})
        assert retried.status_code == 303
        paused = await browser.post("/queues/reports/pause", data={"csrf": csrf, "next": "/"})
        assert paused.status_code == 303
        drained = await browser.post("/workers/action", data={"csrf": csrf, "next": "/", "action": "drain"})
        assert drained.status_code == 303
    status, _jobs, limits, enabled, commands = state(dsn, job_id)
    assert status == "queued" and limits == 0 and enabled is True and commands == before[4] + 2


async def test_an_admin_sets_limits_and_periodic_jobs(dsn: str, dashboard: tuple[dict[str, Any], Any]) -> None:
    data, asgi = dashboard
    async with client(asgi, headers={"authorization": f"Bearer {TOKENS['admin']}"}) as api:
        assert (await api.post("/queues/reports/limits", data={"concurrency": "2"})).status_code == 303
        assert (await api.post("/periodic/nightly/pause")).status_code == 303
    _, _, limits, enabled, _ = state(dsn, data["failed"][0])
    assert limits == 1 and enabled is False


async def test_each_role_sees_only_the_controls_it_may_use_and_who_it_is(
    dsn: str, dashboard: tuple[dict[str, Any], Any]
) -> None:
    data, asgi = dashboard
    failed = f"/jobs/{data['failed'][0]}"
    for role, token in TOKENS.items():
        async with client(asgi, headers={"authorization": f"Bearer {token}"}) as http:
            job = (await http.get(failed)).text
            jobs = (await http.get("/jobs")).text
            queues = (await http.get("/queues")).text
            periodic = (await http.get("/periodic")).text
            workers = (await http.get("/workers")).text
        assert f'{role}-token · <span class="badge role">{role}</span>' in job
        operates = role != "viewer"
        assert (f'action="/jobs/{data["failed"][0]}/retry"' in job) is operates, role
        assert ('action="/jobs/bulk"' in jobs) is operates, role
        assert ('action="/queues/reports/pause"' in queues) is operates, role
        assert ('action="/workers/action"' in workers) is operates, role
        assert ('action="/queues/reports/limits"' in queues) is (role == "admin"), role
        assert ('action="/periodic/nightly/' in periodic) is (role == "admin"), role
    for path in PAGES:  # a viewer's pages hold no form that posts but the logout
        async with client(asgi, headers={"authorization": f"Bearer {TOKENS['viewer']}"}) as http:
            html = (await http.get(path)).text
        assert html.count('method="post"') == 1 and 'action="/logout"' in html, path


async def test_read_only_caps_the_admin_token_at_viewer(dsn: str) -> None:
    data = seed(dsn)
    asgi = create_app(jobbus.App(dsn=dsn), token=TOKENS["admin"], read_only=True)
    async with client(asgi, headers={"authorization": f"Bearer {TOKENS['admin']}"}) as http:
        assert 'admin-token · <span class="badge role">viewer</span>' in (await http.get("/queues")).text
        refused = await http.post("/queues/reports/limits", data={"concurrency": "1"})
        assert refused.status_code == 403 and refused.text == "this dashboard is read-only"
    await asgi.state.dashboard.close()
    assert state(dsn, data["failed"][0])[2] == 0


async def test_a_session_keeps_the_role_of_its_token(dsn: str, dashboard: tuple[dict[str, Any], Any]) -> None:
    _, asgi = dashboard
    cookies = {}
    for role, token in TOKENS.items():
        async with client(asgi) as http:
            await logged_in(http, token)
            cookies[role] = http.cookies["jobbus_session"]
            assert f'<span class="badge role">{role}</span>' in (await http.get("/")).text
    assert len(set(cookies.values())) == 3 and not any(token in cookies.values() for token in TOKENS.values())


# -- behind a proxy ---------------------------------------------------------------------------------

PROXY = "X-Forwarded-User"


@pytest.fixture
async def proxied(dsn: str, tmp_path: Path) -> AsyncIterator[tuple[dict[str, Any], Any]]:
    data = seed(dsn)
    role_map = tmp_path / "roles.toml"
    role_map.write_text('[roles]\nalice = "admin"\nbob = "operator"\n"carol@example.com" = "viewer"\n')
    asgi = create_app(
        jobbus.App(dsn=dsn),
        viewer_token=TOKENS["viewer"],
        trusted_user_header=PROXY,
        trusted_proxies=["10.0.0.0/8", "fd00::/8"],
        role_map=role_map,
    )
    yield data, asgi
    await asgi.state.dashboard.close()


async def test_a_trusted_proxys_user_gets_the_role_the_map_gives(proxied: tuple[dict[str, Any], Any]) -> None:
    _, asgi = proxied
    for peer, user, role in [
        ("10.1.2.3", "alice", "admin"),
        ("fd00::7", "bob", "operator"),
        ("::ffff:10.9.9.9", "carol@example.com", "viewer"),
    ]:
        async with client(asgi, peer=peer, headers={PROXY: user}) as http:
            page = await http.get("/queues")
            assert page.status_code == 200 and f'{user} · <span class="badge role">{role}</span>' in page.text
            limits = await http.post("/queues/reports/limits", data={"csrf": csrf_of(page.text), "next": "/"})
            assert (limits.status_code == 303) is (role == "admin"), (user, limits.status_code)


async def test_a_user_header_from_outside_the_trusted_networks_is_ignored(
    dsn: str, proxied: tuple[dict[str, Any], Any]
) -> None:
    data, asgi = proxied
    job_id = data["failed"][0]
    for peer in ("192.0.2.7", "127.0.0.1", "11.0.0.1", "fe80::1"):
        async with client(asgi, peer=peer, headers={PROXY: "alice"}) as forged:
            assert (await forged.get("/jobs")).status_code == 401, peer
            assert (await forged.post(f"/jobs/{job_id}/retry", data={"csrf": "x"})).status_code == 401
        # With a token it falls back to the token's role, never to the forged user's.
        headers = {PROXY: "alice", "authorization": f"Bearer {TOKENS['viewer']}"}
        async with client(asgi, peer=peer, headers=headers) as forged:
            page = await forged.get("/queues")
            assert 'viewer-token · <span class="badge role">viewer</span>' in page.text
            assert (await forged.post("/queues/reports/limits", data={"concurrency": "1"})).status_code == 403
            assert (await forged.post(f"/jobs/{job_id}/retry")).status_code == 403
    assert state(dsn, job_id)[0] == "failed" and state(dsn, job_id)[2] == 0


async def test_a_user_the_map_does_not_name_is_refused(proxied: tuple[dict[str, Any], Any]) -> None:
    _, asgi = proxied
    async with client(asgi, peer="10.0.0.2", headers={PROXY: "mallory"}) as http:
        refused = await http.get("/jobs")
        assert refused.status_code == 403 and "'mallory' has no role" in refused.text
    async with client(asgi, peer="10.0.0.2") as http:  # from the proxy without a user: a token is needed
        assert (await http.get("/jobs")).status_code == 401
    twice = httpx.Headers([(PROXY, "carol@example.com"), (PROXY, "alice")])
    async with client(asgi, peer="10.0.0.2", headers=twice) as http:
        assert (await http.get("/jobs")).status_code == 403


async def test_without_tokens_a_browser_outside_the_proxy_gets_401_not_the_login_form(dsn: str) -> None:
    asgi = create_app(
        jobbus.App(dsn=dsn), trusted_user_header=PROXY, trusted_proxies=["10.0.0.0/8"], role_map={"alice": "admin"}
    )
    async with client(asgi, peer="192.0.2.1", headers={PROXY: "alice", "accept": "text/html"}) as http:
        assert (await http.get("/jobs")).status_code == 401
    await asgi.state.dashboard.close()


async def test_a_wildcard_gives_every_other_user_a_role(dsn: str) -> None:
    asgi = create_app(
        jobbus.App(dsn=dsn),
        trusted_user_header=PROXY,
        trusted_proxies=["127.0.0.1"],
        role_map={"alice": "admin", "*": "viewer"},
    )
    async with client(asgi, headers={PROXY: "zed"}) as http:
        assert '<span class="badge role">viewer</span>' in (await http.get("/jobs")).text
    await asgi.state.dashboard.close()


# -- the actor, for records of who did what ---------------------------------------------------------


def _request(headers: dict[str, str], peer: str = "10.0.0.1", scope: dict[str, Any] | None = None) -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": raw, "client": (peer, 1), **(scope or {})})


def test_the_actor_of_a_request_names_the_user_or_the_tokens_role() -> None:
    from jobbus.dashboard.roles import TrustedProxy

    proxy = TrustedProxy.of(PROXY, ["10.0.0.0/8"], {"alice": "operator"})
    guard = Guard({"t-admin": Role.ADMIN, "t-view": Role.VIEWER}, read_only=False, proxy=proxy)
    for headers, peer, expected in [
        ({PROXY: "alice"}, "10.0.0.1", Actor("alice", Role.OPERATOR)),
        ({PROXY: "alice", "authorization": "Bearer t-view"}, "8.8.8.8", Actor("viewer-token", Role.VIEWER)),
        ({"authorization": "Bearer t-admin"}, "10.0.0.1", Actor("admin-token", Role.ADMIN)),
    ]:
        request = _request(headers, peer)
        assert actor_of(request) is None  # not yet let in
        assert guard.actor(request) == expected
        assert actor_of(request) == expected and actor_of(request.scope) == expected
    assert guard.actor(_request({"authorization": "Bearer nope"})) is None
    assert Guard({}, read_only=False).actor(_request({})) == Actor("anonymous", Role.ADMIN)
    assert Guard({}, read_only=True).actor(_request({})) == Actor("anonymous", Role.VIEWER)
    host = Guard({}, read_only=False, host_auth=True)
    assert host.actor(_request({}, scope={HOST_ACTOR_KEY: Actor("ada", Role.OPERATOR)})) == Actor("ada", Role.OPERATOR)


# -- bad settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"token": "same", "viewer_token": "same"}, "viewer_token is the same as the admin token"),
        ({"operator_token": " "}, "operator_token must not be empty"),
        ({"trusted_user_header": PROXY, "trusted_proxies": ["10.0.0.0/8"]}, "needs a role_map"),
        ({"trusted_user_header": PROXY, "role_map": {"a": "admin"}}, "at least one trusted proxy"),
        (
            {"trusted_user_header": PROXY, "trusted_proxies": ["10.0.0.0/33"], "role_map": {}},
            "trusted proxy '10.0.0.0/33' is not an IP address or network",
        ),
        (
            {"trusted_user_header": "X User", "trusted_proxies": ["::1"], "role_map": {}},
            "'X User' is not a header name",
        ),
        (
            {"trusted_user_header": PROXY, "trusted_proxies": ["::1"], "role_map": {"bob": "root"}},
            "user 'bob': 'root' is not a role",
        ),
        ({"role_map": {"a": "admin"}}, "go with trusted_user_header"),
        ({"token": "t", "host_auth": True}, "exclude each other"),
    ],
)
def test_bad_settings_are_refused_naming_the_problem(dsn: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        create_app(jobbus.App(dsn=dsn), **options)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[roles]\nalice = "boss"\n', "user 'alice': 'boss' is not a role"),
        ('alice = "admin"\n', "has no [roles] table"),
        ("[roles\n", "is not valid TOML"),
        ('[roles]\nalice = "admin"\n[extra]\n', "unknown table or key extra"),
        ('[roles]\n"" = "admin"\n', "'' is not a user name"),
    ],
)
def test_a_bad_role_map_file_is_refused_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "roles.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        load_role_map(path)
    assert str(path) in str(raised.value)
    with pytest.raises(ValueError, match="No such file"):
        load_role_map(tmp_path / "missing.toml")
    assert load_role_map(_written(tmp_path, '[roles]\nAda = " Operator "\n')) == {"Ada": Role.OPERATOR}


def _written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "good.toml"
    path.write_text(text)
    return path
