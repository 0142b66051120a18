"""TimerService against a brute-force model, with the invariant checker after every step."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trilink_spark.keyed import TimerService


@pytest.mark.parametrize("seed", range(20))
def test_random_operations_match_a_brute_force_model(seed: int) -> None:
    rng = random.Random(seed)
    timers = TimerService()
    model: set[tuple[int, int]] = set()  # (key, ts)
    for _ in range(400):
        op = rng.random()
        key, ts = rng.randrange(20), rng.randrange(100)
        if op < 0.5:
            assert timers.register(key, ts) == ((key, ts) not in model)
            model.add((key, ts))
        elif op < 0.7:
            assert timers.delete(key, ts) == ((key, ts) in model)
            model.discard((key, ts))
        elif op < 0.75:
            expected = sum(1 for k, _ in model if k == key)
            assert timers.delete_key(key) == expected
            model = {(k, t) for k, t in model if k != key}
        else:
            watermark = rng.randrange(-5, 100)
            due = sorted(((t, k) for k, t in model if t <= watermark))
            assert list(timers.pop_due(watermark)) == [(k, t) for t, k in due]
            model -= {(k, t) for t, k in due}
        timers._check()
        assert len(timers) == len(model)
        first = min(((t, k) for k, t in model), default=None)
        assert timers.peek() == (None if first is None else (first[1], first[0]))
        assert timers.timers_of(key) == sorted(t for k, t in model if k == key)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=3), st.integers(-10**12, 10**12)), max_size=60))
def test_snapshot_round_trip_and_firing_order(pairs: list[tuple[str, int]]) -> None:
    timers = TimerService()
    for key, ts in pairs:
        timers.register(key, ts)
    again = TimerService.from_list(timers.to_list())
    again._check()
    assert again.to_list() == timers.to_list() == sorted(set(pairs), key=lambda p: (p[1], p[0]))


def test_timers_registered_while_firing_fire_when_due() -> None:
    timers = TimerService()
    timers.register("a", 1)
    fired = []
    for key, ts in timers.pop_due(10):
        fired.append((key, ts))
        if ts < 5:
            timers.register(key, ts + 3)
    assert fired == [("a", 1), ("a", 4), ("a", 7)]
    assert len(timers) == 0


def test_bad_timestamps_are_refused() -> None:
    timers = TimerService()
    with pytest.raises(TypeError):
        timers.register("a", 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        timers.register("a", True)
    import numpy as np

    assert timers.register("a", np.int64(3))
    assert ("a", 3) in timers and ("a", 4) not in timers and "a" not in timers
