"""jobbus for Django: an installed app, `JOBBUS` settings, ``manage.py jobbus ...``, enqueue inside
Django's own transaction, the schema as a Django migration, and `JobbusBackend` for Django's tasks
framework (``django.tasks`` from Django 6; the ``django-tasks`` backport on Django 5.2).

``INSTALLED_APPS = [..., "jobbus.contrib.django"]`` and, optionally::

    JOBBUS = {
        "app": "shop.jobs:app",   # your App (its @app.job handlers and @app.task tasks); default: a new one
        "database": "default",    # the Django database: its connection enqueues, its DSN is the default dsn
        "schema": "jobbus",       # ... and any other App setting (lease_seconds, pool_max_size, ...)
    }
    TASKS = {"default": {"BACKEND": "jobbus.contrib.django.JobbusBackend", "QUEUES": ["default", "mail"]}}

See docs/integrations.md.
"""

from __future__ import annotations

from jobbus.contrib.django.backend import JobbusBackend
from jobbus.contrib.django.conf import connection, database_dsn, get_app, worker_app

__all__ = ["JobbusBackend", "connection", "database_dsn", "get_app", "worker_app"]
