"""Backoff between attempts: small, pure and property-tested."""

from __future__ import annotations

import random


def backoff_seconds(
    failed_attempts: int,
    *,
    base_seconds: float,
    max_seconds: float,
    jitter: float,
    rng: random.Random | None = None,
) -> float:
    """Delay after the n-th failed attempt (n ≥ 1).

    ``min(max, base * 2 ** (n - 1)) * uniform(1 - jitter, 1 + jitter)``; the exponent is capped
    before it is computed, so huge attempt numbers cannot overflow.
    """
    if failed_attempts < 1:
        raise ValueError(f"failed_attempts must be >= 1, got {failed_attempts}")
    exponent = min(failed_attempts - 1, 64)
    capped = min(max_seconds, base_seconds * 2.0**exponent)
    factor = (rng or random).uniform(1.0 - jitter, 1.0 + jitter)
    return capped * factor
