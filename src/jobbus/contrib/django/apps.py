"""The Django app: ``INSTALLED_APPS = [..., "jobbus.contrib.django"]`` (label ``jobbus``)."""

from __future__ import annotations

from django.apps import AppConfig


class JobbusConfig(AppConfig):
    name = "jobbus.contrib.django"
    label = "jobbus"
    verbose_name = "jobbus"
