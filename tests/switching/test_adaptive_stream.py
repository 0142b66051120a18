"""Adaptive placement with Spark: observe_df, key_by with an AdaptivePartitioner, foreachBatch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import trilink_spark as tl
from trilink_spark.errors import InvalidKeyTypeError, MissingColumnError, NullKeyError
from trilink_spark.placement import shuffle_exchanges
from trilink_spark.switching import adaptive_foreach_batch


def skewed_frame(spark: Any, rows: int, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    heavy = rng.choice(np.arange(0, 64, 8), size=rows // 2)
    light = rng.integers(0, 5000, rows - rows // 2) * 8
    keys = np.concatenate([heavy, light])
    return spark.createDataFrame(pd.DataFrame({"key": keys.astype(np.int64),
                                               "v": np.ones(rows)}))


def uniform_frame(spark: Any, rows: int) -> Any:
    return spark.range(rows).selectExpr("id % 997 AS key", "1.0 AS v")


def test_observe_df_samples_with_spark(spark: Any) -> None:
    df = spark.range(200_000).selectExpr("id % 1000 AS key")
    ap = tl.AdaptivePartitioner(8, sample_rate=0.05, seed=3)
    sampled = ap.observe_df(df, "key")
    assert 9_000 < sampled < 11_000
    assert ap.records_observed == pytest.approx(200_000, rel=0.1)
    again = tl.AdaptivePartitioner(8, sample_rate=0.05, seed=3)
    assert again.observe_df(df, "key") == sampled  # seeded
    assert set(ap.sample_view.index) <= set(range(1000))
    with pytest.raises(InvalidKeyTypeError):
        ap.observe_df(spark.range(3).selectExpr("CAST(id AS double) AS key"), "key")
    with pytest.raises(MissingColumnError):
        ap.observe_df(df, "nope")


def test_key_by_places_with_the_current_strategy(spark: Any) -> None:
    df = skewed_frame(spark, 20_000, 1)
    ap = tl.AdaptivePartitioner(4, sample_rate=0.2, mode="quantity", quantity=1, min_sample=100)
    ap.observe_df(df, "key")
    assert ap.decide().switched
    placed = tl.key_by(df, "key", ap)
    assert shuffle_exchanges(placed) == 1
    rows = placed.selectExpr("key", tl.PARTITION_COL, "spark_partition_id() AS pid").toPandas()
    assert (rows[tl.PARTITION_COL] == rows["pid"]).all()
    assert rows[tl.PARTITION_COL].tolist() == ap.current.assign(rows["key"].to_numpy()).tolist()
    assert tl.partition_balance(placed).balance_degree > 0.9


def _write_batches(spark: Any, root: Path, frames: list[Any]) -> Path:
    src = root / "in"
    for i, frame in enumerate(frames):
        frame.coalesce(1).write.parquet(str(src / f"batch={i:03d}"))
    return src


def _run_stream(spark: Any, src: Path, root: Path, runner: Any) -> None:
    stream = (
        spark.readStream.schema("key long, v double")
        .option("maxFilesPerTrigger", 1)
        .option("recursiveFileLookup", "true")
        .parquet(str(src))
    )
    query = (
        stream.writeStream.foreachBatch(runner)
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None


def test_foreach_batch_observes_decides_and_places(spark: Any, tmp_path: Path) -> None:
    frames = [uniform_frame(spark, 5000), uniform_frame(spark, 5000)]
    frames += [skewed_frame(spark, 5000, s) for s in range(3)]
    src = _write_batches(spark, tmp_path, frames)
    ap = tl.AdaptivePartitioner(4, sample_rate=0.5, mode="threshold", threshold=0.7,
                                min_sample=200, seed=1)
    seen: list[dict[str, Any]] = []

    def sink(placed: Any, batch_id: int) -> None:
        rows = placed.selectExpr("key", tl.PARTITION_COL, "spark_partition_id() AS pid").toPandas()
        strategy = ap.current
        seen.append({
            "batch": batch_id,
            "strategy": ap.current_name,
            "rows": len(rows),
            "in_place": bool((rows[tl.PARTITION_COL] == rows["pid"]).all()),
            "as_strategy": rows[tl.PARTITION_COL].tolist()
            == strategy.assign(rows["key"].to_numpy()).tolist(),
        })

    runner = adaptive_foreach_batch(sink, ap, "key")
    _run_stream(spark, src, tmp_path, runner)
    assert [s["rows"] for s in seen] == [5000] * 5
    assert all(s["in_place"] and s["as_strategy"] for s in seen)
    assert seen[0]["strategy"] == "hash"
    assert seen[-1]["strategy"].startswith("least")
    assert any(d.switched for d in ap.decisions)
    assert runner.last_decision is not None


def test_stateful_pipeline_never_switches(spark: Any, tmp_path: Path) -> None:
    frames = [skewed_frame(spark, 4000, s) for s in range(3)]
    src = _write_batches(spark, tmp_path, frames)
    ap = tl.AdaptivePartitioner(4, sample_rate=0.5, mode="quantity", quantity=1, min_sample=100)
    used: list[str] = []
    runner = adaptive_foreach_batch(lambda df, b: used.append(ap.current_name), ap, "key",
                                    stateful=True)
    ap.config.publish({"strategy": "least_count"})
    _run_stream(spark, src, tmp_path, runner)
    assert used == ["hash", "hash", "hash"]
    assert ap.decisions and all(not d.switched for d in ap.decisions)
    assert all("would" in d.reason for d in ap.decisions)


def test_replayed_batch_is_placed_identically(spark: Any) -> None:
    ap = tl.AdaptivePartitioner(4, sample_rate=0.5, mode="quantity", quantity=1, min_sample=100)
    outputs: list[list[tuple[int, int]]] = []

    def sink(placed: Any, batch_id: int) -> None:
        rows = placed.select("key", tl.PARTITION_COL).collect()
        outputs.append(sorted((r[0], r[1]) for r in rows))

    runner = adaptive_foreach_batch(sink, ap, "key")
    df = skewed_frame(spark, 3000, 9)
    runner(df, 0)
    decisions = len(ap.decisions)
    runner(df, 0)  # the same batch id again
    assert outputs[0] == outputs[1]
    assert len(ap.decisions) == decisions  # not observed or decided twice


def test_adaptive_foreach_batch_argument_errors() -> None:
    ap = tl.AdaptivePartitioner(4)
    with pytest.raises(TypeError):
        adaptive_foreach_batch("not callable", ap, "key")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        adaptive_foreach_batch(print, tl.HashPartitioner(4), "key")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        adaptive_foreach_batch(print, ap, "key", fit="always")


def test_async_observation_informs_the_next_batch(spark: Any) -> None:
    ap = tl.AdaptivePartitioner(4, sample_rate=0.5, mode="quantity", quantity=1, min_sample=100)
    used: list[str] = []
    runner = adaptive_foreach_batch(lambda df, b: used.append(ap.current_name), ap, "key",
                                    observe="async")
    for batch_id in range(3):
        runner(skewed_frame(spark, 3000, batch_id), batch_id)
    assert used[0] == "hash"  # nothing observed yet when the first batch was placed
    assert used[-1].startswith("least")
    assert ap.records_observed > 0


def test_async_observation_errors_surface(spark: Any) -> None:
    ap = tl.AdaptivePartitioner(4, sample_rate=1.0, null_policy="error")
    runner = adaptive_foreach_batch(lambda df, b: None, ap, "key", observe="async")
    df = spark.createDataFrame([(1,), (None,)], "key long")
    with pytest.raises(NullKeyError):
        runner(df, 0)
