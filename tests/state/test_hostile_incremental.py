"""Hostile tests of incremental snapshots (state/incremental.py): concurrent writers and
collectors, copied and damaged lineage files, damaged and forged records and blobs, restores
that fail midway or meet another layout, and the readers over a path of ``.tables``
snapshots. No Spark: the keyed state is made with the codec and the local sync directly."""

from __future__ import annotations

import base64
import dataclasses
import errno
import hashlib
import io
import json
import math
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

import trilink_spark as tl
import trilink_spark.state.incremental as inc
from trilink_spark.errors import StateCorruptError, StateStoreError
from trilink_spark.keyed.durable.codec import encode_state
from trilink_spark.keyed.durable.local_sync import LocalConfig, _stored_table, sync
from trilink_spark.keyed.durable.snapshot_writer import write_snapshot
from trilink_spark.keyed.semantics.keys import PartitionState
from trilink_spark.state import KeyedStateStore
from trilink_spark.state.formats import MANIFEST_FORMAT, MANIFEST_VERSION, tables_bytes
from trilink_spark.state.incremental import (TABLES_DIR, collect, download, lineage,
                                             read_record, stamp_checkpoint)
from trilink_spark.state.local import LocalState, head
from trilink_spark.state.rows import encode_rows
from test_incremental import SCHEMA, put  # beside this file: one way to fill a copy



# ---------------------------------------------------------------------- helpers
def checkpoint(local: LocalState) -> str:
    directory = tempfile.mkdtemp(dir=os.path.dirname(local.directory))
    os.rmdir(directory)
    local.checkpoint(directory)
    stamp_checkpoint(local.directory, directory)
    return directory


def snapshot(local: LocalState, store: KeyedStateStore, version: int) -> Any:
    return write_snapshot(checkpoint(local), store, 0, version, {"shared": "x"})


def values_of(table: Any) -> dict[str, int]:
    return dict(zip(table.column("key").to_pylist(), table.column("n").to_pylist()))


def blob_dir(store: KeyedStateStore, partition: int = 0) -> Path:
    return Path(store.partition_dir(partition)) / TABLES_DIR


def reforge(store: KeyedStateStore, version: int, mutate: Callable[[dict[str, Any]], None],
            partition: int = 0) -> None:
    """Rewrite a record, changed by ``mutate``, sealed again (a foreign but well-formed one)."""
    path = store.tables_path(partition, version)
    doc = json.loads(Path(path).read_text())
    for key in ("trilink.sealed", "trilink.checksum", "format", "format_version"):
        doc.pop(key)
    mutate(doc)
    Path(path).write_bytes(tables_bytes(doc))


class Quiet(tl.KeyedWatermarkProcessFunction):
    output_schema = "k string"

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        return []


PROC = Quiet()


def keyed_tables(tmp_path: Path, keys: int = 300) -> tuple[KeyedStateStore, LocalConfig, Any]:
    """A state path whose partition 0 holds version 1 as an incremental snapshot only (of a
    copy rebuilt from real keyed state), a manifest committing it; the config the copy was
    written under and its rows (key, rows) for comparison."""
    store = KeyedStateStore(str(tmp_path / "state"))
    names = [f"k{i}" for i in range(keys)]
    state = PartitionState(key_high={k: float(i) for i, k in enumerate(names)},
                           last_seen={k: float(i) for i, k in enumerate(names)},
                           key_rows={k: i + 1 for i, k in enumerate(names)},
                           values={k: {"n": i} for i, k in enumerate(names)},
                           partition_high=float(keys))
    store.save_table(0, 1, encode_state(state, pa.string()))
    config = LocalConfig(root=str(tmp_path / "src"), store_id="s", snapshot_interval=2,
                         state_ttl=math.inf, blocks=None)
    with LocalState.open(config.root, "s", 0) as src:
        assert sync(src, store, config, 0, 1, PROC, 0.0, math.inf) == "rebuild"
        expected = local_rows(src)
        directory = checkpoint(src)
        os.remove(store.version_path(0, 1))  # the Arrow snapshot made way for the record
        assert write_snapshot(directory, store, 0, 1, dict(src.meta.get("meta") or {}))
    assert store.listing(0) == ({1}, set()) and read_record(store, 0, 1) is not None
    store.write_manifest({"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION,
                          "committed": [1], "placements": [0]})
    store.save_placement(0, None, 1)
    return store, config, expected


def local_rows(local: LocalState) -> list[tuple[Any, Any]]:
    table = _stored_table(local, [r for _, r in local.rows()])
    return sorted(zip(table.column("key").to_pylist(), table.column("rows").to_pylist()))


class Hooked:
    """A filesystem that runs ``hook`` once, just before the first call of ``method`` whose
    first argument ``when`` accepts: another process's step at that moment."""

    def __init__(self, inner: Any, method: str, when: Callable[[Any], bool],
                 hook: Callable[[], None]) -> None:
        self._inner, self._method, self._when, self._hook = inner, method, when, hook
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._inner, name)
        if name != self._method:
            return real

        def call(arg: Any, *a: Any, **k: Any) -> Any:
            if not self.fired and self._when(arg):
                self.fired = True
                self._hook()
            return real(arg, *a, **k)
        return call


@pytest.fixture()
def local(tmp_path: Path) -> Any:
    with LocalState.open(str(tmp_path / "local"), "s", 0) as copy:
        yield copy


# ---------------------------------------------------------------------- defects
def test_two_writers_of_one_version_from_one_copy_leave_it_restorable(tmp_path: Path,
                                                                     local: Any) -> None:
    """A retried task on the same executor takes a second checkpoint of the version it
    starts from (attempt 1 applied its batch, flushed, and the retry undid it) while attempt
    1's writer process is still uploading: both write ``<lineage>-<version>-MANIFEST-…``
    with different bytes, and the record left lists the other writer's checksum."""
    store = KeyedStateStore(str(tmp_path / "state"))
    put(local, 1, {f"k{i}": i for i in range(2000)})
    first = checkpoint(local)
    put(local, 2, {f"k{i}": -i for i in range(500)})  # attempt 1 of batch 2 ...
    assert local.undo() and local.version == 1  # ... undone by the retry
    local.settle()
    second = checkpoint(local)
    real = inc.create_if_absent  # the record's write: the other writer runs just before it

    def interleaved(fs: Any, path: str, data: bytes) -> bool:
        if path.endswith(".tables") and not interleaved.done:  # type: ignore[attr-defined]
            interleaved.done = True  # type: ignore[attr-defined]
            assert write_snapshot(second, store, 0, 1, {"shared": "x"}) is not None
        return real(fs, path, data)

    interleaved.done = False  # type: ignore[attr-defined]
    inc.create_if_absent = interleaved  # type: ignore[assignment]
    try:
        write_snapshot(first, store, 0, 1, {"shared": "x"})
    finally:
        inc.create_if_absent = real  # type: ignore[assignment]
    assert interleaved.done  # type: ignore[attr-defined]
    # both checkpoints hold version 1: whichever record is left must restore
    assert len(values_of(store.load_table(0, 1))) == 2000


def test_collect_never_deletes_a_blob_that_a_record_written_meanwhile_lists(
        tmp_path: Path) -> None:
    """Prune's collect (the driver) lists records and blobs; then copy L's writer (an
    executor) uploads its snapshot 5, whose record lists L's table file, and checks that
    each is there; then collect deletes by the name it listed."""
    store = KeyedStateStore(str(tmp_path / "state"))
    with LocalState.open(str(tmp_path / "l"), "s", 0) as mine, \
            LocalState.open(str(tmp_path / "m"), "s", 0) as other:
        put(mine, 1, {f"k{i}": i for i in range(2000)})
        snapshot(mine, store, 1)
        put(other, 3, {f"k{i}": i for i in range(2000)})  # another executor's copy
        snapshot(other, store, 3)
        put(mine, 5, {"new": 1})
        os.remove(store.tables_path(0, 1))  # prune dropped snapshot 1
        writer = KeyedStateStore(str(tmp_path / "state"))  # the executor's own
        store.fs = Hooked(store.fs, "delete_file", lambda p: f"/{TABLES_DIR}/" in p,
                          lambda: snapshot(mine, writer, 5))
        collect(store, 0)
        assert store.fs.fired
    record = read_record(writer, 0, 5)
    assert record is not None
    gone = [f["blob"] for f in record["files"] if not (blob_dir(writer) / f["blob"]).exists()]
    assert gone == []  # a kept snapshot lost its table file
    assert len(values_of(writer.load_table(0, 5))) == 2001


def test_a_copied_lineage_never_makes_a_snapshot_share_another_databases_file(
        tmp_path: Path) -> None:
    """A local directory copied (an image cloned, a localDir restored from a backup) gives
    two databases one lineage; their table files of one number and size then differ in
    content, and the second's snapshot shares the first's blob."""
    store = KeyedStateStore(str(tmp_path / "state"))
    with LocalState.open(str(tmp_path / "a"), "s", 0) as a:
        put(a, 1, {f"k{i:05d}": i for i in range(3000)})
        lineage(a.directory)
    shutil.copytree(tmp_path / "a" / "s", tmp_path / "b" / "s")
    with LocalState.open(str(tmp_path / "a"), "s", 0) as a, \
            LocalState.open(str(tmp_path / "b"), "s", 0) as b:
        assert lineage(a.directory) != lineage(b.directory)  # a copied directory: a new one
        put(a, 2, {"k00001": 111})
        put(b, 2, {"k00001": 222})
        sizes = [{n: os.path.getsize(os.path.join(c.directory, n))
                  for n in os.listdir(c.directory) if n.endswith(".sst")} for c in (a, b)]
        assert sizes[0] == sizes[1]  # same names, same sizes, other bytes
        snapshot(a, store, 2)
        put(b, 3, {"zzz": 1})
        snapshot(b, store, 3)
    got = values_of(store.load_table(0, 3))  # b's own state, or a typed refusal today
    assert got["k00001"] == 222 and len(got) == 3001


@pytest.mark.parametrize("damage", ["traversal", "flipped-digest", "no-digest"])
def test_a_damaged_inherited_file_never_spoils_the_next_snapshot(tmp_path: Path,
                                                                 damage: str) -> None:
    """TRILINK-INHERITED.json is a plain, unsealed local file that upload trusts: a damaged
    one writes a file outside the state path, a record the store refuses, a record whose
    shared file fails its checksum, or raises KeyError (every later snapshot lost)."""
    store = KeyedStateStore(str(tmp_path / "state"))
    with LocalState.open(str(tmp_path / "a"), "s", 0) as a:
        put(a, 1, {f"k{i}": i for i in range(2000)})
        snapshot(a, store, 1)
    with LocalState.open(str(tmp_path / "b"), "s", 0) as b:
        target = str(tmp_path / "download")
        download(store, 0, 1, target)
        b.restore(target)
        path = Path(b.directory) / "TRILINK-INHERITED.json"
        doc = json.loads(path.read_text())
        entry = doc["files"][0]
        if damage == "traversal":
            entry["blob"] = "../../../escape"
        elif damage == "flipped-digest":
            entry["sha256"] = ("1" if entry["sha256"][0] == "0" else "0") + entry["sha256"][1:]
        else:
            del entry["sha256"]
        path.write_text(json.dumps(doc))
        put(b, 2, {"new": 1})
        stats = snapshot(b, store, 2)
    assert stats is not None
    assert not (tmp_path / "escape").exists()  # nothing written outside the state path
    assert len(values_of(store.load_table(0, 2))) == 2001


def test_a_restore_that_fails_leaves_the_copy_usable(tmp_path: Path, local: Any) -> None:
    """LocalState.restore says the copy is then empty, to be rebuilt: the task's recovery
    (local.reset(), then a rebuild) must work, not meet a closed database."""
    put(local, 1, {"a": 1})
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "CURRENT").write_text("MANIFEST-999999\n")  # not a database
    with pytest.raises(StateCorruptError):
        local.restore(str(bad))
    local.reset()  # what keyed/run/task.py does on a StateCorruptError from sync
    assert local.version is None
    put(local, 2, {"b": 2})
    assert local.version == 2 and dict(local.rows())


def test_a_snapshot_whose_files_do_not_open_is_named_by_its_record(tmp_path: Path) -> None:
    """A record whose files all pass their checksums but are no database (CURRENT names a
    MANIFEST that is not there): the rebuild's error names the state path's record, as
    load_table's does, after the task's own retry (reset, sync again)."""
    store, config, _ = keyed_tables(tmp_path)
    blobs = blob_dir(store)

    def garble(doc: dict[str, Any]) -> None:
        for f in doc["files"]:
            if f["name"] == "CURRENT":
                data = b"MANIFEST-999999\n"
                (blobs / f["blob"]).write_bytes(data)
                f["size"], f["sha256"] = len(data), hashlib.sha256(data).hexdigest()

    reforge(store, 1, garble)
    with pytest.raises(StateCorruptError, match=r"000000000001\.tables"):
        store.load_table(0, 1)
    cfg = dataclasses.replace(config, root=str(tmp_path / "run"))
    with LocalState.open(cfg.root, "s", 0) as copy:
        with pytest.raises(StateCorruptError, match=r"000000000001\.tables"):
            for attempt in (1, 2):  # keyed/run/task.py's _run_local
                try:
                    sync(copy, store, cfg, 0, 1, PROC, 0.0, math.inf)
                    break
                except StateCorruptError:
                    if attempt == 2:
                        raise
                    copy.reset()


@pytest.mark.parametrize("schema", [pa.schema([]), pa.schema([("n", pa.int64())])],
                         ids=["no-fields", "no-key"])
def test_a_record_whose_schema_does_not_hold_its_rows_is_refused(tmp_path: Path, local: Any,
                                                                 schema: Any) -> None:
    """The record's schema is an Arrow schema, but not its rows': the snapshot must not read
    as an empty table (its 100 keys silently gone) or as one without its key column."""
    store = KeyedStateStore(str(tmp_path / "state"))
    put(local, 1, {f"k{i}": i for i in range(100)})
    snapshot(local, store, 1)
    reforge(store, 1, lambda d: d.update(
        schema=base64.b64encode(schema.serialize().to_pybytes()).decode()))
    with pytest.raises(StateCorruptError, match=r"000000000001\.tables"):
        store.load_table(0, 1)


@pytest.mark.parametrize("field,value", [("partition", False), ("version", 1.0),
                                         ("version", True)])
def test_a_record_naming_its_partition_or_version_by_another_type_is_refused(
        tmp_path: Path, local: Any, field: str, value: Any) -> None:
    """``false`` is not partition 0 and ``1.0`` or ``true`` not version 1: the package's
    other records take counts only as ints (is_count)."""
    store = KeyedStateStore(str(tmp_path / "state"))
    put(local, 1, {"a": 1})
    snapshot(local, store, 1)
    reforge(store, 1, lambda d: d.update({field: value}))
    with pytest.raises(StateCorruptError, match=r"000000000001\.tables"):
        read_record(store, 0, 1)


# ---------------------------------------------------------------------- attacks that held
@pytest.mark.parametrize("damage", ["directory", "truncated", "grown", "missing", "symlink"])
def test_a_damaged_blob_is_a_typed_error_naming_it(tmp_path: Path, local: Any,
                                                   damage: str) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    put(local, 1, {f"k{i}": i for i in range(500)})
    snapshot(local, store, 1)
    record = read_record(store, 0, 1)
    assert record is not None
    sst = next(f for f in record["files"] if f["name"].endswith(".sst"))
    blob = blob_dir(store) / sst["blob"]
    data = blob.read_bytes()
    blob.unlink()
    if damage == "directory":
        blob.mkdir()
    elif damage == "truncated":
        blob.write_bytes(data[:-10])
    elif damage == "grown":
        blob.write_bytes(data + b"x")
    elif damage == "symlink":
        (tmp_path / "other").write_bytes(b"\0" * len(data))
        blob.symlink_to(tmp_path / "other")
    with pytest.raises((StateCorruptError, StateStoreError), match=sst["blob"]):
        store.load_table(0, 1)


@pytest.mark.parametrize("content", [
    b"", b"\xff\xfe\x00", b"[" * 100_000 + b"]" * 100_000, b'{"a": ' + b"9" * 5000 + b"}",
    b"[]", b"ARROW1\x00\x00", "partition", "version", "name-traversal", "blob-slash",
    "too-many", "duplicate-names", "sha-upper"],
    ids=["empty", "binary", "deep", "bignum", "list", "arrow", "partition", "version",
         "name-traversal", "blob-slash", "too-many", "duplicate-names", "sha-upper"])
def test_a_foreign_record_is_a_typed_error_naming_it(tmp_path: Path, local: Any,
                                                     content: Any) -> None:
    store = KeyedStateStore(str(tmp_path / "state"))
    put(local, 1, {"a": 1})
    snapshot(local, store, 1)
    path = Path(store.tables_path(0, 1))
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        mutate: dict[str, Callable[[dict[str, Any]], None]] = {
            "partition": lambda d: d.update(partition=1),
            "version": lambda d: d.update(version=2),
            "name-traversal": lambda d: d["files"][0].update(name="../../escape"),
            "blob-slash": lambda d: d["files"][0].update(blob="x/../../escape"),
            "too-many": lambda d: d.update(files=[dict(d["files"][0], name=f"f{i}")
                                                  for i in range(100_001)]),
            "duplicate-names": lambda d: d.update(files=d["files"] + d["files"][:1]),
            "sha-upper": lambda d: d["files"][0].update(sha256=d["files"][0]["sha256"].upper()),
        }
        reforge(store, 1, mutate[content])
    with pytest.raises(StateCorruptError, match=r"000000000001\.tables"):
        store.load_table(0, 1)
    assert not (tmp_path / "escape").exists()


def test_collect_keeps_what_a_record_written_between_its_listings_shares(
        tmp_path: Path) -> None:
    """A copy restored from snapshot 1 writes snapshot 5 (sharing 1's table file, whose
    record is pruned) while collect is between its listing of records and of blobs."""
    store = KeyedStateStore(str(tmp_path / "state"))
    with LocalState.open(str(tmp_path / "l"), "s", 0) as first, \
            LocalState.open(str(tmp_path / "m"), "s", 0) as other, \
            LocalState.open(str(tmp_path / "r"), "s", 0) as restored:
        put(first, 1, {f"k{i}": i for i in range(2000)})
        snapshot(first, store, 1)
        target = str(tmp_path / "download")
        download(store, 0, 1, target)
        restored.restore(target)
        put(other, 3, {f"k{i}": i for i in range(2000)})
        snapshot(other, store, 3)
        put(restored, 5, {"new": 1})
        os.remove(store.tables_path(0, 1))
        writer = KeyedStateStore(str(tmp_path / "state"))
        store.fs = Hooked(store.fs, "get_file_info",
                          lambda sel: str(getattr(sel, "base_dir", "")).endswith(TABLES_DIR),
                          lambda: snapshot(restored, writer, 5))
        collect(store, 0)
        assert store.fs.fired
    record = read_record(writer, 0, 5)
    assert record is not None  # it shares snapshot 1's table file
    assert any(not f["blob"].startswith(record["lineage"]) for f in record["files"])
    assert len(values_of(writer.load_table(0, 5))) == 2001


def test_a_partition_left_with_arrow_snapshots_only(tmp_path: Path) -> None:
    """Its records pruned, collect waits an hour for what a writer may still use; then it
    deletes; a copy that inherited those files uploads them again with its next snapshot."""
    store = KeyedStateStore(str(tmp_path / "state"))
    with LocalState.open(str(tmp_path / "l"), "s", 0) as first, \
            LocalState.open(str(tmp_path / "r"), "s", 0) as restored:
        put(first, 1, {f"k{i}": i for i in range(2000)})
        snapshot(first, store, 1)
        target = str(tmp_path / "download")
        download(store, 0, 1, target)
        restored.restore(target)
        store.save_table(0, 3, pa.table({"key": ["x"], "n": [1]}))  # a swap's snapshot
        os.remove(store.tables_path(0, 1))
        assert collect(store, 0) == []  # young: a writer may still list them
        old = time.time() - 2 * 3600
        for blob in blob_dir(store).iterdir():
            os.utime(blob, (old, old))
        assert collect(store, 0) and not list(blob_dir(store).iterdir())
        put(restored, 5, {"new": 1})
        stats = snapshot(restored, store, 5)
    assert stats is not None
    assert len(values_of(store.load_table(0, 5))) == 2001


@pytest.mark.parametrize("run", ["same", "timed", "blocks"])
def test_a_restore_into_another_layout_or_timedness_is_rebuilt_exact(tmp_path: Path,
                                                                     run: str) -> None:
    store, config, expected = keyed_tables(tmp_path)
    cfg = dataclasses.replace(config, root=str(tmp_path / run))
    if run == "timed":
        cfg = dataclasses.replace(cfg, processing_ttl=1000.0, batch_time=5.0)
    elif run == "blocks":
        cfg = dataclasses.replace(cfg, blocks=tl.BlockPartitioner(1, num_blocks=16))
    with LocalState.open(cfg.root, "s", 0) as copy:
        assert sync(copy, store, cfg, 0, 1, PROC, 0.0, math.inf) == "rebuild"
        assert copy.version == 1 and copy.timed == (run == "timed")
        assert copy.layout == cfg.layout
        assert local_rows(copy) == expected
        copy.check()


def test_a_full_disk_during_a_restore_keeps_the_copy_and_the_next_sync_rebuilds(
        tmp_path: Path, monkeypatch: Any) -> None:
    store, config, expected = keyed_tables(tmp_path)
    cfg = dataclasses.replace(config, root=str(tmp_path / "run"))
    real = open
    writes = {"n": 0}

    def full(path: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
        if "w" in mode and "restore" in str(path):
            writes["n"] += 1
            if writes["n"] == 3:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, mode, *a, **k)

    with LocalState.open(cfg.root, "s", 0) as copy:
        monkeypatch.setattr(inc, "open", full, raising=False)
        with pytest.raises(StateStoreError, match=f"{TABLES_DIR}/"):
            sync(copy, store, cfg, 0, 1, PROC, 0.0, math.inf)
        monkeypatch.undo()
        assert sorted(os.listdir(os.path.dirname(copy.directory))) == ["p00000.db",
                                                                        "p00000.lock"]
        assert copy.version is None
        assert sync(copy, store, cfg, 0, 1, PROC, 0.0, math.inf) == "rebuild"
        assert local_rows(copy) == expected


def test_the_readers_over_a_read_only_path_of_table_snapshots(tmp_path: Path) -> None:
    """state_summary, ``trilink-spark state``, key_table and the stored values over a path
    whose only snapshot is a record, read-only: exact, and nothing is written there."""
    from trilink_spark.cli import main
    from trilink_spark.keyed import state_summary
    from trilink_spark.keyed.records.state_reader import read_state_values

    store, _, expected = keyed_tables(tmp_path)
    before = sorted(str(p) for p in Path(store.path).rglob("*"))
    modes = {p: p.stat().st_mode for p in [Path(store.path), *Path(store.path).rglob("*")]}
    for p, mode in modes.items():
        p.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        summary = state_summary(store.path)
        assert summary["keys"] == len(expected) and summary["bytes"] > 0
        out = io.StringIO()
        assert main(["state", store.path], out) == 0 and "300" in out.getvalue()
        ro = KeyedStateStore.open_existing(store.path)
        assert ro.key_table(1).num_rows == len(expected)
        assert len(read_state_values(ro)) == len(expected)
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
    assert sorted(str(p) for p in Path(store.path).rglob("*")) == before
