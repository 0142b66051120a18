"""Keyed state split by key (no pickle) and barrier-synchronised swaps of keyed state."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.errors import StateCorruptError, StateOwnershipError, StateTypeError
from trilink_spark.keyed import KeyedBatchFunction
from trilink_spark.measurement import task_metrics
from conftest import RunningCount
from testkit.swaps import check_invariants, die_after_writing, stored_counts

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"k{i:03d}" for i in range(60)]


Count = RunningCount  # running count per key, in a typed state column


class JsonCount(Count):
    state_schema = None


def batch(spark: Any, b: int, rng: np.random.Generator, rows: int = 400) -> tuple[Any, pd.Series]:
    # Zipf-ish: a few heavy keys
    weights = 1.0 / np.arange(1, len(KEYS) + 1) ** 0.8
    picked = rng.choice(len(KEYS), size=rows, p=weights / weights.sum())
    frame = pd.DataFrame({"k": [KEYS[i] for i in picked],
                          "t": np.arange(b * rows, (b + 1) * rows, dtype=np.int64)})
    return spark.createDataFrame(frame), frame["k"].value_counts()


def make_run(tmp_path: Path, sink: list[pd.DataFrame] | None = None, processor: Any = None,
             **kw: Any) -> KeyedBatchFunction:
    def write(df: Any, b: int) -> None:
        rows = df.toPandas()
        if sink is not None:
            sink.append(rows)

    kw.setdefault("num_partitions", 4)
    return tl.keyed_foreach_batch(write, "k", "t", processor or Count(), 1_000_000,
                                  str(tmp_path / "state"), **kw)


# ---------------------------------------------------------------------- state format
def test_state_version_is_an_arrow_table_with_one_row_per_key(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    df, counts = batch(spark, 0, np.random.default_rng(0))
    run(df, 0)
    tables = [run.store.load_table(p, 0) for p in range(4)]
    keys = [k for t in tables for k in t.column("key").to_pylist()]
    assert sorted(keys) == sorted(counts.index) and len(keys) == len(set(keys))
    assert str(tables[0].schema.field("values").type) == "struct<n: int64>"
    stored = [run.store.load(p, 0) or Path(run.store.changelog_path(p, 0)).read_bytes()
              for p in range(4)]  # a snapshot, or (the local store) a changelog
    assert all(data.startswith(b"ARROW1") for data in stored)  # no pickle
    check_invariants(run, counts)


def test_no_pickle_loads_in_the_package() -> None:
    root = Path(tl.__file__).parent
    found = [str(p) for p in root.rglob("*.py") if "pickle.loads" in p.read_text()]
    assert found == []


def test_json_state_round_trips_and_refuses_what_json_cannot_hold(spark: Any,
                                                                  tmp_path: Path) -> None:
    run = make_run(tmp_path, processor=JsonCount())
    df, counts = batch(spark, 0, np.random.default_rng(1))
    run(df, 0)
    assert str(run.store.load_table(0, 0).schema.field("values").type) == "string"
    check_invariants(run, counts)

    class SetState(JsonCount):
        def process_on_time(self, key: Any, rows: pd.DataFrame, ctx: Any) -> Any:
            ctx.set_state("n", {1, 2})
            return None

    bad = make_run(tmp_path / "bad", processor=SetState())
    with pytest.raises(Exception, match="JSON-representable"):
        bad(df, 0)


def test_declared_state_type_refuses_a_value_that_does_not_fit() -> None:
    from trilink_spark.keyed.semantics.process import KeyedContext, KeyedRuntime
    import pyarrow as pa

    rt = KeyedRuntime(Count(), "k", 1.0, float("inf"), value_fields={"n": pa.int64()})
    ctx = KeyedContext(rt, "a")
    ctx.set_state("n", 3)
    with pytest.raises(StateTypeError, match="'n' of key 'a'"):
        ctx.set_state("n", "three")
    with pytest.raises(StateTypeError, match="not declared"):
        ctx.set_state("m", 1)
    assert isinstance(StateTypeError("x"), TypeError)
    assert rt.values == {"a": {"n": 3}}  # the refused values changed nothing


@pytest.mark.parametrize("store,name", [("files", "000000000000.state"),
                                        ("rocksdb", "000000000000.log")])
@pytest.mark.parametrize("junk", [b"", b"\x80\x04K\x01.", b"ARROW1 but truncated",
                                  b"not arrow at all"])
def test_corrupt_state_file_is_named_never_empty(spark: Any, tmp_path: Path, junk: bytes,
                                                 store: str, name: str) -> None:
    run = make_run(tmp_path, state_store=store)
    df, _ = batch(spark, 0, np.random.default_rng(2))
    run(df, 0)
    path = tmp_path / "state" / "partition=00001" / name
    path.write_bytes(junk)
    df1, _ = batch(spark, 1, np.random.default_rng(3))
    with pytest.raises(Exception, match="partition=00001"):
        run(df1, 1)


def test_foreign_arrow_file_is_refused(spark: Any, tmp_path: Path) -> None:
    import pyarrow as pa

    run = make_run(tmp_path)
    df, _ = batch(spark, 0, np.random.default_rng(2))
    run(df, 0)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, pa.schema([("x", pa.int64())])) as w:
        w.write_table(pa.table({"x": [1]}))
    (tmp_path / "state" / "partition=00002" / "000000000000.state").write_bytes(
        sink.getvalue().to_pybytes())
    with pytest.raises(StateCorruptError, match="partition=00002"):
        run.owners()


def test_keep_versions_1_replay_keeps_the_state_it_needs(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path, keep_versions=1)
    rng = np.random.default_rng(4)
    df0, c0 = batch(spark, 0, rng)
    df1, c1 = batch(spark, 1, rng)
    run(df0, 0)
    run(df1, 1)
    run(df1, 1)  # a restarted query replays its last batch
    check_invariants(run, c0.add(c1, fill_value=0))


@pytest.mark.parametrize("store,name", [("files", "000000000002.state"),
                                        ("rocksdb", "000000000002.log")])
def test_a_deleted_version_is_a_gap_not_an_older_start(spark: Any, tmp_path: Path, store: str,
                                                       name: str) -> None:
    run = make_run(tmp_path, state_store=store)
    rng = np.random.default_rng(5)
    for b in range(3):
        run(batch(spark, b, rng)[0], b)
    (tmp_path / "state" / "partition=00000" / name).unlink()
    with pytest.raises(Exception, match="missing"):
        run(batch(spark, 3, rng)[0], 3)


def test_a_second_writer_is_refused(spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    first = make_run(tmp_path)
    first(batch(spark, 0, rng)[0], 0)
    second = make_run(tmp_path)
    with pytest.raises(StateOwnershipError, match="another runner"):
        second(batch(spark, 1, rng)[0], 1)
    first(batch(spark, 1, rng)[0], 1)  # the owner goes on


def test_junk_in_the_manifest_is_refused(spark: Any, tmp_path: Path) -> None:
    run = make_run(tmp_path)
    run(batch(spark, 0, np.random.default_rng(7))[0], 0)
    (tmp_path / "state" / "manifest.json").write_text("{not json")
    with pytest.raises(StateCorruptError, match="manifest.json"):
        run(batch(spark, 1, np.random.default_rng(8))[0], 1)


# ---------------------------------------------------------------------- swaps
def run_batches(spark: Any, run: KeyedBatchFunction, batches: range, rng: Any,
                total: pd.Series) -> pd.Series:
    for b in batches:
        df, counts = batch(spark, b, rng)
        run(df, b)
        total = total.add(counts, fill_value=0)
        check_invariants(run, total)
    return total


def test_sync_swap_rescales_and_moves_only_changed_keys(spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(10)
    run = make_run(tmp_path, strategy=tl.BlockPartitioner(4, num_blocks=64))
    total = run_batches(spark, run, range(2), rng, pd.Series(dtype=float))
    before = run.owners()
    run.request_swap(num_partitions=6)
    total = run_batches(spark, run, range(2, 3), rng, total)
    after = run.owners(2)
    report = run.swaps[-1]
    moved = {k for k in before if before[k] != after[k]}
    assert (report.partitions_before, report.partitions_after) == (4, 6)
    assert report.moved_keys == len(moved) and report.complete and report.mode == "sync"
    assert report.keys_total == len(before) and report.moved_bytes > 0
    assert set(after.values()) <= set(range(6))
    run.request_swap(num_partitions=3)
    total = run_batches(spark, run, range(3, 5), rng, total)
    assert set(run.owners().values()) <= set(range(3))
    assert [r.partitions_after for r in run.swaps] == [6, 3]
    # removed partitions wrote no further version
    assert 4 not in run.store.versions(5) and 3 not in run.store.versions(5)


def test_fluid_swap_moves_a_bounded_number_of_keys_per_batch(spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    run = make_run(tmp_path)
    total = run_batches(spark, run, range(2), rng, pd.Series(dtype=float))
    run.request_swap("least_count", num_partitions=4, refit="none", mode="fluid",
                     max_keys_per_batch=7)
    b = 2
    while not run.swaps or not run.swaps[-1].complete:
        total = run_batches(spark, run, range(b, b + 1), rng, total)
        assert run.swaps[-1].moved_keys <= 7
        b += 1
        assert b < 30
    assert len(run.swaps) >= 2
    final, _ = run.store.placement_at(b - 1)
    assert type(final).__name__ == "LeastCountPartitioner"  # the overlay is gone when done
    owners = run.owners()
    assert {k: final.partition(k) for k in owners} == owners


def test_fluid_swap_of_blocks_moves_whole_blocks_under_a_block_table(
        spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(21)
    run = make_run(tmp_path, strategy=tl.BlockPartitioner(4, num_blocks=32))
    total = run_batches(spark, run, range(2), rng, pd.Series(dtype=float))
    run.request_swap(num_partitions=3, mode="fluid", max_keys_per_batch=6)
    b, moved_blocks = 2, set()
    while not run.swaps or not run.swaps[-1].complete:
        before = run.owners()
        total = run_batches(spark, run, range(b, b + 1), rng, total)
        placement, _ = run.store.placement_at(b)
        assert isinstance(placement, tl.BlockPartitioner)  # no key overlay: blocks
        after = run.owners(b)
        moved = [k for k in before if before[k] != after[k]]
        assert len(moved) == run.swaps[-1].moved_keys
        blocks = {placement.block_of(k) for k in moved}
        # whole blocks: every stored key of a moved block now sits where the table says
        assert all(after[k] == placement.partition(k) for k in after
                   if placement.block_of(k) in blocks)
        assert len(moved) <= 6 or len(blocks) == 1
        assert not blocks & moved_blocks  # a block moves once
        moved_blocks |= blocks
        b += 1
        assert b < 40
    assert len(run.swaps) >= 2
    final, n = run.store.placement_at(b - 1)
    assert isinstance(final, tl.BlockPartitioner) and n == 3
    owners = run.owners()
    assert {k: final.partition(k) for k in owners} == owners


def test_replayed_swap_batch_reuses_its_plan(spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    sink: list[pd.DataFrame] = []
    run = make_run(tmp_path, sink)
    total = run_batches(spark, run, range(2), rng, pd.Series(dtype=float))
    run.request_swap(num_partitions=7)
    df, counts = batch(spark, 2, rng)
    run(df, 2)
    state = {p: run.store.load(p, 2) for p in range(7)}
    plan = json.loads((tmp_path / "state" / "swaps" / f"{2:012d}" / "plan.json").read_text())
    run.request_swap(num_partitions=2)  # must not change the replay
    run(df, 2)
    assert {p: run.store.load(p, 2) for p in range(7)} == state
    assert sink[-1].sort_values("k").values.tolist() == sink[-2].sort_values("k").values.tolist()
    assert plan == json.loads(
        (tmp_path / "state" / "swaps" / f"{2:012d}" / "plan.json").read_text())
    check_invariants(run, total.add(counts, fill_value=0))


def test_batch_replayed_after_the_driver_died_mid_swap(spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(13)
    run = make_run(tmp_path)
    total = run_batches(spark, run, range(2), rng, pd.Series(dtype=float))
    df, counts = batch(spark, 2, rng)

    dying = tl.keyed_foreach_batch(die_after_writing, "k", "t", Count(), 1_000_000,
                                   str(tmp_path / "state"), num_partitions=4, takeover=True)
    dying.request_swap(num_partitions=5)
    with pytest.raises(Exception, match="driver died"):
        dying(df, 2)
    restarted = make_run(tmp_path, takeover=True)
    restarted(df, 2)  # Spark replays the batch: the stored plan is reused
    assert restarted.swaps and restarted.swaps[-1].partitions_after == 5
    check_invariants(restarted, total.add(counts, fill_value=0))


class FailsFirstAttempt(Count):
    """Partition 1's task fails on its first attempt (the retry then runs it again)."""

    def open(self, partition_id: int) -> None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() == 0 and partition_id == 1:
            raise RuntimeError("first attempt fails")


def test_task_failure_during_a_swap_batch_is_retried_with_the_same_result(
        spark: Any, tmp_path: Path) -> None:
    # the shared session allows 2 attempts per task (conftest: local[2,2])
    assert spark.sparkContext.master.replace(" ", "").endswith(",2]"), spark.sparkContext.master
    rng = np.random.default_rng(14)
    total = pd.Series(dtype=float)
    run = make_run(tmp_path, processor=FailsFirstAttempt())
    sc = spark.sparkContext
    sc.setJobGroup("tl-swap-retry", "swap batches whose partition 1 fails once per task")
    try:
        for b in range(3):
            if b == 2:
                run.request_swap(num_partitions=6)
            df, counts = batch(spark, b, rng)
            run(df, b)
            total = total.add(counts, fill_value=0)
    finally:
        sc.setJobGroup("", "")
    tasks = task_metrics(spark, job_group="tl-swap-retry")
    failed = tasks[tasks.status == "FAILED"]
    assert len(failed) > 0 and set(failed.attempt) == {0}, tasks  # it failed, and was retried
    assert stored_counts(run) == {k: int(v) for k, v in total.items()}
    assert run.swaps[-1].partitions_after == 6


def test_streaming_query_rescales_4_6_3_while_it_runs(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    run = make_run(tmp_path)
    rng = np.random.default_rng(15)
    schema = "k string, t long"
    stream = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(src))
    query = (stream.writeStream.foreachBatch(run)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    total = pd.Series(dtype=float)
    ids = set()
    try:
        for b in range(6):
            if b == 2:
                run.request_swap(num_partitions=6)
            if b == 4:
                run.request_swap(num_partitions=3)
            df, counts = batch(spark, b, rng)
            df.toPandas().to_parquet(src / f"part-{b}.parquet")
            query.processAllAvailable()
            total = total.add(counts, fill_value=0)
            ids.add(query.id)
            check_invariants(run, total)
        progress = [p["batchId"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert len(ids) == 1
    assert progress == list(range(progress[0], progress[0] + len(progress)))
    assert [(r.partitions_before, r.partitions_after) for r in run.swaps] == [(4, 6), (6, 3)]


def test_adaptive_switch_is_carried_out_as_a_swap(spark: Any, tmp_path: Path) -> None:
    ap = tl.AdaptivePartitioner(4, mode="manual", sample_rate=1.0, min_sample=10, seed=3)
    run = make_run(tmp_path, strategy=ap)
    rng = np.random.default_rng(16)
    total = run_batches(spark, run, range(2), rng, pd.Series(dtype=float))
    assert run.swaps == []  # nothing switched yet
    decision = ap.decide(force=True)  # an operator's decision between batches
    assert decision.switched and ap.current_name != "hash", decision
    run_batches(spark, run, range(2, 3), rng, total)
    report = run.swaps[-1]
    assert (report.partitions_before, report.partitions_after) == (4, 4) and report.complete
    placement, _ = run.store.placement_at(2)
    assert type(placement) is type(ap.current)
    owners = run.owners()
    assert {k: placement.partition(k) for k in owners} == owners
