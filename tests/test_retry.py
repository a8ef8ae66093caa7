import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobbus.retry import backoff_seconds


@given(
    attempt=st.integers(min_value=1, max_value=10_000),
    base=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    extra_cap=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    jitter=st.floats(min_value=0, max_value=0.999, allow_nan=False),
    seed=st.integers(),
)
def test_backoff_stays_within_the_formula_bounds(
    attempt: int, base: float, extra_cap: float, jitter: float, seed: int
) -> None:
    cap = base + extra_cap
    delay = backoff_seconds(attempt, base_seconds=base, max_seconds=cap, jitter=jitter, rng=random.Random(seed))
    nominal = min(cap, base * 2.0 ** min(attempt - 1, 64))
    assert nominal * (1 - jitter) - 1e-9 <= delay <= nominal * (1 + jitter) + 1e-9
    assert delay <= cap * (1 + jitter) + 1e-9


@given(attempt=st.integers(min_value=1, max_value=30))
def test_backoff_without_jitter_doubles_until_the_cap(attempt: int) -> None:
    delay = backoff_seconds(attempt, base_seconds=30, max_seconds=1800, jitter=0)
    assert delay == min(1800, 30 * 2 ** (attempt - 1))


def test_backoff_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError, match="failed_attempts"):
        backoff_seconds(0, base_seconds=1, max_seconds=2, jitter=0)
