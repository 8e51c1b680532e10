"""driver/backoff.py: delays double from the start, stop at the cap, jitter only lengthens them, and a
reset starts over. The same sequence drives LoopRunner (tests/unit/test_looprunner.py)."""

from __future__ import annotations

import random

import pytest

from driver.backoff import Backoff, backoff_delay


def test_delays_double_then_cap() -> None:
    b = Backoff(0.5, 8.0, jitter=0.0)
    assert [b.next_delay() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert b.attempts == 7


def test_reset_starts_over() -> None:
    b = Backoff(1.0, 30.0, rng=lambda: 0.0)
    b.next_delay(), b.next_delay(), b.next_delay()
    b.reset()
    assert b.attempts == 0 and b.next_delay() == 1.0


@pytest.mark.parametrize(("draw", "factor"), [(0.0, 1.0), (0.5, 1.25), (0.999, 1.4995)])
def test_default_jitter_stretches_by_up_to_half(draw: float, factor: float) -> None:
    b = Backoff(2.0, 30.0, rng=lambda: draw)
    assert b.next_delay() == pytest.approx(2.0 * factor)
    assert b.next_delay() == pytest.approx(4.0 * factor)


def test_jitter_is_bounded_and_spreads_retries() -> None:
    rng = random.Random(7)
    delays = [Backoff(1.0, 4.0, jitter=0.5, rng=rng.random).next_delay() for _ in range(200)]
    assert all(1.0 <= d < 1.5 for d in delays)
    assert max(delays) - min(delays) > 0.3  # many processes failing at once do not retry together
    capped = Backoff(1.0, 4.0, jitter=0.25, rng=rng.random)
    assert all(4.0 <= d < 5.0 for d in [capped.next_delay() for _ in range(20)][2:])


def test_zero_jitter_never_draws() -> None:
    def rng() -> float:
        raise AssertionError("drew a random number")

    assert Backoff(0.5, 8.0, jitter=0.0, rng=rng).next_delay() == 0.5


def test_the_function_matches_the_class() -> None:
    b = Backoff(0.5, 30.0, rng=lambda: 1.0)
    assert [b.next_delay() for _ in range(3)] == [backoff_delay(n, 0.5, 30.0, lambda: 1.0) for n in (1, 2, 3)]
    assert backoff_delay(0, 0.5, 30.0, lambda: 0.0) == 0.5  # attempt 0 is treated as the first


@pytest.mark.parametrize(("start", "cap", "jitter"), [(0.0, 1.0, 0.5), (2.0, 1.0, 0.5), (1.0, 2.0, -0.1)])
def test_bad_settings_are_refused(start: float, cap: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(start, cap, jitter=jitter)


def test_thousands_of_failures_in_a_row_still_give_the_capped_delay() -> None:
    # 2.0 ** 1024 overflows: a loop failing for ~10 h (API server down overnight) must keep retrying.
    backoff = Backoff(0.5, 30.0, jitter=0.0)
    backoff.attempts = 10_000
    assert backoff.next_delay() == 30.0
    assert backoff_delay(10**9, 0.5, 30.0, lambda: 0.99) == 30.0 * (1 + 0.99 * 0.5)
