"""keyed_foreach_batch: state across micro-batches, replays, restarts, a real streaming query."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import trilink_spark as tl
from trilink_spark.errors import InvalidArgumentError
from trilink_spark.keyed import KeyedBatchFunction
from trilink_spark.placement import keyed_by_source
from testkit.windows import window_oracle

SIZE, DELAY = 10, 2


def readings(start: int, stop: int, sensors: int = 12) -> pd.DataFrame:
    rows = [(f"s{s:02d}", t, float(s + t)) for t in range(start, stop) for s in range(sensors)]
    return pd.DataFrame(rows, columns=["sensor", "t", "v"])


def complete(rows: pd.DataFrame) -> pd.DataFrame:
    """Oracle windows every sensor's own watermark has passed."""
    want = window_oracle(rows, SIZE, "v")
    high = rows.groupby("sensor")["t"].max() - DELAY
    return want[want["window_start"] + SIZE <= want["sensor"].map(high)]


def runner(tmp_path: Path, sink: list[pd.DataFrame], **kw: Any) -> KeyedBatchFunction:
    agg = tl.KeyedWindowAggregate(SIZE, value="v", aggs=("count", "sum"))
    return tl.keyed_foreach_batch(lambda df, b: sink.append(df.toPandas()), "sensor", "t", agg,
                                  DELAY, str(tmp_path / "state"), num_partitions=3, **kw)


def collected(sink: list[pd.DataFrame]) -> pd.DataFrame:
    out = pd.concat(sink, ignore_index=True)
    return out.sort_values(["sensor", "window_start"]).reset_index(drop=True)


def test_windows_span_micro_batches(spark: Any, tmp_path: Path) -> None:
    sink: list[pd.DataFrame] = []
    run = runner(tmp_path, sink)
    parts = [readings(0, 7), readings(7, 18), readings(18, 33)]
    for batch_id, part in enumerate(parts):
        run(spark.createDataFrame(part), batch_id)
    got = collected(sink)
    want = complete(pd.concat(parts)).sort_values(["sensor", "window_start"])
    assert got[["sensor", "window_start", "count", "sum"]].values.tolist() == \
        want[["sensor", "window_start", "count", "sum"]].values.tolist()
    assert run.counters()["rows"] == sum(len(p) for p in parts)
    assert run.counters()["late"] == 0


def test_replayed_batch_gives_the_same_output_and_state(spark: Any, tmp_path: Path) -> None:
    sink: list[pd.DataFrame] = []
    run = runner(tmp_path, sink)
    run(spark.createDataFrame(readings(0, 12)), 0)
    batch = spark.createDataFrame(readings(12, 25))
    run(batch, 1)
    state = {p: run.store.latest(p) for p in range(3)}
    run(batch, 1)  # replay
    assert sink[1].sort_values(["sensor", "window_start"]).values.tolist() == \
        sink[2].sort_values(["sensor", "window_start"]).values.tolist()
    assert {p: run.store.latest(p) for p in range(3)} == state


def test_restart_resumes_from_stored_state(spark: Any, tmp_path: Path) -> None:
    first: list[pd.DataFrame] = []
    runner(tmp_path, first)(spark.createDataFrame(readings(0, 15)), 0)
    second: list[pd.DataFrame] = []
    # a new process, same state path (by hand there is no query id: take over explicitly)
    restarted = runner(tmp_path, second, takeover=True)
    restarted(spark.createDataFrame(readings(15, 30)), 1)
    got = collected(first + second)
    want = complete(readings(0, 30)).sort_values(["sensor", "window_start"])
    assert got[["sensor", "window_start", "count"]].values.tolist() == \
        want[["sensor", "window_start", "count"]].values.tolist()
    with pytest.raises(InvalidArgumentError, match="configuration"):  # another window size
        agg = tl.KeyedWindowAggregate(SIZE * 2, value="v", aggs=("count", "sum"))
        tl.keyed_foreach_batch(print, "sensor", "t", agg, DELAY, str(tmp_path / "state"),
                               num_partitions=3, takeover=True)(
            spark.createDataFrame(readings(30, 31)), 2)


def test_restart_with_another_partition_count_swaps(spark: Any, tmp_path: Path) -> None:
    first: list[pd.DataFrame] = []
    runner(tmp_path, first)(spark.createDataFrame(readings(0, 15)), 0)
    second: list[pd.DataFrame] = []
    agg = tl.KeyedWindowAggregate(SIZE, value="v", aggs=("count", "sum"))
    rescaled = tl.keyed_foreach_batch(lambda df, b: second.append(df.toPandas()), "sensor", "t",
                                      agg, DELAY, str(tmp_path / "state"), num_partitions=5,
                                      takeover=True)
    rescaled(spark.createDataFrame(readings(15, 30)), 1)
    assert [(r.partitions_before, r.partitions_after) for r in rescaled.swaps] == [(3, 5)]
    assert set(rescaled.owners().values()) <= set(range(5))
    got = collected(first + second)
    want = complete(readings(0, 30)).sort_values(["sensor", "window_start"])
    assert got[["sensor", "window_start", "count"]].values.tolist() == \
        want[["sensor", "window_start", "count"]].values.tolist()


def test_state_advances_when_func_ignores_the_output(spark: Any, tmp_path: Path) -> None:
    agg = tl.KeyedWindowAggregate(SIZE)
    run = tl.keyed_foreach_batch(lambda df, b: None, "sensor", "t", agg, DELAY,
                                 str(tmp_path / "state"), num_partitions=2, keep_versions=2,
                                 state_store="files")  # whole versions: pruned at once
    for batch_id in range(4):
        run(spark.createDataFrame(readings(batch_id * 5, batch_id * 5 + 5)), batch_id)
    assert run.store.versions(0) == [2, 3]  # computed anyway, old versions pruned
    assert run.counters()["rows"] == 4 * 5 * 12


def test_streaming_query_with_keyed_windows(spark: Any, tmp_path: Path) -> None:
    src = tmp_path / "in"
    parts = [readings(0, 9), readings(9, 21), readings(21, 30)]
    for i, part in enumerate(parts):
        spark.createDataFrame(part).coalesce(1).write.parquet(str(src / f"batch={i}"))
    sink: list[pd.DataFrame] = []
    run = runner(tmp_path, sink)
    stream = (spark.readStream.schema("sensor string, t long, v double")
              .option("maxFilesPerTrigger", 1).option("recursiveFileLookup", "true")
              .parquet(str(src)))
    query = (stream.writeStream.foreachBatch(run)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    got = collected(sink)
    want = complete(pd.concat(parts)).sort_values(["sensor", "window_start"])
    assert got[["sensor", "window_start", "count", "sum"]].values.tolist() == \
        want[["sensor", "window_start", "count", "sum"]].values.tolist()


def declared(spark: Any, rows: pd.DataFrame, partitions: int) -> Any:
    """A batch whose sensors are whole per partition, declared as a keyed source."""
    placed = spark.createDataFrame(rows).repartition(partitions, "sensor")
    return keyed_by_source(placed, "sensor")


def test_source_keyed_state_refuses_a_changed_partition_count(spark: Any,
                                                              tmp_path: Path) -> None:
    sink: list[pd.DataFrame] = []
    run = runner(tmp_path, sink)
    run(declared(spark, readings(0, 7), 3), 0)
    run(declared(spark, readings(7, 14), 3), 1)
    assert run.store.partitions() == [0, 1, 2]
    with pytest.raises(tl.TrilinkError, match="has 3 partitions.*2 input partitions"):
        run(declared(spark, readings(14, 21), 2), 2)
    assert run.store.versions(0) == [0, 1]  # the refused batch wrote nothing
    # a fresh function on the same state (a restarted query) refuses it as well
    with pytest.raises(tl.TrilinkError, match="would strand that state"):
        runner(tmp_path, sink, takeover=True)(declared(spark, readings(14, 21), 2), 2)


def test_source_keyed_stream_refuses_state_placed_by_key_by(spark: Any, tmp_path: Path) -> None:
    sink: list[pd.DataFrame] = []
    runner(tmp_path, sink)(spark.createDataFrame(readings(0, 7)), 0)  # key_by placement
    with pytest.raises(tl.TrilinkError, match="placed by key_by.*own state_path"):
        runner(tmp_path, sink, takeover=True)(declared(spark, readings(7, 14), 3), 1)
