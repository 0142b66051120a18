"""Hostile probes of fluid swaps between block tables (whole blocks, smallest first) and of the
batched conversion of processor outputs.

Every probe checks the swap guarantees against an oracle: after every batch each key is stored
in exactly one partition with its exact count, and a fluid swap over blocks moves every block
once, at most ``max_keys_per_batch`` keys per batch (except one block larger than that, alone).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError
from trilink_spark.keyed import KeyedBatchFunction, KeyedContext
from conftest import RunningCount
from testkit.swaps import check_invariants, die_after_writing
from trilink_spark.keyed.run.task import outputs_to_batches

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS: list[Any] = [f"u{i:03d}" for i in range(28)]


Count = RunningCount  # running count per key, typed state; a null key is emitted as null


def _key(k: Any) -> Any:
    return None if isinstance(k, float) and math.isnan(k) else k


def make_run(tmp_path: Path, **kw: Any) -> KeyedBatchFunction:
    kw.setdefault("num_partitions", 8)
    return tl.keyed_foreach_batch(lambda df, b: df.collect(), "k", "t", Count(), 10**6,
                                  str(tmp_path / "state"), **kw)


def make_batch(spark: Any, b: int, rng: np.random.Generator, keys: list[Any],
               rows: int = 160) -> tuple[Any, pd.Series]:
    weights = 1.0 / np.arange(1, len(keys) + 1) ** 0.7
    picked = rng.choice(len(keys), size=rows, p=weights / weights.sum())
    ks = [keys[i] for i in picked]
    frame = pd.DataFrame({"k": ks, "t": np.arange(b * rows, (b + 1) * rows, dtype=np.int64)})
    df = spark.createDataFrame(frame, "k string, t long")
    counts = pd.Series(ks, dtype=object).fillna("<null>").value_counts()
    return df, counts


def owners(run: KeyedBatchFunction, version: int | None = None) -> dict[Any, int]:
    return {_key(k): p for k, p in run.owners(version).items()}


def drive_fluid_swap(spark: Any, run: KeyedBatchFunction, rng: np.random.Generator,
                     keys: list[Any], total: pd.Series, start: int, cap: int,
                     hook: Any = None) -> tuple[KeyedBatchFunction, pd.Series, int]:
    """Run batches until the fluid swap completes, checking every step against the oracle.
    ``hook(run, df, b)`` runs before batch ``b`` and may hand back another runner."""
    b, moved_blocks = start, set()
    while True:
        before = owners(run)
        df, counts = make_batch(spark, b, rng, keys)
        if hook is not None:
            run = hook(run, df, b)
        run(df, b)
        total = total.add(counts, fill_value=0)
        check_invariants(run, total, null_key="<null>")
        report = run.swaps[-1]
        assert report.batch_id == b
        placement, _ = run.store.placement_at(b)
        assert isinstance(placement, tl.BlockPartitioner)  # blocks, never a key overlay
        after = owners(run, b)
        moved = [k for k in before if before[k] != after[k]]
        assert None not in moved and after[None] == 0  # the null key stays on partition 0
        assert len(moved) == report.moved_keys > 0  # no empty step: every step moves keys
        blocks = {placement.block_of(k) for k in moved}
        assert len(moved) <= cap or len(blocks) == 1, (len(moved), blocks)
        assert not blocks & moved_blocks  # a block moves once
        moved_blocks |= blocks
        # whole blocks: every stored key sits where the batch's block table says
        assert all(p == placement.partition(k) for k, p in after.items() if k is not None)
        b += 1
        assert b < start + 30, "the fluid swap does not finish"
        if report.complete:
            return run, total, b


def start_run(spark: Any, tmp_path: Path, rng: np.random.Generator, keys: list[Any],
              before: int) -> tuple[KeyedBatchFunction, tl.BlockPartitioner, pd.Series]:
    strategy = tl.BlockPartitioner(before, num_blocks=8, null_policy="partition0")
    run = make_run(tmp_path, strategy=strategy, num_partitions=before)
    total = pd.Series(dtype=float)
    df, counts = make_batch(spark, 0, rng, keys)
    run(df, 0)
    total = counts.astype(float)
    check_invariants(run, total, null_key="<null>")
    return run, strategy, total


def finish(spark: Any, run: KeyedBatchFunction, rng: np.random.Generator, keys: list[Any],
           total: pd.Series, b: int, after: int) -> None:
    final, n = run.store.placement_at(b - 1)
    assert isinstance(final, tl.BlockPartitioner) and n == after
    got = owners(run)
    assert set(got.values()) <= set(range(after))
    assert all(final.partition(k) == p for k, p in got.items() if k is not None)
    df, counts = make_batch(spark, b, rng, keys)  # later batches: no swap, exact counts
    run(df, b)
    check_invariants(run, total.add(counts, fill_value=0), null_key="<null>")
    assert run.swaps[-1].batch_id == b - 1


KEYS_AND_NULL = [KEYS[0], None] + KEYS[1:]


def test_fluid_block_shrink_8_to_3_with_null_keys_and_a_replayed_step(
        spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(83)
    run, _, total = start_run(spark, tmp_path, rng, KEYS_AND_NULL, 8)
    run.request_swap(num_partitions=3, mode="fluid", max_keys_per_batch=6)
    replayed: list[int] = []

    def replay_first_step(current: KeyedBatchFunction, df: Any, b: int
                          ) -> KeyedBatchFunction:
        if b == 2:  # replay step 1 (a restarted query re-runs its last batch): no change
            swap_dir = tmp_path / "state" / "swaps" / f"{1:012d}"
            plan = (swap_dir / "plan.json").read_bytes()
            state = {p: current.store.load(p, 1) for p in range(8)}
            current(df_step1[0], 1)
            assert (swap_dir / "plan.json").read_bytes() == plan
            assert {p: current.store.load(p, 1) for p in range(8)} == state
            replayed.append(b)
        else:
            df_step1[:] = [df]
        return current

    df_step1: list[Any] = []
    run, total, b = drive_fluid_swap(spark, run, rng, KEYS_AND_NULL, total, 1, 6,
                                     replay_first_step)
    assert replayed == [2] and len(run.swaps) >= 3
    finish(spark, run, rng, KEYS_AND_NULL, total, b, 3)


def test_fluid_block_grow_3_to_8_blocks_over_the_cap_across_a_restart(
        spark: Any, tmp_path: Path) -> None:
    """Every block holds more than max_keys_per_batch keys: one block per batch. At batch 2
    the driver dies after the tasks wrote state, before the commit; a new runner on the same
    state path replays batch 2 with its stored plan and finishes the swap."""
    rng = np.random.default_rng(38)
    run, strategy, total = start_run(spark, tmp_path, rng, KEYS_AND_NULL, 3)
    run.request_swap(num_partitions=8, mode="fluid", max_keys_per_batch=3)
    restarted: list[int] = []

    def restart(current: KeyedBatchFunction, df: Any, b: int) -> KeyedBatchFunction:
        if b != 2:
            return current
        dying = tl.keyed_foreach_batch(die_after_writing, "k", "t", Count(), 10**6,
                                       str(tmp_path / "state"), strategy=strategy,
                                       num_partitions=3, takeover=True)
        with pytest.raises(Exception, match="driver died"):
            dying(df, 2)
        restarted.append(b)
        return make_run(tmp_path, strategy=strategy, num_partitions=3, takeover=True)

    run, total, b = drive_fluid_swap(spark, run, rng, KEYS_AND_NULL, total, 1, 3, restart)
    assert restarted == [2] and len(run.swaps) >= 3
    finish(spark, run, rng, KEYS_AND_NULL, total, b, 8)


# ---------------------------------------------------------------------- planner at scale
def _write_version(store: Any, version: int, where: dict[Any, int], partitions: int) -> None:
    from trilink_spark.keyed.semantics.keys import NULL_KEY, PartitionState
    from trilink_spark.keyed.durable.codec import encode_state

    states = [PartitionState() for _ in range(partitions)]
    for i, (k, p) in enumerate(where.items()):
        key = NULL_KEY if k is None else k
        states[p].key_rows[key] = i % 5 + 1
        states[p].values[key] = {"n": i}
    for p, st in enumerate(states):
        store.save_table(p, version, encode_state(st, pa.string(), pa.struct([("n", pa.int64())])))


@pytest.mark.parametrize("before,after,cap", [(8, 3, 1_500), (3, 8, 700)])
def test_fluid_block_planner_on_20000_keys(tmp_path: Path, before: int, after: int,
                                           cap: int) -> None:
    """The planner alone (no Spark), step after step as the runner drives it: each step moves
    whole blocks not moved before, at most ``cap`` keys, keeps a block table whose placement
    matches where every key is stored, and the swap ends on the target."""
    import time

    from trilink_spark.keyed.swaps.plan import SwapRequest, plan_swap
    from trilink_spark.state.store import KeyedStateStore

    keys: list[Any] = [f"key-{i}" for i in range(20_000)] + [None]
    current: Any = tl.BlockPartitioner(before, num_blocks=1024, null_policy="partition0")
    where = dict(zip(keys, current.assign(keys).tolist()))
    store = KeyedStateStore(str(tmp_path / "state"))
    _write_version(store, 0, where, before)
    store.save_placement(0, current, before)
    placements = [0]
    store.write_manifest({"committed": [0], "placements": placements})
    request = SwapRequest.checked(None, after, "minimal", "fluid", cap)
    target = None
    moved_blocks: set[int] = set()
    for v in range(1, 60):
        started = time.perf_counter()
        plan, moves, placement = plan_swap(store, v, v - 1, current, request, target)
        assert time.perf_counter() - started < 5
        assert isinstance(placement, tl.BlockPartitioner)
        moved = moves.column("key").to_pylist()
        assert None not in moved and 0 < len(moved) == plan["moved_keys"]
        blocks = set(placement.blocks(moved).tolist())
        assert len(moved) <= cap or len(blocks) == 1
        assert not blocks & moved_blocks
        moved_blocks |= blocks
        for k, to in zip(moved, moves.column("to").to_pylist()):
            where[k] = to
        # the placement of the step places every stored key where it now is
        assert placement.assign(keys).tolist() == [where[k] for k in keys]
        partitions = placement.num_partitions
        _write_version(store, v, where, partitions)
        store.save_placement(v, placement, partitions)
        placements.append(v)
        store.write_manifest({"committed": [v - 1, v], "placements": placements})
        if plan["complete"]:
            break
        current = placement
        target = tl.Partitioner.from_dict(plan["target"])
        request = SwapRequest(None, None, "none", "fluid", plan["max_keys_per_batch"])
    else:
        raise AssertionError("the fluid swap does not finish")
    assert placement.num_partitions == after and v >= 3
    assert placement.to_dict() == plan["target"]
    assert where[None] == 0


# ---------------------------------------------------------------------- output conversion
def _old_outputs_to_batches(outs: list[Any], arrow_schema: Any) -> Any:
    """The conversion before the change (git show 9ad7058:trilink_spark/keyed/runner.py):
    one frame and one Arrow table per processor call."""
    names = arrow_schema.names
    for out in outs:
        if out is None:
            continue
        frame = out if isinstance(out, pd.DataFrame) else pd.DataFrame(list(out), columns=names)
        if not len(frame):
            continue
        table = pa.Table.from_pandas(frame[names], schema=arrow_schema, preserve_index=False)
        yield from table.to_batches()


def _rows(convert: Any, outs: list[Any], schema: Any) -> list[dict[str, Any]]:
    batches = list(convert(outs, schema))
    return pa.Table.from_batches(batches, schema=schema).to_pylist() if batches else []


OUT = pa.schema([("k", pa.string()), ("n", pa.int64())])


def test_outputs_keep_order_across_frames_rows_none_and_empties() -> None:
    outs = [[("a", 1)], None, pd.DataFrame({"k": ["x"], "n": [7]}), [], [("b", 2), ("c", 3)],
            pd.DataFrame({"k": [], "n": []}), iter([("d", 4)]), [{"k": "e", "n": 5}],
            [("f", None)], None]
    want = [("a", 1), ("x", 7), ("b", 2), ("c", 3), ("d", 4), ("e", 5), ("f", None)]
    got = _rows(outputs_to_batches, outs, OUT)
    assert [(r["k"], r["n"]) for r in got] == want
    assert _rows(outputs_to_batches, [None, [], pd.DataFrame()], OUT) == []


@pytest.mark.parametrize("outs,want", [
    ([[("a", 2**53 + 1)], [("b", None)]], [("a", 2**53 + 1), ("b", None)]),
    ([[("a", -(2**63))], [("b", float("nan"))], [("c", 2**63 - 1)]],
     [("a", -(2**63)), ("b", None), ("c", 2**63 - 1)]),
    ([[{"k": "a", "n": 1}], [("b", 2)]], [("a", 1), ("b", 2)]),
    ([[("a", True)], [("b", 2)]], [("a", 1), ("b", 2)]),
    ([[("a", 3.0)], [("b", 2**60 + 1)]], [("a", 3), ("b", 2**60 + 1)]),
], ids=["long-beyond-2^53-then-null", "extremes-and-nan", "dict-then-tuple", "bool-then-int",
        "float-then-big-int"])
def test_rows_gathered_across_calls_convert_as_each_call_alone(outs: list[Any],
                                                               want: list[Any]) -> None:
    """Each call alone converts exactly (the old per-call conversion gives ``want``);
    gathering the calls must not turn a long column into inexact floats or refuse a mix."""
    per_call = [r for out in outs for r in _rows(_old_outputs_to_batches, [out], OUT)]
    assert [(r["k"], r["n"]) for r in per_call] == want
    got = _rows(outputs_to_batches, outs, OUT)
    assert [(r["k"], r["n"]) for r in got] == want


@pytest.mark.parametrize("outs", [
    [[("a",)], [("b", 2)]],
    [[("b", 2)], [("a",)]],
    [[("b", 2, 3)]],
    [["ab"]],
    [[("a", "x")]],
], ids=["short-then-full", "full-then-short", "too-wide", "str-row", "str-in-long"])
def test_malformed_rows_are_a_typed_error_never_padded(outs: list[Any]) -> None:
    with pytest.raises(InvalidArgumentError, match="output"):
        list(outputs_to_batches(outs, OUT))


def test_outputs_match_the_per_call_conversion_on_random_calls() -> None:
    import datetime
    import decimal
    import random

    schema = pa.schema([("k", pa.string()), ("n", pa.int64()), ("i", pa.int32()),
                        ("x", pa.float64()), ("t", pa.timestamp("us", tz="UTC")),
                        ("d", pa.date32()), ("b", pa.bool_()), ("l", pa.list_(pa.int64())),
                        ("m", pa.decimal128(10, 2))])
    utc = datetime.timezone.utc
    pools: dict[str, list[Any]] = {
        "k": ["a", None, "", "\U0001F600"], "n": [1, None, 2**40, -5, np.int64(5)],
        "i": [1, None, -(2**31), np.int32(4)], "x": [1.5, None, math.nan, math.inf, 2],
        "t": [datetime.datetime(2020, 1, 1, tzinfo=utc), None,
              pd.Timestamp("2021-01-01", tz="UTC"), datetime.datetime(2020, 1, 1)],
        "d": [datetime.date(2020, 1, 1), None], "b": [True, False, None],
        "l": [[1, 2], [], None, [2**53 + 1]], "m": [decimal.Decimal("1.25"), None]}
    rng = random.Random(7)

    def row() -> tuple[Any, ...]:
        return tuple(rng.choice(pools[f.name]) for f in schema)

    for _ in range(150):
        outs: list[Any] = []
        for _ in range(rng.randint(1, 5)):
            r = rng.random()
            rows = [row() for _ in range(rng.randint(1, 3))]
            outs.append(None if r < 0.1 else [] if r < 0.2 else
                        pd.DataFrame(rows, columns=schema.names) if r < 0.35 else rows)
        want = _rows(_old_outputs_to_batches, outs, schema)
        assert _rows(outputs_to_batches, outs, schema) == want, outs


class MixedOutputs(tl.KeyedWatermarkProcessFunction):
    """Per key, one of: None, [], a one-row DataFrame, a dict row, a long beyond 2^53 or a
    null long, so one partition's calls mix every kind."""

    output_schema = "k string, n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        kind = int(key[1:]) % 6
        if kind == 0:
            return None
        if kind == 1:
            return []
        if kind == 2:
            return pd.DataFrame({"k": [key], "n": [len(rows)]})
        if kind == 3:
            return [{"n": len(rows), "k": key}]
        if kind == 4:
            return [(key, 2**53 + len(rows))]
        return [(key, None)]


class ShortRow(MixedOutputs):
    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        return [(key,)] if key == "k7" else [(key, 1)]


def test_keyed_process_outputs_every_kind_exactly(spark: Any) -> None:
    keys = [f"k{i}" for i in range(36)]
    frame = pd.DataFrame({"k": keys * 2, "t": range(72)})
    df = spark.createDataFrame(frame, "k string, t long")
    got = tl.keyed_process(df, "k", "t", MixedOutputs(), 10, num_partitions=2).toPandas()
    want = []
    for k in keys:
        kind = int(k[1:]) % 6
        if kind in (2, 3):
            want.append((k, 2))
        elif kind == 4:
            want.append((k, 2**53 + 2))
        elif kind == 5:
            want.append((k, None))
    rows = sorted((r.k, None if pd.isna(r.n) else int(r.n)) for r in got.itertuples())
    assert rows == sorted(want)
    with pytest.raises(Exception, match="does not hold one value per column"):
        tl.keyed_process(df, "k", "t", ShortRow(), 10, num_partitions=2).collect()


def test_fluid_swap_resumed_from_a_key_overlay_over_blocks(tmp_path: Path) -> None:
    """A fluid swap planned before block steps stored a key overlay over a block table; a
    restart on this release resumes it. Block steps from the overlay's base would drop the
    overrides: the keys they placed would get new rows in one partition, their state in
    another."""
    from trilink_spark.keyed.swaps.plan import SwapRequest, plan_swap
    from trilink_spark.partitioners.tables.overlay import OverlayPartitioner
    from trilink_spark.state.store import KeyedStateStore

    keys: list[Any] = [f"key-{i}" for i in range(400)]
    base = tl.BlockPartitioner(4, num_blocks=16)
    target = base.with_table([0, 1, 2] * 5 + [0], 3)
    wanted = dict(zip(keys, target.assign(keys).tolist()))
    first = [k for k in keys if wanted[k] != base.partition(k)][:10]
    current: Any = OverlayPartitioner(base, {k: wanted[k] for k in first}, num_partitions=4)
    where = dict(zip(keys, current.assign(keys).tolist()))
    store = KeyedStateStore(str(tmp_path / "state"))
    _write_version(store, 0, where, 4)
    store.save_placement(0, current, 4)
    store.write_manifest({"committed": [0], "placements": [0]})
    request = SwapRequest(None, None, "none", "fluid", 20)
    for v in range(1, 40):
        plan, moves, placement = plan_swap(store, v, v - 1, current, request, target)
        assert moves.num_rows <= 20
        for k, to in zip(moves.column("key").to_pylist(), moves.column("to").to_pylist()):
            where[k] = to
        assert placement.assign(keys).tolist() == [where[k] for k in keys], v
        _write_version(store, v, where, placement.num_partitions)
        store.save_placement(v, placement, placement.num_partitions)
        store.write_manifest({"committed": [v - 1, v], "placements": list(range(v + 1))})
        if plan["complete"]:
            break
        current = placement
    else:
        raise AssertionError("the fluid swap does not finish")
    assert placement.to_dict() == target.to_dict()


class CountLong(tl.KeyedWatermarkProcessFunction):
    output_schema = "k long, n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        return [(_key(key), len(rows))]


@pytest.mark.xfail(strict=True, reason="pre-existing, outside this change: a task's rows reach "
                   "the runtime through to_pandas(), which turns a long key column holding a "
                   "null into float64, so 2^53 and 2^53 + 1 become one key (decode_keys does "
                   "the same to stored keys); fixing it changes the key type every hook sees")
def test_long_keys_beyond_2_53_stay_distinct_next_to_a_null_key(spark: Any) -> None:
    df = spark.createDataFrame(pd.DataFrame({"k": [2**53, 2**53 + 1, None], "t": [1, 2, 3]}),
                               "k long, t long")
    got = tl.keyed_process(df, "k", "t", CountLong(), 10,
                           strategy=tl.HashPartitioner(1, null_policy="partition0")).collect()
    assert sorted((r.k is None, r.k or 0, r.n) for r in got) == [
        (False, 2**53, 1), (False, 2**53 + 1, 1), (True, 0, 1)]
