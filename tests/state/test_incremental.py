"""Incremental snapshots: a local copy stored as its RocksDB table files, shared between
snapshots, checked on the way back, and never a referenced file pruned."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from trilink_spark.errors import StateCorruptError, StateStoreError
from trilink_spark.keyed.durable.snapshot_writer import write_snapshot
from trilink_spark.state import KeyedStateStore
from trilink_spark.state.incremental import (TABLES_DIR, collect, download, lineage,
                                             load_tables_table, read_record, stamp_checkpoint)
from trilink_spark.state.local import LocalState, head, iter_rows
from trilink_spark.state.rows import encode_rows

SCHEMA = pa.schema([("key", pa.string()), ("n", pa.int64())])


def put(local: LocalState, version: int, values: dict[str, int]) -> None:
    """Apply ``values`` (key -> n) as ``version`` and flush it into a table file."""
    table = pa.table({"key": list(values), "n": list(values.values())}, schema=SCHEMA)
    sid = local.register(table.schema)
    rows = [head(float("inf"), sid) + body for body in encode_rows(table)]
    puts = [(k.encode(), r) for k, r in zip(values, rows)]
    before = dict(zip([k for k, _ in puts], local.get([k for k, _ in puts])))
    local.apply(version, f"a{version}", {"shared": "x"}, puts, [], before)
    local.settle()


def snapshot(local: LocalState, store: KeyedStateStore, version: int) -> dict[str, int]:
    directory = tempfile.mkdtemp(dir=os.path.dirname(local.directory))
    os.rmdir(directory)
    local.checkpoint(directory)
    stamp_checkpoint(local.directory, directory)
    stats = write_snapshot(directory, store, 0, version, {"shared": "x"})
    assert stats is not None and not os.path.exists(directory)  # the checkpoint is removed
    return stats


def rows_of(directory: str) -> dict[bytes, bytes]:
    from trilink_spark.state.local import open_checkpoint

    db = open_checkpoint(directory)
    try:
        return dict(iter_rows(db))
    finally:
        db.close()


@pytest.fixture()
def local(tmp_path: Path) -> Any:
    with LocalState.open(str(tmp_path / "local"), "s", 0) as copy:
        yield copy


def test_a_second_snapshot_uploads_only_the_new_table_files(tmp_path: Path, local: Any
                                                            ) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    put(local, 1, {f"k{i:06d}": i for i in range(20_000)})
    first = snapshot(local, store, 1)
    assert first["shared"] == 0 and first["uploaded"] > 100_000
    put(local, 2, {"k000001": -1, "new": 5})
    second = snapshot(local, store, 2)
    # the 20,000 keys' table file is referred to, not uploaded again
    assert second["shared"] >= first["uploaded"] * 0.8
    assert second["uploaded"] < first["uploaded"] / 4
    one, two = read_record(store, 0, 1), read_record(store, 0, 2)
    assert one is not None and two is not None
    shared = {f["blob"] for f in one["files"]} & {f["blob"] for f in two["files"]}
    assert shared and all(b.endswith(".sst") for b in shared)
    assert 1 in store.listing(0)[0] and 2 in store.listing(0)[0]
    # read back as a table: every key, the newest values, the partition-wide values
    table = store.load_snapshot(0, 2)
    got = dict(zip(table.column("key").to_pylist(), table.column("n").to_pylist()))
    assert len(got) == 20_001 and got["k000001"] == -1 and got["new"] == 5
    assert table.schema.metadata[b"shared"] == b"x"
    assert store.load_table(0, 2).num_rows == 20_001
    assert store.version_bytes(0, 2) >= second["shared"] + second["uploaded"] - 1


def test_a_restored_copy_is_the_snapshot_and_shares_its_files(tmp_path: Path, local: Any
                                                              ) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    put(local, 1, {f"k{i}": i for i in range(5000)})
    snapshot(local, store, 1)
    expected = rows_of_open(local)
    target = str(tmp_path / "restored")
    download(store, 0, 1, target)
    assert rows_of(target) == expected
    assert lineage(target) != lineage(local.directory)  # a database of its own
    with LocalState.open(str(tmp_path / "other"), "s", 0) as other:
        other.restore(target)
        assert other.version == 1 and other.meta["attempt"] == "a1"
        assert rows_of_open(other) == expected
        put(other, 2, {"k1": 7})
        stats = snapshot(other, store, 2)
        assert stats["shared"] > 0  # what it inherited is not uploaded again
    assert not os.path.exists(target)  # moved into place


def rows_of_open(local: LocalState) -> dict[bytes, bytes]:
    return {k: r for k, r in local.rows()}


def test_a_damaged_or_missing_table_file_is_named(tmp_path: Path, local: Any) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    put(local, 1, {f"k{i}": i for i in range(3000)})
    snapshot(local, store, 1)
    record = read_record(store, 0, 1)
    assert record is not None
    sst = next(f for f in record["files"] if f["name"].endswith(".sst"))
    blob = Path(store.partition_dir(0)) / TABLES_DIR / sst["blob"]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
    with pytest.raises(StateCorruptError, match=sst["blob"] + ".*fails its checksum"):
        load_tables_table(store, 0, 1)
    blob.unlink()
    with pytest.raises(StateCorruptError, match=sst["blob"] + " is missing"):
        store.load_table(0, 1)


@pytest.mark.parametrize("damage", ["flip", "traversal", "other-version", "truncate"])
def test_a_damaged_or_foreign_record_is_refused(tmp_path: Path, local: Any, damage: str
                                                ) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    put(local, 1, {"a": 1})
    snapshot(local, store, 1)
    path = Path(store.tables_path(0, 1))
    text = path.read_text()
    if damage == "flip":
        text = text.replace('"version": 1', '"version": 3')  # the seal no longer matches
    elif damage == "truncate":
        text = text[: len(text) // 2]
    else:
        from trilink_spark.state.formats import tables_bytes

        doc = json.loads(text)
        for key in ("trilink.sealed", "trilink.checksum", "format", "format_version"):
            doc.pop(key)
        if damage == "traversal":
            doc["files"][0]["name"] = "../../escape"
        else:
            doc["version"] = 7
        text = tables_bytes(doc).decode()
    path.write_text(text)
    with pytest.raises(StateCorruptError, match=r"000000000001\.tables"):
        store.load_table(0, 1)
    assert not (tmp_path / "escape").exists()


def test_pruning_never_deletes_a_referenced_file_seeded_stress(tmp_path: Path, local: Any
                                                               ) -> None:
    """Random writes, snapshots, restores into other copies and deleted records; after each
    step every remaining record's files are there with their sizes, a restore of any record
    is the state of its version, and nothing unreferenced and older than the newest record
    is left."""
    rng = random.Random(20261203)
    store = KeyedStateStore(str(tmp_path / "state"))
    blobs = Path(store.partition_dir(0)) / TABLES_DIR
    truth: dict[str, int] = {}
    at_version: dict[int, dict[bytes, bytes]] = {}
    copy = local
    extra: list[Any] = []
    for version in range(1, 40):
        changes = {f"k{rng.randrange(3000)}": rng.randrange(10**6)
                   for _ in range(rng.choice([5, 50, 800]))}
        truth.update(changes)
        put(copy, version, changes)
        if rng.random() < 0.5:
            snapshot(copy, store, version)
            at_version[version] = rows_of_open(copy)
        kept = sorted(at_version)
        if len(kept) > 2 and rng.random() < 0.6:  # prune: drop the oldest records
            for v in kept[: rng.randrange(1, len(kept) - 1)]:
                os.remove(store.tables_path(0, v))
                del at_version[v]
            collect(store, 0)
        if at_version and rng.random() < 0.2:  # the partition moves: restored elsewhere
            v = rng.choice(sorted(at_version))
            target = str(tmp_path / f"r{version}")
            other = LocalState.open(str(tmp_path / f"copy{version}"), "s", 0)
            extra.append(other)
            download(store, 0, v, target)
            other.restore(target)
            if v == max(at_version):  # a restored copy carries on from the newest only
                copy = other
        # the invariant
        present = {p.name: p.stat().st_size for p in blobs.iterdir()} if blobs.exists() else {}
        listed: set[str] = set()
        for v in at_version:
            record = read_record(store, 0, v)
            assert record is not None
            for f in record["files"]:
                assert present.get(f["blob"]) == f["size"], (version, v, f)
                listed.add(f["blob"])
        check = rng.choice(sorted(at_version)) if at_version else None
        if check is not None:
            target = str(tmp_path / "check")
            shutil.rmtree(target, ignore_errors=True)
            download(store, 0, check, target)
            assert rows_of(target) == at_version[check]
    collect(store, 0)
    newest = max(os.stat(store.tables_path(0, v)).st_mtime_ns for v in at_version)
    listed = {f["blob"] for v in at_version for f in (read_record(store, 0, v) or {})["files"]}
    stale = [p.name for p in blobs.iterdir()
             if p.name not in listed and p.stat().st_mtime_ns < newest]
    assert stale == []  # what no kept snapshot lists is gone: the disk follows the records
    for other in extra:
        other.close()


# without a stamp only RocksDB's root files (CURRENT and its manifest) are known
@pytest.mark.parametrize("stamped,lost", [(True, "CURRENT"), (True, "MANIFEST"), (True, "sst"),
                                          (False, "CURRENT"), (False, "MANIFEST")])
def test_a_checkpoint_that_lost_a_file_is_never_stored(tmp_path: Path, local: Any,
                                                      stamped: bool, lost: str) -> None:
    # the local directory removed while the writer starts (an executor's disk wiped): a
    # partial listing must not become a record, which would restore as an empty database
    store = KeyedStateStore(str(tmp_path / "state"))
    put(local, 1, {f"k{i:05d}": i for i in range(5_000)})
    directory = tempfile.mkdtemp(dir=os.path.dirname(local.directory))
    os.rmdir(directory)
    local.checkpoint(directory)
    if stamped:
        stamp_checkpoint(local.directory, directory)
    names = sorted(os.listdir(directory))
    victim = next(n for n in names if (n.startswith(lost) if lost != "sst"
                                       else n.endswith(".sst")))
    os.unlink(os.path.join(directory, victim))
    with pytest.raises(StateStoreError, match=victim):
        write_snapshot(directory, store, 0, 1, {"shared": "x"})
    assert read_record(store, 0, 1) is None and 1 not in store.listing(0)[0]


def test_a_record_without_current_is_refused_by_name(tmp_path: Path, local: Any) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    put(local, 1, {"a": 1})
    snapshot(local, store, 1)
    record = read_record(store, 0, 1)
    assert record is not None and any(f["name"] == "CURRENT" for f in record["files"])
    from trilink_spark.state.formats import tables_bytes
    record["files"] = [f for f in record["files"] if f["name"] != "CURRENT"]
    Path(store.tables_path(0, 1)).write_bytes(tables_bytes(record))
    with pytest.raises(StateCorruptError, match="lists no CURRENT"):
        download(store, 0, 1, str(tmp_path / "target"))
    assert not (tmp_path / "target").exists()
