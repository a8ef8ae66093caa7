"""A FastAPI app that enqueues a typed task in the same transaction as the order it writes.

How to install, seed and run it: examples/README.md (tests/test_examples.py follows those steps as
written). The worker runs inside the server here; production runs `jobbus worker` beside it.
tests/contrib/test_asgi.py drives it with FastAPI's test client.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from decimal import Decimal

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

import jobbus
from jobbus.contrib.asgi import lifespan

app = jobbus.App()  # JOBBUS_DSN from the environment

#: The example's own tables.
SCHEMA = """
CREATE TABLE orders (id bigserial PRIMARY KEY, email text NOT NULL, sku text NOT NULL, total numeric NOT NULL);
CREATE TABLE stock (sku text PRIMARY KEY, quantity int NOT NULL CHECK (quantity >= 0));
"""

#: Something to sell: without stock every order answers 409 "out of stock".
SEED = """
INSERT INTO stock (sku, quantity) VALUES ('mug', 10);
"""


@dataclass(frozen=True)
class Receipt:
    order_id: int
    email: str
    total: Decimal


@app.task("shop.send_receipt", queue="mail", max_attempts=5)
async def send_receipt(receipt: Receipt) -> dict[str, object]:
    job = jobbus.current_job()
    # ... send the mail; an exception here retries the job with backoff ...
    return {"sent_to": receipt.email, "order_id": receipt.order_id, "attempt": job.attempt}


api = FastAPI(lifespan=lifespan(app, worker=True))


class NewOrder(BaseModel):
    email: str
    sku: str
    total: Decimal


@api.post("/orders")
async def place_order(order: NewOrder) -> dict[str, object]:
    # The App's pool serves here; a connection of the application's own pool works the same way.
    async with app.pool.connection() as conn, conn.transaction():
        cursor = await conn.execute(
            "INSERT INTO orders (email, sku, total) VALUES (%s, %s, %s) RETURNING id",
            (order.email, order.sku, order.total),
        )
        row = await cursor.fetchone()
        assert row is not None
        order_id = int(row[0])
        receipt = Receipt(order_id, order.email, order.total)
        job_id = await send_receipt.options(connection=conn).defer(receipt)
        taken = await conn.execute(
            "UPDATE stock SET quantity = quantity - 1 WHERE sku = %s AND quantity > 0", (order.sku,)
        )
        if taken.rowcount == 0:  # the order and its receipt job roll back together
            raise HTTPException(409, f"{order.sku} is out of stock")
    return {"order_id": order_id, "job_id": str(job_id)}


@api.get("/jobs/{job_id}")
async def job_status(job_id: uuid.UUID) -> dict[str, object]:
    job = await app.find(job_id)
    if job is None:
        raise HTTPException(404)
    return {"status": job.status, "result": job.result}


if __name__ == "__main__" and "--print-schema" in sys.argv:
    print(SCHEMA + SEED)  # the tables, and 10 mugs in stock
