"""Text in the docs that jobbus generates must be what jobbus generates today."""

from __future__ import annotations

import re

from jobbus import schema
from tests.docs.examples import ROOT


def _statements(script: str) -> list[str]:
    without_comments = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))
    return [" ".join(statement.split()) for statement in without_comments.split(";") if statement.strip()]


def test_security_doc_shows_the_grants_roles_script_prints() -> None:
    text = (ROOT / "docs" / "security.md").read_text()
    shown = re.search(r"```sql\n(.*?)```", text, re.DOTALL)
    assert shown is not None, "docs/security.md has no ```sql block"
    generated = schema.roles_script(
        "jobbus", worker="app_worker", operator="app_ops", observer="app_ro", producer="app_web", dashboard="app_dash"
    )
    assert _statements(shown[1]) == _statements(generated)
