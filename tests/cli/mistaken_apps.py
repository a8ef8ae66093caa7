"""What `--app` names in the CLI's tests of newcomer edges: an App with mail handlers, the ways of giving
one that work, and things a newcomer names by mistake (a handler, a class, a factory of something else)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import jobbus

app = jobbus.App(poll_interval_seconds=0.2)


@app.job("mail.welcome")
def welcome(job: jobbus.SyncJobExecution) -> None:
    return None


@app.job("mail.password_reset")
async def password_reset(job: jobbus.JobExecution) -> None:
    return None


@app.job("report.render")
async def render(job: jobbus.JobExecution) -> None:
    return None


#: An App that only produces: it knows no job type, so it has nothing to compare a type with.
producer = jobbus.App()

#: An App with more types than a warning lists.
many = jobbus.App()
for number in range(8):
    many.job(f"batch.step_{number}")(render)


def make_app() -> jobbus.App:
    return app


async def make_app_async() -> jobbus.App:
    return app


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[jobbus.App]:
    yield app


# -- not Apps ------------------------------------------------------------------------------------------


class Mailer:
    def __init__(self, host: str) -> None:
        self.host = host


def make_number() -> int:
    return 42


@contextlib.asynccontextmanager
async def yields_a_string() -> AsyncIterator[str]:
    yield "not an app"


def broken_inside() -> jobbus.App:
    """A factory with a bug of its own: an internal error (70) with its traceback, not a bad --app."""
    return len(42)  # type: ignore[arg-type,return-value]


settings = {"dsn": "postgresql://localhost/app"}
