"""Hostile probes of the placement in force of a keyed stream (issue 29, helper K).

- A run-time rescale or strategy swap is committed state: a restart with the job's original
  arguments keeps it; only arguments that differ from those the job was last started with
  swap at a restart.
- The counters (rows, late rows) survive every rescale, up and down, sync and fluid.
- ``request_swap`` refuses at once what cannot be carried out; a plan that still fails at the
  batch is refused there (logged, reported in ``run.swaps``) and never fails the batch.
- The rebalancer's "overloaded" advice stays within the blocks and the partition limit.
- A swap request survives a driver that dies before the next batch plans it, and is never
  carried out twice.

Every probe checks the state against an oracle: each key stored once, with its exact count.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark._internal.validation import MAX_PARTITIONS
from trilink_spark.errors import InvalidArgumentError, InvalidKeyTypeError, StateCorruptError
from trilink_spark.keyed import KeyedBatchFunction
from trilink_spark.switching import LoadAwareRebalancer
from conftest import RunningCount
from testkit.swaps import check_invariants, die_after_writing

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"k{i:02d}" for i in range(24)]
ROWS = 60


class DoubleCount(RunningCount):
    output_schema = "k double, n long"


def make_run(tmp_path: Path, sink: Any = None, processor: Any = None,
             **kw: Any) -> KeyedBatchFunction:
    kw.setdefault("num_partitions", 4)
    return tl.keyed_foreach_batch(sink or (lambda df, b: df.collect()), "k", "t",
                                  processor or RunningCount(), 10**6, str(tmp_path / "state"),
                                  **kw)


def make_batch(spark: Any, b: int, keys: list[Any] = KEYS, ddl: str = "k string, t long"
               ) -> tuple[Any, pd.Series]:
    rng = np.random.default_rng(b)
    ks = [keys[i] for i in rng.integers(0, len(keys), ROWS)]
    frame = pd.DataFrame({"k": ks, "t": np.arange(b * ROWS, (b + 1) * ROWS, dtype=np.int64)})
    return spark.createDataFrame(frame, ddl), pd.Series(ks, dtype=object).value_counts()


def drive(spark: Any, run: KeyedBatchFunction, batches: range, total: pd.Series,
          counters: bool = True, **kw: Any) -> pd.Series:
    """Run ``batches``, checking every key's count (and the rows counter) after each."""
    for b in batches:
        df, counts = make_batch(spark, b, **kw)
        run(df, b)
        total = total.add(counts, fill_value=0)
        check_invariants(run, total)
        if counters:
            assert run.counters()["rows"] == int(total.sum())
    return total


def partitions_at(run: KeyedBatchFunction, batch: int) -> int:
    return run.store.placement_at(batch)[1]


# ---------------------------------------------------------------------- 1: restarts
def test_restart_with_the_original_arguments_keeps_a_run_time_rescale(
        spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    run.request_swap(num_partitions=8)
    total = drive(spark, run, range(1, 2), total)
    assert partitions_at(run, 1) == 8
    restarted = make_run(tmp_path, takeover=True)  # the job's own arguments: num_partitions=4
    total = drive(spark, restarted, range(2, 4), total, counters=False)
    assert partitions_at(restarted, 3) == 8 and restarted.swaps == []  # used to swap to 4
    # an explicit change of the arguments is meant: it swaps, once
    edited = make_run(tmp_path, takeover=True, num_partitions=6)
    total = drive(spark, edited, range(4, 6), total)
    assert partitions_at(edited, 5) == 6 and len(edited.swaps) == 1
    again = make_run(tmp_path, takeover=True, num_partitions=6)
    drive(spark, again, range(6, 7), total)
    assert again.swaps == [] and partitions_at(again, 6) == 6


def test_restart_keeps_a_run_time_strategy_swap(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    run.request_swap("least_count", num_partitions=6, refit="none")
    total = drive(spark, run, range(1, 2), total)
    restarted = make_run(tmp_path, takeover=True)
    drive(spark, restarted, range(2, 3), total)
    placement, n = restarted.store.placement_at(2)
    assert type(placement).__name__ == "LeastCountPartitioner" and n == 6
    assert restarted.swaps == []


def test_restart_with_another_strategy_swaps_to_it(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    edited = make_run(tmp_path, takeover=True, strategy="least_count")
    drive(spark, edited, range(1, 2), total)
    placement, n = edited.store.placement_at(1)
    assert type(placement).__name__ == "LeastCountPartitioner" and n == 4
    assert len(edited.swaps) == 1


def test_restart_keeps_an_adaptive_switch(spark: Any, tmp_path: Path) -> None:
    def adaptive() -> tl.AdaptivePartitioner:
        return tl.AdaptivePartitioner(4, mode="manual", sample_rate=1.0, min_sample=10, seed=3)

    ap = adaptive()
    run = make_run(tmp_path, strategy=ap)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    assert ap.decide(force=True).switched
    total = drive(spark, run, range(1, 2), total)
    switched = type(run.store.placement_at(1)[0])
    assert switched is not tl.HashPartitioner and len(run.swaps) == 1
    restarted = make_run(tmp_path, strategy=adaptive(), takeover=True)  # starts on hash
    drive(spark, restarted, range(2, 3), total)
    assert type(restarted.store.placement_at(2)[0]) is switched  # used to swap back to hash
    assert restarted.swaps == []


# ---------------------------------------------------------------------- 2: counters
@pytest.mark.parametrize("steps", [
    [{"num_partitions": 2}, {"num_partitions": 5}, {"num_partitions": 1}],
    [{"num_partitions": 2, "mode": "fluid", "max_keys_per_batch": 4}],
], ids=["sync", "fluid"])
def test_counters_survive_every_rescale(spark: Any, tmp_path: Path,
                                        steps: list[dict[str, Any]]) -> None:
    run = make_run(tmp_path, strategy=tl.BlockPartitioner(4, num_blocks=32),
                   num_partitions=None)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    b = 1
    for step in steps:
        run.request_swap(**step)
        while True:  # every batch of the swap checks the rows counter (drive)
            total = drive(spark, run, range(b, b + 1), total)
            b += 1
            if run.swaps[-1].complete:
                break
            assert b < 40
        assert partitions_at(run, b - 1) == step["num_partitions"]
    total = drive(spark, run, range(b, b + 1), total)


# ---------------------------------------------------------------------- 3: refusals
def test_request_swap_refuses_more_partitions_than_blocks_at_once(
        spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path, strategy=tl.BlockPartitioner(4, num_blocks=16),
                   num_partitions=None)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    with pytest.raises(InvalidArgumentError, match="16 blocks"):
        run.request_swap(num_partitions=40)
    assert run.pending_swap is None
    drive(spark, run, range(1, 2), total)  # used to fail the batch
    assert run.swaps == []


def test_request_swap_refuses_modulo_on_string_keys_at_once(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    with pytest.raises(InvalidKeyTypeError):
        run.request_swap("modulo")
    restarted = make_run(tmp_path, takeover=True)  # the key type is known from the state
    with pytest.raises(InvalidKeyTypeError):
        restarted.request_swap("modulo", refit="none")
    drive(spark, restarted, range(1, 2), total)


def test_request_swap_on_double_keys(spark: Any, tmp_path: Path) -> None:
    keys = [float(i) + 0.5 for i in range(20)]
    run = make_run(tmp_path, processor=DoubleCount())
    total = drive(spark, run, range(1), pd.Series(dtype=float), keys=keys,
                  ddl="k double, t long")
    try:
        run.request_swap(num_partitions=6)
    except InvalidKeyTypeError:  # refused at once, or carried out; never a failed batch
        total = drive(spark, run, range(1, 2), total, keys=keys, ddl="k double, t long")
        assert run.swaps == [] and partitions_at(run, 1) == 4
        return
    total = drive(spark, run, range(1, 2), total, keys=keys, ddl="k double, t long")
    assert partitions_at(run, 1) == 6 and run.swaps[-1].refused is None


def test_a_plan_that_fails_at_the_batch_is_refused_and_the_batch_runs(
        spark: Any, tmp_path: Path, caplog: Any) -> None:
    run = make_run(tmp_path)
    run.request_swap("modulo")  # no batch yet: the key type is not known
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    with caplog.at_level(logging.WARNING, logger="trilink_spark.keyed"):
        total = drive(spark, run, range(1, 2), total)  # used to fail the batch
    report = run.swaps[-1]
    assert report.batch_id == 1 and report.refused and "modulo" in report.refused.lower()
    assert report.moved_keys == 0 and report.partitions_after == report.partitions_before
    assert any("refused" in r.getMessage() for r in caplog.records)
    assert run.pending_swap is None and type(run.store.placement_at(1)[0]).__name__ == \
        "HashPartitioner"
    drive(spark, run, range(2, 3), total)


def test_a_request_made_during_a_fluid_swap_never_fails_a_batch(
        spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path, strategy=tl.BlockPartitioner(4, num_blocks=32),
                   num_partitions=None)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    run.request_swap(num_partitions=2, mode="fluid", max_keys_per_batch=3)
    total = drive(spark, run, range(1, 2), total)
    assert not run.swaps[-1].complete
    try:
        run.request_swap(num_partitions=3)
    except InvalidArgumentError:
        return
    drive(spark, run, range(2, 3), total)  # refused or waiting: the batch runs


# ---------------------------------------------------------------------- 4: rebalancer
@pytest.mark.parametrize("interval, latency", [(1.0, 10**6), (1e-6, 5e11)])
def test_overloaded_advice_is_bounded(interval: float, latency: float) -> None:
    p = tl.BlockPartitioner(4)
    rb = LoadAwareRebalancer(trigger_interval=interval, window=1, cooldown_batches=0)
    rb.observe([latency] * 4, np.ones(p.num_blocks), p)
    decision = rb.decide()
    assert decision.state == "overloaded"
    assert decision.partitions is not None
    assert 4 < decision.partitions <= min(p.num_blocks, MAX_PARTITIONS), decision


def test_overloaded_advice_at_the_block_limit_recommends_no_rescale() -> None:
    p = tl.BlockPartitioner(8, num_blocks=8)
    rb = LoadAwareRebalancer(trigger_interval=1.0, window=1, cooldown_batches=0)
    rb.observe([5000.0] * 8, np.ones(8), p)
    decision = rb.decide()
    assert decision.state == "overloaded" and decision.partitions is None
    assert "8 blocks" in decision.reason


def test_following_overloaded_advice_never_fails_the_query(spark: Any, tmp_path: Path) -> None:
    class Overloaded:
        """Says "overloaded", recommending more partitions than the placement has blocks."""

        def observe(self, *args: Any) -> None:
            pass

        def decide(self) -> Any:
            from trilink_spark.switching import RebalanceDecision
            return RebalanceDecision("overloaded", [], "overloaded", partitions=5000)

        def apply(self, p: Any, decision: Any = None) -> Any:
            return p

    run = make_run(tmp_path, strategy=tl.BlockPartitioner(4, num_blocks=64),
                   num_partitions=None, rebalancer=Overloaded())
    total = drive(spark, run, range(2), pd.Series(dtype=float))
    decision = run.rebalances[-1][1]
    with pytest.raises(InvalidArgumentError):
        run.request_swap(num_partitions=decision.partitions)
    drive(spark, run, range(2, 3), total)


# ---------------------------------------------------------------------- 5: persisted requests
def test_a_request_survives_a_driver_killed_before_the_next_batch(
        spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    run.request_swap(num_partitions=6)
    del run  # the driver dies: the request was never planned
    restarted = make_run(tmp_path, takeover=True)
    total = drive(spark, restarted, range(1, 2), total)
    assert partitions_at(restarted, 1) == 6 and len(restarted.swaps) == 1  # used to be lost
    drive(spark, restarted, range(2, 3), total)
    assert partitions_at(restarted, 2) == 6 and len(restarted.swaps) == 1  # once


def test_a_request_planned_then_killed_is_carried_out_once(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    dying = make_run(tmp_path, sink=die_after_writing, takeover=True)
    dying.request_swap(num_partitions=6)
    df, counts = make_batch(spark, 1)
    with pytest.raises(Exception, match="driver died"):
        dying(df, 1)  # the plan is written; the commit is not
    restarted = make_run(tmp_path, takeover=True)
    total = drive(spark, restarted, range(1, 2), total)  # the replay reuses the plan
    assert partitions_at(restarted, 1) == 6 and len(restarted.swaps) == 1
    again = make_run(tmp_path, takeover=True)
    drive(spark, again, range(2, 4), total)
    assert again.swaps == [] and partitions_at(again, 3) == 6  # never a second time


def test_a_request_done_whose_record_outlived_the_commit_is_not_redone(
        spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    run.request_swap(num_partitions=6)
    record = next((tmp_path / "state").rglob("*request*.json"))
    kept = record.read_bytes()
    total = drive(spark, run, range(1, 2), total)
    assert not record.exists() and len(run.swaps) == 1
    record.write_bytes(kept)  # the driver died after the commit, before the delete
    restarted = make_run(tmp_path, takeover=True)
    drive(spark, restarted, range(2, 3), total)
    assert restarted.swaps == [] and not record.exists()


def test_a_cancelled_request_stays_cancelled_after_a_restart(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    run.request_swap(num_partitions=6)
    assert run.cancel_swap() is not None
    restarted = make_run(tmp_path, takeover=True)
    drive(spark, restarted, range(1, 2), total)
    assert restarted.swaps == [] and partitions_at(restarted, 1) == 4


def test_a_corrupt_request_record_is_named(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    total = drive(spark, run, range(1), pd.Series(dtype=float))
    run.request_swap(num_partitions=6)
    record = next((tmp_path / "state").rglob("*request*.json"))
    body = json.loads(record.read_text())
    body["body"]["num_partitions"] = 7  # the checksum no longer matches
    record.write_text(json.dumps(body))
    restarted = make_run(tmp_path, takeover=True)
    with pytest.raises(StateCorruptError, match=record.name):
        restarted(make_batch(spark, 1)[0], 1)
    record.unlink()  # what the message says to do: the request is dropped
    drive(spark, restarted, range(1, 2), total)
    assert partitions_at(restarted, 1) == 4
