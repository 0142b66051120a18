"""Hostile probes of swap segments (one file per source partition, a record batch per
destination, random access by :func:`~trilink_spark._internal.io.arrowio.open_table`), of the tasks
that load them, and of the stored plans that drive them. No Spark: the segment job's function is
run in-process, as a Spark task runs it.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentTypeError, StateCorruptError
from trilink_spark._internal.io.arrowio import open_table, write_table
from trilink_spark.keyed.run.task import StateIO
from trilink_spark.keyed.semantics.keys import NULL_KEY, PartitionState
from trilink_spark.keyed.durable.codec import cut_segments, decode_state
from trilink_spark.keyed.durable.codec import encode_state
from trilink_spark.keyed.swaps.plan import SwapRequest, _segment_function, plan_swap
from trilink_spark._internal.io.sealed import seal, unseal
from trilink_spark.state.store import STATE_KIND, KeyedStateStore

VALUES = pa.struct([("n", pa.int64())])


def _state(keys: list[Any], base: int = 0) -> PartitionState:
    st = PartitionState()
    for i, k in enumerate(keys):
        key = NULL_KEY if k is None else k
        st.key_high[key] = float(base + i)
        st.last_seen[key] = float(base + i)
        st.key_rows[key] = i + 1
        st.values[key] = {"n": base + i}
        st.timers.append((key, base + i))
    return st


def _table(keys: list[Any], base: int = 0, key_type: Any = pa.string()) -> Any:
    return encode_state(_state(keys, base), key_type, VALUES)


def _store(tmp_path: Path, layout: dict[int, list[Any]], key_type: Any = pa.string()
           ) -> KeyedStateStore:
    """A store whose committed version 0 holds ``layout`` ({partition: keys})."""
    store = KeyedStateStore(str(tmp_path / "state"))
    n = max(layout) + 1
    for p in range(n):
        store.save_table(p, 0, _table(layout.get(p, []), 100 * p, key_type))
    store.save_placement(0, tl.HashPartitioner(n), n)
    store.write_manifest({"committed": [0], "placements": [0]})
    return store


def _swap(store: KeyedStateStore, batch: int, moves: list[tuple[Any, int, int]],
          partitions: int, key_type: Any = pa.string()) -> list[int]:
    """Store a swap plan of ``moves`` (key, from, to) for ``batch`` and write its segments
    with the segment job's own function; returns the sources."""
    table = pa.table({"key": pa.array([m[0] for m in moves], key_type),
                      "from": pa.array([m[1] for m in moves], pa.int32()),
                      "to": pa.array([m[2] for m in moves], pa.int32())})
    placement = tl.HashPartitioner(partitions).to_dict()
    plan = {"batch_id": batch, "prev": batch - 1, "mode": "sync",
            "partitions_before": partitions, "partitions_after": partitions,
            "keys_total": 0, "moved_keys": len(moves), "complete": True,
            "placement": placement, "target": placement, "max_keys_per_batch": None,
            "refit": "none"}
    store.save_plan(batch, plan, table)
    sources = sorted({m[1] for m in moves})
    run = _segment_function(store, batch, batch - 1, sources)
    out = list(run(iter([pa.record_batch({"id": list(range(len(sources)))})])))
    assert [r.column(0)[0].as_py() for r in out] == sources
    return sources


def _io(store: KeyedStateStore, batch: int, partitions: int) -> StateIO:
    """What the task of a partition of ``batch`` loads from (``partitions`` at ``batch - 1``)."""
    return StateIO(store, batch, batch - 1, partitions, True, pa.string(), VALUES)


def _keys_and_values(table: Any) -> dict[Any, int]:
    state = decode_state(table)
    return {(None if isinstance(k, float) else k): v["n"] for k, v in state.values.items()}


def _segment(tmp_path: Path, source: int, batch: int = 1) -> Path:
    return tmp_path / "state" / "swaps" / f"{batch:012d}" / f"segment-{source:05d}.state"


LAYOUT = {0: ["a", "b", "c"], 1: ["d", "e", "f"], 2: ["g"], 3: ["h", "i"]}
MOVES = [("a", 0, 2), ("b", 0, 3), ("d", 1, 2), ("e", 1, 3), ("h", 3, 2)]


# ---------------------------------------------------------------------- the round trip
def test_tasks_load_exactly_their_incoming_keys(tmp_path: Path) -> None:
    store = _store(tmp_path, LAYOUT)
    _swap(store, 1, MOVES, 4)
    io = _io(store, 1, 4)
    got = {p: _keys_and_values(io.load(p)) for p in range(4)}
    assert got == {0: {"c": 2}, 1: {"f": 102}, 2: {"g": 200, "a": 0, "d": 100, "h": 300},
                   3: {"i": 301, "b": 1, "e": 101}}


def test_foreign_segment_with_the_same_row_counts_is_refused(tmp_path: Path) -> None:
    """segment-00001 replaced by segment-00000 (a second job, a stray copy): both send one
    key to partition 2 and one to 3, so the row counts agree, but the keys are not the plan's:
    partition 2 would hold 'a' twice and lose 'd'."""
    store = _store(tmp_path, LAYOUT)
    _swap(store, 1, MOVES, 4)
    shutil.copyfile(_segment(tmp_path, 0), _segment(tmp_path, 1))
    io = _io(store, 1, 4)
    for p in (2, 3):
        with pytest.raises(StateCorruptError, match="segment-00001"):
            io.load(p)


def test_segment_index_pointing_at_another_destination_is_refused(tmp_path: Path) -> None:
    """An index that swaps the record batches of two destinations with equal row counts."""
    store = _store(tmp_path, LAYOUT)
    _swap(store, 1, MOVES, 4)
    path = _segment(tmp_path, 0)
    with pa.memory_map(str(path)) as source:
        stored = open_table(source, STATE_KIND, str(path))
        table = stored.read()
        metadata = dict(stored.metadata)
    index = json.loads(metadata[b"trilink.segment_index"])
    assert index == [[2, 1], [3, 1]]
    metadata[b"trilink.segment_index"] = b"[[3, 1], [2, 1]]"
    path.write_bytes(write_table(pa.Table.from_batches(
        table.to_batches(), schema=table.schema.with_metadata(metadata)), STATE_KIND))
    with pytest.raises(StateCorruptError, match="segment-00000"):
        _io(store, 1, 4).load(2)


def test_segment_holding_a_key_twice_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path, LAYOUT)
    _swap(store, 1, [("a", 0, 2), ("b", 0, 2), ("d", 1, 3)], 4)
    assert _keys_and_values(_io(store, 1, 4).load(2)) == {"g": 200, "a": 0, "b": 1}
    twice = pa.concat_tables([_table(["a"]), _table(["a"])])  # 'b' replaced by 'a' again
    store.save_segment(1, 0, {2: twice})
    with pytest.raises(StateCorruptError, match="segment-00000"):
        _io(store, 1, 4).load(2)


ODD_KEYS: list[Any] = [None, "", "\U0001F600", "x" * 1_000_000, "a", "b"]


def test_odd_keys_and_a_null_key_move_exactly(tmp_path: Path) -> None:
    store = _store(tmp_path, {0: ODD_KEYS, 1: ["z"]})
    moves = [(None, 0, 1), ("", 0, 1), ("\U0001F600", 0, 2), ("x" * 1_000_000, 0, 2)]
    _swap(store, 1, moves, 3)
    io = _io(store, 1, 2)  # a rescale 2 -> 3: partition 2 starts from its segments only
    assert _keys_and_values(io.load(0)) == {"a": 4, "b": 5}
    assert _keys_and_values(io.load(1)) == {"z": 100, None: 0, "": 1}
    assert _keys_and_values(io.load(2)) == {"\U0001F600": 2, "x" * 1_000_000: 3}


@pytest.mark.parametrize("keys", [[2**63 - 1, -(2**63), 0, 7], [b"", b"\x00\xff", b"a", b"b"]],
                         ids=["long-extremes", "binary"])
def test_cut_segments_of_typed_keys_keep_every_row_once(keys: list[Any]) -> None:
    key_type = pa.int64() if isinstance(keys[0], int) else pa.binary()
    table = _table(keys, 0, key_type)
    moves = pa.table({"key": pa.array(keys[:3], key_type),
                      "to": pa.array([5, 9, 5], pa.int32())})
    kept, parts = cut_segments(table, moves)
    assert kept.column("key").to_pylist() == keys[3:]
    assert {d: t.column("key").to_pylist() for d, t in parts.items()} == {
        5: [keys[0], keys[2]], 9: [keys[1]]}
    assert all(t.schema.field("key").type == key_type for t in parts.values())


def test_cut_segments_to_10000_destinations_is_not_one_pass_per_destination() -> None:
    keys = [f"k{i}" for i in range(100_000)]
    st = PartitionState()
    for k in keys:
        st.key_high[k] = 1.0
    table = encode_state(st, pa.string())
    moves = pa.table({"key": pa.array(keys),
                      "to": pa.array((np.arange(100_000) * 7919 % 10_000).astype(np.int32))})
    started = time.perf_counter()
    kept, parts = cut_segments(table, moves)
    elapsed = time.perf_counter() - started
    assert kept.num_rows == 0 and len(parts) == 10_000
    assert sum(t.num_rows for t in parts.values()) == 100_000
    assert parts[0].column("key").to_pylist()[:2] == ["k0", "k10000"]  # arrival order kept
    assert elapsed < 1.5, elapsed  # one filter per destination took ~2 s here


# ---------------------------------------------------------------------- damaged files
def _two_destination_segment(tmp_path: Path) -> tuple[KeyedStateStore, Path, dict[int, Any]]:
    store = KeyedStateStore(str(tmp_path / "state"))
    store.save_segment(1, 0, {2: _table(["a", "b"]), 5: _table(["c"], 7)})
    good = {d: store.load_segment(1, 0, d) for d in (2, 5)}
    return store, _segment(tmp_path, 0), good


def test_every_truncation_of_a_segment_is_named(tmp_path: Path) -> None:
    store, path, _ = _two_destination_segment(tmp_path)
    data = path.read_bytes()
    for n in range(0, len(data), 3):
        for cut in (data[:n], data[:n] + data[-10:], data[len(data) - n:]):
            if cut == data:
                continue
            path.write_bytes(cut)
            with pytest.raises(StateCorruptError, match="segment-00000"):
                store.load_segment(1, 0, 2)


def test_random_byte_damage_is_never_a_raw_error(tmp_path: Path) -> None:
    store, path, good = _two_destination_segment(tmp_path)
    data = path.read_bytes()
    rng = random.Random(11)
    refused = 0
    for _ in range(400):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        path.write_bytes(bytes(damaged))
        for dest in (2, 5):
            try:
                table = store.load_segment(1, 0, dest)
            except StateCorruptError as err:
                assert "segment-00000" in str(err)
                refused += 1
            else:  # checksums: what reads back despite the damage is the segment as written
                assert isinstance(table, pa.Table) and table.equals(good[dest])
    assert refused > 400


def test_a_damaged_value_byte_is_detected(tmp_path: Path) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    store.save_segment(1, 0, {2: _table(["a"], 0x5A5A5A5A5A)})
    path = _segment(tmp_path, 0)
    data = path.read_bytes()
    marker = (0x5A5A5A5A5A).to_bytes(8, "little")
    assert data.count(marker) == 2  # the value is stored in two columns: damage one
    path.write_bytes(data.replace(marker, (0x5A5A5A5A5B).to_bytes(8, "little"), 1))
    with pytest.raises(StateCorruptError, match="segment-00000.*fails its checksum"):
        store.load_segment(1, 0, 2)


def test_a_directory_in_place_of_a_segment_is_a_store_error(tmp_path: Path) -> None:
    store, path, _ = _two_destination_segment(tmp_path)
    path.unlink()
    path.mkdir()
    with pytest.raises(tl.TrilinkError, match="segment-00000"):
        store.load_segment(1, 0, 2)


def test_open_table_refuses_bad_arguments_and_batch_numbers() -> None:
    data = write_table(pa.Table.from_batches([pa.record_batch({"x": [1]}),
                                              pa.record_batch({"x": [2, 3]})]), "example")
    with pytest.raises(InvalidArgumentTypeError):
        open_table(data, "example", "w")  # type: ignore[arg-type]
    with pytest.raises(StateCorruptError, match="state file"):
        open_table(pa.BufferReader(data), "keyed-state", "state file")  # another kind
    stored = open_table(pa.BufferReader(data), "example", "w")
    assert stored.read([1, 0]).column("x").to_pylist() == [2, 3, 1]
    assert stored.read([]).num_rows == 0
    for bad in ([2], [-1], [True], ["0"]):
        with pytest.raises(StateCorruptError, match="record batches"):
            stored.read(bad)


def test_segment_read_while_it_is_rewritten_from_4_threads(tmp_path: Path) -> None:
    """A replayed segment job rewrites the file (temporary name, rename) while readers load
    it: every read sees one whole file."""
    store, _, good = _two_destination_segment(tmp_path)
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        try:
            while not stop.is_set():
                for dest in (2, 5):
                    assert store.load_segment(1, 0, dest).equals(good[dest])
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    readers = [threading.Thread(target=read) for _ in range(4)]
    for t in readers:
        t.start()
    for _ in range(60):
        store.save_segment(1, 0, {2: _table(["a", "b"]), 5: _table(["c"], 7)})
    stop.set()
    for t in readers:
        t.join()
    assert errors == []


# ---------------------------------------------------------------------- stored plans
def _fluid_plan(tmp_path: Path) -> tuple[KeyedStateStore, Path]:
    keys = [f"k{i:02d}" for i in range(40)]
    strategy = tl.HashPartitioner(4)
    pids = strategy.assign(keys).tolist()
    store = _store(tmp_path, {p: [k for k, q in zip(keys, pids) if q == p] for p in range(4)})
    request = SwapRequest.checked(None, 2, "minimal", "fluid", 3)
    plan, moves, _ = plan_swap(store, 1, 0, strategy, request)
    assert not plan["complete"] and plan["max_keys_per_batch"] == 3
    store.save_plan(1, plan, moves)
    return store, tmp_path / "state" / "swaps" / f"{1:012d}" / "plan.json"


@pytest.mark.parametrize("field,value", [
    ("max_keys_per_batch", 0), ("max_keys_per_batch", -1), ("max_keys_per_batch", "3"),
    ("max_keys_per_batch", True), ("max_keys_per_batch", 2.5),
    ("placement", {"strategy": "nope"}),
    ("target", {"strategy": "hash", "num_partitions": "2"}),
    ("placement", {"strategy": "block", "num_partitions": 2, "num_blocks": 4,
                   "table": [5, 0, 0, 0]}),
])
def test_malformed_fluid_plan_fields_are_state_corrupt_errors(tmp_path: Path, field: str,
                                                             value: Any) -> None:
    """A resumed fluid swap rebuilds its step size, placement and target from plan.json: a
    step of 0 keys never finishes, a str fails inside the planner, a bad strategy fails in the
    runner without naming the file."""
    store, path = _fluid_plan(tmp_path)
    plan = unseal(json.loads(path.read_text()), "plan")
    assert store.load_plan(1) == plan
    plan[field] = value
    path.write_text(json.dumps(seal(plan)))  # a whole, sealed plan: its fields are checked
    with pytest.raises(StateCorruptError, match="plan.json"):
        store.load_plan(1)


def test_key_table_with_a_partition_holding_only_the_null_key(tmp_path: Path) -> None:
    """A partition whose only key is the null key may store it untyped (null); that is one
    key type with the others', not a foreign table."""
    store = KeyedStateStore(str(tmp_path / "state"))
    store.save_table(0, 0, encode_state(_state([None]), None, VALUES))
    store.save_table(1, 0, _table(["a", "b"]))
    store.save_placement(0, tl.HashPartitioner(2, null_policy="partition0"), 2)
    store.write_manifest({"committed": [0], "placements": [0]})
    assert store.owners() == {None: 0, "a": 1, "b": 1}
