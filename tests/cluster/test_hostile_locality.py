"""Hostile cases of keyed tasks asking for their copies' executors (``trilinkspark.PreferredRDD``,
``spark.trilink.state.locality``), the executor/host fields of timing records, and the sweep of
copies no task updated (``state.sweep``). Local mode with ``spark.trilink.state.locality=true``
exercises the same JVM class and code path as a cluster."""

from __future__ import annotations

import glob
import json
import logging
import os
import stat
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from conftest import RunningCount
from trilink_spark._internal.spark import locality
from trilink_spark.errors import InvalidArgumentError, StateStoreError, TrilinkError
from trilink_spark.keyed.records.history import record_batch
from trilink_spark.keyed.run.streaming import read_state_values
from trilink_spark.state.formats import parse_timing
from trilink_spark.state.local import LocalState
from trilink_spark.state.sweep import mark, sweep

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _pdf(b: int, keys: int = 20, rows: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(b)
    return pd.DataFrame({"k": [f"k{i}" for i in rng.integers(0, keys, rows)],
                         "t": np.arange(b * rows, (b + 1) * rows, dtype=np.int64)})


def _frame(spark: Any, pdf: pd.DataFrame) -> Any:
    return spark.createDataFrame(pdf, "k string, t long")


def _counts(run: Any) -> dict[str, int]:
    return {k: v["n"] for k, v in read_state_values(run.store).items()}


@pytest.fixture
def located(spark: Any, local_root: Path) -> Iterator[Any]:
    """Locality on in local mode, the local store in a directory of this test's own."""
    spark.conf.set("spark.trilink.state.locality", "true")
    try:
        yield spark
    finally:
        spark.conf.unset("spark.trilink.state.locality")
        spark.conf.unset("spark.trilink.state.dropCopiesAfter")


class FailsFirstAttempt(RunningCount):
    """Fails partition 0's first attempt of one batch (touching ``marker`` first)."""

    marker = ""

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        from pyspark import TaskContext

        task = TaskContext.get()
        if (task is not None and task.partitionId() == 0 and task.attemptNumber() == 0
                and os.path.exists(self.marker + ".arm") and not os.path.exists(self.marker)):
            open(self.marker, "w").close()
            raise RuntimeError("first attempt fails")
        return super().process_on_time(key, rows, ctx)


class Refusing(RunningCount):
    """Raises the package's own error inside the task."""

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        raise StateStoreError(f"refused key {key}")


# ------------------------------------------------------------------ the path itself
@pytest.mark.spark
def test_locality_on_in_local_mode_is_exact_and_names_the_executor(located: Any,
                                                                   tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                 str(tmp_path / "s"), num_partitions=4)
    truth: Counter[str] = Counter()
    for b in range(4):
        pdf = _pdf(b)
        truth.update(pdf["k"])
        run(_frame(located, pdf), b)
    assert _counts(run) == dict(truth)
    t = run.task_timings()
    assert list(t.columns)[-2:] == ["executor", "host"]
    ran = [e for e, r in zip(t["executor"], t["rows"]) if r > 0]
    assert ran and all(e == "driver" for e in ran), t
    assert run.locality["lost"] == 0 and run.locality["moved"] == 0
    assert run.locality["stayed"] >= 3 * len(ran)


@pytest.mark.spark
def test_a_first_attempt_failure_with_locality_on_keeps_exact_state(located: Any,
                                                                     tmp_path: Path) -> None:
    proc = FailsFirstAttempt()
    proc.marker = str(tmp_path / "failed")
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", proc, 10,
                                 str(tmp_path / "s"), num_partitions=2)
    truth: Counter[str] = Counter()
    for b in range(4):
        if b == 2:
            Path(proc.marker + ".arm").touch()
        pdf = _pdf(b)
        truth.update(pdf["k"])
        run(_frame(located, pdf), b)
    assert Path(proc.marker).exists(), "the first attempt did not fail"
    assert _counts(run) == dict(truth)
    assert set(run.task_timings()["executor"]) <= {"driver", ""}


@pytest.mark.spark
def test_a_package_error_in_a_task_reaches_the_caller_typed_with_locality_on(
        located: Any, tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", Refusing(), 10,
                                 str(tmp_path / "s"))
    with pytest.raises(StateStoreError, match=r"^refused key k\d+$") as caught:
        run(_frame(located, _pdf(0)), 0)
    assert isinstance(caught.value, TrilinkError)
    assert "Py4J" not in type(caught.value).__name__


@pytest.mark.spark
def test_replayed_batch_ids_and_output_run_twice_or_never_stay_exact(located: Any,
                                                                     tmp_path: Path) -> None:
    calls: list[int] = []

    def twice_or_never(df: Any, b: int) -> None:
        calls.append(b)
        if b % 2 == 0:
            df.count()
            df.collect()

    run = tl.keyed_foreach_batch(twice_or_never, "k", "t", RunningCount(), 10,
                                 str(tmp_path / "s"), num_partitions=4)
    truth: Counter[str] = Counter()
    for b in range(5):
        pdf = _pdf(b)
        truth.update(pdf["k"])
        run(_frame(located, pdf), b)
        if b in (1, 3):  # the same batch again, as a restarted query replays it
            run(_frame(located, pdf), b)
    assert _counts(run) == dict(truth)
    assert run.locality["lost"] == 0


@pytest.mark.spark
def test_a_rescale_with_locality_on_is_exact(located: Any, tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                 str(tmp_path / "s"), num_partitions=4)
    truth: Counter[str] = Counter()
    for b in range(6):
        if b == 2:
            run.request_swap(num_partitions=8)
        if b == 4:
            run.request_swap(num_partitions=3)
        pdf = _pdf(b, keys=200, rows=400)
        truth.update(pdf["k"])
        run(_frame(located, pdf), b)
    assert _counts(run) == dict(truth)
    t = run.task_timings()
    assert len(t) == 3
    assert all(p < 3 for p in run._where)


# ------------------------------------------------------------------ confs
@pytest.mark.spark
@pytest.mark.parametrize("conf,value", [("spark.trilink.state.locality", "maybe"),
                                        ("spark.trilink.state.locality", ""),
                                        ("spark.trilink.state.dropCopiesAfter", "-1"),
                                        ("spark.trilink.state.dropCopiesAfter", "abc"),
                                        ("spark.trilink.state.dropCopiesAfter", "1.5")])
def test_bad_confs_are_typed_and_named(spark: Any, local_root: Path, tmp_path: Path,
                                       conf: str, value: str) -> None:
    spark.conf.set(conf, value)
    try:
        run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                     str(tmp_path / "s"))
        with pytest.raises(InvalidArgumentError, match=conf.replace(".", r"\.")):
            run(_frame(spark, _pdf(0)), 0)
    finally:
        spark.conf.unset(conf)


@pytest.mark.spark
def test_drop_copies_after_zero_keeps_every_copy(located: Any, tmp_path: Path) -> None:
    located.conf.set("spark.trilink.state.dropCopiesAfter", "0")
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                 str(tmp_path / "s"), num_partitions=4)
    truth: Counter[str] = Counter()
    for b in range(3):
        pdf = _pdf(b)
        truth.update(pdf["k"])
        run(_frame(located, pdf), b)
    assert _counts(run) == dict(truth)


@pytest.mark.spark
def test_a_swept_copy_is_rebuilt_exactly(located: Any, local_root: Path,
                                         tmp_path: Path) -> None:
    """dropCopiesAfter=1: partitions whose keys come only every few batches lose their copy
    to the sweep of the others, and rebuild it from the state path with exact counts."""
    located.conf.set("spark.trilink.state.dropCopiesAfter", "1")
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                 str(tmp_path / "s"), num_partitions=4)
    truth: Counter[str] = Counter()
    keys_of = [f"k{i}" for i in range(40)]
    for b in range(12):
        chosen = keys_of[: 4] if b % 4 else keys_of  # most batches: a few keys only
        pdf = pd.DataFrame({"k": [chosen[i % len(chosen)] for i in range(50)],
                            "t": np.arange(b * 50, (b + 1) * 50, dtype=np.int64)})
        truth.update(pdf["k"])
        run(_frame(located, pdf), b)
        assert _counts(run) == dict(truth), b
    assert glob.glob(str(local_root / "**" / "p*.at"), recursive=True)


# ------------------------------------------------------------------ the missing jar
@pytest.mark.spark
def test_a_missing_jar_falls_back_with_one_warning_and_exact_results(
        located: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(locality, "JAR", tmp_path / "nowhere" / "missing.jar")
    monkeypatch.setattr(locality, "_LOADED", {})
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                 str(tmp_path / "s"), num_partitions=4)
    truth: Counter[str] = Counter()
    with caplog.at_level(logging.WARNING, logger=locality.__name__):
        for b in range(3):
            pdf = _pdf(b)
            truth.update(pdf["k"])
            run(_frame(located, pdf), b)
    warned = [r for r in caplog.records if r.name == locality.__name__
              and "could not be loaded" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert "missing.jar" in warned[0].getMessage()
    assert _counts(run) == dict(truth)
    assert set(run.task_timings()["executor"]) == {""}
    assert run.locality == {"stayed": 0, "moved": 0, "lost": 0}


# ------------------------------------------------------------------ forged timing records
def _timing(**extra: Any) -> bytes:
    from trilink_spark.state.formats import seal

    return json.dumps(seal({"rows": 3, "process_ms": 1.0, **extra})).encode()


@pytest.mark.parametrize("executor", [12345, ["a"], {"x": 1}, "", "e" * 257, "e" * 100_000,
                                      True, 1.5])
def test_a_timing_record_with_a_bad_executor_is_ignored(executor: Any) -> None:
    assert parse_timing(_timing(executor=executor, host="h"), "forged") is None
    assert parse_timing(_timing(executor="1", host=executor), "forged") is None


def test_a_timing_record_with_a_good_executor_is_read() -> None:
    got = parse_timing(_timing(executor="7", host="10.0.0.1"), "ok")
    assert got is not None and got["executor"] == "7" and got["host"] == "10.0.0.1"


@pytest.mark.spark
def test_forged_timing_records_in_a_run_are_ignored_not_fatal(located: Any,
                                                              tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                 str(tmp_path / "s"), num_partitions=2)
    run(_frame(located, _pdf(0)), 0)
    files = sorted(glob.glob(str(tmp_path / "s" / "**" / "*.timing.json"), recursive=True))
    assert files
    for path, bad in zip(files, [12345, "x" * 5000]):
        Path(path).write_bytes(_timing(executor=bad, host="h"))
    t = run.task_timings()
    assert len(t) == 2 and all(isinstance(e, str) for e in t["executor"])
    run(_frame(located, _pdf(1)), 1)  # the next batch runs on
    assert len(run.task_timings()) == 2


@pytest.mark.spark
@pytest.mark.parametrize("length", [200, 230])
def test_an_executor_name_the_timing_accepts_is_accepted_by_the_history(
        located: Any, tmp_path: Path, length: int) -> None:
    # the timing reader and the history record bound a task's executor name alike
    # (MAX_NAME_CHARS): a name the reader takes never costs the batch its history record
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                 str(tmp_path / "s"), num_partitions=2)
    run(_frame(located, _pdf(0)), 0)
    files = sorted(glob.glob(str(tmp_path / "s" / "**" / "*.timing.json"), recursive=True))
    name = "e" * length
    Path(files[-1]).write_bytes(_timing(executor=name, host="h"))
    t = run.task_timings()
    assert (name in set(t["executor"])) == (length <= 200)  # a longer one is ignored
    body = record_batch(run.store, 0, 2, "x", seconds=0.1, keep=10)
    assert body is not None, "the history record of the batch was refused"


# ------------------------------------------------------------------ the sweep, hostile
def _copy(root: Path, pid: int, version: int, store: str = "s") -> Path:
    with LocalState.open(str(root), store, pid) as local:
        local.apply(version, "a", {}, [], [], {})
    mark(str(root), store, pid, version)
    return root / store / f"p{pid:05d}.db"


def test_sweep_ignores_junk_marks(tmp_path: Path) -> None:
    kept = _copy(tmp_path, 1, 3)
    base = tmp_path / "s"
    (base / "p00001.at").unlink()
    (base / "p00001.at").mkdir()  # a directory where the mark should be
    (base / "p00002.at").write_bytes(b"\xff\xfe\x00")  # binary
    (base / "p00003.at").write_text("9" * 5000)  # a 5000-digit number
    (base / "p99999999999999999999999.at").write_text("1")  # a partition no run has
    (base / ".at-tmp").write_text("1")
    assert sweep(str(tmp_path), "s", 0, 100, behind=10) in ([], [99999999999999999999999])
    assert kept.exists()


def test_sweep_never_drops_a_copy_whose_mark_is_ahead(tmp_path: Path) -> None:
    """A query restarted from an older checkpoint runs lower batch ids than the marks."""
    ahead = _copy(tmp_path, 1, 500)
    assert sweep(str(tmp_path), "s", 0, 3, behind=1) == []
    assert ahead.exists()


def test_sweep_of_a_read_only_directory_drops_nothing_and_raises_nothing(tmp_path: Path) -> None:
    old = _copy(tmp_path, 1, 1)
    base = tmp_path / "s"
    modes = {p: p.stat().st_mode for p in [base, old]}
    try:
        for p in modes:
            p.chmod(stat.S_IRUSR | stat.S_IXUSR)
        if os.access(base, os.W_OK):
            pytest.skip("running as root: a read-only directory is writable")
        assert sweep(str(tmp_path), "s", 0, 50, behind=10) == []
        mark(str(tmp_path), "s", 0, 50)  # cannot be written: logged, not raised
    finally:
        for p, m in modes.items():
            p.chmod(m)
    assert old.exists()


def test_sweep_leaves_a_copy_in_use_in_this_process(tmp_path: Path) -> None:
    _copy(tmp_path, 1, 1)
    local = LocalState.open(str(tmp_path), "s", 1)  # a task is using it right now
    try:
        assert sweep(str(tmp_path), "s", 0, 50, behind=10) == []
        assert (tmp_path / "s" / "p00001.db").exists()
        local.apply(2, "b", {}, [], [], {})
    finally:
        local.close()


def test_sweep_touches_only_its_own_store(tmp_path: Path) -> None:
    other = _copy(tmp_path, 1, 1, store="other")
    _copy(tmp_path, 2, 1)
    assert sweep(str(tmp_path), "s", 0, 50, behind=10) == [2]
    assert other.exists()


# ------------------------------------------------------------------ shapes and paths
@pytest.mark.spark
@pytest.mark.parametrize("partitions", [1, 64])
def test_locality_on_with_one_or_many_partitions_and_an_empty_batch(
        located: Any, tmp_path: Path, partitions: int) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                 str(tmp_path / "s"), num_partitions=partitions)
    truth: Counter[str] = Counter()
    for b in range(4):
        pdf = _pdf(b) if b != 1 else _pdf(b).iloc[:0]
        truth.update(pdf["k"])
        run(_frame(located, pdf), b)
    assert _counts(run) == dict(truth)
    assert len(run.task_timings()) == partitions


@pytest.mark.spark
def test_locality_on_in_a_streaming_query_is_exact(located: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    truth: Counter[str] = Counter()
    for b in range(3):
        pdf = _pdf(b)
        truth.update(pdf["k"])
        src.mkdir(exist_ok=True)
        pdf.to_parquet(src / f"part-{b}.parquet")
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                 str(tmp_path / "s"), num_partitions=4)
    query = (located.readStream.schema("k string, t long").option("maxFilesPerTrigger", 1)
             .parquet(str(src)).writeStream.foreachBatch(run)
             .option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(180)
    finally:
        query.stop()
    assert query.exception() is None
    assert _counts(run) == dict(truth)
    ran = [e for e, r in zip(run.task_timings()["executor"], run.task_timings()["rows"]) if r]
    assert ran and set(ran) == {"driver"}


@pytest.mark.spark
def test_the_file_store_runs_exact_whatever_the_locality_conf(spark: Any,
                                                             tmp_path: Path) -> None:
    """The file store has no local copies: the locality confs are not read (as keepOpen is
    not); the run stays exact."""
    spark.conf.set("spark.trilink.state.locality", "true")
    try:
        run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(), 10,
                                     str(tmp_path / "s"), num_partitions=2,
                                     state_store="files")
        truth: Counter[str] = Counter()
        for b in range(2):
            pdf = _pdf(b)
            truth.update(pdf["k"])
            run(_frame(spark, pdf), b)
        assert _counts(run) == dict(truth)
        assert set(run.task_timings()["executor"]) == {""}
    finally:
        spark.conf.unset("spark.trilink.state.locality")
