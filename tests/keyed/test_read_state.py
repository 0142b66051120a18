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


# ---------------------------------------------------------------- hostile inputs (issue 29)
class RowsNamed(tl.KeyedWatermarkProcessFunction):
    """A declared state value named like read_state's own columns."""

    output_schema = "k string, n long"
    state_schema = "rows long, key string"

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        n = ctx.get_state("rows", 0) + len(rows)
        ctx.set_state("rows", n)
        ctx.set_state("key", "mine")
        return [(None if key is None else str(key), n)]


class IntCount(RunningCount):
    output_schema = "k long, n long"


def _keyed_run(tmp_path: Path, processor: Any = None, **kw: Any) -> Any:
    kw.setdefault("num_partitions", 3)
    return tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t",
                                  processor or RunningCount(), 5, str(tmp_path / "state"), **kw)


def test_read_state_blocks_follow_the_recorded_int_key_type(spark: Any, tmp_path: Path) -> None:
    placement = tl.BlockPartitioner(3, num_blocks=64)
    frame = pd.DataFrame({"k": np.arange(-20, 20, dtype=np.int32),
                          "t": np.arange(40, dtype=np.int64)})
    df = spark.createDataFrame(frame, "k int, t long")
    run = _keyed_run(tmp_path, processor=IntCount(), strategy=placement)
    run(df, 0)
    state = read_state(spark, str(tmp_path / "state")).toPandas().set_index("key")
    bound = placement.for_column("int")
    assert state["block"].to_dict() == {int(k): bound.block_of(int(k)) for k in state.index}
    assert state["partition"].to_dict() == run.owners()


def test_read_state_null_key_has_a_null_block(spark: Any, tmp_path: Path) -> None:
    placement = tl.BlockPartitioner(3, num_blocks=16, null_policy="partition0")
    df = spark.createDataFrame([("a", 1), (None, 2), ("b", 3)], "k string, t long")
    run = _keyed_run(tmp_path, strategy=placement)
    run(df, 0)
    state = read_state(spark, str(tmp_path / "state")).toPandas()
    nulls = state[state["key"].isna()]
    assert len(nulls) == 1 and nulls["partition"].iloc[0] == 0
    assert nulls["block"].isna().all()  # a null key has no block (never -1)
    keyed = state.dropna(subset=["key"]).set_index("key")
    assert keyed["block"].to_dict() == {k: placement.block_of(k) for k in keyed.index}


def test_read_state_reads_a_value_named_like_its_columns(spark: Any, tmp_path: Path) -> None:
    df = spark.createDataFrame([("a", 1), ("a", 2), ("b", 3)], "k string, t long")
    run = _keyed_run(tmp_path, processor=RowsNamed())
    run(df, 0)
    state = read_state(spark, str(tmp_path / "state")).toPandas().set_index("key")
    assert state["rows"].to_dict() == {"a": 2, "b": 1}
    assert state["state_rows"].to_dict() == {"a": 2, "b": 1}
    assert set(state["state_key"]) == {"mine"}


def test_read_state_hostile_keys_and_batch_ids(spark: Any, tmp_path: Path) -> None:
    from trilink_spark.errors import InvalidArgumentTypeError
    big = "x" * (1 << 20)
    df = spark.createDataFrame([("😀", 1), (big, 2), ("", 3)], "k string, t long")
    run = _keyed_run(tmp_path)
    run(df, 0)
    run(spark.createDataFrame([], "k string, t long"), 1)  # an empty batch
    path = str(tmp_path / "state")
    state = read_state(spark, path).toPandas().set_index("key")
    assert state["rows"].to_dict() == {"😀": 1, big: 1, "": 1}
    for bad in (True, 1.0, "1"):
        with pytest.raises(InvalidArgumentTypeError):
            read_state(spark, path, batch_id=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="not committed"):
        read_state(spark, path, batch_id=2**70)
    assert read_state(spark, "file://" + path).count() == 3
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        read_state(spark, str(tmp_path / "state" / "manifest.json"))


class BinCount(RunningCount):
    output_schema = "k binary, n long"


def test_read_state_binary_and_extreme_long_keys(spark: Any, tmp_path: Path) -> None:
    placement = tl.BlockPartitioner(3, num_blocks=32)
    df = spark.createDataFrame([(b"\x00\xff", 1), (b"", 2)], "k binary, t long")
    run = _keyed_run(tmp_path, processor=BinCount(), strategy=placement)
    run(df, 0)
    state = read_state(spark, str(tmp_path / "state")).toPandas()
    assert sorted(bytes(k) for k in state["key"]) == [b"", b"\x00\xff"]
    bound = placement.for_column("binary")
    assert {bytes(k): b for k, b in zip(state["key"], state["block"])} == \
        {b"": bound.block_of(b""), b"\x00\xff": bound.block_of(b"\x00\xff")}
    longs = spark.createDataFrame([(-2**63, 1), (2**63 - 1, 2), (0, 3)], "k long, t long")
    run2 = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", IntCount(), 5,
                                  str(tmp_path / "longs"), num_partitions=2,
                                  strategy=tl.BlockPartitioner(2, num_blocks=8))
    run2(longs, 0)
    got = read_state(spark, str(tmp_path / "longs"))
    assert dict(got.dtypes)["key"] == "bigint"
    rows = {r["key"]: r["block"] for r in got.collect()}
    bound = tl.BlockPartitioner(2, num_blocks=8).for_column("long")
    assert rows == {k: bound.block_of(k) for k in (-2**63, 2**63 - 1, 0)}


def test_read_state_batch_before_the_first_is_not_committed(spark: Any,
                                                             tmp_path: Path) -> None:
    run = _run(tmp_path)
    df, _ = _batch(spark, 0, np.random.default_rng(8))
    run(df, 5)
    with pytest.raises(InvalidArgumentError, match="not committed"):
        read_state(spark, str(tmp_path / "state"), batch_id=2)


def test_read_state_damaged_files_are_state_corrupt(spark: Any, tmp_path: Path) -> None:
    run = _run(tmp_path)
    df, _ = _batch(spark, 0, np.random.default_rng(9))
    run(df, 0)
    root = tmp_path / "state"
    state_file = root / "partition=00001" / "000000000000.log"  # the local store's changelog
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state_file.write_bytes(bytes(data))
    with pytest.raises(StateCorruptError, match="partition=00001"):
        read_state(spark, str(root))
    with pytest.raises(StateCorruptError, match="partition=00001"):
        state_summary(str(root))
    assert main(["state", str(root)]) == 2
    (root / "manifest.json").write_text('{"hello": 1}')
    with pytest.raises(StateCorruptError, match="manifest.json"):
        read_state(spark, str(root))
    assert main(["state", str(root)]) == 2
    (root / "manifest.json").write_bytes(b"\xff\x00junk")
    with pytest.raises(StateCorruptError, match="manifest.json"):
        state_summary(str(root))


def test_read_state_refuses_unreadable_uris_with_typed_errors(spark: Any,
                                                              tmp_path: Path) -> None:
    from trilink_spark.errors import InvalidArgumentTypeError
    for bad in ("foo://x/state", "\x00state"):
        with pytest.raises(InvalidArgumentError, match="path or URI"):
            read_state(spark, bad)
        assert main(["state", bad]) == 2
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        state_summary("")
    with pytest.raises(InvalidArgumentTypeError):
        state_summary(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("store", ["rocksdb", "files"])
def test_read_state_after_rescales_empty_and_uncommitted_versions(spark: Any, tmp_path: Path,
                                                                   store: str) -> None:
    import shutil
    run = _run(tmp_path, keep_versions=2, state_store=store)
    run(spark.createDataFrame([], "k string, t long"), 0)  # an empty committed version
    path = str(tmp_path / "state")
    empty = read_state(spark, path)
    assert empty.count() == 0 and dict(empty.dtypes)["key"] == "string"
    rng = np.random.default_rng(10)
    for b, n in ((1, 2), (2, 5), (3, 1)):
        run.request_swap(num_partitions=n)
        df, _ = _batch(spark, b, rng)
        run(df, b)
        state = read_state(spark, path).toPandas().set_index("key")
        assert state["partition"].to_dict() == run.owners()
        assert set(state["partition"]) <= set(range(n))
    if store == "files":
        with pytest.raises(InvalidArgumentError, match="no longer stored"):
            read_state(spark, path, batch_id=1)
    else:  # the changelogs the kept versions replay are kept: batch 1 is still stored
        assert set(read_state(spark, path, batch_id=1).toPandas()["partition"]) <= {0, 1}
    assert read_state(spark, path, batch_id=2).select("partition").distinct().count() <= 5
    # a runner that died mid-batch 4: partition 0 wrote version 4, nothing committed it
    root = tmp_path / "state" / "partition=00000"
    for suffix in (".state", ".log"):
        if (root / f"000000000003{suffix}").exists():
            shutil.copy(root / f"000000000003{suffix}", root / f"000000000004{suffix}")
    assert state_summary(path)["last_committed"] == 3
    assert read_state(spark, path).count() == len(run.owners())
    with pytest.raises(InvalidArgumentError, match="not committed"):
        read_state(spark, path, batch_id=4)


def test_read_state_of_many_keys(spark: Any, tmp_path: Path) -> None:
    n = 100_000
    placement = tl.BlockPartitioner(3, num_blocks=256)
    frame = pd.DataFrame({"k": [f"key{i}" for i in range(n)],
                          "t": np.arange(n, dtype=np.int64)})
    run = _run(tmp_path, strategy=placement)
    run(spark.createDataFrame(frame), 0)
    state = read_state(spark, str(tmp_path / "state"))
    assert state.count() == n
    sample = state.filter("key in ('key0', 'key99999', 'key4242')").toPandas().set_index("key")
    assert sample["block"].to_dict() == {k: placement.block_of(k) for k in sample.index}
    assert state_summary(str(tmp_path / "state"))["keys"] == n


def test_read_state_refuses_a_manifest_with_a_foreign_delay(spark: Any, tmp_path: Path) -> None:
    run = _run(tmp_path)
    df, _ = _batch(spark, 0, np.random.default_rng(11))
    run(df, 0)
    manifest = run.store.read_manifest()
    for bad in ("5 seconds", [1], float("nan")):
        run.store.write_manifest({**manifest, "config": {**manifest["config"], "delay": bad}})
        with pytest.raises(StateCorruptError, match="manifest.json"):
            read_state(spark, str(tmp_path / "state"))


def test_a_timestamp_event_time_gives_timestamp_watermarks(spark: Any, tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", RunningCount(),
                                 "10 seconds", str(tmp_path / "state"), num_partitions=2)
    base = pd.Timestamp("2026-12-03 10:00:00", tz="UTC")
    frame = pd.DataFrame({"k": ["a", "b", "a"],
                          "t": [base, base + pd.Timedelta(seconds=30),
                                base + pd.Timedelta(seconds=90)]})
    run(spark.createDataFrame(frame, "k string, t timestamp"), 0)
    state = read_state(spark, str(tmp_path / "state"))
    assert dict(state.dtypes)["watermark"] == "timestamp"
    assert dict(state.dtypes)["last_seen"] == "timestamp"
    rows = {r.key: r for r in state.collect()}
    as_utc = {k: (pd.Timestamp(r.watermark).tz_localize(None), pd.Timestamp(r.last_seen)
                  .tz_localize(None)) for k, r in rows.items()}
    # Spark gives session-local wall times: compare as the session's zone sees them
    zone = spark.conf.get("spark.sql.session.timeZone")
    local = (base + pd.Timedelta(seconds=80)).tz_convert(zone).tz_localize(None)
    assert as_utc["a"][0] == local  # highest event time 90 s less the 10 s delay
    assert as_utc["b"][1] == (base + pd.Timedelta(seconds=30)).tz_convert(zone).tz_localize(None)
