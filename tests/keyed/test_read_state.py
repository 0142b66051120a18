"""State as a DataFrame (read_state) and the state path summary (trilink-spark state)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.cli import main
from trilink_spark.errors import InvalidArgumentError, StateCorruptError
from trilink_spark.keyed import read_state, state_summary
from conftest import RunningCount

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"k{i:02d}" for i in range(30)]


class JsonCount(RunningCount):
    state_schema = None


def _batch(spark: Any, b: int, rng: np.random.Generator, rows: int = 300) -> tuple[Any, pd.Series]:
    picked = rng.choice(len(KEYS), size=rows)
    frame = pd.DataFrame({"k": [KEYS[i] for i in picked],
                          "t": np.arange(b * rows, (b + 1) * rows, dtype=np.int64)})
    return spark.createDataFrame(frame), frame


def _run(tmp_path: Path, processor: Any = None, **kw: Any) -> Any:
    kw.setdefault("num_partitions", 3)
    return tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t",
                                  processor or RunningCount(), 5, str(tmp_path / "state"), **kw)


@pytest.mark.connect
def test_read_state_gives_one_row_per_key_with_its_counts_and_watermark(spark: Any,
                                                                      tmp_path: Path) -> None:
    run = _run(tmp_path)
    rng = np.random.default_rng(3)
    frames = []
    for b in range(2):
        df, frame = _batch(spark, b, rng)
        run(df, b)
        frames.append(frame)
    seen = pd.concat(frames)
    state = read_state(spark, str(tmp_path / "state")).toPandas().set_index("key")
    assert list(state.columns) == ["partition", "block", "watermark", "last_seen", "rows", "n"]
    counts = seen["k"].value_counts()
    assert sorted(state.index) == sorted(counts.index)
    assert (state["rows"] == counts.reindex(state.index)).all()
    assert (state["n"] == counts.reindex(state.index)).all()  # the declared value, as a column
    high = seen.groupby("k")["t"].max().reindex(state.index)
    assert (state["watermark"] == high - 5).all()  # highest event time less the delay
    assert state["block"].isna().all()  # hash placement: no blocks
    assert state["partition"].to_dict() == run.owners()
    # an earlier committed batch that is still stored
    first = read_state(spark, str(tmp_path / "state"), batch_id=0).toPandas().set_index("key")
    assert (first["rows"] == frames[0]["k"].value_counts().reindex(first.index)).all()


def test_read_state_names_blocks_and_json_values(spark: Any, tmp_path: Path) -> None:
    placement = tl.BlockPartitioner(3, num_blocks=64)
    run = _run(tmp_path, processor=JsonCount(), strategy=placement)
    df, frame = _batch(spark, 0, np.random.default_rng(4))
    run(df, 0)
    state = read_state(spark, str(tmp_path / "state")).toPandas().set_index("key")
    assert "values" in state.columns and "n" not in state.columns
    assert {k: json.loads(v)["n"] for k, v in state["values"].items()} == \
        frame["k"].value_counts().to_dict()
    assert state["block"].to_dict() == {k: placement.block_of(k) for k in state.index}
    assert (state["partition"] == [int(placement.table[b]) for b in state["block"]]).all()


def test_read_state_refuses_what_it_cannot_read(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        read_state(spark, str(tmp_path / "missing"))
    assert not (tmp_path / "missing").exists()  # a reader creates nothing
    (tmp_path / "empty").mkdir()
    with pytest.raises(StateCorruptError, match="no manifest"):
        read_state(spark, str(tmp_path / "empty"))
    run = _run(tmp_path)
    df, _ = _batch(spark, 0, np.random.default_rng(5))
    run(df, 0)
    with pytest.raises(InvalidArgumentError, match="not committed"):
        read_state(spark, str(tmp_path / "state"), batch_id=7)
    with pytest.raises(ValueError, match="batch_id"):
        read_state(spark, str(tmp_path / "state"), batch_id=-1)


def test_reading_writes_nothing_under_the_path(spark: Any, tmp_path: Path) -> None:
    run = _run(tmp_path)
    df, frame = _batch(spark, 0, np.random.default_rng(6))
    run(df, 0)
    root = tmp_path / "state"

    def listing() -> dict[str, tuple[int, int]]:
        return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}

    before = listing()
    assert read_state(spark, str(root)).count() == frame["k"].nunique()
    state_summary(str(root))
    assert listing() == before  # no probe file, no manifest rewrite, nothing pruned


def test_state_summary_and_the_command(spark: Any, tmp_path: Path) -> None:
    run = _run(tmp_path)
    rng = np.random.default_rng(7)
    for b in range(2):
        df, _ = _batch(spark, b, rng)
        run(df, b)
    run.request_swap(num_partitions=4)
    df, _ = _batch(spark, 2, rng)
    run(df, 2)
    path = str(tmp_path / "state")
    summary = state_summary(path)
    assert summary["last_committed"] == 2
    assert [p["partition"] for p in summary["partitions"]] == [0, 1, 2, 3]
    assert summary["keys"] == len(run.owners())
    assert summary["bytes"] == run.store.state_bytes()
    assert summary["swaps"][0]["batch"] == 2
    assert (summary["swaps"][0]["partitions_before"], summary["swaps"][0]["partitions_after"]) \
        == (3, 4)
    out = io.StringIO()
    assert main(["state", path], out) == 0
    text = out.getvalue()
    assert "batch 2" in text and "least_count on 4 partitions" in text and "3 -> 4" in text
    assert summary["placement"]["strategy"] == "least_count"  # the minimal refit's table
    assert summary["placement"]["table_entries"] == len(run.owners())
    out = io.StringIO()
    assert main(["state", path, "--json"], out) == 0
    assert json.loads(out.getvalue()) == summary
    assert main(["state", str(tmp_path / "nowhere")]) == 2  # a typed error, exit 2
