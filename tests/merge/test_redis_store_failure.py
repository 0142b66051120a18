"""A task that cannot reach Redis reports it by type; the driver raises StoreUnavailableError."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark import cloudpickle

import trilink_spark as tl
from trilink_spark.errors import StoreUnavailableError
from trilink_spark.merge import RedisStore
from trilink_spark.testing import free_port  # a port nobody listens on

cloudpickle.register_pickle_by_value(sys.modules[__name__])

AGGS = {"n": ("count", None), "s": ("sum", "v")}


class TasksOnly(RedisStore):
    """Writes nothing from the driver, so that every Redis call is a task's ``apply``."""

    def set_meta(self, key: str, spark_type: str, specs: Any) -> None:
        return None


class NotAStoreError(TasksOnly):
    """Fails with another exception whose text merely mentions StoreUnavailableError."""

    def apply(self, deltas: pd.DataFrame, key: str, specs: Any, marker: str) -> bool:
        raise RuntimeError("StoreUnavailableError is only named here; this is a bug elsewhere")


def frame(spark: Any) -> Any:
    rng = np.random.default_rng(0)
    pdf = pd.DataFrame({"k": rng.integers(0, 20, 3000), "v": rng.normal(size=3000)})
    return spark.createDataFrame(pdf).repartition(3)


def test_unreachable_redis_in_the_tasks_raises_store_unavailable(spark: Any) -> None:
    url = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"
    store = TasksOnly(url, "t:tasks-down", socket_timeout=0.5)
    with pytest.raises(StoreUnavailableError) as info:
        tl.global_merge(frame(spark), "k", AGGS, store=store, batch_id=42, quantity=500,
                        read=False)
    message = str(info.value)
    assert type(info.value) is StoreUnavailableError
    assert "during batch 42" in message and "unreachable" in message
    assert "partition(s)" in message  # reported by the tasks' status rows
    assert "hunter2-secret" not in message and "127.0.0.1" in message


def test_other_task_errors_are_not_taken_for_a_store_failure(spark: Any) -> None:
    store = NotAStoreError("redis://127.0.0.1:1/0", "t:other")
    with pytest.raises(Exception) as info:
        tl.global_merge(frame(spark), "k", AGGS, store=store, batch_id=1, read=False)
    assert not isinstance(info.value, StoreUnavailableError)
    assert "only named here" in str(info.value)
