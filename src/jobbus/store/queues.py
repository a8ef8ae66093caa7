"""Statements of queue settings: flow-control limits (`sql/queries/queues.sql`)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from jobbus.limits import KEEP, Keep, QueueSettings, RateLimit
from jobbus.store.statements import Row, Statement, queries


class QueueStore:
    def __init__(self, schema: str) -> None:
        self._q = queries(schema)

    def set_limits(
        self,
        queue: str,
        *,
        concurrency: int | Keep | None,
        concurrency_per_key: int | Keep | None,
        rate_limit: RateLimit | Keep | None,
        rate_limit_per_key: RateLimit | Keep | None,
    ) -> list[Statement[None]]:
        """Two statements: write the limits given (keeping the others), then drop a row left empty."""

        def value(limit: object) -> object:
            return None if limit is KEEP else limit

        def rate(limit: RateLimit | Keep | None) -> tuple[int | None, float | None]:
            return (limit.count, limit.per.total_seconds()) if isinstance(limit, RateLimit) else (None, None)

        rate_count, rate_period = rate(rate_limit)
        key_count, key_period = rate(rate_limit_per_key)
        params = {
            "queue": queue,
            "concurrency": value(concurrency),
            "concurrency_per_key": value(concurrency_per_key),
            "rate_count": rate_count,
            "rate_period_seconds": rate_period,
            "key_rate_count": key_count,
            "key_rate_period_seconds": key_period,
            "keep_concurrency": concurrency is KEEP,
            "keep_concurrency_per_key": concurrency_per_key is KEEP,
            "keep_rate": rate_limit is KEEP,
            "keep_key_rate": rate_limit_per_key is KEEP,
        }
        return [
            Statement(self._q["upsert_queue_setting"], params, lambda rows, _: None),
            Statement(self._q["delete_queue_setting_if_empty"], {"queue": queue}, lambda rows, _: None),
        ]

    def list_settings(self, queue: str | None = None) -> Statement[list[QueueSettings]]:
        def decode(rows: list[Row], _: int) -> list[QueueSettings]:
            return [
                QueueSettings(
                    queue=r[0],
                    concurrency=r[1],
                    concurrency_per_key=r[2],
                    rate_limit=RateLimit(r[3], timedelta(seconds=r[4])) if r[3] is not None else None,
                    rate_limit_per_key=RateLimit(r[5], timedelta(seconds=r[6])) if r[5] is not None else None,
                )
                for r in rows
            ]

        return Statement(self._q["list_queue_settings"], {"queue": queue}, decode)

    def limited_queues(self) -> Statement[list[str]]:
        return Statement(self._q["limited_queues"], {}, lambda rows, _: [r[0] for r in rows])

    def usage(self) -> Statement[dict[str, tuple[int, int | None]]]:
        """Per limited queue: (jobs holding a valid lease, starts in its rate window or None), by weight
        (and spends by their units)."""
        return Statement(self._q["queue_usage"], {}, lambda rows, _: {r[0]: (int(r[1]), r[2]) for r in rows})

    def spend_units(self, spend_id: uuid.UUID, queue: str, key: str | None, units: int) -> Statement[bool]:
        """`App.consume`: spend `units` of the queue's rate windows (and the key's); once per `spend_id`,
        so repeating it after a lost connection spends nothing twice. False: no rate limit counts it."""
        params = {"id": spend_id, "queue": queue, "key": key, "units": units}
        return Statement(self._q["spend_units"], params, lambda rows, _: bool(rows[0][0]))

    def seconds_until_rate_capacity(self, queues: list[str]) -> Statement[float | None]:
        return Statement(
            self._q["seconds_until_rate_capacity"],
            {"queues": queues},
            lambda rows, _: None if not rows or rows[0][0] is None else float(rows[0][0]),
        )
