"""AdaptivePartitioner: copies keep following the config and keep what they saw; threads agree."""

from __future__ import annotations

import pickle
import threading

import numpy as np

import trilink_spark as tl


def _observed(**kwargs) -> tl.AdaptivePartitioner:
    ap = tl.AdaptivePartitioner(4, mode="quantity", quantity=1000, min_sample=100, seed=1,
                                **kwargs)
    ap.observe(["hot"] * 700 + [f"k{i}" for i in range(300)])
    ap.decide()
    return ap


def test_a_copy_follows_the_config_center_of_its_original():
    ap = _observed()
    for copy in (ap.copy(), pickle.loads(pickle.dumps(ap))):
        assert copy.config is ap.config
        ap.config.publish({"min_gain": 0.2})
        copy.batch_boundary()
        assert copy.settings["min_gain"] == 0.2
        ap.config.publish({"min_gain": 0.1})
        copy.batch_boundary()
        assert copy.settings["min_gain"] == 0.1
        copy.close()


def test_a_copy_in_another_process_has_a_private_center():
    ap = _observed()
    state = ap.__getstate__()
    state["_config_id"] = "not-in-this-process"
    clone = tl.AdaptivePartitioner.__new__(tl.AdaptivePartitioner)
    clone.__setstate__(state)
    assert clone.config is not ap.config
    assert clone.partition("hot") == ap.partition("hot")


def test_from_dict_keeps_the_sample_view_and_the_decision_log():
    ap = _observed()
    back = tl.Partitioner.from_dict(ap.to_dict())
    assert isinstance(back, tl.AdaptivePartitioner)
    assert back.current_name == ap.current_name == "least_count"
    assert back.sample_view.sort_index().equals(ap.sample_view.sort_index())
    assert [d.to_dict() for d in back.decisions] == [d.to_dict() for d in ap.decisions]
    assert back.records_observed == ap.records_observed
    assert back.partition("hot") == ap.partition("hot")
    # the restored view decides like the original
    assert back.decide(force=True).chosen == ap.decide(force=True).chosen
    assert back.to_dict() == ap.to_dict()


def test_threads_placing_while_it_switches_see_one_strategy_each():
    """Placement calls see one strategy from start to end, and threads agree on new keys."""
    ap = tl.AdaptivePartitioner(8, mode="manual", seed=3)
    keys = np.arange(50_000, dtype=np.int64)
    results: list[np.ndarray] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def place() -> None:
        try:
            for _ in range(5):
                out = ap.assign(keys)
                with lock:
                    results.append(out)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    def switch() -> None:
        for name in ("least_key", "hash", "least_count", "least_key"):
            ap.config.publish({"strategy": name})
            ap.batch_boundary()

    threads = [threading.Thread(target=place) for _ in range(4)]
    threads.append(threading.Thread(target=switch))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    hashed = tl.HashPartitioner(8).assign(keys)
    for out in results:
        # every result is one whole placement: Hash's, or a table strategy's that places the
        # 50,000 keys evenly (it never mixes two strategies within one call)
        loads = np.bincount(out, minlength=8)
        assert np.array_equal(out, hashed) or loads.max() - loads.min() <= 1
