"""A stored or received strategy dict is checked: hostile values never hang, pile up or crash."""

from __future__ import annotations

import gc
import math
import weakref

import pytest

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark._internal.io.files import resolve_filesystem, write_atomic


@pytest.mark.parametrize("data", [
    {"strategy": "least_key", "num_partitions": 2, "loads": [math.nan, math.nan]},
    {"strategy": "least_count", "num_partitions": 2, "loads": [0, math.nan]},
    {"strategy": "least_count", "num_partitions": 2, "loads": [-math.inf, 0]},
    {"strategy": "least_count", "num_partitions": 2, "loads": ["x", 1]},
    {"strategy": "least_count", "num_partitions": 2, "loads": 5},
    {"strategy": "least_key", "num_partitions": 2**40},
    {"strategy": "modulo", "num_partitions": 2**63},
    {"strategy": "least_key", "num_partitions": 2, "table": 5},
    {"strategy": "least_key", "num_partitions": 2, "table": [["a", None]]},
    {"strategy": "least_key", "num_partitions": 2, "table": [["a", 1.7]]},
    {"strategy": "least_key", "num_partitions": 2, "table": [["a", True]]},
    {"strategy": "least_key", "num_partitions": 2, "table": [[1.5, 0]]},
    {"strategy": "least_key", "num_partitions": 2, "table": [[True, 0]]},
    {"strategy": "least_key", "num_partitions": 2, "table": [[[1, 2], 0]]},
    {"strategy": "least_key", "num_partitions": 2, "table": [[{"b64": 5}, 0]]},
    {"strategy": "least_key", "num_partitions": 2, "table": [[{"b64": "!!!"}, 0]]},
    {"strategy": "least_key", "num_partitions": 2, "table": [["a", 0], ["a", 1]]},
    {"strategy": "least_key", "num_partitions": 2, "table": [["a", 0, 1]]},
    {"strategy": "least_key", "num_partitions": 2, "colour": "red"},
    {"strategy": "hash", "num_partitions": 2, "colour": "red"},
    {"strategy": "weight", "num_partitions": 2},
    {"strategy": "weight", "weights": [50, 50], "mode": "random", "rng_state": "junk"},
    {"strategy": "adaptive", "num_partitions": 2},
    {"strategy": "adaptive", "num_partitions": 2, "current": {"strategy": "hash",
     "num_partitions": 2}, "decisions": [{"x": 1}]},
])
def test_hostile_dicts_are_refused_with_a_typed_error(data):
    with pytest.raises(tl.TrilinkError):
        tl.Partitioner.from_dict(data).assign(["a", "b"])


def test_a_pid_out_of_range_or_a_float_pid_never_places_a_key():
    with pytest.raises(InvalidArgumentError, match="partition in"):
        tl.Partitioner.from_dict({"strategy": "least_key", "num_partitions": 2,
                                  "table": [["a", 2]]})


def test_write_atomic_leaves_no_temporary_behind(tmp_path):
    fs, path = resolve_filesystem(str(tmp_path / "dir"))
    (tmp_path / "dir").mkdir()  # a directory where the file should go: the rename fails
    with pytest.raises(OSError):
        write_atomic(fs, path, b"data")
    assert [p.name for p in tmp_path.iterdir()] == ["dir"]
    with pytest.raises(InvalidArgumentTypeError):
        write_atomic(fs, str(tmp_path / "x"), "text")  # type: ignore[arg-type]


def test_evaluate_strategies_refuses_a_name_string_duplicates_and_no_keys():
    with pytest.raises(InvalidArgumentTypeError, match="sequence of names"):
        tl.evaluate_strategies({"a": 1}, 2, strategies="hash")
    with pytest.raises(InvalidArgumentError, match="twice"):
        tl.evaluate_strategies({"a": 1}, 2, strategies=["hash", "hash"])
    with pytest.raises(InvalidArgumentError, match="no keys"):
        tl.evaluate_strategies({}, 2)
    with pytest.raises(InvalidArgumentError):
        tl.evaluate_strategies({"a": 10**400}, 2)


def test_pinning_the_same_strategy_again_pins_it():
    ap = tl.AdaptivePartitioner(4, mode="quantity", quantity=1, min_sample=10, seed=1)
    ap.config.publish({"strategy": "hash"})
    ap.batch_boundary()
    ap.observe(["hot"] * 700 + [f"k{i}" for i in range(300)])
    assert ap.decide().chosen == "least_count"
    ap.config.publish({"strategy": "hash"})
    ap.batch_boundary()
    assert ap.current_name == "hash"


def test_dropped_copies_are_collected_and_stop_listening():
    ap = tl.AdaptivePartitioner(4)
    copy = ap.copy()
    assert copy.config is ap.config
    alive = weakref.ref(copy)
    del copy
    gc.collect()
    assert alive() is None  # the config center does not keep a copy alive
    ap.config.publish({"min_gain": 0.3})  # the dead copy's subscription does nothing
    ap.batch_boundary()
    assert ap.settings["min_gain"] == 0.3
