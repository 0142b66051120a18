"""Hostile review of swaps planned by blocks (``spark.trilink.state.blockPlans``): every key
type, null keys, replays, lost and damaged copies, failed scans, the per-block key record
through every write, and what the plan reads."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from conftest import KeylessCount
from trilink_spark.state.store import KeyedStateStore

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(autouse=True)
def by_blocks(spark: Any) -> Any:
    spark.conf.set("spark.trilink.state.blockPlans", "true")
    yield
    spark.conf.unset("spark.trilink.state.blockPlans")


def _label(key: Any) -> Any:
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    if isinstance(key, float) and key != key:
        return None
    return key


def _values(run: Any) -> dict[Any, int]:
    return {_label(k): int(v["n"]) for k, v in run.state_values().items()}


def _moves(store: Any, b: int) -> set[tuple[Any, int, int]]:
    moves = store.load_moves(b)
    return {(_label(k), f, t) for k, f, t in zip(moves.column("key").to_pylist(),
                                                   moves.column("from").to_pylist(),
                                                   moves.column("to").to_pylist())}


def _twin_runs(tmp_path: Path, strategy: Any, **kw: Any) -> tuple[Any, Any]:
    def make(store: str) -> Any:
        return tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", KeylessCount(),
                                      1_000_000, str(tmp_path / store), state_store=store,
                                      strategy=strategy(), **kw)
    return make("rocksdb"), make("files")


def _frame(spark: Any, keys: list[Any], b: int, schema: str, rng: Any, rows: int) -> Any:
    picked = list(range(len(keys))) if b == 0 else rng.integers(0, len(keys), rows).tolist()
    data = [(keys[i], b * 100_000 + j) for j, i in enumerate(picked)]
    return spark.createDataFrame(data, f"k {schema}, t long"), [keys[i] for i in picked]


def _compare(ours: Any, theirs: Any, b: int) -> None:
    mine, other = ours.store.load_plan(b), theirs.store.load_plan(b)
    assert mine is not None and other is not None
    assert mine.pop("planned_by") == "blocks" and "planned_by" not in other
    mine.pop("request"), other.pop("request")
    assert mine == other
    assert _moves(ours.store, b) == _moves(theirs.store, b)
    assert {_label(k): p for k, p in ours.owners().items()} == \
        {_label(k): p for k, p in theirs.owners().items()}
    assert ours.counters() == theirs.counters()
    assert _values(ours) == _values(theirs)


def _swap_twins(spark: Any, tmp_path: Path, keys: list[Any], schema: str, strategy: Any,
                swaps: list[dict[str, Any]], rows: int = 200) -> tuple[Any, Any]:
    """Both runs take the same batches and swaps; each swap step is compared."""
    ours, theirs = _twin_runs(tmp_path, strategy)
    rng = np.random.default_rng(5)
    expected: dict[Any, int] = {}
    b = 0

    def step() -> None:
        nonlocal b
        df, picked = _frame(spark, keys, b, schema, rng, rows)
        for k in picked:
            expected[_label(k)] = expected.get(_label(k), 0) + 1
        ours(df, b)
        theirs(df, b)
        b += 1

    step()
    step()
    for swap in swaps:
        ours.request_swap(**swap)
        theirs.request_swap(**swap)
        while True:
            step()
            assert ours.swaps and ours.swaps[-1].batch_id == b - 1, ours.swaps
            assert ours.swaps[-1].refused is None, ours.swaps[-1].refused
            _compare(ours, theirs, b - 1)
            if ours.swaps[-1].complete:
                break
            assert b < 20
    step()
    assert _values(ours) == expected
    assert set(ours.task_timings(b - 1)["sync"]) == {"current"}
    return ours, theirs


INT_KEYS = [-(2**31), 2**31 - 1, 0, -1, 1, *range(1000, 1150)]
LONG_KEYS = [-(2**63), 2**63 - 1, -(2**63) + 1, 2**62, 0, -1, *range(10**12, 10**12 + 150)]
SMALL_KEYS = [-(2**15), 2**15 - 1, 0, *range(-75, 75)]
STRING_KEYS = ["", " ", "\u00e9", "e\u0301", "\U0001f600", "\U0001f468\u200d\U0001f469",
               "x" * (1 << 16), *[f"s{i}\U0001f525" for i in range(150)]]  # 1 MB keys: test_hostile_local_swaps
BINARY_KEYS = [b"", b"\x00", b"\x00\x00", b"\xff" * 9, *[i.to_bytes(3, "big") for i in
                                                         range(150)]]

KEY_CASES = [
    pytest.param(INT_KEYS, "int", id="int"),
    pytest.param(SMALL_KEYS, "smallint", id="smallint"),
    pytest.param(LONG_KEYS, "bigint", id="bigint-extremes"),
    pytest.param(STRING_KEYS, "string", id="string-emoji-empty-64KB"),
    pytest.param(BINARY_KEYS, "binary", id="binary"),
    pytest.param([None, *LONG_KEYS], "bigint", id="bigint-null"),
    pytest.param([None, *STRING_KEYS[:50]], "string", id="string-null"),
]


@pytest.mark.parametrize("keys,schema", KEY_CASES)
def test_every_key_type_plans_by_blocks_as_by_keys(spark: Any, tmp_path: Path,
                                                   keys: list[Any], schema: str) -> None:
    """A refit up, then a given table down fluid step by step: the block plan is the key plan
    (plan, moves, owners, counters, values) for every key type the store encodes."""
    null = "partition0" if None in keys else "error"
    _swap_twins(spark, tmp_path, keys, schema,
                lambda: tl.BlockPartitioner(4, num_blocks=32, null_policy=null),
                [{"num_partitions": 6},
                 {"strategy": tl.BlockPartitioner(3, num_blocks=32, null_policy=null),
                  "refit": "none", "mode": "fluid", "max_keys_per_batch": 70}])


KEYS = [f"k{i:03d}" for i in range(300)]


def _run(tmp_path: Path, sink: Any = None, **kw: Any) -> Any:
    kw.setdefault("strategy", tl.BlockPartitioner(4, num_blocks=32))
    return tl.keyed_foreach_batch(sink or (lambda df, b: df.count()), "k", "t", KeylessCount(),
                                  1_000_000, str(tmp_path / "state"), **kw)


def _batch(spark: Any, b: int, keys: list[str] = KEYS, rows: int = 150) -> tuple[Any, dict]:
    rng = np.random.default_rng(50 + b)
    picked = keys if b == 0 else [keys[i] for i in rng.integers(0, len(keys), rows)]
    counts: dict[str, int] = {}
    for k in picked:
        counts[k] = counts.get(k, 0) + 1
    data = [(k, b * 10_000 + j) for j, k in enumerate(picked)]
    return spark.createDataFrame(data, "k string, t long"), counts


def _add(total: dict[str, int], counts: dict[str, int]) -> dict[str, int]:
    return {k: total.get(k, 0) + counts.get(k, 0) for k in {*total, *counts}}


def _check(run: Any, total: dict[str, int]) -> None:
    assert {k: int(v["n"]) for k, v in run.state_values().items()} == total


def _load(spark: Any, run: Any, batches: int = 2) -> dict[str, int]:
    total: dict[str, int] = {}
    for b in range(batches):
        df, counts = _batch(spark, b)
        run(df, b)
        total = _add(total, counts)
    return total


def test_a_block_plan_reads_only_the_copies_not_the_state_path(spark: Any, tmp_path: Path,
                                                              local_root: Path) -> None:
    """Cost: with current copies, neither the plan nor its scans read a version off the state
    path: batch 0's files deleted, which any rebuild would need, the swap by blocks still
    runs (and the driver reads no state)."""
    run = _run(tmp_path)
    total = _load(spark, run, 3)
    hidden = tmp_path / "hidden"
    moved = []
    for f in (tmp_path / "state").glob("partition=*/000000000000.*"):
        target = hidden / f.parent.name / f.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(f), target)
        moved.append((target, f))
    assert moved
    run.request_swap(strategy=tl.BlockPartitioner(6, num_blocks=32), refit="none")
    df, counts = _batch(spark, 3)
    mp = pytest.MonkeyPatch()
    for name in ("load_table", "key_table", "load_snapshot", "load_changelog"):
        mp.setattr(KeyedStateStore, name, _refuse(name))
    try:
        run(df, 3)
    finally:
        mp.undo()
    assert run.store.load_plan(3)["planned_by"] == "blocks"
    assert run.swaps[-1].refused is None and run.swaps[-1].moved_keys > 0
    assert set(run.task_timings(3)["sync"]) <= {"current", "rebuild"}
    for target, f in moved:  # the oracle reads whole versions
        shutil.move(str(target), f)
    _check(run, _add(total, counts))


def _refuse(name: str) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the driver called KeyedStateStore.{name} in a block plan")
    return fail


def test_a_swap_of_an_empty_state_plans_by_blocks(spark: Any, tmp_path: Path) -> None:
    """No key stored at all (an empty first batch): a refit and a given table, by blocks."""
    run = _run(tmp_path)
    empty = spark.createDataFrame([], "k string, t long")
    run(empty, 0)
    run.request_swap(num_partitions=6)
    run(empty, 1)
    assert run.swaps[-1].refused is None and run.swaps[-1].keys_total == 0
    assert run.store.load_plan(1)["planned_by"] == "blocks"
    run.request_swap(strategy=tl.BlockPartitioner(3, num_blocks=32), refit="none",
                     mode="fluid", max_keys_per_batch=1)
    df, counts = _batch(spark, 0)
    run(df, 2)
    assert run.swaps[-1].refused is None and run.swaps[-1].complete
    _check(run, counts)


def test_a_replayed_batch_whose_first_attempt_ran_without_the_swap(
        spark: Any, tmp_path: Path, local_root: Path) -> None:
    """The driver died after batch 2's tasks wrote (no swap then): the copies are a version
    ahead. The replay plans a swap by blocks from them: they are undone to version 1 first,
    and the state stays exact."""
    from testkit.swaps import dies_at

    dying = _run(tmp_path, dies_at(2))
    total = _load(spark, dying)
    df, counts = _batch(spark, 2, rows=400)
    with pytest.raises(Exception, match="driver died"):
        dying(df, 2)
    run = _run(tmp_path, takeover=True)
    run.request_swap(strategy=tl.BlockPartitioner(6, num_blocks=32), refit="none")
    run(df, 2)
    assert run.swaps[-1].refused is None and run.swaps[-1].partitions_after == 6
    assert run.store.load_plan(2)["planned_by"] == "blocks"
    total = _add(total, counts)
    _check(run, total)
    df, counts = _batch(spark, 3)
    run(df, 3)
    _check(run, _add(total, counts))
    assert set(run.task_timings(3)["sync"]) == {"current"}


def test_a_swap_batch_killed_after_writing_is_replayed_from_its_block_plan(
        spark: Any, tmp_path: Path) -> None:
    from testkit.swaps import dies_at

    dying = _run(tmp_path, dies_at(2))
    total = _load(spark, dying)
    dying.request_swap(num_partitions=5)
    df, counts = _batch(spark, 2)
    with pytest.raises(Exception, match="driver died"):
        dying(df, 2)
    plan = dying.store.load_plan(2)
    assert plan["planned_by"] == "blocks"
    run = _run(tmp_path, takeover=True)
    run(df, 2)
    assert run.store.load_plan(2) == plan  # reused, not planned again
    total = _add(total, counts)
    _check(run, total)


def test_a_failed_scan_fails_the_batch_and_the_swap_waits(spark: Any, tmp_path: Path,
                                                          local_root: Path) -> None:
    """The copies are gone and the state path lacks what a rebuild needs: the plan's scan
    fails, so the batch fails with a typed error (not a refusal, nothing stored); with the
    file back, the retry plans the same swap."""
    from trilink_spark.errors import TrilinkError

    run = _run(tmp_path)
    total = _load(spark, run)
    shutil.rmtree(local_root)
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    victim = next((tmp_path / "state").glob("partition=00001/000000000000.log"))
    shutil.move(str(victim), hidden / victim.name)
    run.request_swap(num_partitions=6)
    df, counts = _batch(spark, 2)
    with pytest.raises(TrilinkError, match="swap plan"):
        run(df, 2)
    assert not run.swaps and run.store.load_plan(2) is None
    shutil.move(str(hidden / victim.name), victim)
    run(df, 2)
    assert run.swaps[-1].refused is None and run.swaps[-1].partitions_after == 6
    _check(run, _add(total, counts))


def test_auto_plans_a_given_table_by_blocks_and_a_refit_by_keys(
        spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trilink_spark.keyed.swaps import block_plan as swap_blocks

    spark.conf.set("spark.trilink.state.blockPlans", " AUTO ")
    run = _run(tmp_path)
    total = _load(spark, run)
    monkeypatch.setattr(swap_blocks, "GIVEN_BY_BLOCKS_BYTES", 1)
    run.request_swap(strategy=tl.BlockPartitioner(5, num_blocks=32), refit="none")
    df, counts = _batch(spark, 2)
    run(df, 2)
    assert run.store.load_plan(2).get("planned_by") == "blocks"
    run.request_swap(num_partitions=3)
    df2, counts2 = _batch(spark, 3)
    run(df2, 3)
    assert run.swaps[-1].refused is None and "planned_by" not in run.store.load_plan(3)
    monkeypatch.setattr(swap_blocks, "GIVEN_BY_BLOCKS_BYTES", 1 << 40)
    run.request_swap(strategy=tl.BlockPartitioner(4, num_blocks=32), refit="none")
    df3, counts3 = _batch(spark, 4)
    run(df3, 4)
    assert run.swaps[-1].refused is None and "planned_by" not in run.store.load_plan(4)
    _check(run, _add(_add(_add(total, counts), counts2), counts3))


def test_block_key_counts_stay_exact_through_ttl_expiry_and_swaps(
        spark: Any, tmp_path: Path, local_root: Path) -> None:
    """state_ttl expires keys each batch, swaps move blocks: every copy's per-block key record
    matches its rows after every batch."""
    from trilink_spark.state.local import NULL_KEY_BYTES, LocalState

    run = _run(tmp_path, state_ttl=500)
    swaps = {2: {"num_partitions": 6}, 4: {"strategy": tl.BlockPartitioner(3, num_blocks=32),
                                           "refit": "none"}}
    for b in range(6):
        if b in swaps:
            run.request_swap(**swaps[b])
        rng = np.random.default_rng(b)
        ks = [KEYS[i] for i in rng.integers(0, 120, 200)]
        run(spark.createDataFrame([(k, b * 1000 + j % 10) for j, k in enumerate(ks)],
                                  "k string, t long"), b)
        dbs = list(local_root.rglob("p*.db"))
        assert dbs
        for db in dbs:
            pid = int(db.name[1:-3])
            with LocalState.open(str(local_root), db.parent.name, pid) as local:
                actual: dict[str, int] = {}
                for k, _ in local.rows():
                    label = "null" if k == NULL_KEY_BYTES else str(int.from_bytes(k[:4], "big"))
                    actual[label] = actual.get(label, 0) + 1
                assert local.block_keys == actual, (b, pid)
        assert set(run.state_values()) <= set(ks)
