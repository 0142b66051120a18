"""Hostile probes of the keyed state store, state tables, swaps and the keyed runner.

Each test asserts the correct behaviour where a probe found a defect, so that it stays fixed.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError, StateCorruptError, StateStoreError
from trilink_spark.errors import StateTypeError
from trilink_spark.keyed import KeyedBatchFunction, KeyedContext
from trilink_spark._internal.io.arrowio import write_table
from trilink_spark.keyed.semantics.keys import PartitionState
from trilink_spark.keyed.durable.codec import decode_state, encode_state
from trilink_spark.keyed.durable.codec import merge_in, split_out
from trilink_spark.keyed.swaps.plan import SwapRequest, plan_swap
from trilink_spark.partitioners.tables.overlay import OverlayPartitioner
from trilink_spark.state.store import KeyedStateStore

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class N(tl.KeyedWatermarkProcessFunction):
    """Running count per key (typed state); outputs the count only, so any key type works."""

    output_schema = "n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        return [(n,)]


def _state(keys: list[Any], values: dict[str, Any] | None = None) -> PartitionState:
    st = PartitionState()
    for i, k in enumerate(keys):
        st.key_high[k] = float(i)
        st.last_seen[k] = float(i)
        st.key_rows[k] = i % 7 + 1
        if values is not None:
            st.values[k] = dict(values)
    return st


def make_store(tmp_path: Path, keys: list[Any], strategy: tl.Partitioner | None = None
               ) -> KeyedStateStore:
    """A store with one committed version 0 of ``keys`` placed by ``strategy``."""
    strategy = strategy or tl.HashPartitioner(4)
    store = KeyedStateStore(str(tmp_path / "state"))
    pids = np.asarray(strategy.assign(keys)) if keys else np.zeros(0, np.int64)
    for p in range(strategy.num_partitions):
        mine = [k for k, q in zip(keys, pids.tolist()) if q == p]
        store.save_table(p, 0, encode_state(_state(mine, {"n": 1}), pa.string()))
    store.save_placement(0, strategy, strategy.num_partitions)
    store.write_manifest({"committed": [0], "placements": [0]})
    return store


KEYS = [f"k{i:03d}" for i in range(50)]


# ---------------------------------------------------------------------- state tables
@pytest.mark.parametrize("keys", [
    [b"a", b"\x00\xff", b""],
    ["a" * 1_000_000, "\U0001F600", "", "x"],
    [2**63 - 1, -(2**63), 0],
    [True, False],
    [datetime.date(2020, 1, 1), datetime.date(1970, 1, 1)],
    [1.5, -2.25, 1e300],
], ids=["bytes", "long-emoji-empty", "int64-extremes", "bool", "date", "double"])
def test_odd_keys_round_trip_exactly(keys: list[Any]) -> None:
    state = decode_state(encode_state(_state(keys)))
    assert list(state.key_high) == keys
    assert [type(k) for k in state.key_high] == [type(k) for k in keys]


def test_mixed_key_kinds_are_a_typed_error() -> None:
    with pytest.raises(StateTypeError):
        encode_state(_state([1, "a"]))


def test_json_state_keeps_nan_inf_huge_ints_and_nesting() -> None:
    value = {"x": math.inf, "y": -math.inf, "z": 2**70, "n": {"a": {"b": [1, None, "s"]}}}
    back = decode_state(encode_state(_state(["a"], {"v": value}))).values["a"]["v"]
    assert back["x"] == math.inf and back["y"] == -math.inf and back["z"] == 2**70
    assert back["n"] == value["n"]
    nan = decode_state(encode_state(_state(["a"], {"v": math.nan}))).values["a"]["v"]
    assert math.isnan(nan)


def test_declared_schema_refuses_values_that_do_not_fit() -> None:
    typed = pa.struct([("x", pa.int64())])
    for bad in (2**63, "s", [1]):
        with pytest.raises(StateTypeError):
            encode_state(_state(["a"], {"x": bad}), value_type=typed)


def test_typed_nan_state_value_survives() -> None:
    typed = pa.struct([("x", pa.float64())])
    back = decode_state(encode_state(_state(["a"], {"x": math.nan}), value_type=typed))
    assert "a" in back.values and math.isnan(back.values["a"]["x"])


def test_json_state_with_non_str_dict_keys_is_refused_or_exact() -> None:
    try:
        back = decode_state(encode_state(_state(["a"], {"v": {1: 2}})))
    except StateTypeError:
        return
    assert back.values["a"]["v"] == {1: 2}


def test_split_out_and_merge_in_keep_every_row_once() -> None:
    table = encode_state(_state(KEYS, {"n": 1}), pa.string())
    moving = pa.array(KEYS[::3] + ["not-stored", None])
    kept, leaving = split_out(table, moving)
    assert kept.num_rows + leaving.num_rows == len(KEYS)
    assert set(leaving.column("key").to_pylist()) == set(KEYS[::3])
    merged = merge_in(kept, [leaving])
    assert sorted(merged.column("key").to_pylist()) == sorted(KEYS)
    assert merge_in(None, []) is None
    empty = encode_state(PartitionState(), pa.string())
    assert split_out(empty, moving)[1].num_rows == 0


# ---------------------------------------------------------------------- corrupt files
@pytest.mark.parametrize("body", [b"{not json", b"\xff\xfe", b"[1, 2]", b"1" * 5000, b"",
                                  b'{"format": "trilink-keyed-state-manifest", "version": 2}',
                                  b'{"format": "trilink-keyed-state-manifest", "version": 1, '
                                  b'"committed": "0"}'])
def test_corrupt_manifest_is_state_corrupt_error(tmp_path: Path, body: bytes) -> None:
    store = make_store(tmp_path, KEYS)
    (tmp_path / "state" / "manifest.json").write_bytes(body)
    with pytest.raises(StateCorruptError, match="manifest.json"):
        store.owners()


def test_deeply_nested_manifest_is_state_corrupt_error(tmp_path: Path) -> None:
    store = make_store(tmp_path, KEYS)
    (tmp_path / "state" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StateCorruptError):
        store.read_manifest()


@pytest.mark.parametrize("body", [{"partitions": 4, "strategy": [1]},
                                  {"partitions": 4, "strategy": {"strategy": "nope"}},
                                  {"partitions": "x", "strategy": None}, [1],
                                  {"partitions": 0, "strategy": None}])
def test_corrupt_placement_is_state_corrupt_error(tmp_path: Path, body: Any) -> None:
    store = make_store(tmp_path, KEYS)
    (tmp_path / "state" / "placements" / f"{0:012d}.json").write_text(json.dumps(body))
    with pytest.raises(StateCorruptError, match="placements"):
        store.placement_at(0)


def test_missing_placement_and_segment_and_moves_are_named(tmp_path: Path) -> None:
    store = make_store(tmp_path, KEYS)
    (tmp_path / "state" / "placements" / f"{0:012d}.json").unlink()
    with pytest.raises(StateCorruptError, match="missing"):
        store.placement_at(0)
    with pytest.raises(StateCorruptError, match="moves"):
        store.load_moves(3)
    with pytest.raises(StateCorruptError, match="segment"):
        store.load_segment(3, 0, 1)


@pytest.mark.parametrize("junk", [b"", b"\x80\x04K\x01.", b"ARROW1 truncated", b"junk" * 10])
def test_corrupt_moves_and_segments_are_named(tmp_path: Path, junk: bytes) -> None:
    store = make_store(tmp_path, KEYS)
    swap = tmp_path / "state" / "swaps" / f"{1:012d}"
    swap.mkdir(parents=True)
    (swap / "moves.state").write_bytes(junk)
    (swap / "segment-00000.state").write_bytes(junk)
    with pytest.raises(StateCorruptError, match="moves.state"):
        store.load_moves(1)
    with pytest.raises(StateCorruptError, match="segment-00000"):
        store.load_segment(1, 0, 1)


def test_segment_file_reads_only_its_destination(tmp_path: Path) -> None:
    store = make_store(tmp_path, KEYS)
    to_two = encode_state(_state(["a", "b"]))
    to_five = encode_state(_state(["c"]))
    written = store.save_segment(4, 0, {5: to_five, 2: to_two})
    path = tmp_path / "state" / "swaps" / f"{4:012d}" / "segment-00000.state"
    assert path.stat().st_size == written
    assert store.load_segment(4, 0, 2).column("key").to_pylist() == ["a", "b"]
    assert store.load_segment(4, 0, 5).column("key").to_pylist() == ["c"]
    with pytest.raises(StateCorruptError, match="no segment for partition 3"):
        store.load_segment(4, 0, 3)


@pytest.mark.parametrize("index", [b"[[2, 2]]", b"[[2, 3], [5, 1]]", b"[[2, 2], [2, 1]]",
                                   b"{}", b"[[2, -1], [5, 1]]", b"[" * 100_000, b"\xff"])
def test_segment_file_with_a_bad_index_is_refused(tmp_path: Path, index: bytes) -> None:
    from trilink_spark._internal.io.arrowio import read_table, write_table
    from trilink_spark.state.store import STATE_KIND

    store = make_store(tmp_path, KEYS)
    store.save_segment(4, 0, {2: encode_state(_state(["a", "b"])),
                              5: encode_state(_state(["c"]))})
    path = tmp_path / "state" / "swaps" / f"{4:012d}" / "segment-00000.state"
    table = read_table(path.read_bytes(), STATE_KIND, "segment")
    metadata = dict(table.schema.metadata)
    metadata[b"trilink.segment_index"] = index
    path.write_bytes(write_table(pa.Table.from_batches(table.to_batches(),
                                                       schema=table.schema.with_metadata(
                                                           metadata)), STATE_KIND))
    with pytest.raises(StateCorruptError, match="segment-00000"):
        store.load_segment(4, 0, 2)


def test_state_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path, KEYS)
    table = encode_state(_state(["a"]))
    store.save(1, 0, write_table(table, "swap-moves"))
    with pytest.raises(StateCorruptError, match="partition=00001"):
        store.owners()


def test_junk_names_in_the_store_are_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path, KEYS)
    (tmp_path / "state" / "partition=00001" / "latest.state").write_bytes(b"x")
    with pytest.raises(StateCorruptError, match="latest.state"):
        store.versions(1)
    (tmp_path / "state" / "partition=abc").mkdir()
    with pytest.raises(StateCorruptError, match="partition=abc"):
        store.partitions()


def _bad_tables() -> list[Any]:
    good = encode_state(_state(["a"]))
    meta = dict(good.schema.metadata)
    return [
        good.set_column(1, "high", pa.array(["x"])),
        good.set_column(4, "timers", pa.array([["x"]])),
        good.set_column(5, "values", pa.array([3])),
        good.replace_schema_metadata({**meta, b"trilink.partition_high": b"null"}),
        good.replace_schema_metadata({**meta, b"trilink.counters": b'{"rows": "x"}'}),
        good.replace_schema_metadata({**meta, b"trilink.shared_tables": b"[1]"}),
    ]


@pytest.mark.parametrize("index", range(6), ids=["high-str", "timers-str", "values-int",
                                                   "high-null", "counters-str", "tables-list"])
def test_malformed_state_table_is_state_corrupt_error(index: int) -> None:
    with pytest.raises(StateCorruptError):
        decode_state(_bad_tables()[index], "state P")


@pytest.mark.parametrize("table", [encode_state(_state(["a"])).drop(["key"]),
                                   encode_state(_state([5]))], ids=["no-key", "int-key"])
def test_key_table_of_foreign_state_is_state_corrupt_error(tmp_path: Path, table: Any) -> None:
    store = make_store(tmp_path, KEYS)
    store.save_table(1, 0, table)
    with pytest.raises(StateCorruptError):
        store.owners()


@pytest.mark.parametrize("body", [{"partitions": 2, "strategy": {"strategy": "hash",
                                                                 "num_partitions": 4}},
                                  {"partitions": 2.5, "strategy": None},
                                  {"partitions": True, "strategy": None}])
def test_inconsistent_placement_is_state_corrupt_error(tmp_path: Path, body: Any) -> None:
    store = make_store(tmp_path, KEYS)
    (tmp_path / "state" / "placements" / f"{0:012d}.json").write_text(json.dumps(body))
    with pytest.raises(StateCorruptError):
        store.placement_at(0)


@pytest.mark.parametrize("plan", [{"batch_id": 1}, {"batch_id": True}])
def test_incomplete_plan_is_state_corrupt_error(tmp_path: Path, plan: Any) -> None:
    store = make_store(tmp_path, KEYS)
    swap = tmp_path / "state" / "swaps" / f"{1:012d}"
    swap.mkdir(parents=True)
    (swap / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(StateCorruptError):
        store.load_plan(1)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_read_only_state_path_is_a_store_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(StateStoreError):
            KeyedStateStore(str(ro))
    finally:
        ro.chmod(0o700)


def test_prune_with_keep_versions_1_keeps_what_a_replay_needs(tmp_path: Path) -> None:
    store = KeyedStateStore(str(tmp_path / "s"), keep_versions=1)
    for v in range(5):
        store.save_table(0, v, encode_state(_state(["a"])))
    store.prune(1, 4, keep_from=3)
    assert store.versions(0) == [3, 4]


# ---------------------------------------------------------------------- swap requests
@pytest.mark.parametrize("kwargs", [
    {"num_partitions": "4"}, {"num_partitions": 4.0}, {"num_partitions": 0},
    {"num_partitions": True}, {"strategy": 5}, {"strategy": tl.HashPartitioner},
    {"strategy": tl.HashPartitioner(3), "num_partitions": 4}, {"refit": ["minimal"]},
    {"num_partitions": 4, "mode": {}}, {"num_partitions": 4, "mode": "fluid"},
    {"num_partitions": 4, "mode": "fluid", "max_keys_per_batch": 0},
    {"strategy": OverlayPartitioner(tl.HashPartitioner(2), {})},
    {"refit": "none"}, {"strategy": "no-such-strategy"},
])
def test_bad_request_swap_arguments_are_typed_errors(tmp_path: Path, kwargs: Any) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", N(), 1.0, str(tmp_path / "s"))
    with pytest.raises(tl.TrilinkError):
        run.request_swap(**kwargs)
    assert run.pending_swap is None


def test_request_swap_to_overlay_by_name_is_refused(tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", N(), 1.0, str(tmp_path / "s"))
    with pytest.raises(InvalidArgumentError):
        run.request_swap("overlay")


def test_request_swap_checks_the_partition_limit_when_asked(tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", N(), 1.0, str(tmp_path / "s"))
    with pytest.raises(InvalidArgumentError):
        run.request_swap(num_partitions=10**9)


def test_swap_plan_with_no_keys_in_state(tmp_path: Path) -> None:
    store = make_store(tmp_path, [])
    for request in (SwapRequest.checked(None, 6, "minimal", "sync", None),
                    SwapRequest.checked("least_count", 6, "none", "fluid", 3)):
        plan, moves, placement = plan_swap(store, 1, 0, tl.HashPartitioner(4), request)
        assert plan["moved_keys"] == 0 and moves.num_rows == 0 and plan["complete"]
        assert placement.num_partitions == 6


def test_swap_to_the_same_placement_moves_nothing(tmp_path: Path) -> None:
    store = make_store(tmp_path, KEYS)
    request = SwapRequest.checked(tl.HashPartitioner(4), None, "none", "sync", None)
    plan, moves, _ = plan_swap(store, 1, 0, tl.HashPartitioner(4), request)
    assert plan["moved_keys"] == 0 and moves.num_rows == 0 and plan["keys_total"] == len(KEYS)


def test_fluid_plan_moves_at_most_its_bound_heaviest_first(tmp_path: Path) -> None:
    store = make_store(tmp_path, KEYS)
    request = SwapRequest.checked("least_count", 4, "none", "fluid", 5)
    plan, moves, placement = plan_swap(store, 1, 0, tl.HashPartitioner(4), request)
    assert moves.num_rows <= 5
    moved = dict(zip(moves.column("key").to_pylist(), moves.column("to").to_pylist()))
    assert {k: placement.partition(k) for k in moved} == moved


def test_swap_to_an_explicit_one_partition_strategy(tmp_path: Path) -> None:
    store = make_store(tmp_path, KEYS)
    request = SwapRequest.checked(tl.HashPartitioner(1), None, "none", "sync", None)
    plan, _, placement = plan_swap(store, 1, 0, tl.HashPartitioner(4), request)
    assert plan["partitions_after"] == 1 and placement.num_partitions == 1


def test_request_swap_during_a_fluid_swap_is_refused_when_asked(tmp_path: Path) -> None:
    store = make_store(tmp_path, KEYS)
    request = SwapRequest.checked("least_count", 4, "none", "fluid", 2)
    plan, moves, placement = plan_swap(store, 1, 0, tl.HashPartitioner(4), request)
    assert not plan["complete"]
    store.save_placement(1, placement, placement.num_partitions)
    store.save_plan(1, plan, moves)
    store.write_manifest({"committed": [0, 1], "placements": [0, 1]})
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", N(), 1.0,
                                 str(tmp_path / "state"), num_partitions=4)
    with pytest.raises(InvalidArgumentError, match="a fluid swap is under way"):
        run.request_swap(num_partitions=2)
    assert run.pending_swap is None  # nothing pending: the next batch goes on with the swap


def test_request_swap_from_threads_keeps_one_whole_request(tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", N(), 1.0, str(tmp_path / "s"))
    errors: list[BaseException] = []

    def ask(n: int) -> None:
        try:
            for _ in range(200):
                run.request_swap(num_partitions=n)
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=ask, args=(n,)) for n in (2, 3, 5, 7)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and run.pending_swap is not None
    assert run.pending_swap.num_partitions in (2, 3, 5, 7)


def test_runner_pickles_with_its_pending_swap(tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: None, "k", "t", N(), 1.0, str(tmp_path / "s"))
    run.request_swap(num_partitions=3)
    back = pickle.loads(cloudpickle.dumps(run))
    assert back.pending_swap == run.pending_swap and back.token == run.token
    back.request_swap(num_partitions=5)  # the lock is re-made
    assert back.pending_swap.num_partitions == 5 and run.pending_swap.num_partitions == 3


# ---------------------------------------------------------------------- scale
def _timed(n: int) -> tuple[float, float, float]:
    keys = [f"key-{i}" for i in range(n)]
    state = _state(keys, {"n": 1})
    state.timers = [(keys[i], i) for i in range(0, n, 3)]
    start = time.perf_counter()
    table = encode_state(state, pa.string())
    encoded = time.perf_counter() - start
    start = time.perf_counter()
    decode_state(table)
    decoded = time.perf_counter() - start
    start = time.perf_counter()
    split_out(table, pa.array(keys[::2]))
    split = time.perf_counter() - start
    return encoded, decoded, split


def test_encode_decode_split_grow_about_linearly() -> None:
    small = _timed(4_000)
    big = _timed(40_000)
    # 10x the keys; quadratic growth would be ~100x. Bound generously (cache, GC noise).
    for s, b in zip(small, big):
        assert b < 40 * max(s, 2e-3), (small, big)


def test_plan_swap_grows_about_linearly(tmp_path: Path) -> None:
    out = []
    for n in (2_000, 20_000):
        store = make_store(tmp_path / str(n), [f"key-{i}" for i in range(n)])
        request = SwapRequest.checked(None, 6, "minimal", "sync", None)
        start = time.perf_counter()
        plan_swap(store, 1, 0, tl.HashPartitioner(4), request)
        out.append(time.perf_counter() - start)
    assert out[1] < 40 * max(out[0], 5e-3), out


# ---------------------------------------------------------------------- with Spark
def _runner(tmp_path: Path, name: str, **kw: Any) -> KeyedBatchFunction:
    kw.setdefault("num_partitions", 2)
    return tl.keyed_foreach_batch(lambda df, b: df.collect(), "k", "t", N(), 10**6,
                                  str(tmp_path / name), **kw)


def _stored(run: KeyedBatchFunction) -> list[tuple[Any, int]]:
    manifest = run.store.read_manifest()
    version = manifest["committed"][-1]
    _, partitions = run.store.placement_at(version)
    rows = []
    for p in range(partitions):
        table = run.store.load_table(p, version)
        rows += [(r["key"], r["values"]["n"]) for r in
                 table.select(["key", "values"]).to_pylist()]
    return rows


@pytest.mark.parametrize("schema,keys", [("k string, t long", ["a", None]),
                                         ("k long, t long", [1, None])], ids=["str", "long"])
def test_null_key_state_is_carried_across_batches(spark: Any, tmp_path: Path, schema: str,
                                                  keys: list[Any]) -> None:
    run = _runner(tmp_path, "null", strategy=tl.HashPartitioner(2, null_policy="partition0"))
    df = spark.createDataFrame(pd.DataFrame({"k": keys, "t": [1, 2]}), schema)
    for b in range(3):
        run(df, b)
    stored = _stored(run)
    assert sorted(n for _, n in stored) == [3, 3], stored


def test_an_empty_micro_batch_keeps_the_state(spark: Any, tmp_path: Path) -> None:
    run = _runner(tmp_path, "empty")
    df = spark.createDataFrame(pd.DataFrame({"k": KEYS[:6], "t": range(6)}), "k string, t long")
    empty = spark.createDataFrame([], "k string, t long")
    run(df, 0)
    run(empty, 1)
    run(df, 2)
    assert sorted(_stored(run)) == sorted((k, 2) for k in KEYS[:6])


def test_a_swap_every_batch(spark: Any, tmp_path: Path) -> None:
    run = _runner(tmp_path, "every")
    df = spark.createDataFrame(pd.DataFrame({"k": KEYS[:20], "t": range(20)}),
                               "k string, t long")
    run(df, 0)
    for b, n in zip(range(1, 4), (3, 1, 5)):
        run.request_swap(num_partitions=n)
        run(df, b)
        assert run.swaps[-1].partitions_after == n
    assert sorted(_stored(run)) == sorted((k, 4) for k in KEYS[:20])
    assert set(run.owners().values()) <= set(range(5))


def test_fluid_swap_survives_a_restart(spark: Any, tmp_path: Path) -> None:
    run = _runner(tmp_path, "fluid", num_partitions=4)
    df = spark.createDataFrame(pd.DataFrame({"k": KEYS[:24], "t": range(24)}),
                               "k string, t long")
    run(df, 0)
    run.request_swap(num_partitions=2, mode="fluid", max_keys_per_batch=5)
    run(df, 1)
    assert not run.swaps[-1].complete
    again = _runner(tmp_path, "fluid", num_partitions=4, takeover=True)  # a restart
    b = 2
    while not again.swaps or not again.swaps[-1].complete:
        again(df, b)
        assert again.swaps[-1].moved_keys <= 5
        b += 1
        assert b < 12
    assert sorted(_stored(again)) == sorted((k, b) for k in KEYS[:24])
    assert set(again.owners().values()) <= {0, 1}
