"""Hostile inputs for load-aware rebalancing: measurements, decisions, timing files, the
keyed runtime's use of them, and ``task_metrics``.

Each test names what it protects: bad figures give a typed error and record nothing, a
decision only applies to the placement it was made for, a measurement never fails a batch,
each batch is measured once, and deciding stays O(blocks log blocks).
"""

from __future__ import annotations

import math
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import TaskContext, cloudpickle

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, InvalidArgumentTypeError
from trilink_spark.measurement import TASK_METRIC_COLUMNS, task_metrics
from trilink_spark.state import KeyedStateStore
from trilink_spark.switching import LoadAwareRebalancer, RebalanceDecision
from conftest import RunningCount
from trilink_spark.state import store as store_module
from trilink_spark.state.store import parse_timing

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _measured(p: tl.BlockPartitioner, latency: list[float], sizes: Any,
              **kw: Any) -> LoadAwareRebalancer:
    kw.setdefault("cooldown_batches", 0)
    kw.setdefault("window", 1)
    rb = LoadAwareRebalancer(**kw)
    rb.observe(latency, sizes, p)
    return rb


# ---------------------------------------------------------------------- measurements
@pytest.mark.parametrize("latency", [
    [True, False],                   # booleans are not milliseconds
    np.array([True, False]),
    ["300", "100"],                  # strings used to be parsed as numbers
    np.array(["300", "100"]),
    "31",
    [300.0, None],
    [1 + 1j, 2],
])
def test_odd_typed_latencies_are_refused_and_record_nothing(latency: Any) -> None:
    p = tl.BlockPartitioner(2, num_blocks=8)
    rb = LoadAwareRebalancer(cooldown_batches=0, window=1)
    with pytest.raises(InvalidArgumentTypeError, match="latency_by_partition"):
        rb.observe(latency, np.ones(8), p)
    assert rb.decide().reason == "no measurement yet"


@pytest.mark.parametrize("latency,sizes", [
    ([1e308, 1e308], np.ones(8)),     # the mean overflowed to inf: cv nan, "balanced"
    ([1.7e308, 1e300], np.ones(8)),
    ([300.0, 100.0], np.full(8, 1.7e308)),  # the moved records overflowed int()
    ([300.0, 100.0], [2**70] * 8),
    ({0: 10**400, 1: 1.0}, np.ones(8)),
])
def test_figures_too_large_to_average_are_refused(latency: Any, sizes: Any) -> None:
    p = tl.BlockPartitioner(2, num_blocks=8)
    rb = LoadAwareRebalancer(cooldown_batches=0, window=1)
    with pytest.raises(InvalidArgumentError, match="at most 1e"):
        rb.observe(latency, sizes, p)
    assert rb.decide().reason == "no measurement yet"


def test_the_largest_accepted_figures_decide_finite_numbers() -> None:
    p = tl.BlockPartitioner(2, num_blocks=8)
    d = _measured(p, [1e15, 1e14], np.full(8, 1e15)).decide()
    assert d.state == "skewed"
    assert all(math.isfinite(x) for x in (d.max_ms, d.mean_ms, d.cv, d.threshold_ms))


# ---------------------------------------------------------------------- apply
def test_apply_refuses_a_decision_for_another_placement() -> None:
    p = tl.BlockPartitioner(2, num_blocks=8)
    rb = _measured(p, [300.0, 100.0], [5, 10, 20, 30, 10, 10, 10, 10])
    d = rb.decide()
    assert d.moves
    others = [
        tl.BlockPartitioner(3, num_blocks=8),  # other partitions: blocks 0, 1 still on 0
        tl.BlockPartitioner(2, num_blocks=4),  # other blocks: pmod(hash, 4) is not (.., 8)
        p.with_table([0, 0, 0, 1, 1, 1, 1, 0]),  # same shape, another table
    ]
    for other in others:
        with pytest.raises(InvalidArgumentError, match="measured a placement"):
            rb.apply(other, d)
        with pytest.raises(InvalidArgumentError, match="measured a placement"):
            rb.apply(other)
    assert rb.rounds == 0
    new = rb.apply(p, d)  # the placement it measured still works
    assert rb.rounds == 1 and new.table.tolist() != p.table.tolist()


def test_a_fresh_rebalancer_refuses_a_decision_for_another_partition_count() -> None:
    p = tl.BlockPartitioner(2, num_blocks=8)
    d = _measured(p, [300.0, 100.0], [5, 10, 20, 30, 10, 10, 10, 10]).decide()
    with pytest.raises(InvalidArgumentError, match="made for 2 partitions"):
        LoadAwareRebalancer().apply(tl.BlockPartitioner(4, num_blocks=8), d)


@pytest.mark.parametrize("decision", [
    "moves",
    RebalanceDecision("skewed", [("a", 0, 1)], "forged"),
    RebalanceDecision("skewed", [(0.5, 0, 1)], "forged"),
    RebalanceDecision("skewed", [(True, 0, 1)], "forged"),
    RebalanceDecision("skewed", [(0, 1)], "forged"),  # type: ignore[list-item]
])
def test_apply_refuses_malformed_decisions_with_a_typed_error(decision: Any) -> None:
    p = tl.BlockPartitioner(2, num_blocks=8)
    rb = _measured(p, [300.0, 100.0], np.ones(8))
    with pytest.raises(InvalidArgumentTypeError):
        rb.apply(p, decision)
    assert rb.rounds == 0


# ---------------------------------------------------------------------- scale
def _decide_seconds(m: int, k: int, repeat: int) -> float:
    rng = np.random.default_rng(0)
    p = tl.BlockPartitioner(m, num_blocks=k)
    sizes = rng.integers(1, 100, size=k).astype(float)
    latency = np.bincount(p.table, weights=sizes, minlength=m)
    latency[: m // 2] *= 3  # half the partitions slow: m/2 pairs exchange blocks
    rb = _measured(p, latency.tolist(), sizes)
    best = math.inf
    for _ in range(repeat):
        started = time.perf_counter()
        d = rb.decide()
        best = min(best, time.perf_counter() - started)
    assert d.state == "skewed" and len(d.moves) > m // 4
    return best


def test_deciding_on_thousands_of_partitions_and_2_20_blocks_is_n_log_n() -> None:
    """Each pair used to scan the whole table for its blocks: O(partitions x blocks)."""
    small = _decide_seconds(2**11, 2**16, 3)
    _decide_seconds(2**13, 2**18, 1)
    big = _decide_seconds(2**15, 2**20, 1)
    # 16x the blocks (and partitions): about 16 x log(blocks) the time, not 16 x 16
    assert big / small < 40, (small, big)
    assert big < 10.0


def test_observing_2_20_blocks_is_linear() -> None:
    p = tl.BlockPartitioner(4, num_blocks=2**20)
    sizes = np.ones(2**20)
    rb = LoadAwareRebalancer(cooldown_batches=0, window=3)
    started = time.perf_counter()
    for _ in range(3):
        rb.observe([100.0, 100.0, 100.0, 400.0], sizes, p)
    assert time.perf_counter() - started < 2.0
    assert rb.decide().state == "skewed"


# ---------------------------------------------------------------------- threads
def test_observe_and_decide_from_four_threads_never_raise() -> None:
    """decide() iterated the window while observe() appended to it: 'deque mutated during
    iteration'."""
    p = tl.BlockPartitioner(8, num_blocks=256)
    rb = LoadAwareRebalancer(cooldown_batches=0, window=200)
    latency, sizes = np.linspace(100.0, 300.0, 8), np.ones(256)
    errors: list[str] = []

    def observe() -> None:
        for _ in range(2000):
            try:
                rb.observe(latency, sizes, p)
            except Exception as err:  # noqa: BLE001 - collected for the assertion
                errors.append(repr(err))

    def decide() -> None:
        for _ in range(300):
            try:
                rb.decide()
            except Exception as err:  # noqa: BLE001
                errors.append(repr(err))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=f) for f in (observe, observe, decide, decide)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert rb.decide().latencies_ms == [round(float(x), 3) for x in latency]


def test_a_rebalancer_pickles_with_its_measurements() -> None:
    p = tl.BlockPartitioner(2, num_blocks=8)
    rb = _measured(p, [300.0, 100.0], [5, 10, 20, 30, 10, 10, 10, 10])
    copy = pickle.loads(pickle.dumps(rb))
    assert copy.decide().moves == rb.decide().moves
    copy.observe([300.0, 100.0], np.ones(8), p)  # its lock works after unpickling


# ---------------------------------------------------------------------- timing files
@pytest.mark.parametrize("raw", [
    b'{"rows": 1, "process_ms": ' + b"9" * 400 + b"}",  # used to raise OverflowError
    b'{"rows": ' + b"9" * 400 + b', "process_ms": 1}',
    b'{"rows": 1, "process_ms": 1, "block_rows": {"blocks": [' + b"9" * 30
    + b'], "rows": [1]}}',
    b'{"rows": 1, "process_ms": 1, "block_rows": {"blocks": [1], "rows": [' + b"9" * 30
    + b']}}',
    b'{"rows": 1, "process_ms": 1, "block_rows": {"blocks": [[1]], "rows": [1]}}',
    b'{"rows": 1, "process_ms": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"rows": 1, "process_ms": true}',
    b'{"rows": 1, "process_ms": 1, "upkeep_ms": "slow"}',
    b'{"rows": 1, "process_ms": 1, "upkeep_ms": -3}',
    b'{"rows": 1, "process_ms": 1, "phases_ms": {"sync": 1, "read": 1, "hooks": 1}}',
    b'{"rows": 1, "process_ms": 1, "phases_ms": {"sync": 1, "read": 1, "hooks": 1, '
    b'"write": -1}}',
    b'{"rows": 1, "process_ms": 1, "phases_ms": [1, 1, 1, 1]}',
    b"\xef\xbb\xbf{}",
])
def test_forged_timing_records_are_ignored_never_raised(raw: bytes) -> None:
    assert parse_timing(raw, "forged") is None


class _CountingFS:
    """A filesystem that records how many bytes each read asked for."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads: list[int | None] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def open_input_stream(self, path: str) -> Any:
        stream = self.inner.open_input_stream(path)
        reads = self.reads

        class Stream:
            def __enter__(self) -> Stream:
                return self

            def __exit__(self, *exc: Any) -> None:
                stream.close()

            def read(self, size: int | None = None) -> bytes:
                reads.append(size)
                data: bytes = stream.read() if size is None else stream.read(size)
                return data

        return Stream()


def test_a_huge_timing_file_is_never_read_whole(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "MAX_TIMING_BYTES", 1000)
    store = KeyedStateStore(str(tmp_path / "s"))
    store.save_timing(0, 3, {"rows": 1, "process_ms": 2.0, "pad": "x" * 100_000})
    counting = _CountingFS(store.fs)
    store.fs = counting
    assert store.timing(0, 3) is None
    assert counting.reads and all(r is not None and r <= 1001 for r in counting.reads)


# ---------------------------------------------------------------------- task_metrics
@pytest.mark.parametrize("kw,error", [
    ({"stage_ids": 5}, InvalidArgumentTypeError),      # used to be a bare TypeError
    ({"stage_ids": [1.0]}, InvalidArgumentTypeError),
    ({"stage_ids": [True]}, InvalidArgumentTypeError),
    ({"job_group": b"g"}, InvalidArgumentTypeError),
])
def test_task_metrics_refuses_bad_arguments_with_typed_errors(
        spark: Any, kw: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        task_metrics(spark, **kw)


@pytest.mark.parametrize("session", [None, "spark", 3])
def test_task_metrics_refuses_what_is_not_a_session(session: Any) -> None:
    with pytest.raises(InvalidArgumentTypeError, match="SparkSession"):
        task_metrics(session)


def _boom(x: int) -> int:
    raise ValueError("boom")


def test_task_metrics_after_a_failed_job_lists_its_failed_tasks(spark: Any) -> None:
    sc = spark.sparkContext
    sc.setJobGroup("tl-hostile-failed-job", "a job that fails")
    try:
        with pytest.raises(Exception, match="boom"):
            sc.parallelize(range(4), 2).map(_boom).collect()
    finally:
        sc.setJobGroup("", "")
    m = task_metrics(spark, job_group="tl-hostile-failed-job")
    assert m.attrs["unavailable"] is None
    assert "FAILED" in set(m.status) and set(m.partition) <= {0, 1}
    assert list(m.columns) == list(TASK_METRIC_COLUMNS)


# ---------------------------------------------------------------------- the keyed runtime
class _Counting(LoadAwareRebalancer):
    """A rebalancer that records every measurement it is shown."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.shown: list[float] = []

    def observe(self, latency: Any, sizes: Any, partitioner: tl.BlockPartitioner) -> None:
        self.shown.append(float(np.sum(sizes)))
        super().observe(latency, sizes, partitioner)


def _batch(spark: Any, b: int, n: int = 40) -> Any:
    return spark.createDataFrame(pd.DataFrame({
        "k": [f"k{i % 9}" for i in range(n)],
        "t": np.arange(n, dtype=np.int64) + n * b}))


def _expected_counts(batches: int, n: int = 40) -> dict[str, int]:
    keys = [f"k{i % 9}" for i in range(n)] * batches
    return {k: keys.count(k) for k in set(keys)}


def test_a_replayed_batch_is_shown_to_the_rebalancer_once(spark: Any, tmp_path: Path) -> None:
    rb = _Counting(cooldown_batches=0, window=2)
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", RunningCount(), 1_000_000,
                                 str(tmp_path / "s"), strategy=tl.BlockPartitioner(2, 16),
                                 rebalancer=rb)
    run(_batch(spark, 0), 0)
    run(_batch(spark, 1), 1)
    run(_batch(spark, 1), 1)  # the same batch again (a restarted query replays it)
    assert rb.shown == [40.0, 40.0]
    assert [b for b, _ in run.rebalances] == [0, 1]
    assert {k: int(v["n"]) for k, v in run.state_values().items()} == _expected_counts(2)


def _forging_sink(record: bytes, holder: dict[str, Any]) -> Any:
    """A foreachBatch function that computes the output, then forges partition 0's timing
    record before the rebalancer reads it."""
    def sink(df: Any, batch_id: int) -> None:
        df.count()
        Path(holder["run"].store.timing_path(0, batch_id)).write_bytes(record)
    return sink


@pytest.mark.parametrize("record", [
    b'{"rows": 1, "process_ms": 5, "block_rows": {"blocks": [99], "rows": [1]}}',
    b'{"rows": 1, "process_ms": ' + b"9" * 400 + b"}",
    b'{"rows": 1, "process_ms": 9e300}',
])
def test_a_forged_timing_record_never_fails_the_batch(spark: Any, tmp_path: Path,
                                                      record: bytes) -> None:
    holder: dict[str, Any] = {}
    rb = _Counting(cooldown_batches=0, window=1)
    run = tl.keyed_foreach_batch(_forging_sink(record, holder), "k", "t", RunningCount(),
                                 1_000_000, str(tmp_path / "s"),
                                 strategy=tl.BlockPartitioner(2, 16), rebalancer=rb)
    holder["run"] = run
    run(_batch(spark, 0), 0)  # used to raise IndexError / OverflowError after the commit
    assert run.rebalances == [] and run.pending_swap is None
    assert {k: int(v["n"]) for k, v in run.state_values().items()} == _expected_counts(1)


def test_a_timing_file_that_cannot_be_written_never_fails_the_batch(
        spark: Any, tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", RunningCount(), 1_000_000,
                                 str(tmp_path / "s"), strategy=tl.BlockPartitioner(2, 16),
                                 rebalancer=LoadAwareRebalancer())
    run(_batch(spark, 0), 0)
    Path(run.store.timing_path(0, 1)).mkdir()  # junk where the record goes
    run(_batch(spark, 1), 1)  # the task used to fail on the timing write
    timings = run.task_timings()
    assert timings.rows.tolist()[0] == -1 and timings.rows.tolist()[1] > 0
    assert [b for b, _ in run.rebalances] == [0]  # batch 1: nothing decided, no crash
    assert {k: int(v["n"]) for k, v in run.state_values().items()} == _expected_counts(2)


def test_task_timings_refuses_a_version_that_is_not_committed(spark: Any,
                                                              tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", RunningCount(), 1_000_000,
                                 str(tmp_path / "s"), strategy=tl.BlockPartitioner(2, 16))
    run(_batch(spark, 0), 0)
    assert run.task_timings(0).rows.sum() == 40
    with pytest.raises(InvalidArgumentError, match="not a committed version"):
        run.task_timings(77)  # used to answer -1 for every partition
    with pytest.raises(InvalidArgumentTypeError, match="version must be an int"):
        run.task_timings("0")  # type: ignore[arg-type]


class _FailsFirstAttempt(RunningCount):
    """Partition 0's task fails on its first attempt."""

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        context = TaskContext.get()
        if context is not None and context.partitionId() == 0 \
                and context.attemptNumber() == 0:
            raise RuntimeError("injected failure on the first attempt")
        return super().process_on_time(key, rows, ctx)


def test_a_task_retried_under_a_rebalancer_counts_each_row_once(spark: Any,
                                                                tmp_path: Path) -> None:
    if not spark.sparkContext.master.replace(" ", "").endswith(",2]"):
        pytest.skip("the shared session allows no task retry")
    rb = _Counting(cooldown_batches=0, window=1)
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", _FailsFirstAttempt(),
                                 1_000_000, str(tmp_path / "s"),
                                 strategy=tl.BlockPartitioner(2, 16), rebalancer=rb)
    sc = spark.sparkContext
    sc.setJobGroup("tl-hostile-retry", "a batch whose task fails once")
    try:
        run(_batch(spark, 0), 0)
    finally:
        sc.setJobGroup("", "")
    statuses = task_metrics(spark, job_group="tl-hostile-retry").status.tolist()
    assert "FAILED" in statuses  # the injected failure happened, and was retried
    assert {k: int(v["n"]) for k, v in run.state_values().items()} == _expected_counts(1)
    timings = run.task_timings()
    assert int(timings.rows.sum()) == 40 and (timings.process_ms >= 0).all()
    assert rb.shown == [40.0] and [b for b, _ in run.rebalances] == [0]
