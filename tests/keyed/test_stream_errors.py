"""In a streaming query, the package's typed error is what the user catches: ``await_query``
raises it and ``query_error`` returns it, Spark's ``StreamingQueryException`` chained."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.errors import StreamingQueryException

import trilink_spark as tl
from conftest import RunningCount
from trilink_spark.errors import (StateCorruptError, StateStoreError,
                                  await_query, query_error)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Refusing(RunningCount):
    """Raises the package's own error inside a Spark task."""

    def process_on_time(self, key: Any, rows: Any, ctx: Any) -> Any:
        raise StateStoreError(f"refused key {key}\nsecond line")


def rate_stream(spark: Any) -> Any:
    return (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
            .selectExpr("concat('k', value % 5) AS k", "value AS t"))


def test_a_task_s_typed_error_is_what_a_stream_raises(spark: Any, tmp_path: Path) -> None:
    run = tl.keyed_foreach_batch(lambda df, b: df.count(), "k", "t", Refusing(), 10,
                                 str(tmp_path / "s"))
    query = (rate_stream(spark).writeStream.foreachBatch(run)
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    try:
        with pytest.raises(StateStoreError, match=r"^refused key k\d\nsecond line$") as caught:
            await_query(query, 120)
        assert isinstance(caught.value.__cause__, StreamingQueryException)
        assert "Traceback" in str(caught.value.__cause__)  # the worker's, kept
        found = query_error(query)
        assert type(found) is StateStoreError and str(found) == str(caught.value)
        assert isinstance(found.__cause__, StreamingQueryException)
    finally:
        query.stop()


def test_an_error_of_the_batch_function_itself_is_typed_and_others_stay_spark_s(
        spark: Any, tmp_path: Path) -> None:
    def damaged(df: Any, batch_id: int) -> None:
        raise StateCorruptError("p00001.json fails its checksum; restore it")

    def plain(df: Any, batch_id: int) -> None:
        raise KeyError("not ours")

    query = rate_stream(spark).writeStream.foreachBatch(damaged).start()
    try:
        with pytest.raises(StateCorruptError, match="^p00001.json fails its checksum; restore "
                                                    "it$"):
            await_query(query)
    finally:
        query.stop()
    other = rate_stream(spark).writeStream.foreachBatch(plain).start()
    try:
        with pytest.raises(StreamingQueryException, match="not ours"):
            await_query(other, 120)
        assert isinstance(query_error(other), StreamingQueryException)
    finally:
        other.stop()


def test_a_running_query_has_no_error_and_a_bad_timeout_is_refused(spark: Any) -> None:
    query = rate_stream(spark).writeStream.format("noop").start()
    try:
        assert query_error(query) is None
        assert await_query(query, 0.1) is False
        with pytest.raises(ValueError, match="timeout"):  # Spark's own refusal
            await_query(query, -1)
    finally:
        query.stop()
    assert await_query(query) is True and query_error(query) is None
