"""Local copies held open between tasks: taken back by the same worker, handed over at once to
another process, never used once replaced on disk, and at most ``MAX_HELD`` per worker."""

from __future__ import annotations

import fcntl
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import trilink_spark as tl
from conftest import RunningCount
from testkit.held import holding
from testkit.swaps import check_invariants
from trilink_spark.state import held
from trilink_spark.state.local import LocalState, head


@pytest.fixture(autouse=True)
def nothing_held() -> Any:
    yield
    held.release_all()


def write(local: LocalState, version: int, key: bytes) -> None:
    old = local.get([key])[0]
    before = {} if old is None else {key: old}
    local.apply(version, f"a{version}", {}, [(key, head(math.inf, 1) + key)], [], before)


def locked(path: Path) -> bool:
    """Whether another open file description holds the lock file ``path``."""
    fd = os.open(str(path), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_the_same_worker_takes_its_held_copy_back(tmp_path: Path) -> None:
    local = LocalState.open(str(tmp_path), "s", 0)
    write(local, 1, b"\x00\x00\x00\x01\x03a")
    assert local.release(keep=True) and held.held_count() == 1
    assert locked(tmp_path / "s" / "p00000.lock")  # still this worker's
    again = LocalState.open(str(tmp_path), "s", 0, timeout=1.0)
    assert again is local and again.version == 1 and held.held_count() == 0
    assert not again.release(keep=False)
    assert not locked(tmp_path / "s" / "p00000.lock")


@pytest.fixture
def holder(tmp_path: Path) -> Any:
    """Another process that wrote version 5 of partition 0's copy and holds it open."""
    with holding(tmp_path, [5]) as child:
        yield child


def test_another_process_gets_a_held_copy_at_once(tmp_path: Path, holder: Any) -> None:
    assert locked(tmp_path / "s" / "p00000.lock")
    started = time.monotonic()
    with LocalState.open(str(tmp_path), "s", 0, timeout=10.0) as local:
        assert local.version == 5 and local.keys == 1  # the holder's write, flushed
    assert time.monotonic() - started < 5.0
    assert holder.poll() is None  # the holder lives on; it only closed the copy


def test_a_killed_holder_holds_nothing(tmp_path: Path, holder: Any) -> None:
    holder.kill()
    holder.wait()
    with LocalState.open(str(tmp_path), "s", 0, timeout=5.0) as local:
        assert local.version == 5


def test_a_held_copy_replaced_on_disk_is_never_used(tmp_path: Path) -> None:
    local = LocalState.open(str(tmp_path), "s", 0)
    write(local, 1, b"\x00\x00\x00\x01\x03a")
    assert local.release(keep=True)
    shutil.rmtree(tmp_path / "s")  # the executor's disk was wiped
    fresh = LocalState.open(str(tmp_path), "s", 0, timeout=1.0)
    try:
        assert fresh is not local and fresh.version is None
    finally:
        fresh.close()
    assert held.held_count() == 0


def test_a_worker_holds_at_most_max_held_copies(tmp_path: Path) -> None:
    for pid in range(held.MAX_HELD + 2):
        local = LocalState.open(str(tmp_path), "s", pid)
        write(local, 1, b"\x00\x00\x00\x01\x03a")
        assert local.release(keep=True)
    assert held.held_count() == held.MAX_HELD
    lock = [locked(tmp_path / "s" / f"p{pid:05d}.lock") for pid in range(held.MAX_HELD + 2)]
    assert lock == [False, False, True, True]  # the oldest were closed


def test_asking_when_nobody_holds_returns_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    assert not held.ask_release(str(tmp_path / "s" / "p00000.db"))
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("keep", ["true", "false"])
def test_a_stream_keeps_its_copies_open_between_batches(spark: Any, tmp_path: Path,
                                                         local_root: Path, keep: str) -> None:
    """With ``keepOpen`` the workers hold copies after their tasks (their locks stay taken),
    the next batches find them current, and any other process still gets them at once."""
    spark.conf.set("spark.trilink.state.keepOpen", keep)
    try:
        run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(),
                                     1_000_000, str(tmp_path / "state"), num_partitions=2)
        total = pd.Series(dtype=np.int64)
        for b in range(4):
            rng = np.random.default_rng(b)
            frame = pd.DataFrame({"k": [f"u{i}" for i in rng.integers(0, 50, 300)],
                                  "t": np.arange(b * 300, (b + 1) * 300)})
            run(spark.createDataFrame(frame, "k string, t long"), b)
            total = total.add(frame["k"].value_counts(), fill_value=0)
            check_invariants(run, total)
            if b:
                assert set(run.task_timings()["sync"]) == {"current"}
        locks = sorted(local_root.rglob("p*.lock"))
        assert len(locks) == 2
        assert any(locked(p) for p in locks) == (keep == "true")
        for p in locks:  # a reader in another process gets each copy, current
            with LocalState.open(str(local_root), p.parent.name, int(p.name[1:6]),
                                 timeout=10.0) as local:
                assert local.version == 3
        rng = np.random.default_rng(9)
        frame = pd.DataFrame({"k": [f"u{i}" for i in rng.integers(0, 50, 300)],
                              "t": np.arange(1200, 1500)})
        run(spark.createDataFrame(frame, "k string, t long"), 4)
        check_invariants(run, total.add(frame["k"].value_counts(), fill_value=0))
    finally:
        spark.conf.unset("spark.trilink.state.keepOpen")
