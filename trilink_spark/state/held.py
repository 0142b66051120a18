"""Local copies kept open between the tasks of one Python worker, handed over on request.

RocksDB lets one process at a time open a database. A task that ends can leave its partition's
local copy open, still locked, in its Python worker (:func:`hold`): when the worker runs that
partition again, the next task takes the copy as it is (:func:`take`), with no open, no lock
wait and RocksDB's caches warm, and the copy's compaction goes on in the background between
the tasks.

Another process that wants the copy (a task of another Python worker, the swap's segment
job, a reader) asks for it (:func:`ask_release`): the holder listens on an abstract Unix socket
named after the copy's directory, closes the copy and releases its lock at once, then
answers. A holder that died holds nothing: the kernel drops its lock and its socket with it.
A held copy whose directory or lock file was replaced meanwhile is closed, never used.

Each worker holds at most :data:`MAX_HELD` copies; taking a new one closes the one held the
longest. Runtime only, nothing here is pickled.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["hold", "take", "ask_release", "release_all", "held_count", "identity",
           "MAX_HELD", "ASK_TIMEOUT_S"]

logger = logging.getLogger(__name__)

#: Copies one Python worker keeps open at most (the oldest is closed first).
MAX_HELD = 2
#: Seconds a process waits for a holder to close a copy it asked for.
ASK_TIMEOUT_S = 30.0

_LOCK = threading.Lock()
_HELD: dict[str, _Held] = {}  # directory -> copy, oldest first (insertion order)


@dataclass
class _Held:
    value: Any
    close: Callable[[], None]
    identity: tuple[Any, ...]
    server: socket.socket
    thread: threading.Thread | None = None


#: Copies a forked child inherited from its parent: never served, closed nor used here.
_INHERITED: list[_Held] = []


def _forget_in_child() -> None:
    """After ``fork`` (a processor's ``multiprocessing`` pool): the parent's held copies are
    not the child's. Closing one here would hang (RocksDB's threads stayed in the parent),
    unlock the parent's lock (the open file is shared) and shut its listening socket; so the
    child forgets them, keeping the objects (their destructors would close them) and closing
    only its own descriptors of the sockets."""
    global _LOCK
    _LOCK = threading.Lock()  # another thread may have held it at the fork
    entries = list(_HELD.values())
    _HELD.clear()
    _INHERITED.extend(entries)
    for entry in entries:
        try:
            entry.server.close()  # this process's descriptor; the parent's socket lives on
        except OSError:
            pass


os.register_at_fork(after_in_child=_forget_in_child)


def _address(directory: str) -> str:
    """The abstract socket a holder of ``directory`` listens on (no file: gone with it)."""
    digest = hashlib.sha256(os.path.abspath(directory).encode()).hexdigest()[:40]
    return "\0trilink-state-" + digest


def _identity(*paths: str) -> tuple[Any, ...]:
    """Device and inode of each path (None: missing): a replaced directory differs."""
    out: list[Any] = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_dev, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


def identity(directory: str, lock_path: str) -> tuple[Any, ...]:
    """What :func:`take` compares: the device and inode of ``directory`` and ``lock_path``
    (None: missing). Taken when the copy is opened and locked, it tells a copy replaced
    while a task had it open from the files it opened. O(1)."""
    return _identity(directory, lock_path)


def hold(directory: str, lock_path: str, value: Any, close: Callable[[], None],
         opened: tuple[Any, ...] | None = None) -> bool:
    """Keep ``value`` (an open copy of ``directory``, locked through ``lock_path``) open in
    this process until a task of it takes it again or another process asks for it; False
    when it cannot be held (the caller then closes it). ``opened``: the copy's
    :func:`identity` when it was opened (default: now); one that differs from the files on
    disk now is never held. O(1)."""
    now = _identity(directory, lock_path)
    if opened is not None and opened != now:
        logger.info("%s was replaced while open; the copy is closed, not held", directory)
        return False
    server: socket.socket | None = None
    try:  # out of descriptors (RocksDB keeps its table files open) is not an error here
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(_address(directory))
        server.listen(8)
    except OSError as err:  # another holder of this name cannot exist; be safe anyway
        if server is not None:
            server.close()
        logger.debug("%s: not held open (%s)", directory, err)
        return False
    entry = _Held(value, close, now, server)
    entry.thread = threading.Thread(target=_serve, args=(directory, entry), daemon=True,
                                    name="trilink-held-copy")
    evicted: list[_Held] = []
    with _LOCK:
        _HELD[directory] = entry
        while len(_HELD) > MAX_HELD:
            oldest = next(iter(_HELD))
            evicted.append(_HELD.pop(oldest))
    for old in evicted:
        _drop(old)
    try:
        entry.thread.start()
    except RuntimeError as err:  # no thread to answer requests: never held unanswered
        with _LOCK:
            mine = _HELD.get(directory) is entry
            if mine:
                del _HELD[directory]
        if not mine:
            return True  # another thread of this process took it meanwhile: it is theirs
        entry.thread = None
        _stop(entry)
        logger.debug("%s: not held open (%s)", directory, err)
        return False
    return True


def take(directory: str, lock_path: str) -> Any | None:
    """The copy of ``directory`` this process holds, now the caller's (None: none held, or
    the held one was replaced on disk and is closed)."""
    with _LOCK:
        entry = _HELD.pop(directory, None)
    if entry is None:
        return None
    _stop(entry)
    if entry.identity != _identity(directory, lock_path):
        logger.info("%s was replaced while held open; the held copy is closed", directory)
        _close(entry)
        return None
    return entry.value


def ask_release(directory: str, timeout: float = ASK_TIMEOUT_S) -> bool:
    """Ask the process that holds ``directory``'s copy open to close it; returns once it did
    (True), or at once when no process holds it (False). O(1)."""
    try:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:  # out of descriptors: as if nobody held it (the lock wait goes on)
        return False
    client.settimeout(timeout)
    try:
        client.connect(_address(directory))
        return client.recv(2) == b"ok"
    except OSError:
        return False
    finally:
        client.close()


def release_all() -> None:
    """Close every copy this process holds (a worker that stops, tests)."""
    with _LOCK:
        entries = list(_HELD.values())
        _HELD.clear()
    for entry in entries:
        _drop(entry)


def held_count() -> int:
    """How many copies this process holds open."""
    with _LOCK:
        return len(_HELD)


def _serve(directory: str, entry: _Held) -> None:
    """Wait for a request; close the copy and answer when it is still held."""
    while True:
        try:
            conn, _ = entry.server.accept()
        except OSError:
            return  # taken back, or dropped
        with conn:
            with _LOCK:
                mine = _HELD.get(directory) is entry
                if mine:
                    del _HELD[directory]
            if not mine:
                return
            _drop(entry)
            try:
                conn.sendall(b"ok")
            except OSError:
                pass
            return


def _stop(entry: _Held) -> None:
    try:
        entry.server.shutdown(socket.SHUT_RDWR)  # wakes the accept() of its thread
    except OSError:
        pass
    entry.server.close()
    thread = entry.thread
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join(1.0)  # its accept() pins the socket, and so the name, until it returns:
        # without the wait, the next hold() of the directory may find the name still bound


def _close(entry: _Held) -> None:
    try:
        entry.close()
    except Exception as err:  # noqa: BLE001 - a cache: the next opener rebuilds it
        logger.warning("a held local copy did not close cleanly (%s)", err)


def _drop(entry: _Held) -> None:
    _stop(entry)
    _close(entry)
