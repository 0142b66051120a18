"""Integrity of the keyed state path: damaged files, two writers, a lost or rolled-back manifest.

Each test asserts the correct behaviour where a hostile probe found a defect (issue 29,
"Integrity"), so that it stays fixed:

1. One flipped byte in any stored file (state versions, segments, moves, swap plans, placement
   records, the manifest) is refused with a StateCorruptError naming the file, or is harmless
   (the file reads back exactly as written): never a wrong value read back silently.
2. Two runners on one fresh state path: the second is refused with StateOwnershipError before
   any of its tasks writes, and a runner whose path was taken over writes nothing more.
3. A missing manifest over existing state, or a manifest rolled back one commit, is a
   StateCorruptError naming the manifest, never a silent restart or a dropped batch.
"""

from __future__ import annotations

import json
import sys
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark._internal.io.arrowio import FORMAT_KEY, VERSION_KEY, read_table, write_table
from trilink_spark.errors import StateCorruptError, StateOwnershipError
from trilink_spark.keyed import KeyedBatchFunction, KeyedContext
from trilink_spark.keyed.semantics.keys import PartitionState
from trilink_spark.keyed.durable.codec import encode_state
from trilink_spark.state.store import STATE_KIND, KeyedStateStore

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: A count no row count reaches by itself: its 8 bytes occur once in a state file.
MARK = 0x5A5A5A5A00


class Marked(tl.KeyedWatermarkProcessFunction):
    """Running count per key, started at MARK (typed state); outputs the count."""

    output_schema = "k string, n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: KeyedContext) -> Any:
        n = ctx.get_state("n", MARK) + len(rows)
        ctx.set_state("n", n)
        return [(key, n)]


class Tracked(Marked):
    """Marked, and each task leaves a file named ``<label>-<partition>`` in ``where``: which
    runner's tasks ran at all."""

    def __init__(self, where: str, label: str) -> None:
        self.where = where
        self.label = label

    def state_config(self) -> dict[str, Any]:
        return {}  # both runners of a test share one configuration

    def open(self, partition_id: int) -> None:
        Path(self.where, f"{self.label}-{partition_id}").touch()


def frame(spark: Any, keys: list[str], start: int = 0) -> Any:
    return spark.createDataFrame(pd.DataFrame({"k": keys, "t": range(start, start + len(keys))}),
                                 "k string, t long")


def runner(path: Path, processor: Any = None, sink: Any = None, **kw: Any) -> KeyedBatchFunction:
    kw.setdefault("num_partitions", 2)
    return tl.keyed_foreach_batch(sink or (lambda df, b: df.collect()), "k", "t",
                                  processor or Marked(), 10**6, str(path), **kw)


def counts(run: KeyedBatchFunction) -> dict[Any, int]:
    return {k: int(v["n"]) - MARK for k, v in run.state_values().items()}


def in_thread(call: Any) -> tuple[threading.Thread, list[BaseException]]:
    """``call()`` started in a thread; what it raises is collected in the returned list."""
    errors: list[BaseException] = []

    def go() -> None:
        try:
            call()
        except BaseException as err:  # noqa: BLE001 - the test reads it
            errors.append(err)

    thread = threading.Thread(target=go)
    thread.start()
    return thread, errors


def flipped(data: bytes, i: int, mask: int = 0x01) -> bytes:
    return data[:i] + bytes([data[i] ^ mask]) + data[i + 1:]


def _state(keys: list[str]) -> pa.Table:
    st = PartitionState()
    for i, k in enumerate(keys):
        st.key_high[k] = float(i)
        st.last_seen[k] = float(i)
        st.key_rows[k] = i + 1
        st.values[k] = {"n": MARK + i}
    return encode_state(st, pa.string(), pa.struct([("n", pa.int64())]))


# ---------------------------------------------------------------------- 1. checksums
def test_a_flipped_value_byte_in_a_committed_state_file_fails_the_next_batch(
        spark: Any, tmp_path: Path) -> None:
    run = runner(tmp_path / "state", state_store="files")
    run(frame(spark, ["a", "a", "a"]), 0)
    path = run.store.version_path(run.owners()["a"], 0)
    data = Path(path).read_bytes()
    marker = (MARK + 3).to_bytes(8, "little")
    assert data.count(marker) == 1
    Path(path).write_bytes(data.replace(marker, (MARK + 4).to_bytes(8, "little")))
    # the task that loads it refuses it (Spark reports the task's error)
    with pytest.raises(StateCorruptError, match=r"\S*partition=0000\d/000000000000"
                                                r"\.state fails its checksum"):
        run(frame(spark, ["a"], 3), 1)
    assert run.store.read_manifest()["committed"] == [0]  # nothing committed on it


def test_a_flipped_value_byte_in_a_changelog_is_never_read_as_a_count(
        spark: Any, tmp_path: Path) -> None:
    """The local store: the running copy keeps the right count; the first read of the damaged
    changelog (a rebuild on a fresh executor) refuses it, naming it."""
    local = tmp_path / "local"
    spark.conf.set("spark.trilink.state.localDir", str(local))
    try:
        out: list[Any] = []
        run = runner(tmp_path / "state", state_store="rocksdb",
                     sink=lambda df, b: out.extend(df.collect()))
        run(frame(spark, ["a", "a", "a"]), 0)
        path = run.store.changelog_path(run.owners()["a"], 0)
        data = Path(path).read_bytes()
        marker = (MARK + 3).to_bytes(8, "little")
        assert data.count(marker) == 1
        Path(path).write_bytes(data.replace(marker, (MARK + 4).to_bytes(8, "little")))
        run(frame(spark, ["a"], 3), 1)  # from the local copy: 3 + 1, not the damaged 4 + 1
        assert out[-1]["n"] - MARK == 4
        shutil.rmtree(local)  # another executor: it rebuilds from the state path
        with pytest.raises(StateCorruptError, match=r"\S*partition=0000\d/"
                                                    r"000000000000\.log fails its checksum"):
            run(frame(spark, ["a"], 5), 2)
        assert run.store.read_manifest()["committed"] == [0, 1]  # nothing committed on it
    finally:
        spark.conf.unset("spark.trilink.state.localDir")


def test_every_flipped_byte_of_a_state_file_is_refused_or_harmless() -> None:
    table = _state(["a", "bb", "ccc"])
    data = write_table(table, STATE_KIND)
    refused = 0
    for i in range(len(data)):
        for mask in (0x01, 0x80):
            try:
                back = read_table(flipped(data, i, mask), STATE_KIND, "state file S")
            except StateCorruptError as err:
                assert "state file S" in str(err)
                refused += 1
            else:
                assert back.equals(table, check_metadata=True), (i, mask)
    assert refused > len(data)


def test_every_flipped_byte_of_a_segment_is_refused_or_harmless(tmp_path: Path) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    parts = {2: _state(["a", "b"]), 5: _state(["c"])}
    store.save_segment(1, 0, parts)
    path = Path(store.segment_path(1, 0))
    data = path.read_bytes()
    good = {d: store.load_segment(1, 0, d) for d in parts}
    for i in range(len(data)):
        path.write_bytes(flipped(data, i))
        for dest in parts:
            try:
                back = store.load_segment(1, 0, dest)
            except StateCorruptError as err:
                assert "segment-00000" in str(err)
            else:
                assert back.equals(good[dest], check_metadata=True), (i, dest)


def test_every_flipped_byte_of_moves_and_json_records_is_refused_or_harmless(
        tmp_path: Path) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    strategy = tl.HashPartitioner(4)
    store.save_placement(0, strategy, 4)
    store.write_manifest({"committed": [0, 7], "placements": [0], "owner": {"token": "t"}})
    moves = pa.table({"key": ["a", "b"], "from": pa.array([0, 1], pa.int32()),
                      "to": pa.array([1, 2], pa.int32())})
    plan = {"batch_id": 7, "prev": 0, "mode": "sync", "partitions_before": 4,
            "partitions_after": 4, "keys_total": 2, "moved_keys": 2, "complete": True,
            "placement": strategy.to_dict(), "target": strategy.to_dict(),
            "max_keys_per_batch": None}
    store.save_plan(7, plan, moves)
    swap = tmp_path / "state" / "swaps" / f"{7:012d}"
    reads = {
        tmp_path / "state" / "manifest.json": store.read_manifest,
        tmp_path / "state" / "placements" / f"{0:012d}.json": lambda: store.load_placement(0),
        swap / "plan.json": lambda: store.load_plan(7),
        swap / "moves.state": lambda: store.load_moves(7),
    }
    for path, read in reads.items():
        data = path.read_bytes()
        good = read()
        for i in range(len(data)):
            path.write_bytes(flipped(data, i))
            try:
                back = read()
            except StateCorruptError as err:
                assert path.name in str(err), err
            else:
                assert _same(back, good), (path.name, i, back)
        path.write_bytes(data)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, pa.Table):
        return a.equals(b, check_metadata=True)
    if isinstance(a, tuple):  # (strategy, partitions) of a placement record
        return a[1] == b[1] and a[0].to_dict() == b[0].to_dict()
    return bool(a == b)


def _legacy_bytes(table: pa.Table, kind: str, extra: dict[bytes, bytes] | None = None) -> bytes:
    """A table laid out as the release before checksums wrote it (tag version 1)."""
    metadata = dict(table.schema.metadata or {})
    metadata[FORMAT_KEY] = kind.encode()
    metadata[VERSION_KEY] = b"1"
    metadata.update(extra or {})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema.with_metadata(metadata)) as writer:
        for batch in table.to_batches():
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def test_files_of_the_previous_release_stay_readable(tmp_path: Path) -> None:
    table = _state(["a", "b"])
    assert read_table(_legacy_bytes(table, STATE_KIND), STATE_KIND, "old").equals(
        table, check_metadata=True)
    # a version-1 tag on a file with a checksum is a damaged version-2 tag
    with pytest.raises(StateCorruptError, match="old"):
        read_table(_legacy_bytes(table, STATE_KIND, {b"trilink.checksum": b"{}"}), STATE_KIND,
                   "old")
    store = KeyedStateStore(str(tmp_path / "state"))
    store.save(0, 0, _legacy_bytes(table, STATE_KIND))
    (tmp_path / "state" / "manifest.json").write_text(json.dumps(
        {"format": "trilink-keyed-state-manifest", "version": 1, "committed": [0],
         "placements": [0]}, sort_keys=True))
    (tmp_path / "state" / "placements").mkdir()
    (tmp_path / "state" / "placements" / f"{0:012d}.json").write_text(json.dumps(
        {"partitions": 1, "strategy": tl.HashPartitioner(1).to_dict()}))
    assert store.read_manifest()["committed"] == [0]
    assert store.owners() == {"a": 0, "b": 0}


def test_a_sealed_record_missing_half_its_seal_is_refused(tmp_path: Path) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    store.write_manifest({"committed": [0], "placements": [0]})
    path = tmp_path / "state" / "manifest.json"
    body = json.loads(path.read_text())
    for dropped in ("trilink.checksum", "trilink.sealed"):
        path.write_text(json.dumps({k: v for k, v in body.items() if k != dropped}))
        with pytest.raises(StateCorruptError, match="manifest.json"):
            store.read_manifest()


# ---------------------------------------------------------------------- 2. one writer
def test_two_runners_started_at_once_on_a_fresh_path(spark: Any, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    path = tmp_path / "state"
    keys = {"A": ["a1", "a2", "a2"], "B": ["b1", "b1", "b1", "b2"]}
    runs = {label: runner(path, Tracked(str(marks), label)) for label in keys}
    start = threading.Barrier(2)
    outcome: dict[str, BaseException | None] = {}

    def go(label: str) -> None:
        start.wait()
        try:
            runs[label](frame(spark, keys[label]), 0)
            outcome[label] = None
        except BaseException as err:  # noqa: BLE001 - the test reads it
            outcome[label] = err

    threads = [threading.Thread(target=go, args=(label,)) for label in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    won = [label for label, err in outcome.items() if err is None]
    assert len(won) == 1, outcome
    winner, loser = won[0], "B" if won[0] == "A" else "A"
    assert isinstance(outcome[loser], StateOwnershipError), outcome[loser]
    assert not list(marks.glob(f"{loser}-*")), "the refused runner's tasks ran"
    want = pd.Series(keys[winner]).value_counts().to_dict()
    assert counts(runs[winner]) == want
    runs[winner](frame(spark, keys[winner][:1], 10), 1)  # the owner goes on from its own state
    want[keys[winner][0]] += 1
    assert counts(runs[winner]) == want


def test_a_runner_started_while_another_is_mid_batch(spark: Any, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    path = tmp_path / "state"
    wrote, tried = threading.Event(), threading.Event()

    def blocking(df: Any, b: int) -> None:
        df.write.format("noop").mode("overwrite").save()  # the tasks wrote version 0
        wrote.set()
        assert tried.wait(120)

    first = runner(path, Tracked(str(marks), "A"), sink=blocking)
    second = runner(path, Tracked(str(marks), "B"))
    thread, errors = in_thread(lambda: first(frame(spark, ["a", "a"]), 0))
    try:
        assert wrote.wait(120)
        with pytest.raises(StateOwnershipError, match="another runner"):
            second(frame(spark, ["a", "b", "b"]), 0)
    finally:
        tried.set()
        thread.join(120)
    assert not errors, errors
    assert not list(marks.glob("B-*")), "the refused runner's tasks ran"
    assert counts(first) == {"a": 2}
    first(frame(spark, ["a"], 5), 1)
    assert counts(first) == {"a": 3}


def test_tasks_of_a_runner_whose_path_was_taken_over_write_nothing(
        spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "state"
    started, taken = threading.Event(), threading.Event()

    def blocking(df: Any, b: int) -> None:
        started.set()
        assert taken.wait(120)
        df.collect()  # the tasks run only now, after the takeover

    first = runner(path, sink=blocking)
    thread, errors = in_thread(lambda: first(frame(spark, ["a", "a"]), 0))
    try:
        assert started.wait(120)
        second = runner(path, takeover=True)  # says: the first has stopped for good
        second(frame(spark, ["b", "b", "b"]), 0)
    finally:
        taken.set()
        thread.join(120)
    assert len(errors) == 1 and "StateOwnershipError" in f"{type(errors[0]).__name__} {errors[0]}"
    assert counts(second) == {"b": 3}  # its committed version 0 was not overwritten


# ---------------------------------------------------------------------- 3. the manifest
def test_a_missing_manifest_over_existing_state_is_refused(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "state"
    run = runner(path)
    run(frame(spark, ["a", "b"]), 0)
    run(frame(spark, ["a"], 2), 1)
    (path / "manifest.json").unlink()  # a partial restore
    with pytest.raises(StateCorruptError, match=r"manifest\.json.*missing"):
        runner(path, takeover=True)(frame(spark, ["a"], 3), 2)
    with pytest.raises(StateCorruptError, match=r"manifest\.json"):
        run.counters()


def test_a_manifest_rolled_back_one_commit_is_refused(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "state"
    run = runner(path)
    run(frame(spark, ["a", "b"]), 0)
    run(frame(spark, ["a"], 2), 1)
    older = (path / "manifest.json").read_bytes()
    run(frame(spark, ["a"], 3), 2)
    (path / "manifest.json").write_bytes(older)  # the commit of batch 2 is lost
    with pytest.raises(StateCorruptError, match=r"manifest\.json.*\b2\b"):
        run(frame(spark, ["a"], 4), 3)
    run(frame(spark, ["a"], 3), 2)  # a replay of batch 2 itself is the same batch again
    run(frame(spark, ["a"], 4), 3)
    assert counts(run) == {"a": 4, "b": 1}


def test_a_fresh_path_starts_empty(spark: Any, tmp_path: Path) -> None:
    run = runner(tmp_path / "state")
    assert run.store.read_manifest() is None and run.counters()["rows"] == 0
    run(frame(spark, ["a"]), 0)
    assert counts(run) == {"a": 1}


def test_manifest_json_is_created_once_from_threads(tmp_path: Path) -> None:
    from trilink_spark._internal.io.files import create_if_absent, resolve_filesystem

    fs, target = resolve_filesystem(str(tmp_path / "claim.json"))
    barrier = threading.Barrier(8)
    won: list[int] = []

    def go(i: int) -> None:
        barrier.wait()
        if create_if_absent(fs, target, json.dumps({"i": i}).encode()):
            won.append(i)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert json.loads((tmp_path / "claim.json").read_text()) == {"i": won[0]}
    assert [p.name for p in tmp_path.iterdir()] == ["claim.json"]


def test_a_claim_without_a_committed_batch_pins_no_configuration(spark: Any,
                                                                  tmp_path: Path) -> None:
    """The claim is written before the first batch's tasks: a first batch that never
    committed leaves no state, so a restart with other settings is not refused."""
    path = tmp_path / "state"

    def fails(df: Any, b: int) -> None:
        raise RuntimeError("sink down")

    with pytest.raises(RuntimeError, match="sink down"):
        runner(path, sink=fails)(frame(spark, ["a"]), 0)
    assert run_owner(path) is not None  # the path is claimed ...
    again = tl.keyed_foreach_batch(lambda df, b: df.collect(), "k", "t", Marked(), 10**5,
                                   str(path), num_partitions=2, takeover=True)
    again(frame(spark, ["a", "a"]), 0)  # ... and another delay is taken
    assert counts(again) == {"a": 2}
    with pytest.raises(tl.TrilinkError, match="configuration"):  # once committed, it is pinned
        runner(path, takeover=True)(frame(spark, ["a"], 2), 1)


def run_owner(path: Path) -> Any:
    return (KeyedStateStore(str(path)).read_manifest() or {}).get("owner")
