"""Table strategies shared by threads: each new key is placed once, and everyone agrees."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import trilink_spark as tl


@pytest.mark.parametrize("make", [
    lambda: tl.LeastCountPartitioner(8, max_keys=1_000_000),
    lambda: tl.LeastKeyPartitioner(8, max_keys=1_000_000),
    lambda: tl.WeightPartitioner([10, 20, 30, 40], "random", seed=5, max_keys=1_000_000),
])
def test_four_threads_assigning_the_same_new_keys_agree(make):
    p = make()
    keys = np.arange(200_000, dtype=np.int64)
    out: list[np.ndarray] = [np.empty(0)] * 4

    def run(i: int) -> None:
        out[i] = p.assign(keys)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for other in out[1:]:
        assert np.array_equal(out[0], other)
    assert len(p) == len(keys)
    if isinstance(p, tl.LeastCountPartitioner):
        assert p.loads.sum() == len(keys)  # each key counted once, not once per thread
    assert np.array_equal(p.assign(keys), out[0])


def test_threads_mixing_partition_and_fit_place_each_key_once():
    p = tl.LeastKeyPartitioner(4)
    keys = [f"k{i}" for i in range(5_000)]

    def one_by_one() -> None:
        for k in keys:
            p.partition(k)

    def all_at_once() -> None:
        p.fit(keys)

    threads = [threading.Thread(target=f) for f in (one_by_one, all_at_once, one_by_one)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(p) == len(keys)
    assert p.loads.sum() == len(keys)
    p._check()


@pytest.mark.parametrize("pickled", [False, True])
def test_threads_looking_up_a_fresh_overlay_agree(pickled):
    """A shared lookup index gets its hash table before it is shared: pandas builds it lazily,
    and two threads building it at once were told the index was not unique."""
    import pickle

    for trial in range(20):
        p = tl.OverlayPartitioner(tl.HashPartitioner(8), {k: k % 8 for k in range(50_000)})
        if pickled:
            p = pickle.loads(pickle.dumps(p))
        keys = np.arange(60_000, dtype=np.int64)
        out: list[np.ndarray] = [np.empty(0)] * 4
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                out[i] = p.assign(keys)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], f"trial {trial}: {errors!r}"
        assert np.array_equal(out[0][:50_000], np.arange(50_000) % 8)
        for other in out[1:]:
            assert np.array_equal(out[0], other)
