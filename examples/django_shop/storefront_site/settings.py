"""Settings of the example Django project: jobbus as an installed app and as the tasks backend."""

import importlib.util
import os

from psycopg.conninfo import conninfo_to_dict

_database = conninfo_to_dict(os.environ.get("DATABASE_URL", "dbname=shop"))

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "storefront_site.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",  # staff log in at /admin/; the jobbus dashboard at /ops/jobs/ is for them (asgi.py)
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "jobbus.contrib.django",  # manage.py jobbus ..., and jobbus's schema as a migration
    "storefront",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
STATIC_URL = "static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
if importlib.util.find_spec("django.tasks") is None:  # Django 5.2: the backport of django.tasks
    INSTALLED_APPS.append("django_tasks")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _database.get("dbname", "storefront"),
        "USER": _database.get("user", ""),
        "PASSWORD": _database.get("password", ""),
        "HOST": _database.get("host", ""),
        "PORT": _database.get("port", ""),
    }
}

# jobbus: the App of storefront/jobs.py (its typed tasks), on the default database.
JOBBUS = {"app": "storefront.jobs:app", "database": "default"}

# Django's tasks framework, run by jobbus workers (manage.py jobbus worker).
TASKS = {
    "default": {
        "BACKEND": "jobbus.contrib.django.JobbusBackend",
        "QUEUES": ["default", "mail"],
    }
}
