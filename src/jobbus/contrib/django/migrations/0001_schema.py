"""jobbus's schema, created by jobbus's own migrations (`jobbus.schema.migrate`), on Django's database.

Not atomic: jobbus's migrator takes its advisory lock and builds some indexes CONCURRENTLY, on a
connection of its own. Idempotent, like `jobbus migrate`: later jobbus releases that add SQL
migrations add a Django migration running it again, so ``manage.py migrate`` keeps the schema current.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def create_schema(apps: Any, schema_editor: Any) -> None:
    from jobbus.contrib.django.conf import migrate_schema

    migrate_schema(schema_editor.connection.alias)


def drop_schema(apps: Any, schema_editor: Any) -> None:
    from jobbus.contrib.django.conf import drop_schema as drop

    drop(schema_editor.connection.alias)


class Migration(migrations.Migration):
    initial = True
    atomic = False
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(create_schema, drop_schema)]
