"""Swaps between bounded tables plan by key groups from the executors' local copies: whole
groups by range scan, named keys by lookup. The same plan, moves and state as the key plan,
without reading the state path on the driver."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from conftest import KeylessCount, RunningCount
from testkit.swaps import check_invariants
from trilink_spark.keyed.durable.local_sync import LocalConfig
from trilink_spark.keyed.swaps.block_plan import BlockAim, block_aim, group_steps
from trilink_spark.keyed.swaps.plan import SwapRequest
from trilink_spark.state.store import KeyedStateStore

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STRING_KEYS: list[Any] = [f"u{i:04d}" for i in range(900)]
INT_KEYS: list[Any] = list(range(-450, 450))
BOUND = 60  # every stream below holds 900 keys: its tables are bounded


def batch(spark: Any, b: int, rows: int, keys: list[Any], ddl: str,
          nulls: int = 0) -> tuple[Any, pd.Series]:
    """Batch ``b``: ``rows`` skewed rows (every key once more in batch 0) and ``nulls`` rows
    of the null key, and the rows per key (the null key as ``"<null>"``)."""
    rng = np.random.default_rng(11 + b)
    weights = 1.0 / np.arange(1, len(keys) + 1) ** 1.1
    picked = rng.choice(len(keys), size=rows, p=weights / weights.sum())
    if b == 0:
        picked = np.concatenate([np.arange(len(keys)), picked])
    values: list[Any] = [keys[i] for i in picked] + [None] * nulls
    frame = pd.DataFrame({"k": pd.Series(values, dtype=object),
                          "t": np.arange(b * 10_000, b * 10_000 + len(values), dtype=np.int64)})
    counts = frame["k"].astype(object).where(frame["k"].notna(), "<null>").value_counts()
    return spark.createDataFrame(frame, f"k {ddl}, t long"), counts


@pytest.fixture(autouse=True)
def by_blocks(spark: Any) -> Any:
    """Every swap that can be planned by blocks is (``auto`` waits for a large state)."""
    spark.conf.set("spark.trilink.state.blockPlans", "true")
    yield
    spark.conf.unset("spark.trilink.state.blockPlans")


def make_run(tmp_path: Path, store: str, name: str, **kw: Any) -> Any:
    kw.setdefault("strategy", tl.LeastCountPartitioner(4, max_keys=BOUND))
    processor = RunningCount() if name.startswith(("string", "fluid")) else KeylessCount()
    return tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", processor,
                                  1_000_000, str(tmp_path / f"{name}-{store}"),
                                  state_store=store, **kw)


def fitted(cls: type[Any], n: int, keys: list[Any], seed: int) -> Any:
    """A bounded table of ``cls`` fitted on other loads than the stream's."""
    rng = np.random.default_rng(seed)
    return cls(n, max_keys=BOUND).fit({k: int(c) for k, c in
                                       zip(keys, rng.integers(1, 50, len(keys)))})


def refuse(name: str) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the driver called KeyedStateStore.{name} in a group plan")
    return fail


def moves_of(store: Any, b: int) -> set[tuple[Any, int, int]]:
    moves = store.load_moves(b)
    return set(zip(moves.column("key").to_pylist(), moves.column("from").to_pylist(),
                   moves.column("to").to_pylist()))


CASES = [
    pytest.param("string", STRING_KEYS, lambda: fitted(tl.LeastCountPartitioner, 5,
                                                       STRING_KEYS, 1), {}, id="string-up"),
    pytest.param("string", STRING_KEYS, lambda: fitted(tl.LeastKeyPartitioner, 3,
                                                       STRING_KEYS, 2),
                 {"mode": "fluid", "max_keys_per_batch": 100_000},
                 id="string-down-least-key-fluid-one-step"),
    pytest.param("int", INT_KEYS, lambda: fitted(tl.LeastCountPartitioner, 6, INT_KEYS, 3),
                 {}, id="int-up"),
    pytest.param("bigint", INT_KEYS, lambda: fitted(tl.LeastCountPartitioner, 4, INT_KEYS, 4),
                 {}, id="bigint-same-count"),
]


@pytest.mark.parametrize(("ddl", "keys", "target", "extra"), CASES)
def test_a_group_plan_is_the_key_plan(spark: Any, tmp_path: Path, ddl: str, keys: list[Any],
                                      target: Any, extra: dict[str, Any],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The local store plans a swap to a bounded table given whole by key groups; the file
    store plans the same swap by keys. Same plan, same moves, same state and owners; the
    null key (``"group"``) moves when the partition count moves it."""
    by_groups = make_run(tmp_path, "rocksdb", ddl)
    by_keys = make_run(tmp_path, "files", ddl)
    total = pd.Series(dtype=np.int64)
    for b in (0, 1):
        df, counts = batch(spark, b, 2_000, keys, ddl, nulls=3)
        by_groups(df, b)
        by_keys(df, b)
        total = total.add(counts, fill_value=0)
    placed, _ = by_groups.store.placement_at(1)
    assert isinstance(placed, tl.LeastCountPartitioner) and placed.bounded
    aim = target()
    assert aim.bounded
    by_groups.request_swap(strategy=aim, refit="none", **extra)
    by_keys.request_swap(strategy=aim, refit="none", **extra)
    df, counts = batch(spark, 2, 300, keys, ddl, nulls=2)
    total = total.add(counts, fill_value=0)
    with monkeypatch.context() as patch:  # the group plan reads no state on the driver
        for name in ("load_table", "key_table", "load_snapshot"):
            patch.setattr(KeyedStateStore, name, refuse(name))
        by_groups(df, 2)
    by_keys(df, 2)
    ours, theirs = by_groups.store.load_plan(2), by_keys.store.load_plan(2)
    assert ours is not None and theirs is not None
    assert ours.pop("planned_by") == "groups" and "planned_by" not in theirs
    assert (ours.pop("request") is None) == (theirs.pop("request") is None)
    assert ours == theirs
    assert ours["moved_keys"] > 0 and ours["complete"]
    assert moves_of(by_groups.store, 2) == moves_of(by_keys.store, 2)
    check_invariants(by_groups, total, null_key="<null>")
    check_invariants(by_keys, total, null_key="<null>")
    assert by_groups.owners() == by_keys.owners()
    assert by_groups.counters() == by_keys.counters()
    # every key sits where the target puts it, the null key where its policy does
    owners = by_groups.owners()
    named = [k for k in owners if k is not None]
    want = aim.for_column("int" if ddl == "int" else "long" if ddl == "bigint" else ddl)
    assert [owners[k] for k in named] == want.assign(named).tolist()
    df, counts = batch(spark, 3, 300, keys, ddl)
    by_groups(df, 3)  # the copies are current after the swap
    check_invariants(by_groups, total.add(counts, fill_value=0), null_key="<null>")
    assert set(by_groups.task_timings(3)["sync"]) == {"current"}


@pytest.mark.parametrize(("n", "cap"), [(6, 120), (2, 200)])
def test_a_fluid_swap_steps_by_groups_and_lands_as_the_key_plan_does(
        spark: Any, tmp_path: Path, n: int, cap: int) -> None:
    """A fluid swap between bounded tables steps by key groups (the changed named keys in
    the first step, the smallest groups within the cap), keeps every key once with its exact
    count after every step, and ends where the key plan ends. Then a minimal refit of the
    bounded table in force (it weighs every key's load) is planned by keys."""
    by_groups = make_run(tmp_path, "rocksdb", f"fluid{n}")
    by_keys = make_run(tmp_path, "files", f"fluid{n}")
    total = pd.Series(dtype=np.int64)
    for b in (0, 1):
        df, counts = batch(spark, b, 2_000, STRING_KEYS, "string", nulls=2)
        by_groups(df, b)
        by_keys(df, b)
        total = total.add(counts, fill_value=0)
    aim = fitted(tl.LeastCountPartitioner, n, STRING_KEYS, 5)
    for run in (by_groups, by_keys):
        run.request_swap(strategy=aim, refit="none", mode="fluid", max_keys_per_batch=cap)
    b = 2
    steps = []
    while True:
        df, counts = batch(spark, b, 300, STRING_KEYS, "string", nulls=1)
        by_groups(df, b)
        total = total.add(counts, fill_value=0)
        plan = by_groups.store.load_plan(b)
        assert plan is not None and plan["planned_by"] == "groups"
        steps.append(plan["moved_keys"])
        check_invariants(by_groups, total, null_key="<null>")
        placed, _ = by_groups.store.placement_at(b)
        assert isinstance(placed, tl.TablePartitioner) and placed.bounded
        owners = by_groups.owners()
        named = [k for k in owners if k is not None]
        assert [owners[k] for k in named] == placed.for_column("string").assign(named).tolist()
        if by_groups.swaps[-1].complete:
            break
        b += 1
        assert b < 30, "the fluid swap did not finish"
    assert len(steps) > 1 and max(steps[1:]) <= cap + 60, steps  # a group over the room moves alone
    for c in range(2, b + 1):  # the key plan, fed the same batches
        df, _ = batch(spark, c, 300, STRING_KEYS, "string", nulls=1)
        by_keys(df, c)
    while not by_keys.swaps[-1].complete:
        c += 1
        df, counts = batch(spark, c, 300, STRING_KEYS, "string", nulls=1)
        by_keys(df, c)
        by_groups(df, c)
        total = total.add(counts, fill_value=0)
    assert by_groups.owners() == by_keys.owners()
    assert by_groups.store.placement_at(c)[0].to_dict() == aim.for_column("string").to_dict()
    check_invariants(by_keys, total, null_key="<null>")
    by_groups.request_swap(num_partitions=3)
    df, counts = batch(spark, c + 1, 300, STRING_KEYS, "string")
    by_groups(df, c + 1)
    total = total.add(counts, fill_value=0)
    plan = by_groups.store.load_plan(c + 1)
    assert plan is not None and "planned_by" not in plan and plan["partitions_after"] == 3
    placed, _ = by_groups.store.placement_at(c + 1)
    assert isinstance(placed, tl.TablePartitioner) and placed.bounded
    check_invariants(by_groups, total, null_key="<null>")


def test_group_steps_and_the_aim_of_a_bounded_table() -> None:
    """Which swaps go by groups: two bounded tables over the same groups, hashed alike, with
    the same null policy; never a per-key table, a refit, or a capped fluid step."""
    counts = {f"k{i}": i + 1 for i in range(300)}
    a = tl.LeastCountPartitioner(4, max_keys=20).fit(counts)
    b = tl.LeastKeyPartitioner(5, max_keys=20).fit(counts)
    per_key = tl.LeastCountPartitioner(4).fit(counts)
    other_nulls = tl.LeastCountPartitioner(4, max_keys=20, null_policy="partition0").fit(counts)
    many = tl.LeastCountPartitioner(5000, max_keys=20).fit(counts)
    assert group_steps(a, b, "string") and group_steps(b, a, "string")
    assert not group_steps(a, per_key, "string") and not group_steps(per_key, a, "string")
    assert not group_steps(a, other_nulls, "string")
    assert not group_steps(a, many, "string")  # 5,000 groups against 4,096
    assert not group_steps(a, tl.BlockPartitioner(4), "string")
    ints = tl.LeastCountPartitioner(4, max_keys=20, key_type="int").fit(dict(enumerate(range(
        1, 301))))
    longs = tl.LeastCountPartitioner(4, max_keys=20, key_type="long").fit(dict(enumerate(range(
        1, 301))))
    assert not group_steps(ints, longs, "int")  # hashed differently
    given = SwapRequest(b, None, "none", "atomic", None)
    aim = block_aim(a, given, None, "string")
    assert isinstance(aim, BlockAim) and aim.target.bounded and not aim.refit
    assert aim.target is not b  # a copy: the request's own table is never changed
    assert block_aim(a, SwapRequest(None, 6, "minimal", "atomic", None), None, "string") is None
    assert block_aim(a, SwapRequest(b, None, "none", "fluid", 10), None, "string") is not None
    assert block_aim(a, SwapRequest(None, None, "none", "fluid", 10), b, "string") is not None
    assert block_aim(per_key, given, None, "string") is None


@pytest.mark.parametrize("kind", ["int", "long", "string", "binary"])
def test_the_local_blocks_of_a_bounded_table_are_its_key_groups(kind: str) -> None:
    """Under a bounded table the local store files each key under its key group (as the JVM
    hashes it), so a group is one range scan; 4,096 long, string or binary groups keep the
    default layout (no copy is rebuilt when a table becomes bounded)."""
    values = {"int": list(range(-200, 200)), "long": [2**40 + i for i in range(400)],
              "string": [f"s{i}" for i in range(400)],
              "binary": [f"b{i}".encode() for i in range(400)]}[kind]
    table = tl.LeastCountPartitioner(4, max_keys=30).fit(
        {v: i % 17 + 1 for i, v in enumerate(values)})
    assert table.bounded
    default = LocalConfig("", "x", 10, float("inf"),
                          tl.BlockPartitioner(1, key_type=kind, null_policy="partition0"))
    placed = default.placed_by(table)
    assert placed.blocks is not None
    arrow = pa.array(values, {"int": pa.int32(), "long": pa.int64(), "string": pa.string(),
                              "binary": pa.binary()}[kind])
    assert placed.blocks.blocks(arrow).tolist() == table.key_groups(arrow).tolist()
    assert (placed.layout == default.layout) == (kind != "int")
    assert default.placed_by(tl.LeastCountPartitioner(4).fit({values[0]: 1})) is default
