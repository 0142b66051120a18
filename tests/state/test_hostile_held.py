"""Hostile tests of copies held open between tasks (:mod:`trilink_spark.state.held`): copies
replaced on disk while another process holds them, requests while a task uses the copy,
races between taking a copy back and handing it over, eviction, and leaks per cycle."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from testkit.held import holding
from trilink_spark.state import held
from trilink_spark.state.local import LocalState, head


@pytest.fixture(autouse=True)
def nothing_held() -> Any:
    yield
    held.release_all()


def key(i: int) -> bytes:
    return b"\x00\x00\x00\x01\x03" + str(i).encode()


def write(local: LocalState, version: int, k: bytes) -> None:
    old = local.get([k])[0]
    before = {} if old is None else {k: old}
    local.apply(version, f"a{version}", {}, [(k, head(math.inf, 1) + k)], [], before)


@pytest.fixture
def holder(tmp_path: Path) -> Any:
    """Another process that wrote versions 1..5 (5 keys) of partition 0 and holds it open."""
    with holding(tmp_path, range(1, 6)) as child:
        yield child


def test_a_lock_file_removed_while_another_process_holds_the_copy_loses_nothing(
        tmp_path: Path, holder: Any) -> None:
    """The lock file was removed (a cleaner, an operator): the next opener's flock succeeds on
    a new lock file at once, but the holder still has RocksDB open on the directory. The
    opener must have the holder close it first, not find RocksDB locked and empty the copy
    under the holder."""
    os.remove(tmp_path / "s" / "p00000.lock")
    with LocalState.open(str(tmp_path), "s", 0, timeout=10.0) as local:
        assert local.version == 5 and local.keys == 5
    assert holder.poll() is None


def test_only_the_db_directory_removed_while_another_process_holds_it(
        tmp_path: Path, holder: Any) -> None:
    shutil.rmtree(tmp_path / "s" / "p00000.db")
    started = time.monotonic()
    with LocalState.open(str(tmp_path), "s", 0, timeout=10.0) as local:
        assert local.version is None  # gone: rebuilt by its caller, never a hang
        write(local, 1, key(1))
    assert time.monotonic() - started < 5.0
    with LocalState.open(str(tmp_path), "s", 0, timeout=5.0) as local:
        assert local.version == 1


def test_only_the_db_directory_removed_while_this_process_holds_it(tmp_path: Path) -> None:
    local = LocalState.open(str(tmp_path), "s", 0)
    write(local, 1, key(1))
    assert local.release(keep=True)
    shutil.rmtree(tmp_path / "s" / "p00000.db")
    fresh = LocalState.open(str(tmp_path), "s", 0, timeout=2.0)
    try:
        assert fresh is not local and fresh.version is None
    finally:
        fresh.close()
    assert held.held_count() == 0


def test_a_killed_holder_loses_no_committed_version(tmp_path: Path, holder: Any) -> None:
    os.kill(holder.pid, 9)
    holder.wait()
    with LocalState.open(str(tmp_path), "s", 0, timeout=5.0) as local:
        assert local.version == 5 and local.keys == 5
        assert all(v is not None for v in local.get([b"\x00\x00\x00\x02\x03" + str(v).encode()
                                                    for v in range(1, 6)]))


def test_a_request_while_a_task_uses_the_copy_waits_for_the_task(tmp_path: Path) -> None:
    local = LocalState.open(str(tmp_path), "s", 0)
    write(local, 1, key(1))
    assert local.release(keep=True)
    task = LocalState.open(str(tmp_path), "s", 0, timeout=1.0)  # taken back: in use
    assert task is local
    got: list[Any] = []

    def other() -> None:
        got.append(LocalState.open(str(tmp_path), "s", 0, timeout=10.0))

    thread = threading.Thread(target=other)
    thread.start()
    time.sleep(0.5)
    assert not got  # it waits
    write(task, 2, key(2))  # still open under the task
    assert task.release(keep=True)
    thread.join(10.0)
    assert got and got[0] is not task and got[0].version == 2
    got[0].close()


def test_eviction_keeps_the_evicted_copy_intact(tmp_path: Path) -> None:
    for pid in range(held.MAX_HELD + 1):
        local = LocalState.open(str(tmp_path), "s", pid)
        write(local, 1, key(pid))
        assert local.release(keep=True)
    assert held.held_count() == held.MAX_HELD
    with LocalState.open(str(tmp_path), "s", 0, timeout=1.0) as local:
        assert local.version == 1 and local.get([key(0)])[0] is not None


def test_two_state_paths_with_the_same_partition_are_held_apart(tmp_path: Path) -> None:
    for sid in ("a", "b"):
        local = LocalState.open(str(tmp_path), sid, 0)
        write(local, 1 if sid == "a" else 2, key(0))
        assert local.release(keep=True)
    assert held.held_count() == 2
    with LocalState.open(str(tmp_path), "a", 0, timeout=1.0) as a:
        assert a.version == 1
    with LocalState.open(str(tmp_path), "b", 0, timeout=1.0) as b:
        assert b.version == 2


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_no_descriptor_or_thread_leaks_over_many_cycles(tmp_path: Path) -> None:
    for pid in range(3):  # warm up: RocksDB's own threads and files
        LocalState.open(str(tmp_path), "s", pid).release(keep=True)
    held.release_all()
    time.sleep(0.2)
    fds, threads = _fds(), threading.active_count()
    for i in range(150):
        local = LocalState.open(str(tmp_path), "s", i % 3)
        write(local, i + 1 if i < 3 else (local.version or 0) + 1, key(i))
        assert local.release(keep=True)
        assert held.held_count() <= held.MAX_HELD
    held.release_all()
    time.sleep(0.2)
    assert _fds() <= fds + 2
    assert threading.active_count() <= threads


ASKER = textwrap.dedent("""
    import sys, time
    from trilink_spark.state.local import LocalState
    end = time.monotonic() + float(sys.argv[2])
    n = 0
    while time.monotonic() < end:
        with LocalState.open(sys.argv[1], "s", 0, timeout=20.0) as local:
            n += 1
        time.sleep(0.003)
    print(n, flush=True)
""")


def test_take_and_hand_over_race_loses_no_version(tmp_path: Path) -> None:
    """This process takes its copy back, writes and holds it, in a loop, while another
    process keeps asking for it: every version lands, no open fails, nothing hangs."""
    local = LocalState.open(str(tmp_path), "s", 0)
    write(local, 1, key(0))
    local.release(keep=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", ASKER, str(tmp_path), "3"], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        version = 1
        end = time.monotonic() + 3.5
        while time.monotonic() < end:
            local = LocalState.open(str(tmp_path), "s", 0, timeout=20.0)
            assert local.version == version
            version += 1
            write(local, version, key(version))
            assert local.release(keep=True)
        out, _ = child.communicate(timeout=30)
        assert child.returncode == 0 and int(out.strip()) > 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    with LocalState.open(str(tmp_path), "s", 0, timeout=5.0) as local:
        assert local.version == version and local.keys == version


def test_a_copy_taken_back_at_once_is_held_again() -> None:
    """A task that takes its copy back and releases it at once (an empty batch) holds it
    again: the listening socket of the copy's last hold is gone, not still bound while its
    thread leaves accept()."""
    import tempfile

    root = tempfile.mkdtemp()
    try:
        for _ in range(1500):
            local = LocalState.open(root, "s", 0, timeout=5.0)
            assert local.release(keep=True)
    finally:
        held.release_all()
        shutil.rmtree(root, ignore_errors=True)


def test_held_copies_through_a_dead_driver_a_failed_first_attempt_and_a_bad_conf(
        spark: Any, tmp_path: Path, local_root: Path) -> None:
    """Workers hold copies written by a batch whose driver died before the commit, then run
    its replay; a later batch's tasks fail on their first attempt (Spark retries them, in the
    same or another worker): every count stays exact. A bad ``keepOpen`` is a typed error."""
    import numpy as np
    import pandas as pd

    import trilink_spark as tl
    from conftest import RunningCount
    from testkit.swaps import check_invariants, die_after_writing
    from trilink_spark.errors import InvalidArgumentError

    flag = tmp_path / "fail-first-attempt"

    class FailsFirstAttempt(RunningCount):  # type: ignore[misc]
        def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
            from pyspark import TaskContext

            task = TaskContext.get()
            if os.path.exists(flag) and task is not None and task.attemptNumber() == 0:
                raise RuntimeError("first attempt fails")
            return super().process_on_time(key, rows, ctx)

    outs: dict[int, pd.DataFrame] = {}
    die = [False]

    def sink(df: Any, b: int) -> None:
        if die[0]:
            die[0] = False
            die_after_writing(df, b)
        outs[b] = df.toPandas()

    spark.conf.set("spark.trilink.state.keepOpen", "true")
    try:
        def frame_of(b: int) -> pd.DataFrame:
            rng = np.random.default_rng(b)
            return pd.DataFrame({"k": [f"u{i}" for i in rng.integers(0, 40, 200)],
                                 "t": np.arange(b * 200, (b + 1) * 200)})

        run = tl.keyed_foreach_batch(sink, "k", "t", FailsFirstAttempt(), 1_000_000,
                                     str(tmp_path / "state"), num_partitions=2)
        total = pd.Series(dtype=np.int64)
        for b in range(2):
            run(spark.createDataFrame(frame_of(b), "k string, t long"), b)
            total = total.add(frame_of(b)["k"].value_counts(), fill_value=0)
        die[0] = True
        with pytest.raises(Exception, match="driver died"):
            run(spark.createDataFrame(frame_of(2), "k string, t long"), 2)
        for b in (2, 3):
            if b == 3:
                flag.touch()
            run(spark.createDataFrame(frame_of(b), "k string, t long"), b)
            total = total.add(frame_of(b)["k"].value_counts(), fill_value=0)
            check_invariants(run, total)
            got = dict(zip(outs[b]["k"], outs[b]["n"]))
            assert got == {k: int(total[k]) for k in set(frame_of(b)["k"])}
        spark.conf.set("spark.trilink.state.keepOpen", "yes")
        with pytest.raises(InvalidArgumentError, match="keepOpen"):
            run(spark.createDataFrame(frame_of(4), "k string, t long"), 4)
    finally:
        spark.conf.unset("spark.trilink.state.keepOpen")


def test_a_copy_wiped_while_another_process_holds_it_is_closed_there_first(
        tmp_path: Path, holder: Any) -> None:
    """The executor's directory was wiped while another worker held its copy: the next
    opener's flock succeeds on a new lock file, and RocksDB opens the new directory. The
    holder must have closed its database by then (its background work writes files by the
    directory's name, which is now the new copy's)."""
    directory = str(tmp_path / "s" / "p00000.db")
    shutil.rmtree(tmp_path / "s")
    with LocalState.open(str(tmp_path), "s", 0, timeout=10.0) as local:
        assert local.version is None
        assert not held.ask_release(directory, timeout=2.0)  # nobody holds the old one
    assert holder.poll() is None


def test_a_holder_that_never_answers_fails_the_open_within_its_timeout(
        tmp_path: Path) -> None:
    """A holder that is alive but does not answer (its serving thread starved of the GIL by a
    long call of another task, a stopped process) makes the open fail after its own timeout,
    not after the 30 s a request may wait."""
    import fcntl
    import socket

    from trilink_spark.errors import StateStoreError

    base = tmp_path / "s"
    base.mkdir()
    fd = os.open(str(base / "p00000.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(held._address(str(base / "p00000.db")))
    mute.listen(8)  # connects succeed, nothing is ever answered
    try:
        started = time.monotonic()
        with pytest.raises(StateStoreError, match="locked"):
            LocalState.open(str(tmp_path), "s", 0, timeout=1.0)
        assert time.monotonic() - started < 5.0
    finally:
        mute.close()
        os.close(fd)


OPENER = textwrap.dedent("""
    import sys
    from trilink_spark.state.local import LocalState
    with LocalState.open(sys.argv[1], "s", 0, timeout=float(sys.argv[2])) as local:
        print(local.version, flush=True)
""")


def test_a_process_forked_by_a_worker_keeps_none_of_its_held_copies(tmp_path: Path) -> None:
    """A processor's forked helpers (``multiprocessing``'s fork pool) inherit the worker's
    descriptors: the held copies' locks and sockets must not go with them, or a copy handed
    over on request stays locked for as long as the helper lives."""
    local = LocalState.open(str(tmp_path), "s", 0)
    write(local, 3, key(3))
    assert local.release(keep=True)
    child = os.fork()
    if child == 0:  # a long-lived helper that never touches the copies
        try:
            time.sleep(8.0)
        finally:
            os._exit(0)
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        out = subprocess.run([sys.executable, "-c", OPENER, str(tmp_path), "4"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == "3"
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


def test_a_checkpoint_of_a_held_copy_with_unflushed_writes_has_them_all(
        tmp_path: Path) -> None:
    """A held copy flushes only past 8 MiB of memtables: a snapshot's checkpoint taken from
    it by the next task (then read read-only by the snapshot writer) still has every row."""
    from trilink_spark.state.local import iter_rows, open_checkpoint

    local = LocalState.open(str(tmp_path), "s", 0)
    for v in range(1, 41):
        write(local, v, key(v))
        assert local.release(keep=True)
        local = LocalState.open(str(tmp_path), "s", 0, timeout=1.0)
    target = str(tmp_path / "s" / "snap-0-test")
    local.checkpoint(target)
    assert local.release(keep=True)
    db = open_checkpoint(target)
    try:
        assert sorted(k for k, _ in iter_rows(db)) == sorted(key(v) for v in range(1, 41))
    finally:
        db.close()


def test_a_copy_that_cannot_get_a_socket_is_closed_not_leaked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of descriptors (RocksDB keeps its table files open): no socket for the holder.
    The task's release neither raises a raw OSError nor leaves the copy open and locked."""
    real = held.socket.socket

    def no_socket(*args: Any, **kwargs: Any) -> Any:
        raise OSError(24, "Too many open files")

    local = LocalState.open(str(tmp_path), "s", 0)
    write(local, 1, key(1))
    monkeypatch.setattr(held.socket, "socket", no_socket)
    assert not local.release(keep=True)
    monkeypatch.setattr(held.socket, "socket", real)
    assert held.held_count() == 0
    with LocalState.open(str(tmp_path), "s", 0, timeout=1.0) as again:
        assert again is not local and again.version == 1


def test_a_copy_whose_serving_thread_cannot_start_is_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread can be started (the worker's thread limit): the copy must not stay held
    with nobody to answer a request (every other opener would wait 30 s a try)."""
    local = LocalState.open(str(tmp_path), "s", 0)
    write(local, 1, key(1))

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(held.threading.Thread, "start", no_thread)
    released = local.release(keep=True)
    monkeypatch.undo()
    assert not released and held.held_count() == 0
    started = time.monotonic()
    assert not held.ask_release(local.directory, timeout=5.0)
    assert time.monotonic() - started < 1.0
    with LocalState.open(str(tmp_path), "s", 0, timeout=1.0) as again:
        assert again.version == 1


def test_a_copy_replaced_while_its_task_ran_is_never_held_as_the_new_one(
        tmp_path: Path) -> None:
    """The copy's directory and lock file were replaced while a task had it open (a wipe
    and another opener): the task's copy is of the old files, so what it holds must never
    pass for the new copy at the next open."""
    local = LocalState.open(str(tmp_path), "s", 0)
    write(local, 1, key(1))
    lock = tmp_path / "s" / "p00000.lock"
    os.remove(lock)
    shutil.rmtree(tmp_path / "s" / "p00000.db")
    lock.touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    other = subprocess.run([sys.executable, "-c", OPENER, str(tmp_path), "5"], env=env,
                           capture_output=True, text=True, timeout=60)  # another worker
    assert other.returncode == 0 and other.stdout.strip() == "None", other.stderr[-2000:]
    assert not local.release(keep=True)  # closed: its files are gone
    again = LocalState.open(str(tmp_path), "s", 0, timeout=5.0)
    try:
        assert again is not local
    finally:
        again.close()


ASKER_MANY = textwrap.dedent("""
    import sys, time
    from trilink_spark.state.local import LocalState
    end = time.monotonic() + float(sys.argv[2])
    n = 0
    while time.monotonic() < end:
        with LocalState.open(sys.argv[1], "s", n % 3, timeout=20.0) as local:
            n += 1
    print(n, flush=True)
""")


def test_eviction_while_another_process_asks_loses_no_version(tmp_path: Path) -> None:
    """This process cycles through three partitions (each hold evicts the oldest) while
    another process keeps asking for them: every version of every partition lands."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", ASKER_MANY, str(tmp_path), "3"], env=env,
                             stdout=subprocess.PIPE, text=True)
    versions = [0, 0, 0]
    try:
        end = time.monotonic() + 3.5
        i = 0
        while time.monotonic() < end:
            pid = i % 3
            local = LocalState.open(str(tmp_path), "s", pid, timeout=20.0)
            assert (local.version or 0) == versions[pid]
            versions[pid] += 1
            write(local, versions[pid], key(versions[pid]))
            local.release(keep=True)
            assert held.held_count() <= held.MAX_HELD
            i += 1
        out, _ = child.communicate(timeout=30)
        assert child.returncode == 0 and int(out.strip()) > 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    held.release_all()
    for pid in range(3):
        with LocalState.open(str(tmp_path), "s", pid, timeout=5.0) as local:
            assert (local.version or 0) == versions[pid] and local.keys == versions[pid]


def test_a_forked_helper_that_uses_held_copies_leaves_the_workers_alone(
        tmp_path: Path) -> None:
    """A forked helper inherits the registry of held copies; when it calls into it (here
    ``release_all``, as eviction by its own holds would), it must not shut the worker's
    listening socket, unlock the worker's lock or close the worker's database."""
    local = LocalState.open(str(tmp_path), "s", 0)
    write(local, 3, key(3))
    assert local.release(keep=True)
    child = os.fork()
    if child == 0:
        code = 1
        try:
            held.release_all()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10.0
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(child, 9)
            os.waitpid(child, 0)
            pytest.fail("the forked helper hangs closing the worker's held copy")
        time.sleep(0.05)
    assert status == 0
    assert held.held_count() == 1
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", OPENER, str(tmp_path), "4"], env=env,
                         capture_output=True, text=True, timeout=60)  # asks this worker
    assert out.returncode == 0 and out.stdout.strip() == "3", out.stderr[-2000:]
    assert held.held_count() == 0
