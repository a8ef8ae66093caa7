"""Typed tasks end to end: define, defer (checked), run, read the result.

    export JOBBUS_DSN=postgresql://localhost/app && jobbus migrate
    python -m examples.typed_tasks

tests/test_examples.py runs it against a fresh database.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

import jobbus

app = jobbus.App()  # JOBBUS_DSN from the environment


@dataclass(frozen=True)
class Invoice:
    number: str
    total: Decimal


@app.task("billing.send_invoice", queue="billing", max_attempts=5)
async def send_invoice(invoice: Invoice, to: str, *, copy_to: list[str] | None = None) -> dict[str, object]:
    job = jobbus.current_job()  # the running JobExecution: attempt, checkpoint, progress, ...
    await job.progress(1, 1)
    return {"invoice": invoice.number, "to": [to, *(copy_to or [])], "attempt": job.attempt}


async def main() -> None:
    async with app:
        invoice = Invoice("INV-7", Decimal("99.90"))
        job_id = await send_invoice.defer(invoice, "a@example.com", copy_to=["books@example.com"])
        later = await send_invoice.options(available_at=timedelta(hours=1), priority=5).defer(invoice, "b@example.com")
        try:
            await send_invoice.defer(invoice, to=42)  # type: ignore[arg-type]  # mypy says so too
        except TypeError as exc:
            print(f"refused: {exc}")

        print("drained:", await app.drain())
        done, waiting = await app.find(job_id), await app.find(later)
        assert done is not None and waiting is not None
        print(f"{done.status}: {done.result}")
        print(f"{waiting.status}: not before {waiting.available_at:%H:%M}")


if __name__ == "__main__":
    asyncio.run(main())
