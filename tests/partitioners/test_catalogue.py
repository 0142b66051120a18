"""One catalogue: adding a strategy is one class and one registration, and every consumer sees it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import trilink_spark as tl
from trilink_spark.errors import ConfigError, InvalidArgumentError, UnknownStrategyError
from trilink_spark.partitioners import CANDIDATES, strategy_names
from trilink_spark.switching import validate_update
from trilink_spark.partitioners.choosing import catalogue
from trilink_spark.partitioners.core import base
from trilink_spark.partitioners.core.keys import to_key_array
from trilink_spark.partitioners.choosing.catalogue import Candidate, register_candidate


class ReversedModulo(tl.Partitioner):
    """A toy strategy for the test: integer key mod n, partitions numbered backwards."""

    strategy_name = "test_reversed_modulo"

    def _partition(self, key: Any) -> int:
        return self.num_partitions - 1 - int(key) % self.num_partitions

    def _assign(self, keys: Any) -> np.ndarray:
        return (self.num_partitions - 1 - np.mod(keys.ints(), self.num_partitions)).astype(np.int32)


@pytest.fixture
def registered():
    register_candidate(Candidate(
        "test_reversed_modulo",
        lambda n, *, null_policy, **_: ReversedModulo(n, null_policy=null_policy),
        integer_keys=True,
    ))
    yield
    catalogue._CATALOGUE.pop("test_reversed_modulo")


def test_a_registered_candidate_reaches_every_consumer(registered):
    assert "test_reversed_modulo" in catalogue.candidate_names()
    scores = tl.evaluate_strategies({k: 1 for k in range(40)}, 4)
    assert "test_reversed_modulo" in [s.name for s in scores]
    # not for string keys (integer only)
    names = [s.name for s in tl.evaluate_strategies({"a": 1, "b": 2}, 4)]
    assert "test_reversed_modulo" not in names
    # the config center accepts it, the adaptive partitioner can pin it
    assert validate_update({"strategy": "test_reversed_modulo"})
    ap = tl.AdaptivePartitioner(4, mode="manual")
    ap.config.publish({"strategy": "test_reversed_modulo"})
    ap.batch_boundary()
    assert ap.current_name == "test_reversed_modulo"
    assert ap.partition(1) == 2
    # it round-trips through the class registry
    assert tl.Partitioner.from_dict(ap.current.to_dict()).partition(1) == 2


def test_unregistered_candidates_are_refused():
    with pytest.raises(ConfigError):
        validate_update({"strategy": "test_reversed_modulo"})
    with pytest.raises(UnknownStrategyError):
        catalogue.build("nope", 4)


def test_build_refuses_weights_it_does_not_have():
    with pytest.raises(InvalidArgumentError, match="needs weights"):
        catalogue.build("weight", 4)
    p = catalogue.build("weight_random", 2, weights=[50, 50])
    assert p.is_stateful and catalogue.candidate_of(p) == "weight_random"


def test_candidate_of_names_the_variant():
    assert catalogue.candidate_of(tl.WeightPartitioner([50, 50])) == "weight"
    assert catalogue.candidate_of(tl.WeightPartitioner([50, 50], "random")) == "weight_random"
    assert catalogue.candidate_of(tl.LeastCountPartitioner(2)) == "least_count"
    assert catalogue.candidate_of(tl.HashPartitioner(2)) == "hash"


def test_the_name_lists_derive_from_the_catalogue():
    assert CANDIDATES == catalogue.candidate_names()
    assert "least_count_no_history" not in catalogue.configurable_names()
    assert set(catalogue.configurable_names()) < set(CANDIDATES)
    assert set(strategy_names()) <= set(base._REGISTRY)
    assert "adaptive" not in strategy_names()
    assert base.strategy_class("adaptive") is tl.AdaptivePartitioner


@pytest.mark.parametrize("name", ["least_key", "least_count", "weight_random"])
def test_fresh_keeps_configuration_and_drops_what_was_learnt(name):
    p = catalogue.build(name, 3, weights=[20, 30, 50], seed=7)
    catalogue.fit_counts(p, to_key_array(["a", "b", "c"]), np.array([5.0, 3.0, 1.0]))
    assert len(p) == 3
    fresh = p.fresh()
    assert type(fresh) is type(p) and len(fresh) == 0
    assert fresh.num_partitions == p.num_partitions
    assert catalogue.candidate_of(fresh) == name
    assert fresh.fresh(null_policy="partition0").null_policy == "partition0"


def test_fit_counts_gives_least_count_its_history():
    p = tl.LeastCountPartitioner(2)
    catalogue.fit_counts(p, to_key_array(["hot", "a", "b"]), np.array([90.0, 40.0, 40.0]))
    assert p.loads.tolist() == [90.0, 80.0]
