"""The dashboard in the ASGI routing of a Django project (examples/django_shop), for the users Django
gives a role (superusers, staff, the jobbus permissions), over real HTTP against uvicorn and a real
database."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from tests.contrib import test_django

django_db = test_django.django_db  # the fixture (a migrated Django database); importing it set Django up

from asgiref.sync import sync_to_async  # noqa: E402
from django.contrib.auth.models import Permission, User  # noqa: E402
from django.contrib.contenttypes.models import ContentType  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402
from django.db import connections  # noqa: E402
from django.test import Client  # noqa: E402

import jobbus  # noqa: E402
from jobbus.contrib.django.dashboard import default_role, mount_dashboard  # noqa: E402
from jobbus.dashboard import Role, create_app  # noqa: E402
from tests.contrib.servers import served  # noqa: E402

HTML = {"accept": "text/html"}


def _permission(codename: str) -> Permission:
    """A jobbus permission as a project creates it for Django's ModelBackend (jobbus has no model)."""
    kind, _ = ContentType.objects.get_or_create(app_label="jobbus", model="dashboard")
    return Permission.objects.get_or_create(codename=codename, content_type=kind, defaults={"name": codename})[0]


def _session(user: User) -> dict[str, str]:
    client = Client()
    client.force_login(user)
    return {"sessionid": client.cookies["sessionid"].value}


@pytest.fixture
def site(django_db: str) -> Iterator[tuple[str, dict[str, dict[str, str]]]]:
    staff = User.objects.create_user("ops", password="x", is_staff=True)
    customer = User.objects.create_user("customer", password="x")
    retired = User.objects.create_user("retired", password="x", is_staff=True)
    root = User.objects.create_superuser("root", password="x")
    auditor = User.objects.create_user("auditor", password="x")
    auditor.user_permissions.add(_permission("view_jobs"))
    users = {"staff": staff, "customer": customer, "retired": retired, "root": root, "auditor": auditor}
    sessions = {name: _session(user) for name, user in users.items()}
    User.objects.filter(pk=retired.pk).update(is_active=False)  # deactivated after logging in
    app = jobbus.App(dsn=django_db)
    with app.sync:
        app.sync.schedule("mail.send", {"to": "a@example.com"}, queue="mail")
    dashboard = create_app(app, host_auth=True)

    async def cleanup() -> None:
        await dashboard.state.dashboard.close()
        await sync_to_async(connections.close_all)()  # the connections of the server's thread

    with served(mount_dashboard(get_asgi_application(), "/ops/jobs", dashboard), cleanup=cleanup) as url:
        yield url, sessions


def test_anonymous_and_non_staff_users_go_to_the_admins_login(site: tuple[str, dict[str, dict[str, str]]]) -> None:
    base, sessions = site
    for cookies in ({}, sessions["customer"], sessions["retired"]):
        with httpx.Client(base_url=base, cookies=cookies) as http:
            page = http.get("/ops/jobs/jobs?status=queued", headers=HTML)
            assert page.status_code == 302
            assert page.headers["location"] == "/admin/login/?next=/ops/jobs/jobs%3Fstatus%3Dqueued"
            assert http.get("/ops/jobs/events").status_code == 403
            assert http.post("/ops/jobs/queues/mail/pause", data={"csrf": "x"}).status_code == 403
            assert http.get(page.headers["location"]).status_code == 200  # Django's admin login page


def test_staff_users_get_the_pages_and_the_event_stream(site: tuple[str, dict[str, dict[str, str]]]) -> None:
    base, sessions = site
    with httpx.Client(base_url=base, cookies=sessions["staff"]) as http:
        jobs = http.get("/ops/jobs/jobs?status=queued", headers=HTML)
        assert jobs.status_code == 200 and "mail.send" in jobs.text
        assert 'href="/ops/jobs/static/dashboard.css"' in jobs.text
        with http.stream("GET", "/ops/jobs/events") as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert next(stream.iter_text()).startswith("retry: 2000")
        # Everything else is the project's own.
        assert http.get("/admin/").status_code == 200  # the same session in the admin
        assert http.get("/orders").status_code == 405  # its view takes POST only


def test_a_stale_connection_left_in_djangos_thread_is_not_used_for_the_staff_check(
    site: tuple[str, dict[str, dict[str, str]]], django_db: str
) -> None:
    """Django closes a thread's connections past CONN_MAX_AGE (0: after each request) when a request
    starts; the staff check does the same before it reads the session, so a connection left in that
    thread and terminated since (a restart, a failover) is not the one it uses."""
    base, sessions = site

    def open_and_terminate() -> None:  # in asgiref's one thread for sync code, which the check uses too
        connection = connections["default"]
        connection.ensure_connection()
        pid = connection.connection.info.backend_pid
        with psycopg.connect(django_db, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    asyncio.run(sync_to_async(open_and_terminate)())
    with httpx.Client(base_url=base, cookies=sessions["staff"]) as http:
        assert http.get("/ops/jobs/jobs?status=queued", headers=HTML).status_code == 200


def test_the_projects_asgi_module_mounts_the_dashboard() -> None:
    from storefront_site import asgi

    assert callable(asgi.application)


def test_each_user_gets_the_role_django_gives_them(site: tuple[str, dict[str, dict[str, str]]], django_db: str) -> None:
    base, sessions = site
    for user, role in (("root", "admin"), ("staff", "operator"), ("auditor", "viewer")):
        with httpx.Client(base_url=base, cookies=sessions[user]) as http:
            queues = http.get("/ops/jobs/queues", headers=HTML)
            name = {"staff": "ops"}.get(user, user)
            assert queues.status_code == 200 and f'{name} · <span class="badge role">{role}</span>' in queues.text
            csrf = http.cookies["jobbus_csrf"]
            paused = http.post("/ops/jobs/queues/mail/pause", data={"csrf": csrf, "next": "/queues"})
            assert paused.status_code == (403 if role == "viewer" else 303), user
            limits = http.post("/ops/jobs/queues/mail/limits", data={"csrf": csrf, "concurrency": "2"})
            assert limits.status_code == (303 if role == "admin" else 403), user
            assert ('action="/ops/jobs/queues/mail/limits"' in queues.text) is (role == "admin")
    with psycopg.connect(django_db) as conn:
        assert conn.execute("SELECT concurrency FROM jobbus.queue_setting").fetchall() == [(2,)]


@pytest.mark.usefixtures("django_db")
def test_the_default_rule_and_the_permissions_that_grant_roles() -> None:
    lead = User.objects.create_user("lead", password="x")
    lead.user_permissions.add(_permission("administer_jobs"))
    helper = User.objects.create_user("helper", password="x")
    helper.user_permissions.add(_permission("operate_jobs"))
    nobody = User.objects.create_user("nobody", password="x")
    for user, role in ((lead, Role.ADMIN), (helper, Role.OPERATOR), (nobody, None)):
        assert default_role(User.objects.get(pk=user.pk)) is role, user  # fresh: no permission cache


def test_a_projects_own_rule_replaces_the_default(django_db: str) -> None:
    viewer = User.objects.create_user("viewer", password="x", is_staff=True)
    session = _session(viewer)
    app = jobbus.App(dsn=django_db)
    dashboard = create_app(app, host_auth=True)
    asgi = mount_dashboard(get_asgi_application(), "/ops", dashboard, role=lambda user: "viewer")

    async def cleanup() -> None:
        await dashboard.state.dashboard.close()
        await sync_to_async(connections.close_all)()

    with served(asgi, cleanup=cleanup) as base, httpx.Client(base_url=base, cookies=session) as http:
        assert '<span class="badge role">viewer</span>' in http.get("/ops/jobs", headers=HTML).text
        assert http.post("/ops/queues/mail/pause", data={"csrf": http.cookies["jobbus_csrf"]}).status_code == 403
