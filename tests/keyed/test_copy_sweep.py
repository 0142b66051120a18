"""Copies an executor no longer uses are dropped (``state.sweep``): by their mark's age, never
while held, and the partition that comes back rebuilds its copy with exact state."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from trilink_spark.state.local import LocalState
from trilink_spark.state.sweep import mark, sweep


def make_copy(root: Path, pid: int, version: int) -> Path:
    with LocalState.open(str(root), "s", pid) as local:
        local.apply(version, "a", {}, [], [], {})
    mark(str(root), "s", pid, version)
    return root / "s" / f"p{pid:05d}.db"


def test_only_copies_behind_by_more_than_the_limit_go(tmp_path: Path) -> None:
    old = make_copy(tmp_path, 1, 3)
    recent = make_copy(tmp_path, 2, 12)
    mine = make_copy(tmp_path, 0, 2)  # the sweeping partition's own copy is never dropped
    assert sweep(str(tmp_path), "s", 0, 20, behind=10) == [1]
    assert not old.exists() and recent.exists() and mine.exists()
    assert not (tmp_path / "s" / "p00001.at").exists()
    assert (tmp_path / "s" / "p00001.lock").exists()  # lock files stay
    # the limit itself is kept: 20 - 10 = 10 batches behind stays
    make_copy(tmp_path, 3, 10)
    assert sweep(str(tmp_path), "s", 0, 20, behind=10) == []


def test_a_locked_copy_is_left_alone(tmp_path: Path) -> None:
    make_copy(tmp_path, 1, 1)
    fd = os.open(tmp_path / "s" / "p00001.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert sweep(str(tmp_path), "s", 0, 50, behind=10) == []
        assert (tmp_path / "s" / "p00001.db").exists()
    finally:
        os.close(fd)
    assert sweep(str(tmp_path), "s", 0, 50, behind=10) == [1]


def test_a_copy_held_open_by_this_process_is_closed_then_dropped(tmp_path: Path) -> None:
    local = LocalState.open(str(tmp_path), "s", 1)
    local.apply(1, "a", {}, [], [], {})
    mark(str(tmp_path), "s", 1, 1)
    assert local.release(keep=True)  # held open for the partition's next task here
    assert sweep(str(tmp_path), "s", 0, 50, behind=10) == [1]
    assert not (tmp_path / "s" / "p00001.db").exists()
    again = LocalState.open(str(tmp_path), "s", 1)  # opens empty: the sync rebuilds it
    try:
        assert again.version is None
    finally:
        again.close()


def test_unmarked_foreign_and_malformed_entries_are_ignored(tmp_path: Path) -> None:
    with LocalState.open(str(tmp_path), "s", 1) as local:  # no mark: written before marks
        local.apply(1, "a", {}, [], [], {})
    (tmp_path / "s" / "p00002.at").write_text("not a number")
    (tmp_path / "s" / "notes.at").write_text("1")
    assert sweep(str(tmp_path), "s", 0, 99, behind=1) == []
    assert sweep(str(tmp_path / "missing"), "s", 0, 99, behind=1) == []
    assert (tmp_path / "s" / "p00001.db").exists()
