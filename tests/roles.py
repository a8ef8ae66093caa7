"""Login roles for one test, granted by `roles_script` and dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from jobbus import schema

#: The grant of the claim of migration 23, which the grants of an earlier release could not name.
CLAIM_OF_MIGRATION_23 = "claim_jobs(text, integer, text[], text[], double precision, integer, text[], integer)"
#: What the grants name of migration 28 (weights): lines an earlier release did not grant.
WEIGHTS_OF_MIGRATION_28 = ("take_per_key", "fit_weights", "refuse_heavy_jobs", "spend_units", "refuse_limits_below")


#: What the grants name of migration 36 (the audit trail): lines an earlier release did not grant.
AUDIT_OF_MIGRATION_36 = "audit"


#: The columns of migration 31 the dashboard role is granted, which the grants of an earlier release could
#: not name.
COLUMNS_OF_MIGRATION_31 = ",\n              priority, queue, tags, debounce_until)"


def before_tags(script: str) -> str:
    """The grants without the job columns of migration 31 (the dashboard role's, as granted before it)."""
    return script.replace(COLUMNS_OF_MIGRATION_31, ")")


def without_lines(script: str, *needles: str) -> str:
    """The grants without the lines naming any of `needles` (what an earlier release did not grant)."""
    return "\n".join(line for line in script.splitlines() if not any(needle in line for needle in needles))


@contextmanager
def granted_roles(
    dsn: str, kinds: Sequence[str], *, edit: Callable[[str], str] = lambda script: script
) -> Iterator[dict[str, str]]:
    """One fresh role per kind (worker, operator, observer, producer, dashboard): kind -> its conninfo.
    `edit` changes the grants before they run (the grants an earlier release printed)."""
    suffix = uuid.uuid4().hex[:8]
    names = {kind: f"jobbus_{kind}_{suffix}" for kind in kinds}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in names.values():
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        conn.execute(edit(schema.roles_script("jobbus", **names)).encode())
    try:
        yield {kind: make_conninfo(dsn, user=name) for kind, name in names.items()}
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in names.values():
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
