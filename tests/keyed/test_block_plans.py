"""Swaps between block tables plan by blocks from the executors' local copies: the same plan,
moves and state as the key plan, without reading the state path on the driver."""

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
from conftest import RunningCount
from testkit.swaps import check_invariants
from trilink_spark.partitioners import rebalance_minimal
from trilink_spark.state.local import NULL_KEY_BYTES, LocalState, head, key_bytes
from trilink_spark.state.store import KeyedStateStore
from trilink_spark.state.held import ask_release

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"u{i:04d}" for i in range(900)]


def batch(spark: Any, b: int, rows: int, keys: list[Any] = KEYS) -> tuple[Any, pd.Series]:
    """Batch ``b``: ``rows`` skewed rows (every key once more in batch 0), and its counts."""
    rng = np.random.default_rng(7 + b)
    # skewed: a few keys carry most rows, so a refit has loads to weigh
    weights = 1.0 / np.arange(1, len(keys) + 1) ** 1.1
    picked = rng.choice(len(keys), size=rows, p=weights / weights.sum())
    if b == 0:
        picked = np.concatenate([np.arange(len(keys)), picked])
    frame = pd.DataFrame({"k": [keys[i] for i in picked],
                          "t": np.arange(b * 10_000, b * 10_000 + len(picked), dtype=np.int64)})
    return (spark.createDataFrame(frame, "k string, t long"),
            frame["k"].value_counts(dropna=False))


@pytest.fixture(autouse=True)
def by_blocks(spark: Any) -> Any:
    """Every swap that can be planned by blocks is (``auto`` waits for a large state)."""
    spark.conf.set("spark.trilink.state.blockPlans", "true")
    yield
    spark.conf.unset("spark.trilink.state.blockPlans")


def make_run(tmp_path: Path, store: str, **kw: Any) -> Any:
    kw.setdefault("strategy", tl.BlockPartitioner(4, num_blocks=64))
    return tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(),
                                  1_000_000, str(tmp_path / store), state_store=store, **kw)


def loaded(spark: Any, run: Any, rows: int, keys: list[Any] = KEYS) -> pd.Series:
    """Batches 0 and 1 run (every key has state); their rows per key."""
    total = pd.Series(dtype=np.int64)
    for b in (0, 1):
        df, counts = batch(spark, b, rows, keys)
        run(df, b)
        total = total.add(counts, fill_value=0)
    return total


def explicit_table() -> tl.BlockPartitioner:
    table = np.arange(64) % 5
    table[:8] = 0  # partition 0 takes more blocks
    return tl.BlockPartitioner(5, num_blocks=64, table=table)


SWAPS = [
    pytest.param({"num_partitions": 6}, id="refit-minimal-up"),
    pytest.param({"strategy": tl.BlockPartitioner(3, num_blocks=64), "refit": "none"},
                 id="default-table-down"),
    pytest.param({"strategy": explicit_table(), "refit": "none"}, id="explicit-table"),
    pytest.param({"num_partitions": 7, "mode": "fluid", "max_keys_per_batch": 60},
                 id="fluid-refit"),
    pytest.param({"strategy": tl.BlockPartitioner(7, num_blocks=64), "refit": "none",
                  "mode": "fluid", "max_keys_per_batch": 150}, id="fluid-up"),
    pytest.param({"strategy": tl.BlockPartitioner(2, num_blocks=64), "refit": "none",
                  "mode": "fluid", "max_keys_per_batch": 200}, id="fluid-down"),
]


def moves_of(store: Any, b: int) -> set[tuple[Any, int, int]]:
    moves = store.load_moves(b)
    return set(zip(moves.column("key").to_pylist(), moves.column("from").to_pylist(),
                   moves.column("to").to_pylist()))


@pytest.mark.parametrize("swap", SWAPS)
def test_a_block_plan_is_the_key_plan(spark: Any, tmp_path: Path, swap: dict[str, Any],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The local store plans by blocks; the file store plans the same swap by keys, from
    every key read off the state path. Same plans, same moves, same state, every step."""
    by_blocks, by_keys = make_run(tmp_path, "rocksdb"), make_run(tmp_path, "files")
    total = pd.Series(dtype=np.int64)
    for b in (0, 1):
        df, counts = batch(spark, b, 2_000)
        by_blocks(df, b)
        by_keys(df, b)
        total = total.add(counts, fill_value=0)
    by_blocks.request_swap(**swap)
    by_keys.request_swap(**swap)
    b = 2
    while True:
        df, counts = batch(spark, b, 300)
        total = total.add(counts, fill_value=0)
        with monkeypatch.context() as patch:  # the block plan reads no state on the driver
            for name in ("load_table", "key_table", "load_snapshot"):
                patch.setattr(KeyedStateStore, name, refuse(name))
            by_blocks(df, b)
        by_keys(df, b)
        ours, theirs = by_blocks.store.load_plan(b), by_keys.store.load_plan(b)
        assert ours is not None and theirs is not None
        assert ours.pop("planned_by") == "blocks" and "planned_by" not in theirs
        assert (ours.pop("request") is None) == (theirs.pop("request") is None)  # random ids
        assert ours == theirs
        assert moves_of(by_blocks.store, b) == moves_of(by_keys.store, b)
        check_invariants(by_blocks, total)
        check_invariants(by_keys, total)
        assert by_blocks.owners() == by_keys.owners()
        assert by_blocks.counters() == by_keys.counters()
        if by_blocks.swaps[-1].complete:
            break
        b += 1
        assert b < 12, "the fluid swap did not finish"
    report = by_blocks.swaps[-1]
    assert report.refused is None and report.moved_keys > 0
    if swap.get("mode") == "fluid":
        assert b > 2, [(r.batch_id, r.moved_keys, r.complete) for r in by_blocks.swaps]
    df, counts = batch(spark, b + 1, 300)  # the copies are current after the swap
    by_blocks(df, b + 1)
    check_invariants(by_blocks, total.add(counts, fill_value=0))
    assert set(by_blocks.task_timings(b + 1)["sync"]) == {"current"}


def refuse(name: str) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the driver called KeyedStateStore.{name} in a block plan")
    return fail


def test_lost_copies_are_rebuilt_by_the_plan_and_a_null_key_stays_put(
        spark: Any, tmp_path: Path, local_root: Path) -> None:
    """Copies deleted before the swap: the plan's scan rebuilds them from the state path. A
    null key has no block: it stays on partition 0 and weighs on it."""
    import shutil

    keys = [*KEYS[:300], None]
    run = make_run(tmp_path, "rocksdb",
                   strategy=tl.BlockPartitioner(4, num_blocks=64, null_policy="partition0"))
    total = loaded(spark, run, 1_500, keys)
    copies = list(local_root.glob("*"))
    assert copies
    for copy in copies:
        shutil.rmtree(copy)
    run.request_swap(num_partitions=5)
    df, counts = batch(spark, 2, 200, keys)
    run(df, 2)
    total = total.add(counts, fill_value=0)
    check_invariants(run, total.rename(index=lambda k: "<null>" if k is None or k != k else k),
                     null_key="<null>")
    assert run.owners()[None] == 0
    assert run.store.load_plan(2)["planned_by"] == "blocks"
    assert run.swaps[-1].moved_keys > 0 and run.swaps[-1].keys_total == len(keys)


def test_block_rows_is_one_blocks_keys_without_the_null_key(tmp_path: Path) -> None:
    keys = pa.array(["a", "b", "c", None, "d"])
    blocks = np.array([0, 3, 0, 0, 7])
    raw = key_bytes(keys, blocks)
    assert raw[3] == NULL_KEY_BYTES
    with LocalState.open(str(tmp_path), "x", 0) as local:
        local.apply(1, "t", {}, [(k, head(math.inf, 1) + k) for k in raw], [], {})
        assert [k for k, _ in local.block_rows(0)] == sorted([raw[0], raw[2]])
        assert [k for k, _ in local.block_rows(3)] == [raw[1]]
        assert [v for _, v in local.block_rows(7)] == [head(math.inf, 1) + raw[4]]
        assert local.block_rows(5) == []


def test_block_loads_with_a_null_entry_rebalance_as_the_keys_do() -> None:
    rng = np.random.default_rng(3)
    p = tl.BlockPartitioner(4, num_blocks=32, key_type="string", null_policy="partition0")
    keys = [f"k{i}" for i in range(400)]
    counts: dict[Any, float] = {k: float(c) for k, c in zip(keys, rng.integers(1, 50, 400))}
    counts[None] = 900.0  # a heavy null key: fixed on partition 0
    by_keys = rebalance_minimal(p, counts, num_partitions=6)
    blocks = p.blocks(keys)
    per_block = np.bincount(blocks, weights=[counts[k] for k in keys], minlength=32)
    by_blocks = rebalance_minimal(
        p, {**{b: float(v) for b, v in enumerate(per_block) if v}, None: 900.0},
        num_partitions=6, unit="block")
    assert np.array_equal(by_keys.table, by_blocks.table)
    without = rebalance_minimal(p, {b: float(v) for b, v in enumerate(per_block) if v},
                                num_partitions=6, unit="block")
    assert not np.array_equal(without.table, by_blocks.table)  # the null load counts


def test_block_key_counts_follow_apply_and_undo_seeded() -> None:
    """The per-block key record a block plan checks its scans against stays exact through
    random puts, deletes, undos and resets (an invariant check after each step)."""
    import tempfile

    rng = np.random.default_rng(11)
    universe = key_bytes(pa.array([f"k{i}" for i in range(60)] + [None]),
                         np.r_[rng.integers(0, 9, 60), 0])

    def actual(local: LocalState) -> dict[str, int]:
        out: dict[str, int] = {}
        for k, _ in local.rows():
            label = "null" if k == NULL_KEY_BYTES else str(int.from_bytes(k[:4], "big"))
            out[label] = out.get(label, 0) + 1
        return out

    with tempfile.TemporaryDirectory() as root, LocalState.open(root, "s", 0) as local:
        version = 0
        for step in range(150):
            op = rng.random()
            if op < 0.1 and local.undo():
                version -= 1
            elif op < 0.13:
                local.reset()
                version = 0
            else:
                held = {k for k, _ in local.rows()}
                picked = [universe[i] for i in rng.choice(len(universe), 8, replace=False)]
                puts = [(k, head(math.inf, 1) + k) for k in picked[:5]]
                dels = picked[5:]
                before = {k: v for k, v in zip(picked, local.get(picked)) if v is not None}
                version += 1
                local.apply(version, f"a{step}", {}, puts, dels, before)
                assert {k for k, _ in local.rows()} == (held | set(picked[:5])) - set(dels)
            assert (local.block_keys or {}) == actual(local), step
            assert local.keys == sum(actual(local).values())


@pytest.mark.parametrize("drop_record", [True, False])
def test_a_copy_that_lost_rows_is_rebuilt_by_the_plan(spark: Any, tmp_path: Path,
                                                      local_root: Path,
                                                      drop_record: bool) -> None:
    """A copy that lost rows behind its record fails the plan's per-block check; one an
    earlier release wrote keeps no per-block record, so its scans cannot be checked. Either
    is rebuilt from the state path first, and the swap stays exact."""
    import json

    from rocksdict import Options, Rdict

    run = make_run(tmp_path, "rocksdb")
    total = loaded(spark, run, 1_000)
    dbs = list(local_root.rglob("p0000*.db"))
    assert dbs
    for db_dir in dbs:
        ask_release(str(db_dir))  # a worker holds it open since its task
        db = Rdict(str(db_dir), Options(raw_mode=True))
        meta = json.loads(db[b"m"])
        assert "blocks" in meta
        if drop_record:
            del meta["blocks"]
        for k in [k for k in db.keys() if k.startswith(b"r")][::4]:
            del db[k]  # and it lost rows, which only a check would see
        db[b"m"] = json.dumps(meta).encode()
        db.close()
    run.request_swap(num_partitions=6)
    df, counts = batch(spark, 2, 300)
    run(df, 2)
    check_invariants(run, total.add(counts, fill_value=0))
    assert run.store.load_plan(2)["planned_by"] == "blocks"
    for pid in range(6):
        with LocalState.open(str(local_root), dbs[0].parent.name, pid) as local:
            assert local.block_keys is not None and local.version == 2


@pytest.mark.parametrize("value", ["false", "auto", "maybe"])
def test_block_plans_can_be_turned_off(spark: Any, tmp_path: Path, value: str) -> None:
    """``spark.trilink.state.blockPlans=false`` plans by keys, as ``auto`` does for a small
    state; a value not allowed refuses the swap (logged, in ``run.swaps``), and the query
    goes on."""
    run = make_run(tmp_path, "rocksdb")
    total = loaded(spark, run, 500)
    run.request_swap(num_partitions=6)
    spark.conf.set("spark.trilink.state.blockPlans", value)
    df, counts = batch(spark, 2, 300)
    run(df, 2)
    check_invariants(run, total.add(counts, fill_value=0))
    report = run.swaps[-1]
    if value in ("false", "auto"):
        plan = run.store.load_plan(2)
        assert report.refused is None and "planned_by" not in plan
    else:
        assert report.refused is not None and "blockPlans must be one of 'auto'" in \
            report.refused
        assert run.store.load_plan(2) is None
